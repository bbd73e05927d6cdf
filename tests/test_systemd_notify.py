"""The daemon under a fake systemd: the notify socket, the watchdog, reload, stop.

A datagram socket stands in for systemd's ``NOTIFY_SOCKET``; a thread
records every message with the time it came and whether the mount was up
then. The daemon is the real one, mounted, with Tier 2 on the filesystem.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gateway.client.sync import SyncClient
from gateway.notify import Notifier
from tests.helpers.mount import MountedDaemon, mount_entry, require_fuse
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024


@dataclass
class FakeSystemd:
    """Receives notify messages on a socket, like systemd does."""

    path: pathlib.Path
    mnt: pathlib.Path | None = None
    messages: list[tuple[float, str, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            mounted = self.mnt is not None and mount_entry(self.mnt) is not None
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line, mounted))

    def lines(self, prefix: str) -> list[tuple[float, str, bool]]:
        return [m for m in list(self.messages) if m[1].startswith(prefix)]

    def wait_for(self, prefix: str, seconds: float, after: int = 0) -> tuple[float, str, bool]:
        """The first message starting with ``prefix`` among messages[after:]."""

        def first() -> tuple[float, str, bool] | None:
            return next((m for m in list(self.messages)[after:] if m[1].startswith(prefix)), None)

        try:
            found = wait_for(first, seconds, f"a {prefix!r} message")
        except AssertionError as e:
            raise AssertionError(f"{e}; the last messages: {self.messages[-20:]}") from None
        assert found is not None
        return found

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def systemd(tmp_path: pathlib.Path) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(tmp_path / "notify.sock", tmp_path / "mnt")
    yield fake
    fake.close()


CONFIG = """
[tier2]
url = "file://{root}/tier2"
flush_interval = "{interval}"
"""


def start(tmp_path: pathlib.Path, systemd: FakeSystemd, **env: str) -> MountedDaemon:
    require_fuse()
    daemon = MountedDaemon(
        tmp_path / "node",
        tmp_path / "mnt",
        config_text=CONFIG.format(root=tmp_path, interval="1h"),
        env={"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "400000", **env},
    )
    daemon.start(timeout=60)
    return daemon


@pytest.mark.timeout(120)
def test_ready_watchdog_status_and_clean_stop(tmp_path: pathlib.Path, systemd: FakeSystemd) -> None:
    daemon = start(tmp_path, systemd)
    try:
        _, _, mounted = systemd.wait_for("READY=1", 10)
        assert mounted, "READY=1 came before the mount was up"
        status = systemd.wait_for("STATUS=", 5)[1]
        assert "segments" in status and "journal" in status
        with SyncClient(daemon.address) as c:
            c.create("n/s")
            c.append("n/s", b"x" * 300 * KiB)
        # WATCHDOG_USEC = 0.4 s: a ping every 0.2 s, so never 0.4 s without
        # one, and not a flood either (the pings are paced, not spun).
        first = systemd.wait_for("WATCHDOG=1", 5)[0]
        wait_for(lambda: len(systemd.lines("WATCHDOG=1")) >= 10, 30, "10 pings")
        pings = [t for t, line, _ in systemd.lines("WATCHDOG=1")]
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert max(gaps) < 0.4, f"a gap of {max(gaps):.2f} s between pings"
        assert pings[9] - first >= 9 * 0.1, "pings came faster than half the interval"

        assert daemon.proc is not None
        before = len(systemd.messages)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(60) == 0, daemon.log()
        systemd.wait_for("STOPPING=1", 1, after=before)
        assert mount_entry(daemon.mnt) is None, "the mount outlived the daemon"
    finally:
        daemon.teardown()
    # The stop flushed everything to Tier 2 (flush_interval is an hour).
    plain = MountedDaemon(tmp_path / "node", tmp_path / "mnt")
    plain.start(timeout=60)
    try:
        with SyncClient(plain.address) as c:
            info = c.info("n/s")
            assert info.storage_length == info.length == 300 * KiB
    finally:
        plain.teardown()


@pytest.mark.timeout(120)
def test_a_stuck_event_loop_stops_the_watchdog(
    tmp_path: pathlib.Path, systemd: FakeSystemd
) -> None:
    daemon = start(tmp_path, systemd, SEGMENT_GATEWAY_FAILPOINTS="watchdog_ping_5=stall")
    try:
        systemd.wait_for("READY=1", 10)
        wait_for(lambda: len(systemd.lines("WATCHDOG=1")) >= 5, 30, "5 pings")
        # The loop stalls after the fifth ping. Nothing can signal "no ping
        # came": watch for three watchdog periods (WATCHDOG_USEC = 0.4 s).
        time.sleep(1.2)
        pings = systemd.lines("WATCHDOG=1")
        assert len(pings) == 5, f"{len(pings)} pings"
        assert time.monotonic() - pings[-1][0] > 1.2, "pings went on with the loop stuck"
        assert daemon.alive()  # alive but stuck: what systemd's watchdog is for
    finally:
        daemon.teardown()


@pytest.mark.timeout(120)
@pytest.mark.expect_errors("reload: keeping the running configuration")
def test_sighup_reloads_the_flush_interval_without_dropping_connections(
    tmp_path: pathlib.Path, systemd: FakeSystemd
) -> None:
    daemon = start(tmp_path, systemd)
    try:
        systemd.wait_for("READY=1", 10)
        with SyncClient(daemon.address) as c:
            c.create("h/s")
            c.append("h/s", b"y" * 100 * KiB)
            # Time passing is the subject: nothing is flushed before the reload.
            time.sleep(1.5)
            assert c.info("h/s").storage_length == 0  # flush_interval is an hour
            daemon.config_path.write_text(CONFIG.format(root=tmp_path, interval="200ms"))
            before = len(systemd.messages)
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGHUP)
            reloading = systemd.wait_for("RELOADING=1", 5, after=before)
            ready = systemd.wait_for("READY=1", 5, after=before)
            assert ready[0] >= reloading[0]
            wait_for(
                lambda: c.info("h/s").storage_length >= 100 * KiB,
                5,
                "the new flush interval applied",
            )
            # The same connection still works, and so does the mount.
            c.append("h/s", b"z")
            assert (daemon.mnt / "h/s").read_bytes()[:3] == b"yyy"
        assert "reloaded: tier2.flush_interval" in daemon.log()

        # A broken file is refused; the daemon keeps running on the old one.
        daemon.config_path.write_text("[tier2]\nflush_interval = 'soon'\n")
        before = len(systemd.messages)
        daemon.proc.send_signal(signal.SIGHUP)
        systemd.wait_for("READY=1", 5, after=before)
        assert "keeping the running configuration" in daemon.log()
        assert daemon.alive()
    finally:
        daemon.teardown()


def test_notifier_outside_systemd_does_nothing() -> None:
    n = Notifier({})
    assert not n.enabled and n.watchdog_interval is None
    assert not n.ready("x") and not n.watchdog()


def test_notifier_abstract_socket_and_watchdog_pid() -> None:
    name = f"sg-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "3000000"})
        assert n.enabled and n.watchdog_interval == 1.5
        assert n.ready("up")
        assert sock.recv(100) == b"READY=1\nSTATUS=up"
        n.close()
    finally:
        sock.close()
    # A watchdog meant for another process is not ours to feed.
    other = Notifier({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None
