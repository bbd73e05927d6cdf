"""What a peer can take from a real daemon: memory and file descriptors (docs/SECURITY.md).

Each attack runs at the scale the hardening issue measured it at, against a
`segment-gateway serve` process, and the daemon's resident memory is read
from /proc/PID/status before and during the attack: its growth must stay
under the configured ``server.max_memory`` plus a fixed allowance for what
the budget does not count (per-connection buffers and Python objects,
allocator slack).
"""

from __future__ import annotations

import errno
import logging
import pathlib
import resource
import selectors
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
import trio.testing

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.protocol import wire_pb2 as wire
from gateway.server import MemoryBudget

from .helpers.daemon import Daemon
from .helpers.inprocess import Served, served
from .helpers.peers import HELLO, frame, rss
from .helpers.segments import make_config

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

MiB = 1024 * 1024
#: server.max_memory in these tests.
MAX_MEMORY = 64 * MiB
#: What the memory budget does not count: receive buffers and Python objects
#: of each connection, transient copies, allocator slack.
ALLOWANCE = 48 * MiB


class Peak:
    """The largest RSS growth of a process seen by `poll` since `start`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = rss(pid)
        self.peak = self.base

    def poll(self) -> None:
        self.peak = max(self.peak, rss(self.pid))

    @property
    def growth(self) -> int:
        return self.peak - self.base


def receive(sock: socket.socket) -> wire.Response | None:
    """One response (None at EOF or on a reset)."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    body = _exactly(sock, n)
    return None if body is None else wire.Response.FromString(body)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def greeted(daemon: Daemon, read_answer: bool = True) -> socket.socket:
    """A connection that has said Hello (and, by default, read the answer)."""
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
    sock.sendall(HELLO)
    if read_answer:
        answer = receive(sock)
        assert answer is not None and answer.WhichOneof("kind") == "hello", answer
    return sock


def send_for(socks: list[socket.socket], data: bytes, seconds: float, peak: Peak) -> list[int]:
    """Send ``data`` (repeated) on every socket without ever reading, for ``seconds``.

    Returns how many bytes went out on each socket.
    """
    sent = [0] * len(socks)
    for s in socks:
        s.setblocking(False)
    view = memoryview(data * max(1, (256 * 1024) // len(data)))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        progress = False
        for i, s in enumerate(socks):
            try:
                n = s.send(view[sent[i] % len(data) :])
            except BlockingIOError:
                continue
            sent[i] += n
            progress = progress or n > 0
        peak.poll()
        if not progress:
            time.sleep(0.01)  # every socket is full: the server stopped reading
    return sent


@contextmanager
def closing(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


LIMITS = f"""
[server]
max_memory = {MAX_MEMORY}
"""


@pytest.fixture
def daemon(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    extra = getattr(request, "param", "")
    d = Daemon(tmp_path / "node", LIMITS + extra)
    d.start()
    yield d
    assert d.stop() == 0, d.log()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("daemon", ['max_inflight_bytes = "16 MiB"\n'], indirect=True)
def test_unread_read_answers_take_bounded_memory(daemon: Daemon) -> None:
    """Issue item 5: pipelined Reads whose answers are never read (+392 MiB in 4 s before)."""
    data = bytes(range(256)) * 4096  # 1 MiB
    with SyncClient(daemon.address) as c:
        c.create("r")
        c.append("r", data)
        assert c.read("r", 0, MiB).data == data
    read = frame(
        wire.Request(request_id=7, read=wire.ReadRequest(segment="r", offset=0, max_length=MiB))
    )
    peak = Peak(daemon.proc.pid)  # type: ignore[union-attr]
    with closing([greeted(daemon) for _ in range(3)]) as attackers:
        sent = send_for(attackers, read, 4.0, peak)
        # An honest client is served meanwhile: the attackers hold their own
        # connections' budgets (3 x 16 MiB), not the whole server's.
        with SyncClient(daemon.address) as c:
            assert c.append("r", b"honest").offset == MiB
            assert c.read("r", MiB, 100).data == b"honest"
        peak.poll()
    assert min(sent) > 0
    assert peak.growth < MAX_MEMORY + ALLOWANCE, (peak.growth / MiB, sent)


@pytest.mark.timeout(180)
def test_pipelined_lists_take_bounded_memory(daemon: Daemon) -> None:
    """Issue item 6: 3,200 bytes of List requests with 10,000 segments (+523 MiB before)."""
    names = [f"many/{i:05d}" for i in range(10_000)]
    with closing([greeted(daemon)]) as (s,):
        for start in range(0, len(names), 1000):
            batch = names[start : start + 1000]
            s.sendall(
                b"".join(
                    frame(wire.Request(request_id=10 + i, create=wire.CreateSegmentRequest(
                        segment=name)))
                    for i, name in enumerate(batch)
                )
            )  # fmt: skip
            for _ in batch:
                r = receive(s)
                assert r is not None and r.WhichOneof("kind") == "info", r
    lists = b"".join(
        frame(wire.Request(request_id=i, list=wire.ListSegmentsRequest())) for i in range(1, 321)
    )
    assert len(lists) <= 3200
    peak = Peak(daemon.proc.pid)  # type: ignore[union-attr]
    with closing([greeted(daemon)]) as (attacker,):
        attacker.sendall(lists)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            # Sampling the memory over the whole window is the subject, not a wait.
            peak.poll()
            time.sleep(0.02)
        # The answers are right, for whoever reads them.
        with SyncClient(daemon.address) as c:
            assert [i.name for i in c.list("many/")] == names
        peak.poll()
    assert peak.growth < MAX_MEMORY + ALLOWANCE, peak.growth / MiB


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "daemon", ['memory_timeout = "1s"\nmessage_timeout = "6s"\n'], indirect=True
)
def test_stalled_large_messages_take_bounded_memory(daemon: Daemon) -> None:
    """Issue item 7: 40 connections stalled one byte short of a 9 MiB message (+369 MiB)."""
    length = 9 * MiB  # server.max_message_bytes
    stalled = struct.pack(">I", length) + bytes(length - 1)
    peak = Peak(daemon.proc.pid)  # type: ignore[union-attr]
    with closing([greeted(daemon) for _ in range(40)]) as attackers:
        for s in attackers:
            s.setblocking(False)
        sent = [0] * len(attackers)
        refused = [False] * len(attackers)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            for i, s in enumerate(attackers):
                if sent[i] == len(stalled) or refused[i]:
                    continue
                try:
                    sent[i] += s.send(stalled[sent[i] : sent[i] + 1024 * 1024])
                except BlockingIOError:
                    pass
                except OSError as e:  # the server refused this one and closed
                    assert e.errno in (errno.ECONNRESET, errno.EPIPE), e
                    refused[i] = True
            peak.poll()
            time.sleep(0.005)  # a sampling step of the window, not a wait
        assert peak.growth < MAX_MEMORY + ALLOWANCE, peak.growth / MiB
        # Whoever the budget refused was told why (OVERLOADED) and closed;
        # the rest are closed when server.message_timeout passes.
        answers = []
        for s in attackers:
            s.setblocking(True)
            s.settimeout(15)
            answers.append(receive(s))
            peak.poll()
        codes = [a.error.code if a is not None else None for a in answers]
        assert codes.count(wire.OVERLOADED) >= 40 - MAX_MEMORY // length, codes
        assert codes.count(wire.MALFORMED) >= 1, codes  # server.message_timeout
        assert set(codes) <= {wire.OVERLOADED, wire.MALFORMED, None}, codes
    assert peak.growth < MAX_MEMORY + ALLOWANCE, peak.growth / MiB
    # The budget is whole again: a large append goes through.
    with SyncClient(daemon.address) as c:
        c.create("after")
        assert c.append("after", bytes(8 * MiB)).length == 8 * MiB


def _lower_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


FD_LIMIT = 256
ROLLING_JOURNAL = """
[journal]
file_size = "1 MiB"
preallocate_step = "256 KiB"
max_operation_bytes = "1 MiB"
[container]
max_append_bytes = "512 KiB"
"""


@pytest.mark.timeout(120)
def test_idle_connections_cannot_take_the_daemons_file_descriptors(
    tmp_path: pathlib.Path,
) -> None:
    """Issue item 3: idle connections past the fd limit made the journal fail (EMFILE)."""
    d = Daemon(tmp_path / "node", ROLLING_JOURNAL, preexec_fn=_lower_fd_limit)
    d.start()
    journal = d.data_dir / "journal"
    try:
        with SyncClient(d.address) as c:
            c.create("fd/s")
            files_before = set(journal.glob("*.wal"))
            idle: list[socket.socket] = []
            with closing(idle):
                # Twice what the daemon could hold, on each port: those past
                # its limits are closed at once, holding no descriptor there.
                for _ in range(2 * FD_LIMIT):
                    idle.append(greeted(d, read_answer=False))
                for _ in range(2 * FD_LIMIT):
                    idle.append(socket.create_connection(("127.0.0.1", d.metrics_port), 10))
                # Appends roll the journal to new files (1 MiB each) meanwhile.
                piece = b"x" * (512 * 1024)
                for i in range(8):
                    assert c.append("fd/s", piece).offset == i * len(piece)
                assert set(journal.glob("*.wal")) - files_before, "the journal rolled"
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10
                ) as r:
                    assert b"segment_gateway_appends_total 8.0" in r.read()
                assert closed_by_server(idle, want=2 * FD_LIMIT, timeout=10) >= 2 * FD_LIMIT
            assert c.read("fd/s", 0, 8 * len(piece)).data == piece * 8
    finally:
        code = d.stop()
    log = d.log_path.read_text()
    assert code == 0, log
    assert "EMFILE" not in log and "Too many open files" not in log, log
    assert any(
        "file descriptors" in line and f"limit {FD_LIMIT}" in line for line in log.splitlines()
    ), log
    refusals = [line for line in log.splitlines() if "refusing connections" in line]
    assert 1 <= len(refusals) <= 3, refusals


def _soft_limit_below_hard() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, 4 * FD_LIMIT))


@pytest.mark.timeout(60)
def test_soft_fd_limit_is_raised_to_the_hard_one(tmp_path: pathlib.Path) -> None:
    d = Daemon(tmp_path / "node", preexec_fn=_soft_limit_below_hard)
    d.start()
    try:
        limits = pathlib.Path(f"/proc/{d.proc.pid}/limits").read_text()  # type: ignore[union-attr]
        (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
        assert line.split()[3:5] == [str(4 * FD_LIMIT)] * 2, line
        with SyncClient(d.address) as c:
            c.create("raised")
    finally:
        assert d.stop() == 0, d.log()
    log = d.log_path.read_text()
    assert f"file descriptors: limit {4 * FD_LIMIT}, raised from {FD_LIMIT}" in log, log
    # The connection bound follows the raised limit, not the one the daemon was given.
    (bound,) = [x for x in log.splitlines() if "connections: at most" in x]
    assert int(bound.split("at most ")[1].split()[0]) > FD_LIMIT, bound


def closed_by_server(socks: list[socket.socket], want: int, timeout: float) -> int:
    """How many of ``socks`` the server closed (waiting until ``want`` are, or ``timeout``)."""
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        closed = 0
        deadline = time.monotonic() + timeout
        while closed < want and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.1):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    if s.recv(65536):
                        continue  # what it said before closing (or a Hello answer)
                except ConnectionResetError:
                    pass
                sel.unregister(s)
                closed += 1
        return closed


# -- in-process: the budget, and the deadlines that give memory back -------------


async def test_memory_budget_serves_waiters_in_order() -> None:
    budget = MemoryBudget(100)
    await budget.acquire(60)
    order: list[str] = []

    async def take(name: str, n: int) -> None:
        await budget.acquire(n)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "big", 80)
        await trio.testing.wait_all_tasks_blocked()
        # 30 would fit now, but "big" came first: it does not jump the queue.
        nursery.start_soon(take, "small", 30)
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and budget.used == 60
        budget.release(60)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["big"] and budget.used == 80
        budget.release(80)
    assert order == ["big", "small"] and budget.used == 30
    budget.release(30)
    # Alone, one request may exceed the limit (else it could never be served).
    await budget.acquire(500)
    assert budget.used == 500
    budget.release(500)


async def test_memory_budget_waits_are_bounded_and_cancellable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budget = MemoryBudget(100)
    await budget.acquire(90)
    assert not await budget.acquire_within(20, 5.0)
    assert budget.used == 90 and budget.statistics()["refusals"] == 1
    with trio.move_on_after(1):
        await budget.acquire(20)
    assert budget.used == 90 and budget.statistics()["waiting"] == 0
    budget.release(90)
    assert budget.used == 0


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def _wait_no_connections(s: Served) -> None:
    with trio.fail_after(10):
        await s.server.wait_connections_closed()


async def test_peer_that_stops_reading_is_disconnected(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.server")
    config = make_config(tmp_path, server={"send_timeout": 0.5})
    async with served(config) as s:
        async with open_client(s.address) as c:
            await c.create("r")
            await c.append("r", bytes(512 * 1024))
        host, port = s.address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        read = frame(wire.Request(request_id=2, read=wire.ReadRequest(segment="r", max_length=MiB)))
        await stream.send_all(HELLO + read * 64)  # and never read an answer
        await _wait_no_connections(s)
        assert s.server.memory.peak >= 16 * MiB, "the queued reads were charged"
        assert s.server.memory.used == 0, "and their memory given back"
        await stream.aclose()
    assert any("server.send_timeout" in r.getMessage() for r in caplog.records)


async def test_message_that_trickles_in_is_refused(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, server={"message_timeout": 0.5})
    async with served(config) as s:
        host, port = s.address.rsplit(":", 1)
        for length in (100, 200 * 1024):  # from the buffer, and into its own buffer
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(HELLO + struct.pack(">I", length) + b"\x08\x01")
            data = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some(65536):
                    data += chunk
            await stream.aclose()
            (n,) = struct.unpack(">I", data[:4])
            hello_answer = 4 + n
            (n,) = struct.unpack(">I", data[hello_answer : hello_answer + 4])
            error = wire.Response.FromString(data[hello_answer + 4 : hello_answer + 4 + n]).error
            assert error.code == wire.MALFORMED and "did not arrive within 0.5s" in error.message
        await _wait_no_connections(s)
        assert s.server.memory.used == 0
        async with open_client(s.address) as c:
            await c.create("still-serving")
