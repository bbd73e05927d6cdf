"""The daemon's TLS server context, from ``[server]``'s files; errors name the key."""

from __future__ import annotations

import contextlib
import re
import ssl
from typing import Protocol

from gateway.errors import os_reason


class ServerConfig(Protocol):
    """The keys of ``[server]`` this module reads (`gateway.config.sections.ServerConfig`)."""

    @property
    def tls_cert(self) -> str: ...
    @property
    def tls_key(self) -> str: ...
    @property
    def tls_client_ca(self) -> str: ...


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted
    # key, which hangs a daemon; refuse instead.
    raise ValueError("the key is encrypted; give an unencrypted key readable only by the daemon")


def _server_ssl_context(c: ServerConfig) -> ssl.SSLContext | None:
    """Build the context; raises ValueError naming the key at fault."""
    if not c.tls_cert:
        return None
    # PROTOCOL_TLS_SERVER rather than create_default_context(CLIENT_AUTH): the
    # latter also trusts the system CAs for client certificates, so with
    # tls_client_ca any publicly issued certificate would be let in.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(c, key)
        try:
            # Opening is the only honest test: permissions, ACLs, a directory,
            # a dangling link all show up here rather than at the first client.
            with open(path, "rb") if path else contextlib.nullcontext():
                pass
        except OSError as e:
            raise ValueError(f"server.{key}: cannot read {path}: {e.strerror or e}") from None
    # OpenSSL's errors do not say which file is wrong; a look at the PEM
    # labels does, for the common mistakes (swapped files, DER, a CSR).
    if not _pem_has(c.tls_cert, "CERTIFICATE"):
        raise ValueError(f"server.tls_cert: {c.tls_cert} holds no PEM certificate")
    if not _pem_has(c.tls_key, "PRIVATE KEY"):
        raise ValueError(f"server.tls_key: {c.tls_key} holds no PEM private key")
    try:
        ctx.load_cert_chain(c.tls_cert, c.tls_key, password=_no_password)
    except ValueError as e:
        raise ValueError(f"server.tls_key: {e}") from None
    except (ssl.SSLError, OSError) as e:
        raise ValueError(
            f"server.tls_key: cannot use {c.tls_key} with the certificate in {c.tls_cert} "
            f"(not its private key?): {os_reason(e)}"
        ) from None
    if c.tls_client_ca:
        try:
            ctx.load_verify_locations(cafile=c.tls_client_ca)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(
                f"server.tls_client_ca: cannot load {c.tls_client_ca} "
                f"(PEM CA certificates expected): {os_reason(e)}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def certificate_expiry(path: str) -> float | None:
    """The earliest ``notAfter`` (Unix time) of the PEM certificates in ``path`` (the
    server's and its intermediates); None if there are none or it cannot be read."""
    from cryptography import x509

    try:
        with open(path, "rb") as f:
            certificates = x509.load_pem_x509_certificates(f.read())
    except (OSError, ValueError):
        return None  # `serve` refuses such a file before anyone asks
    return min(c.not_valid_after_utc.timestamp() for c in certificates)


def _pem_has(path: str, label: str) -> bool:
    """Whether the file has a PEM block whose label ends with ``label``."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    return re.search(rb"-----BEGIN [A-Z0-9 ]*" + label.encode() + rb"-----", text) is not None


def _tls_context(
    c: ServerConfig, check_files: bool = True
) -> tuple[ssl.SSLContext | None, list[str]]:
    """The server's TLS context, or the errors (naming the keys) that prevent it.

    Without ``check_files`` only the keys' combination is checked (and no
    context is built).
    """
    if bool(c.tls_cert) != bool(c.tls_key):
        given, missing = ("tls_cert", "tls_key") if c.tls_cert else ("tls_key", "tls_cert")
        return None, [f"server.{missing}: required when server.{given} is set (TLS needs both)"]
    if c.tls_client_ca and not c.tls_cert:
        return None, ["server.tls_client_ca: requires server.tls_cert and server.tls_key (TLS)"]
    if not check_files:
        return None, []
    try:
        return _server_ssl_context(c), []
    except ValueError as e:
        return None, [str(e)]
