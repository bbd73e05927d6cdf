"""Reading segments: read-your-write, future reads, the Read request, budget, restarts."""

from __future__ import annotations

import math
import os
import pathlib
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client.client import open_client
from gateway.client.sync import SyncClient
from gateway.config import Config
from gateway.errors import Overloaded, SegmentNotFound, SegmentTruncated
from gateway.node import open_node
from tests.helpers.container import DirectContainer

from .conftest import ROOT
from .helpers.daemon import Daemon
from .helpers.inprocess import served
from .helpers.segments import make_config

# -- read-your-write, with truncations and restarts (hypothesis) -------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 70_000)),
        st.tuples(st.just("read"), st.floats(0, 1), st.integers(1, 200_000)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


async def _run_ops(config: Config, script: list[tuple[Any, ...]], seed: int) -> None:
    rng = random.Random(seed)
    model = bytearray()
    start = 0
    node_cm = open_node(config, container_type=DirectContainer)
    c = (await node_cm.__aenter__()).container
    try:
        await c.create("s")
        for op in script:
            if op[0] == "append":
                data = rng.randbytes(op[1])
                r = await c.append("s", data)
                assert r.offset == len(model)
                model += data
                # Read-your-write: the bytes just acknowledged read back at once.
                got = await c.read("s", r.offset, len(data))
                assert got.data == data
            elif op[0] == "read":
                offset = int(op[1] * len(model))
                if offset < start:
                    with pytest.raises(SegmentTruncated):
                        await c.read("s", offset, op[2])
                    got = await c.read("s", offset, op[2], zeros_below_start=True)
                    expect = bytes(start - offset) + bytes(model[start : offset + op[2]])
                    assert got.data == expect[: op[2]]
                else:
                    got = await c.read("s", offset, op[2])
                    assert got.data == bytes(model[offset : offset + op[2]])
                assert got.length == len(model)
            elif op[0] == "truncate":
                new_start = max(start, int(op[1] * len(model)))
                await c.truncate("s", new_start)
                start = new_start
            else:
                await node_cm.__aexit__(None, None, None)
                node_cm = open_node(config, container_type=DirectContainer)
                c = (await node_cm.__aenter__()).container
        # Everything from the start offset on, in one read, after all of it.
        got = await c.read("s", start, len(model))
        assert got.data == bytes(model[start:])
    finally:
        await node_cm.__aexit__(None, None, None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=ops, seed=st.integers(0, 2**32))
def test_read_your_write(script: list[tuple[Any, ...]], seed: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        trio.run(_run_ops, make_config(pathlib.Path(d)), script, seed)


# -- future reads -------------------------------------------------------------------


async def test_tail_reader_wakes_on_append(tmp_path: pathlib.Path) -> None:
    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        await c.create("t")
        await c.append("t", b"head")
        for i in range(20):
            woke = trio.Event()
            offset = c.info("t").length

            async def reader(offset: int = offset, woke: trio.Event = woke) -> None:
                r = await c.read("t", offset, 100, wait=5.0)
                assert r.data == b"x%02d" % i
                woke.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await trio.testing.wait_all_tasks_blocked()  # the reader is waiting now
                assert not woke.is_set()
                await c.append("t", b"x%02d" % i)
                # Woken by the append itself, not by a timer: by the time
                # every task is idle again the reader has its bytes.
                await trio.testing.wait_all_tasks_blocked()
                assert woke.is_set(), "the tail reader did not wake on the append"


async def test_tail_wait_times_out_and_sees_seal_and_delete(
    tmp_path: pathlib.Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        await c.create("t")
        await c.append("t", b"abc")
        started = trio.current_time()
        r = await c.read("t", 3, 10, wait=0.1)
        assert r.data == b"" and trio.current_time() - started == pytest.approx(0.1)
        assert not r.end_of_segment
        r = await c.read("t", 3, 10)  # no wait: at once
        assert r.data == b""
        # From here on the clock stands still (the journal's fdatasyncs run in
        # threads, and a jump would time the waits below out): a reader
        # returns only because the seal or the delete woke it.
        autojump_clock.autojump_threshold = math.inf

        async def seal_later() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the reader is waiting now
            await c.seal("t")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(seal_later)
            r = await c.read("t", 3, 10, wait=5.0)
        assert r.data == b"" and r.end_of_segment

        await c.create("d")

        async def delete_later() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the reader is waiting now
            await c.delete("d")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(delete_later)
            with pytest.raises(SegmentNotFound):
                await c.read("d", 0, 10, wait=5.0)


# -- the Read request over the wire ---------------------------------------------------


async def test_read_request_streams_large_reads(tmp_path: pathlib.Path) -> None:
    data = random.Random(1).randbytes(5 * 1024 * 1024 + 123)
    async with served(make_config(tmp_path)) as s, open_client(s.address) as c:
        await c.create("big")
        for i in range(0, len(data), 500_000):
            await c.append("big", data[i : i + 500_000])
        pieces = [p async for p in c.read_pieces("big", 0, 64 << 20)]
        assert len(pieces) >= 5, "large reads come in pieces"
        assert all(len(p.data) <= 1 << 20 for p in pieces)
        assert b"".join(p.data for p in pieces) == data
        r = await c.read("big", 1000, 3)
        assert r.data == data[1000:1003] and r.length == len(data)
        await c.truncate("big", 4096)
        with pytest.raises(SegmentTruncated) as e:
            await c.read("big", 10, 10)
        assert e.value.expected_offset == 4096
        with pytest.raises(SegmentNotFound):
            await c.read("nope", 0, 10)
        # The connection is still fine after errors.
        assert (await c.read("big", 4096, 10)).data == data[4096:4106]


# -- budget -----------------------------------------------------------------------------


def _du(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def test_tiny_budget_turns_into_backpressure(tmp_path: pathlib.Path) -> None:
    config = make_config(
        tmp_path,
        cache={"budget": "8 MiB", "pinned_share": 0.5},
        container={"overload_timeout": 0.2},
    )
    acked: list[tuple[int, bytes]] = []
    async with open_node(config, container_type=DirectContainer) as node:
        c = node.container
        await c.create("s")
        overloaded = 0
        for i in range(40):
            data = random.Random(i).randbytes(300_000)
            try:
                r = await c.append("s", data)
            except Overloaded as e:
                assert "cache budget" in str(e)
                overloaded += 1
            else:
                acked.append((r.offset, data))
        assert overloaded > 0, "pinned data past its share must push back"
        assert sum(len(d) for _, d in acked) <= 4 * 1024 * 1024 + 300_000
        for off, d in acked:
            assert (await c.read("s", off, len(d))).data == d
        # Truncating frees room: appends go through again.
        await c.truncate("s", c.info("s").length)
        await c.append("s", b"room again")
    assert _du(config.cache_dir) < 8 * 1024 * 1024 * 1.5


# -- restart after SIGKILL ---------------------------------------------------------------


def test_unflushed_data_survives_sigkill(tmp_path: pathlib.Path) -> None:
    d = Daemon(tmp_path / "node")
    d.start()
    try:
        rng = random.Random(5)
        expected: dict[str, bytes] = {}
        with SyncClient(d.address) as c:
            for k in range(5):
                name = f"k/{k}"
                c.create(name)
                blob = b""
                for _ in range(20):
                    data = rng.randbytes(rng.randint(1, 40_000))
                    c.append(name, data)
                    blob += data
                expected[name] = blob
            c.truncate("k/0", 1000)
        d.kill()
        d.start()
        with SyncClient(d.address) as c:
            for name, blob in expected.items():
                start = c.info(name).start_offset
                assert c.read(name, start, len(blob)).data == blob[start:]
        assert d.stop() == 0, d.log()
    finally:
        d.kill()


# -- segment-gateway cat --------------------------------------------------------------


def test_cat_and_follow(tmp_path: pathlib.Path) -> None:
    d = Daemon(tmp_path / "node")
    d.start()
    try:
        with SyncClient(d.address) as c:
            c.create("c/log")
            c.append("c/log", b"one\ntwo\n")
        cat = [sys.executable, "-m", "gateway.cli", "cat", "--connect", d.address]
        r = subprocess.run([*cat, "c/log"], capture_output=True, timeout=60, cwd=ROOT)
        assert r.returncode == 0 and r.stdout == b"one\ntwo\n"
        r = subprocess.run([*cat, "c/log", "--offset", "4"], capture_output=True, timeout=60,
                           cwd=ROOT)  # fmt: skip
        assert r.stdout == b"two\n"
        follow = subprocess.Popen([*cat, "--follow", "c/log"], stdout=subprocess.PIPE, cwd=ROOT)
        assert follow.stdout is not None
        try:
            # What is there is printed first; then the follower waits at the tail.
            out = read_exactly(follow.stdout, len(b"one\ntwo\n"))
            with SyncClient(d.address) as c:
                c.append("c/log", b"three\n")
                # Seen while following (not only at the end): it comes before the next append.
                out += read_exactly(follow.stdout, len(b"three\n"))
                c.append("c/log", b"four\n")
                c.seal("c/log")
            rest, _ = follow.communicate(timeout=30)
            out += rest
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.communicate()
        assert follow.returncode == 0
        assert out == b"one\ntwo\nthree\nfour\n"
        assert d.stop() == 0, d.log()
    finally:
        d.kill()


def read_exactly(stream: IO[bytes], n: int, timeout: float = 30.0) -> bytes:
    """``n`` bytes from a child's pipe, failing after ``timeout`` seconds."""
    out = b""
    deadline = time.monotonic() + timeout
    while len(out) < n:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"only {out!r} within {timeout}s"
        chunk = os.read(stream.fileno(), n - len(out))
        assert chunk, f"the stream ended after {out!r}"
        out += chunk
    return out


def test_cat_missing_segment(tmp_path: pathlib.Path) -> None:
    d = Daemon(tmp_path / "node")
    d.start()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "cat", "--connect", d.address, "nope"],
            capture_output=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode == 10 and b"does not exist" in r.stderr
    finally:
        d.stop()


async def test_stalled_cache_writes_do_not_block_reads_or_the_loop(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        index = c.read_index
        real = index._apply_ops
        release = threading.Event()
        stalling = threading.Event()

        def stalled(ops: list[Any]) -> None:
            stalling.set()
            release.wait(10)  # a RocksDB write stall, in the worker thread
            real(ops)

        monkeypatch.setattr(index, "_apply_ops", stalled)
        await c.create("s")
        data = random.Random(3).randbytes(200_000)
        await c.append("s", data)
        # Appended bytes are read back from their journal file: no store write.
        assert index.located_bytes == len(data) and index.unwritten_bytes == 0
        # Replayed appends (no file position) go through the store queue: a
        # put stuck in the worker thread, and the loop goes on, its bytes
        # served from memory meanwhile.
        index.on_append(12345, 0, data)
        assert await trio.to_thread.run_sync(stalling.wait, 10)
        assert index.unwritten_bytes >= len(data)
        assert index._cached(12345, 0) == data  # served from memory
        assert (await c.read("s", 0, len(data))).data == data
        await c.append("s", b"more")  # the loop still takes appends
        release.set()
        await index.wait_written()
        assert index.unwritten_bytes == 0
        assert index._cached(12345, 0) == data  # now from the store
        index.on_delete(12345)
        assert (await c.read("s", 1000, 10)).data == data[1000:1010]


async def test_unflushed_bytes_are_read_from_their_journal_file(tmp_path: pathlib.Path) -> None:
    """Appended bytes are not copied into the cache: the journal file holds them until Tier 2."""
    config = make_config(tmp_path)  # 1 MiB journal files: the appends span several
    rng = random.Random(11)
    datas = [rng.randbytes(rng.randrange(1, 300_000)) for _ in range(16)]
    async with open_node(config, container_type=DirectContainer) as node:
        c = node.container
        index = c.read_index
        await c.create("s")
        await c.create("t")
        offsets = [(await c.append("s", d)).offset for d in datas]
        await c.append("t", b"other")
        assert index.located_bytes == sum(map(len, datas)) + 5
        assert node.store.statistics().pinned_bytes == 0
        files = set(index._files)
        assert len(files) >= 3 and all(p.parent == config.journal_dir for p in files)
        whole = b"".join(datas)
        assert (await c.read("s", 0, len(whole))).data == whole
        for off, d in zip(offsets, datas, strict=True):
            half = len(d) // 2
            assert (await c.read("s", off + half, len(d) - half)).data == d[half:]
        # Truncation drops the entries below it; a file no entry needs is closed.
        cut = offsets[8]
        await c.truncate("s", cut)
        assert index.located_bytes == len(whole) - cut + 5
        assert len(index._files) < len(files)
        assert (await c.read("s", cut, len(whole))).data == whole[cut:]
        await c.delete("s")
        assert index.located_bytes == 5 and len(index._files) == 1
    assert not index._files  # closed with the node
    # A restart replays the journal and finds "t"'s bytes where they lie.
    async with open_node(config, container_type=DirectContainer) as node:
        assert node.read_index.located_bytes == 5
        assert node.store.statistics().pinned_bytes == 0
        assert (await node.container.read("t", 0, 5)).data == b"other"
