"""A real daemon with its FUSE mount, for tests that must never hang the suite.

pyfuse3's own tests show the shape: skip without /dev/fuse, wait for the
mount with a deadline while checking the process lives, and in teardown
whatever happened: stop the daemon, abort its FUSE connection through
``/sys/fs/fuse/connections/N/abort`` if the mount is still there (a hung or
dead daemon's mount makes every access wait or fail), unmount lazily, kill.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator

import pytest

from tests.helpers.daemon import Daemon
from tests.helpers.wait import wait_for


def require_fuse() -> None:
    """Skip the test where FUSE cannot be mounted."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    if os.geteuid() != 0:
        pytest.skip("mounting needs root here")


def mount_entry(path: pathlib.Path) -> tuple[str, str, str] | None:
    """(major:minor, type, mount options) of the mount at ``path``, or None."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[4] == str(path):
                found = (fields[2], fields[sep + 1], f"{fields[5]},{fields[sep + 3]}")
    return found


def force_unmount(path: pathlib.Path) -> None:
    """Abort the FUSE connection of the mount at ``path`` (if any) and detach it."""
    for _ in range(8):  # mounts may be stacked
        entry = mount_entry(path)
        if entry is None:
            return
        minor = entry[0].partition(":")[2]
        with contextlib.suppress(OSError):
            pathlib.Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


class MountedDaemon(Daemon):
    """A `Daemon` that mounts at ``mountpoint`` and is ready once the mount is."""

    def __init__(self, data_dir: pathlib.Path, mountpoint: pathlib.Path, **kwargs: object) -> None:
        super().__init__(data_dir, mountpoint=mountpoint, **kwargs)  # type: ignore[arg-type]
        self.mnt = mountpoint

    def start(self, timeout: float = 30.0, serve_args: tuple[str, ...] = ()) -> None:
        """Start; ready means serving the protocol with the mount in place.

        ``serve_args`` as for `Daemon.start` (e.g. ``--recover-from-tier2``).
        """
        super().start(timeout, serve_args)

        def mounted() -> bool:
            if not self.alive():
                raise RuntimeError("the daemon died")
            return mount_entry(self.mnt) is not None

        try:
            wait_for(mounted, timeout, f"a mount at {self.mnt}", interval=0.01)
        except (AssertionError, RuntimeError):
            self.kill()
            raise RuntimeError(f"no mount at {self.mnt}:\n{self.log()}") from None

    def teardown(self) -> None:
        """Whatever state it is in: stopped, its mount gone, nothing left hanging."""
        try:
            if self.alive():
                self.stop(timeout=15)
        finally:
            self.kill()
            force_unmount(self.mnt)


def stop_all(daemons: Iterable[Daemon], timeout: float = 15.0) -> None:
    """Stop daemons together, whatever state each is in; unmount their mounts.

    ``timeout`` > 0: SIGTERM to all at once, then SIGKILL to those still up
    after ``timeout`` s in all (not per daemon, as stopping them in turn
    would). ``timeout`` = 0: SIGKILL at once (replicating nodes: each one
    stopping waits for peers that are stopping too; a test's end needs no
    graceful stop).
    """
    daemons = list(daemons)
    try:
        if timeout > 0:
            for d in daemons:
                if d.alive() and d.proc is not None:
                    d.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for d in daemons:
                if d.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        d.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for d in daemons:
            d.kill()
            if isinstance(d, MountedDaemon):
                force_unmount(d.mnt)


@contextlib.contextmanager
def mounted_daemon(
    tmp_path: pathlib.Path, config_text: str = "", env: dict[str, str] | None = None
) -> Iterator[MountedDaemon]:
    """A started `MountedDaemon` (data in tmp_path/node, mount at tmp_path/mnt)."""
    require_fuse()
    daemon = MountedDaemon(tmp_path / "node", tmp_path / "mnt", config_text=config_text, env=env)
    try:
        daemon.start(timeout=60)
        yield daemon
    finally:
        daemon.teardown()


def run(
    *args: str | pathlib.Path, timeout: float = 30, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """A command against the mount, in a subprocess with a timeout (never hangs the test)."""
    r = subprocess.run([str(a) for a in args], capture_output=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r
