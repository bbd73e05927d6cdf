"""The storage writer and reads from Tier 2, in-process, over every binding.

The container runs in the test's trio loop with a `ChunkLayer` over the
filesystem binding, the S3 binding on a real SeaweedFS (``s3_storage``), or
the in-memory binding (with and without append, and with outages injected).
"""

from __future__ import annotations

import pathlib
import random
import shutil
import threading
from typing import Any

import pytest
import trio
import trio.testing

from gateway.config import Config
from gateway.errors import FlushTimeout, Overloaded, Tier2Error
from gateway.node import open_node
from gateway.protocol.metadata_pb2 import MetadataSnapshot
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from gateway.storage.interface import ChunkStorage
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from tests.helpers.container import DirectContainer
from tests.helpers.inprocess import running
from tests.helpers.segments import make_config
from tests.helpers.wait import async_wait_for

KiB = 1024
MiB = 1024 * KiB


def tier2_config(data_dir: pathlib.Path, **tier2: Any) -> Config:
    values: dict[str, Any] = {
        "flush_size": "64 KiB",
        "flush_interval": "30s",
        "max_chunk_size": "256 KiB",
        "retry_deadline": "2s",
        "snapshot_interval": "0s",
        "gc_interval": "1h",
        "gc_grace": "0s",
    }
    values.update(tier2)
    return make_config(data_dir, tier2=values, cache={"budget": "64 MiB"})


@pytest.fixture(params=["file", "s3", "memory-no-append"])
def storage(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> ChunkStorage:
    """A Tier-2 binding: filesystem, S3 (SeaweedFS), memory without append."""
    if request.param == "file":
        return FileStorage(tmp_path / "tier2")
    if request.param == "s3":
        s3: ChunkStorage = request.getfixturevalue("s3_storage")
        return s3
    return MemoryStorage(supports_append=False)


def chunk_bytes(storage: ChunkStorage, container: DirectContainer, name: str) -> bytes:
    """The segment's flushed bytes, read straight from its chunk objects."""
    seg = container._committed(name)
    out = bytearray()
    for c in seg.chunks:
        assert c.start_offset == len(out) or c.start_offset >= seg.start_offset
        out[c.start_offset :] = storage.read(c.name, 0, c.length)
    return bytes(out)


async def read_all(c: DirectContainer, name: str, length: int, piece: int) -> bytes:
    """Bytes [0, length) of ``name``, read sequentially in reads of ``piece`` bytes."""
    got = bytearray()
    while len(got) < length:
        got += (await c.read(name, len(got), piece)).data
    return bytes(got)


async def test_flush_by_size_moves_bytes_to_chunks(
    tmp_path: pathlib.Path, storage: ChunkStorage
) -> None:
    config = tier2_config(tmp_path)
    rng = random.Random(1)
    data = rng.randbytes(700 * KiB)
    async with running(config, storage) as (c, writer):
        await c.create("a/b")
        for i in range(0, len(data), 10 * KiB):
            await c.append("a/b", data[i : i + 10 * KiB])
        # Everything at or past flush_size is flushed without being asked.
        await async_wait_for(
            lambda: c.info("a/b").storage_length >= len(data) - 64 * KiB, 10, "the flush by size"
        )
        await c.flush("a/b")
        info = c.info("a/b")
        assert info.storage_length == len(data)
        assert chunk_bytes(storage, c, "a/b") == data
        chunks = c._committed("a/b").chunks
        assert all(ch.length <= 256 * KiB for ch in chunks)
        assert all(names.chunk_epoch(ch.name) == writer.epoch for ch in chunks)
        if storage.supports_append:
            assert writer.chunk_appends > 0
            assert len(chunks) == 3  # 700 KiB in chunks of at most 256 KiB
        # Flushed entries are unpinned: the cache no longer holds them.
        await c.read_index.wait_written()
        assert c.read_index.store.statistics().pinned_bytes == 0
        r = await c.read("a/b", 0, len(data))
        assert r.data == data
        meta = storage.stat(chunks[0].name).metadata
        assert meta["segment"] == "a/b" and meta["offset"] == "0"
        assert int(meta["crc32c"], 16) == chunks[0].crc32c


async def test_flush_interval_flushes_a_trickle(tmp_path: pathlib.Path) -> None:
    storage = FileStorage(tmp_path / "tier2")
    config = tier2_config(tmp_path, flush_interval="200ms")
    async with running(config, storage) as (c, _):
        await c.create("s")
        await c.append("s", b"x" * 100)
        await async_wait_for(lambda: c.info("s").storage_length == 100, 3, "the flush by time")


async def test_seal_flushes_and_seals_in_storage(tmp_path: pathlib.Path) -> None:
    storage = MemoryStorage()
    async with running(tier2_config(tmp_path), storage) as (c, _):
        await c.create("s")
        await c.append("s", b"abc")
        await c.seal("s")
        await async_wait_for(lambda: c.info("s").sealed_in_storage, 10, "sealed in storage")
        assert c.info("s").storage_length == 3


async def test_cold_read_after_cache_wiped_and_restart(
    tmp_path: pathlib.Path, storage: ChunkStorage
) -> None:
    config = tier2_config(tmp_path, read_ahead=4)
    rng = random.Random(2)
    data = {f"seg{i}": rng.randbytes(rng.randrange(1, 3 * MiB)) for i in range(4)}
    async with running(config, storage) as (c, _):
        for name, d in data.items():
            await c.create(name)
            for i in range(0, len(d), 200 * KiB):
                await c.append(name, d[i : i + 200 * KiB])
        await c.flush()
    shutil.rmtree(config.cache_dir)
    async with running(config, storage) as (c, w):
        for name, d in data.items():
            assert c.info(name).storage_length == len(d)
            assert await read_all(c, name, len(d), 1 * MiB) == d
            # Random ranges too.
            for _ in range(5):
                a = rng.randrange(len(d))
                r = await c.read(name, a, rng.randrange(1, 2 * MiB))
                assert r.data == d[a : a + len(r.data)] and r.data
        stats = w.reader.statistics() if w.reader else {}
        assert stats["blocks_fetched"] > 0 and stats["read_ahead_blocks"] > 0
        # Blocks asked for directly are cached; read-ahead ones are not (scans).
        await async_wait_for(
            lambda: c.read_index.store.statistics().block_bytes > 0, 10, "blocks in the cache"
        )


async def test_truncate_and_delete_remove_chunks(
    tmp_path: pathlib.Path, storage: ChunkStorage
) -> None:
    async with running(tier2_config(tmp_path), storage) as (c, writer):
        await c.create("t")
        await c.create("d")
        for _ in range(8):
            await c.append("t", b"t" * (100 * KiB))
            await c.append("d", b"d" * (100 * KiB))
        await c.flush()
        t_chunks = list(c._committed("t").chunks)
        d_chunks = list(c._committed("d").chunks)
        assert len(t_chunks) >= 3
        cut = t_chunks[1].start_offset + t_chunks[1].length  # first two wholly below
        await c.truncate("t", cut + 10)
        await c.delete("d")
        gone = {x.name for x in t_chunks[:2] + d_chunks}
        await async_wait_for(
            lambda: not gone & {o.key for o in storage.list("")}, 10, "the chunks deleted"
        )
        assert {x.name for x in c._committed("t").chunks} == {x.name for x in t_chunks[2:]}
        r = await c.read("t", 0, 800 * KiB, zeros_below_start=True)
        assert r.data == bytes(cut + 10) + b"t" * (800 * KiB - cut - 10)
        # Counted once the delete call returns, a moment after the object is gone.
        await async_wait_for(lambda: writer.chunks_deleted >= len(gone), 10, "the deletes counted")
        assert writer.chunks_deleted == len(gone)


class SlowDeletes(MemoryStorage):
    """Deletes of chunks that take a while; the most in flight at once is counted."""

    def __init__(self) -> None:
        super().__init__(supports_append=False)
        self._lock = threading.Lock()
        self.in_flight = self.most = 0

    def delete(self, key: str) -> None:
        if "/chunks/" not in key:
            return super().delete(key)  # (snapshots the writer prunes meanwhile)
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            threading.Event().wait(0.05)
            super().delete(key)
        finally:
            with self._lock:
                self.in_flight -= 1


async def test_dropped_chunks_are_deleted_several_at_once(tmp_path: pathlib.Path) -> None:
    storage = SlowDeletes()
    async with running(tier2_config(tmp_path, flush_size="4 KiB"), storage) as (c, writer):
        for i in range(6):
            await c.create(f"d{i}")
            for _ in range(5):
                await c.append(f"d{i}", b"d" * (8 * KiB))
                await c.flush(f"d{i}")
        gone = {ch.name for i in range(6) for ch in c._committed(f"d{i}").chunks}
        assert len(gone) >= 30
        for i in range(6):
            await c.delete(f"d{i}")
        await async_wait_for(lambda: writer.chunks_deleted == len(gone), 20, "all deleted")
        assert not gone & {o.key for o in storage.list("")}
        assert storage.most > 1  # (the layer here runs at most 4 calls at once)


async def test_restart_never_appends_to_an_earlier_epochs_chunk(tmp_path: pathlib.Path) -> None:
    storage = FileStorage(tmp_path / "tier2")
    config = tier2_config(tmp_path)
    async with running(config, storage) as (c, w1):
        await c.create("s")
        await c.append("s", b"a" * 1000)
        await c.flush("s")
        first = list(c._committed("s").chunks)
    async with running(config, storage) as (c, w2):
        assert w2.epoch > w1.epoch
        await c.append("s", b"b" * 1000)
        await c.flush("s")
        chunks = list(c._committed("s").chunks)
        assert chunks[0] == first[0]  # untouched
        assert len(chunks) == 2 and names.chunk_epoch(chunks[1].name) == w2.epoch
        assert chunk_bytes(storage, c, "s") == b"a" * 1000 + b"b" * 1000


async def test_outage_backpressure_then_drain(tmp_path: pathlib.Path) -> None:
    """While Tier 2 is down appends land in the journal until the pinned share is
    full, then wait and are refused with Overloaded; after it returns all drains."""
    storage = MemoryStorage(supports_append=False)
    config = make_config(
        tmp_path,
        tier2={"flush_size": "64 KiB", "retry_deadline": "200ms", "flush_interval": "30s"},
        cache={"budget": "8 MiB", "pinned_share": 0.25},
        container={"overload_timeout": "300ms"},
    )
    storage.set_down(True)
    acked = bytearray()
    async with running(config, storage) as (c, writer):
        await c.create("s")
        with pytest.raises(Overloaded):
            for _ in range(200):
                piece = random.randbytes(64 * KiB)
                await c.append("s", piece)
                acked += piece
        assert 1 * MiB <= len(acked) <= 3 * MiB
        assert writer.flush_failures > 0
        storage.set_down(False)
        await c.flush("s")  # the request skips the backoff of the earlier failures
        assert c.info("s").storage_length == len(acked)
        assert chunk_bytes(storage, c, "s") == acked
        await c.append("s", b"after")  # room again


async def test_flush_reports_failure_while_down(tmp_path: pathlib.Path) -> None:
    storage = MemoryStorage()
    config = tier2_config(tmp_path, retry_deadline="100ms")
    async with running(config, storage) as (c, _):
        await c.create("s")
        await c.append("s", b"x")
        storage.set_down(True)
        with pytest.raises(Exception, match="flush of 's' failed"):
            await c.flush("s")
        storage.set_down(False)
        await c.flush("s")
        assert c.info("s").storage_length == 1


async def test_a_waiting_flush_outlasts_an_outage_shorter_than_its_time(
    tmp_path: pathlib.Path,
) -> None:
    """With ``retry`` (a flush request), failures are retried about once a second,
    and the flush returns once Tier 2 is back."""
    storage = MemoryStorage()
    config = tier2_config(tmp_path, retry_deadline="100ms")
    async with running(config, storage) as (c, writer):
        await c.create("s")
        await c.append("s", b"x" * 1000)
        storage.set_down(True)
        finished: list[float] = []

        async def flush() -> None:
            await c.flush("s", within=60, retry=True)
            finished.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            await async_wait_for(lambda: writer.flush_failures >= 3, 10, "three failed flushes")
            assert not finished
            back = trio.current_time()
            storage.set_down(False)
        # Retried within REQUESTED_RETRY_WAIT (1 s) of its return, not after the backoff.
        assert finished and finished[0] - back < 3
        assert c.info("s").storage_length == 1000
        assert chunk_bytes(storage, c, "s") == b"x" * 1000


async def test_the_backlogs_age_grows_through_failed_flushes(tmp_path: pathlib.Path) -> None:
    """``pending_flush_oldest_seconds`` (the alerting rules' flush backlog) is the
    age of the oldest unflushed byte: failed attempts while Tier 2 is down do not
    make it younger; the flush that succeeds does."""
    storage = MemoryStorage()
    config = tier2_config(tmp_path, retry_deadline="100ms", flush_interval="100ms")
    async with running(config, storage) as (c, writer):
        await c.create("s")
        storage.set_down(True)
        await c.append("s", b"x" * 1000)
        appended = trio.current_time()
        await async_wait_for(
            lambda: writer.flush_failures >= 2 and trio.current_time() - appended >= 1.0,
            10,
            "two failed flushes, a second after the append",
        )
        # Each failure moved the next attempt's due time on; the age must not follow.
        assert writer.oldest_unflushed_age() >= trio.current_time() - appended - 0.05
        storage.set_down(False)
        await async_wait_for(lambda: c.info("s").storage_length == 1000, 10, "the flush")
        assert writer.oldest_unflushed_age() == 0


async def test_a_waiting_flush_says_what_is_left_when_its_time_is_up(
    tmp_path: pathlib.Path,
) -> None:
    storage = MemoryStorage()
    config = tier2_config(tmp_path, retry_deadline="100ms")
    async with running(config, storage) as (c, _):
        await c.create("s")
        await c.append("s", b"x" * 1000)
        storage.set_down(True)
        started = trio.current_time()
        with pytest.raises(FlushTimeout) as e:
            await c.flush("s", within=1.5, retry=True)
        assert 1.5 <= trio.current_time() - started < 5
        assert e.value.exit_code == 27 and e.value.wire_code == "TIER2_UNAVAILABLE"
        assert str(e.value).startswith(
            "flush of 's': 1000 byte(s) not in Tier 2 after waiting 1.5s; the storage writer "
            "keeps retrying, its last attempt failed: "
        ), str(e.value)
        # No time given (a client that sends none): failures are waited through
        # for tier2.retry_deadline, then the error says so.
        with pytest.raises(FlushTimeout, match=r"after waiting 0\.\ds"):
            await c.flush("s", retry=True)
        storage.set_down(False)
        await c.flush("s", within=10, retry=True)
        assert c.info("s").storage_length == 1000


async def test_journal_is_truncated_once_flushed(tmp_path: pathlib.Path) -> None:
    storage = FileStorage(tmp_path / "tier2")
    config = tier2_config(tmp_path, max_chunk_size="1 MiB", flush_size="256 KiB")
    journal_dir = config.journal_dir
    async with running(config, storage) as (c, _):
        await c.create("s")
        sizes = []
        for _ in range(6):
            for _ in range(40):
                await c.append("s", random.randbytes(100 * KiB))
            await c.flush("s")
            await c.checkpoint()
            sizes.append(sum(p.stat().st_size for p in journal_dir.glob("*.wal")))
        # 24 MiB went through 1 MiB journal files; only a few stay.
        assert c.statistics()["journal_files_truncated"] >= 15
        assert max(sizes[2:]) <= 6 * MiB, sizes


async def test_snapshots_kept_and_gc_removes_orphans(tmp_path: pathlib.Path) -> None:
    storage = FileStorage(tmp_path / "tier2")
    config = tier2_config(tmp_path, snapshots_kept=2)
    orphan = names.chunk_key("node-1", 1, 0, 1)
    storage.write(orphan, b"orphan", {})
    async with running(config, storage) as (c, writer):
        await c.create("s")
        for _ in range(4):
            await c.append("s", b"x" * 100)
            await c.flush("s")
            await writer.upload_snapshot()
        metas = [o.key for o in storage.list(names.meta_prefix("node-1"))]
        assert len(metas) == 2
        result = await writer.collect_garbage()
        assert result is not None and result.deleted_keys == [orphan]
        keys = {o.key for o in storage.list(names.chunks_prefix("node-1"))}
        assert keys == {ch.name for ch in c._committed("s").chunks}


async def test_journal_truncation_waits_for_the_durability_barrier(tmp_path: pathlib.Path) -> None:
    """The embedded server acknowledges from its page cache: before journal files
    holding flushed data go, the layer's barrier (syncfs there) must have run."""
    calls: list[float] = []
    config = tier2_config(tmp_path)
    layer = ChunkLayer(MemoryStorage(), barrier=lambda: calls.append(1.0))
    async with open_node(config, layer, container_type=DirectContainer) as node:
        c = node.container
        await c.create("s")
        await c.append("s", b"x" * 1000)
        await c.flush("s")
        await c.checkpoint()
        assert calls == []  # nothing to truncate: no barrier (it may cost a syncfs)
        for _ in range(30):  # a few 1 MiB journal files
            await c.append("s", b"x" * (100 * KiB))
        await c.flush("s")
        # (Not cleared here: a background checkpoint may truncate between the
        # flush and the one below, and run the barrier itself.)
        await c.checkpoint()
        assert calls
        assert c.statistics()["journal_files_truncated"] >= 2


async def test_read_of_flushed_bytes_while_tier2_is_down_fails_cleanly(
    tmp_path: pathlib.Path,
) -> None:
    storage = MemoryStorage()
    config = tier2_config(tmp_path, retry_deadline="200ms")
    async with running(config, storage) as (c, _):
        await c.create("s")
        await c.append("s", b"y" * 5000)
        await c.flush("s")
    shutil.rmtree(config.cache_dir)
    async with running(config, storage) as (c, _):
        storage.set_down(True)
        with pytest.raises(Tier2Error):
            await c.read("s", 0, 100)
        storage.set_down(False)
        assert (await c.read("s", 0, 5000)).data == b"y" * 5000


async def test_read_of_several_blocks_while_tier2_is_down_fails_with_a_tier2_error(
    tmp_path: pathlib.Path,
) -> None:
    """Blocks are fetched in parallel; a failure must still be one Tier2Error (the mount
    turns that into EIO and a log line), not an exception group."""
    storage = MemoryStorage()
    config = tier2_config(tmp_path, retry_deadline="200ms", max_chunk_size="4 MiB")
    data = random.Random(5).randbytes(3 * MiB)
    async with running(config, storage) as (c, _):
        await c.create("s")
        for i in range(0, len(data), 256 * KiB):
            await c.append("s", data[i : i + 256 * KiB])
        await c.flush("s")
    shutil.rmtree(config.cache_dir)
    async with running(config, storage) as (c, _):
        storage.set_down(True)
        with pytest.raises(Tier2Error):
            await c.read("s", 100, 2 * MiB)  # three 1 MiB blocks
        storage.set_down(False)
        assert (await c.read("s", 100, 2 * MiB)).data == data[100 : 100 + 2 * MiB]


class _GatedStorage(MemoryStorage):
    """Writes wait for ``gate`` (a flush held in the middle of its upload)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.writing = threading.Event()

    def write(self, key: str, data: Any, metadata: Any) -> None:
        if "/chunks/" in key:
            self.writing.set()
            assert self.gate.wait(30)
        super().write(key, data, metadata)


async def test_flush_during_a_flush_does_not_leave_the_segment_urgent(
    tmp_path: pathlib.Path,
) -> None:
    """A flush request while the same segment is being flushed is answered by that flush;
    afterwards the segment is under the policy again (its next append is not uploaded at once)."""
    storage = _GatedStorage()
    config = tier2_config(tmp_path, flush_interval="30s")
    async with running(config, storage) as (c, _), trio.open_nursery() as nursery:
        await c.create("s")
        await c.append("s", b"x" * 100)
        nursery.start_soon(c.flush, "s")
        await trio.to_thread.run_sync(storage.writing.wait, 10)
        nursery.start_soon(c.flush, "s")  # the same bytes, while the first upload runs
        await trio.testing.wait_all_tasks_blocked()
        storage.gate.set()
        await async_wait_for(lambda: c.info("s").storage_length == 100, 10, "the flush")
        await c.flush("s")
        await c.append("s", b"y" * 50)
        await trio.sleep(0.5)  # long enough for an urgent flush to start and finish
        assert c.info("s").storage_length == 100, "the append was flushed at once"
        assert c.info("s").chunk_count == 1


async def test_cold_segments_keep_their_chunks_through_gc_snapshots_and_reads(
    tmp_path: pathlib.Path,
) -> None:
    """Sealed, flushed segments come back cold after a restart: GC still sees
    their chunks (read from their records in a thread), the metadata snapshot
    still holds them, and a read warms one and returns its bytes."""
    storage = FileStorage(tmp_path / "tier2")
    config = tier2_config(tmp_path)
    orphan = names.chunk_key("node-1", 99, 0, 1)
    async with running(config, storage) as (c, writer):
        for i in range(20):
            await c.create(f"s{i:02d}")
            await c.append(f"s{i:02d}", bytes([i]) * 1000)
            await c.seal(f"s{i:02d}")
        await async_wait_for(
            lambda: all(c.info(f"s{i:02d}").sealed_in_storage for i in range(20)), 10, "sealed"
        )
    storage.write(orphan, b"orphan", {})
    async with running(config, storage) as (c, writer):
        segs = list(c._table.by_id.values())
        assert len(segs) == 20 and all(s.cold for s in segs)
        result = await writer.collect_garbage()
        assert result is not None and result.deleted_keys == [orphan]
        assert all(s.cold for s in segs)  # GC read their records, no more
        key = await writer.upload_snapshot()
        snap = MetadataSnapshot.FromString(storage.read(key, 0, 1 << 20))
        assert sorted(r.name for r in snap.container.segments) == [f"s{i:02d}" for i in range(20)]
        assert (await c.read("s07", 0, 5000)).data == b"\x07" * 1000
        assert not c._table.by_name["s07"].cold
