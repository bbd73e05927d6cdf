"""Who may talk to the embedded server: its S3 identity, JWT keys, gRPC TLS, environment.

docs/SECURITY.md, "The embedded S3 server": the S3 API takes one identity
whose keys are generated at the first start and kept in
``s3-identities.json`` (0600, SeaweedFS's ``-s3.config`` format); other
credentials get 403. The master's and the filer's HTTP APIs are off
(``-disableHttp``: the gateway reaches them over gRPC only); the volume
server's HTTP API wants a JWT for every read, write and delete of a needle
(``security.toml``'s ``[jwt.signing]`` and ``[jwt.signing.read]``); every gRPC
port wants a client certificate from a CA made for this run (mutual TLS,
``[grpc.*]``). The JWT keys and the certificates are made anew at every
start of ``weed`` (nothing to expire or rotate) and live only in the data
directory, which is made 0700.

SeaweedFS creates an admin identity from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` and lets ``WEED_*`` variables override
``security.toml``; the child gets an environment without any of them
(`child_environment`).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import secrets
import string

from gateway.embedded.errors import EmbeddedS3Error
from gateway.embedded.files import write_atomically
from gateway.embedded.ports import HOST

__all__ = [
    "IDENTITIES_FILE",
    "IDENTITY_NAME",
    "SECURITY_FILE",
    "TLS_DIR",
    "child_environment",
    "load_or_create_identity",
    "write_security_config",
]

log = logging.getLogger(__name__)

#: The S3 identity (SeaweedFS's ``-s3.config`` format), made once, kept 0600.
IDENTITIES_FILE = "s3-identities.json"
#: The identity the daemon uses, in `IDENTITIES_FILE`.
IDENTITY_NAME = "segment-gateway"
#: JWT keys and gRPC TLS paths, rewritten at every start; weed reads it from its cwd.
SECURITY_FILE = "security.toml"
#: The gRPC CA, certificate and key of the current run.
TLS_DIR = "tls"
#: Environment variables the child does not inherit (see the module docstring).
_SCRUBBED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY",
    "AWS_SECRET_KEY",
    "AWS_SESSION_TOKEN",
)
#: Prefix of the variables SeaweedFS reads its configuration from; none is inherited.
_SCRUBBED_ENV_PREFIX = "WEED_"
#: The gRPC servers (and clients) of ``weed server`` that get the run's certificate.
_GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "client")


def child_environment() -> dict[str, str]:
    """This process's environment without the variables SeaweedFS would take keys from."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUBBED_ENV and not k.startswith(_SCRUBBED_ENV_PREFIX)
    }


def _new_identity() -> dict[str, object]:
    """A fresh identity with every S3 right, in SeaweedFS's ``-s3.config`` format."""
    alphabet = string.ascii_uppercase + string.digits
    return {
        "name": IDENTITY_NAME,
        # AWS's shapes: 20 characters, 40 characters (160 and 240 bits of entropy).
        "credentials": [
            {
                "accessKey": "SG" + "".join(secrets.choice(alphabet) for _ in range(18)),
                "secretKey": secrets.token_urlsafe(30),
            }
        ],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }


def load_or_create_identity(data_dir: pathlib.Path) -> tuple[str, str]:
    """The access and secret key of the daemon's S3 identity, made at the first call.

    Kept in ``<data_dir>/s3-identities.json`` (0600; a looser mode is
    tightened with a warning). A file that exists but cannot be used is an
    `EmbeddedS3Error` naming it: it is never replaced, since the identity it
    holds may be the one other tools were given.
    """
    path = data_dir / IDENTITIES_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        new = _new_identity()
        # "identities": who may use the S3 API; "credentials": their key pairs;
        # "actions": what they may do (Admin: create buckets).
        write_atomically(path, json.dumps({"identities": [new]}, indent=2) + "\n", 0o600)
        log.info("embedded S3: generated its access key, in %s", path)
        text = path.read_text()
    except OSError as e:
        raise EmbeddedS3Error(f"cannot read {path}: {e.strerror}") from e
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("%s was readable by others (mode %o); making it 0600", path, mode)
        path.chmod(0o600)
    try:
        config = json.loads(text)
        identity = next(i for i in config["identities"] if i.get("name") == IDENTITY_NAME)
        credential = identity["credentials"][0]
        access_key, secret_key = str(credential["accessKey"]), str(credential["secretKey"])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, StopIteration) as e:
        raise EmbeddedS3Error(
            f"cannot use {path}: no identity {IDENTITY_NAME!r} with an accessKey and a "
            f"secretKey ({type(e).__name__}: {e}); repair it, or move it away to have "
            "a new key pair made"
        ) from None
    if not access_key or not secret_key:
        raise EmbeddedS3Error(f"cannot use {path}: identity {IDENTITY_NAME!r} has an empty key")
    return access_key, secret_key


def _toml_string(value: str) -> str:
    # A JSON string (ASCII, escaped) is a valid TOML basic string.
    return json.dumps(value)


def write_security_config(data_dir: pathlib.Path) -> None:
    """Fresh JWT keys and gRPC certificates, and the ``security.toml`` naming them.

    Called before every start of ``weed``: it reads ``./security.toml``
    first (its working directory is ``data_dir``). Keys and the private key
    are 0600 in a 0700 directory.
    """
    import datetime
    import ipaddress

    # Imported here: only the embedded server needs it, and it takes a while.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    data_dir = data_dir.absolute()
    tls = data_dir / TLS_DIR
    tls.mkdir(mode=0o700, exist_ok=True)
    tls.chmod(0o700)
    now = datetime.datetime.now(datetime.UTC)
    # Valid for long: the files are replaced at every start, never renewed in place.
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=36500)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "segment-gateway embedded S3")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    # One certificate for every component, as server and as client: SeaweedFS
    # checks the chain only, not the name (security.toml's own comments).
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "weed")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_path, cert_path, key_path = tls / "ca.pem", tls / "weed.pem", tls / "weed.key"
    write_atomically(ca_path, ca.public_bytes(pem).decode())
    write_atomically(cert_path, cert.public_bytes(pem).decode())
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    write_atomically(key_path, key_pem, 0o600)

    lines = [
        "# Written by segment-gateway before every start of its embedded SeaweedFS;",
        "# changes are lost. See docs/SECURITY.md.",
        "",
        "# The volume server takes writes and deletes only with a JWT signed with",
        "# this key (the master hands one out with every file id it assigns)...",
        "[jwt.signing]",
        f"key = {_toml_string(secrets.token_urlsafe(32))}",
        "expires_after_seconds = 10",
        "",
        "# ...and reads only with one signed with this key (the filer and S3 gateway sign them).",
        "[jwt.signing.read]",
        f"key = {_toml_string(secrets.token_urlsafe(32))}",
        "expires_after_seconds = 60",
        "",
        "# The filer's HTTP API is off (-disableHttp); should it be on, it wants JWTs too.",
        "[jwt.filer_signing]",
        f"key = {_toml_string(secrets.token_urlsafe(32))}",
        "",
        "[jwt.filer_signing.read]",
        f"key = {_toml_string(secrets.token_urlsafe(32))}",
        "",
        "# No volume server UI; no directory listings from the filer.",
        "[access]",
        "ui = false",
        "",
        "[filer.expose_directory_metadata]",
        "enabled = false",
        "",
        "# Mutual TLS on every gRPC port: only holders of a certificate from this",
        "# run's CA (the components themselves, and `weed shell` run from this",
        "# directory) get an answer.",
        "[grpc]",
        f"ca = {_toml_string(str(ca_path))}",
    ]
    for component in _GRPC_COMPONENTS:
        lines += [
            "",
            f"[grpc.{component}]",
            f"cert = {_toml_string(str(cert_path))}",
            f"key = {_toml_string(str(key_path))}",
        ]
    write_atomically(data_dir / SECURITY_FILE, "\n".join(lines) + "\n", 0o600)
