"""TLS for the client: the context that verifies the server, and why a handshake failed.

A failure becomes one line with a hint at its usual cause (`describe_tls_failure`),
carried by `ConnectionLost`, so a user sees "is the CA file the one that signed
the server's certificate?" rather than an OpenSSL reason code alone.
"""

from __future__ import annotations

import ssl

import trio

from gateway.errors import ConfigError, ConnectionLost, os_reason
from gateway.protocol.framing import close_now


def client_ssl_context(
    ca_file: str | None = None, *, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A TLS context that verifies the server: against ``ca_file`` only, or the system CAs.

    ``cert_file``/``key_file`` (PEM) present a client certificate, for a
    daemon with ``server.tls_client_ca``. Unreadable or malformed files raise
    ConfigError naming the file.
    """
    errors: list[str] = []
    ctx: ssl.SSLContext | None = None
    try:
        # With a cafile, create_default_context trusts that file alone.
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        errors.append(f"tls_ca {ca_file}: cannot load CA certificates: {os_reason(e)}")
    if ctx is not None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert_file or key_file:
            try:
                ctx.load_cert_chain(cert_file or key_file or "", key_file)
            except (OSError, ssl.SSLError) as e:
                errors.append(f"tls_cert {cert_file} / tls_key {key_file}: {os_reason(e)}")
    if errors or ctx is None:
        raise ConfigError("the client's TLS settings", errors)
    return ctx


#: OpenSSL reasons and what usually causes them.
_TLS_HINTS = (
    (("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE", "UNKNOWN_CA"),
     "the server refused us: does it want a client certificate it trusts?"),
    (("WRONG_VERSION_NUMBER", "RECORD_LAYER", "PACKET_LENGTH_TOO_LONG"),
     "does the server use TLS on this port?"),
    (("EOF",), "the server hung up: does it want a client certificate it trusts?"),
)  # fmt: skip


def describe_tls_failure(e: BaseException, server_hostname: str = "") -> str:
    """One line saying why a TLS connection failed, with a hint at the usual cause.

    trio raises BrokenResourceError with the ssl error as its cause.
    """
    cause = e if isinstance(e, ssl.SSLError) else (e.__cause__ or e.__context__)
    if isinstance(cause, ssl.SSLCertVerificationError):
        what = cause.verify_message or os_reason(cause)
        if "mismatch" in what.lower():
            return (
                f"the server's certificate is not valid for {server_hostname!r}: {what} "
                "(connect by a name the certificate lists, or set the server name to check)"
            )
        return (
            f"the server's certificate is not trusted: {what} (is the CA file the one "
            "that signed the server's certificate?)"
        )
    if isinstance(cause, ssl.SSLError):
        reason = os_reason(cause)
        for marks, hint in _TLS_HINTS:
            if any(m in reason.upper() for m in marks):
                return f"TLS failed: {reason} ({hint})"
        return f"TLS failed: {reason}"
    return str(e) or type(e).__name__


async def start_tls(
    tcp: trio.SocketStream, address: str, ssl_context: ssl.SSLContext, server_hostname: str
) -> trio.SSLStream[trio.SocketStream]:
    """TLS over ``tcp``, handshake done; ConnectionLost saying why if it fails."""
    tls = trio.SSLStream(tcp, ssl_context, server_hostname=server_hostname)
    try:
        # Explicitly, so that a certificate problem is reported as such
        # rather than as a broken first request.
        await tls.do_handshake()
    except trio.BrokenResourceError as e:
        close_now(tcp)
        raise ConnectionLost(address, describe_tls_failure(e, server_hostname)) from None
    except BaseException:
        close_now(tcp)
        raise
    return tls
