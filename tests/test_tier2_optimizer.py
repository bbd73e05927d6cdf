"""The storage optimizer (defragmentation): run selection, the journaled swap, merges in-process.

The in-process tests run the container and storage writer in the test's trio
loop over the memory binding (no append, like S3) and the filesystem binding,
and call `Optimizer.optimize` directly instead of waiting for its interval.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import random
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import crc32c
import pytest
import trio

from gateway.config import Config, Tier2Config
from gateway.container.segment import Segment
from gateway.container.table import SegmentTable, check_chunks
from gateway.errors import JournalClosed
from gateway.fsck.online import live_target
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from gateway.storage.interface import ChunkStorage
from gateway.storage.memory_storage import MemoryStorage
from gateway.tier2.optimizer import crc32c_combine, pick_run
from tests.helpers.container import DirectContainer
from tests.helpers.inprocess import running
from tests.helpers.segments import make_config
from tests.helpers.wait import async_wait_for

KiB = 1024
MiB = 1024 * KiB

pytestmark = pytest.mark.timeout(60)


def records(*lengths: int) -> list[ChunkRecord]:
    out, at = [], 0
    for i, n in enumerate(lengths):
        out.append(ChunkRecord(name=f"c{i}", start_offset=at, length=n, crc32c=i, epoch=1))
        at += n
    return out


CFG = Tier2Config(max_chunk_size=64 * KiB, defrag_min_chunks=4)  # small: below 16 KiB


def test_pick_run_finds_the_first_run_of_enough_small_chunks() -> None:
    # Big, 3 small (too few), big, 5 small, then the last (excluded).
    chunks = records(20 * KiB, 1, 2, 3, 20 * KiB, 10, 10, 10, 10, 10, 10)
    assert pick_run(chunks, CFG, include_last=False) == (5, 5)
    assert pick_run(chunks, CFG, include_last=True) == (5, 6)


def test_pick_run_never_takes_the_last_chunk_of_an_active_segment() -> None:
    chunks = records(1, 1, 1, 1)
    assert pick_run(chunks, CFG, include_last=False) is None
    assert pick_run(chunks, CFG, include_last=True) == (0, 4)


def test_pick_run_caps_a_merge_at_max_chunk_size() -> None:
    chunks = records(*([15 * KiB] * 10), 1)
    # 4 of 15 KiB fit in 64 KiB; the next pick starts after the merged one.
    assert pick_run(chunks, CFG, include_last=False) == (0, 4)
    merged = records(60 * KiB, *([15 * KiB] * 6), 1)
    assert pick_run(merged, CFG, include_last=False) == (1, 4)


def test_pick_run_needs_adjacent_offsets() -> None:
    chunks = records(1, 1, 1, 1, 1, 1)
    chunks[3].start_offset += 5  # a gap (cannot happen in a sound list; never merged over)
    assert pick_run(chunks, CFG, include_last=True) is None


def test_pick_run_leaves_a_chunk_holding_half_the_stretch_until_it_would_double() -> None:
    # 8 KiB merged before, then 4 flushes of 1 KiB: merging the 8 KiB again now
    # would copy it for 4 KiB of news; the 4 small ones alone are a stretch.
    chunks = records(8 * KiB, *([KiB] * 4), 1)
    assert pick_run(chunks, CFG, include_last=False) == (1, 4)
    # Once the rest holds as much as it, it is merged along.
    chunks = records(8 * KiB, 4 * KiB, *([KiB] * 4), 1)
    assert pick_run(chunks, CFG, include_last=False) == (0, 6)
    chunks = records(8 * KiB, 4 * KiB, 2 * KiB, KiB, 1)
    assert pick_run(chunks, CFG, include_last=False) is None


def test_pick_run_final_packs_a_sealed_segment_into_chunks_of_max_size() -> None:
    chunks = records(8 * KiB, 4 * KiB, 2 * KiB)
    assert pick_run(chunks, CFG, include_last=True) is None
    assert pick_run(chunks, CFG, include_last=True, final=True) == (0, 3)
    assert pick_run(records(20 * KiB, KiB), CFG, include_last=True, final=True) == (0, 2)
    assert pick_run(records(60 * KiB, 5 * KiB), CFG, include_last=True, final=True) is None


def simulate_trickle(flushes: int, size: int, cfg: Tier2Config) -> tuple[float, int]:
    """A segment flushed ``flushes`` times, merged after each flush as the optimizer
    would: (bytes rewritten / bytes, chunks at the end)."""
    chunks: list[ChunkRecord] = []
    rewritten = 0
    for k in range(flushes):
        chunks.append(ChunkRecord(name=f"c{k}", start_offset=k * size, length=size))
        while (run := pick_run(chunks, cfg, include_last=False)) is not None:
            first, count = run
            merged = chunks[first : first + count]
            length = sum(c.length for c in merged)
            rewritten += length
            chunks[first : first + count] = [
                ChunkRecord(name=f"m{k}", start_offset=merged[0].start_offset, length=length)
            ]
    return rewritten / (flushes * size), len(chunks)


def test_a_trickle_is_rewritten_a_logarithmic_number_of_times() -> None:
    """Default policy scaled down 64x (max 1 MiB, small 256 KiB, 16 chunks), 1 KB flushes:
    each byte is copied about log2(small / flush) times at most, and the chunks stay few.
    (Merging any 16 small chunks, the merged prefix was copied again every 16 flushes
    until it reached defrag_small: 9x here, ~490x at the real sizes.)"""
    cfg = Tier2Config(max_chunk_size=MiB, defrag_min_chunks=16)
    amplification, count = simulate_trickle(4000, 1000, cfg)
    assert amplification <= math.log2(256 * KiB / 1000)
    # Full-ish chunks (>= small), a chain of halving ones, < 16 new ones, the tail.
    assert count <= 4000 * 1000 // (256 * KiB) + math.log2(256 * KiB / 1000) + 16 + 1


def test_crc32c_combine_is_the_crc_of_the_concatenation() -> None:
    rng = random.Random(3)
    pieces = [rng.randbytes(n) for n in (0, 1, 7, 4096, 100_000, 3 * MiB + 5)]
    parts = [(crc32c.crc32c(p), len(p)) for p in pieces]
    assert crc32c_combine(parts) == crc32c.crc32c(b"".join(pieces))
    assert crc32c_combine(parts[3:4]) == crc32c.crc32c(pieces[3])


def table_with_chunks(*lengths: int) -> tuple[SegmentTable, Segment]:
    table = SegmentTable.__new__(SegmentTable)
    SegmentTable.__init__(table, read_index=None)  # type: ignore[arg-type]
    seg = Segment(1, "s", 0)
    seg.chunks = records(*lengths)
    seg.length = seg.storage_length = sum(lengths)
    table.add(seg)
    return table, seg


def merged(first: int, run: list[ChunkRecord]) -> ChunkRecord:
    return ChunkRecord(
        name="m",
        start_offset=run[0].start_offset,
        length=sum(c.length for c in run),
        crc32c=7,
        epoch=2,
    )


def test_apply_chunks_replaced_swaps_the_run_in_place() -> None:
    table, seg = table_with_chunks(5, 6, 7, 8, 9)
    held = seg.chunks  # a reader's reference
    run = list(seg.chunks[1:4])
    table.seq = 10
    dropped = table.apply_chunks_replaced(seg, [c.name for c in run], merged(1, run))
    assert dropped == run
    assert [c.name for c in seg.chunks] == ["c0", "m", "c4"]
    assert held is seg.chunks
    assert seg.chunks[1].start_offset == 5 and seg.chunks[1].length == 21
    check_chunks(seg)
    assert table.changes[seg.id] == 10  # touched: followers see the new list


def test_apply_chunks_replaced_is_a_no_op_when_the_run_changed() -> None:
    table, seg = table_with_chunks(5, 6, 7, 8, 9)
    run = list(seg.chunks[1:4])
    names_ = [c.name for c in run]
    # Truncated past the first of the run meanwhile.
    del seg.chunks[:2]
    assert table.apply_chunks_replaced(seg, names_, merged(1, run)) is None
    assert [c.name for c in seg.chunks] == ["c2", "c3", "c4"]
    # Not adjacent any more, or not covering the merged range.
    table, seg = table_with_chunks(5, 6, 7, 8, 9)
    assert table.apply_chunks_replaced(seg, ["c1", "c3"], merged(1, run)) is None
    bad = merged(1, run)
    bad.length += 1
    assert table.apply_chunks_replaced(seg, names_, bad) is None
    assert [c.name for c in seg.chunks] == ["c0", "c1", "c2", "c3", "c4"]


# -- in-process, with the storage writer --------------------------------------------------


def optimizer_config(data_dir: pathlib.Path, **tier2: Any) -> Config:
    values: dict[str, Any] = {
        "flush_size": "64 KiB",
        "flush_interval": "1h",
        "max_chunk_size": "256 KiB",
        "retry_deadline": "2s",
        "snapshot_interval": "0s",
        "gc_interval": "1h",
        "gc_grace": "0s",
        "defrag_min_chunks": 4,
        "defrag_interval": "1h",  # the tests call optimize() themselves
    }
    values.update(tier2)
    return make_config(data_dir, tier2=values, cache={"budget": "64 MiB"})


@pytest.fixture(params=["memory-no-append", "s3"])
def storage(request: pytest.FixtureRequest) -> ChunkStorage:
    """Bindings without append (one object per flush): memory, S3 on SeaweedFS."""
    if request.param == "s3":
        s3: ChunkStorage = request.getfixturevalue("s3_storage")
        return s3
    return MemoryStorage(supports_append=False)


def object_bytes(storage: ChunkStorage, chunks: Sequence[ChunkRecord]) -> bytes:
    return b"".join(storage.read(c.name, 0, c.length) for c in chunks)


async def trickle(c: DirectContainer, name: str, flushes: int, size: int) -> bytes:
    rng = random.Random(flushes)
    data = b""
    await c.create(name)
    for _ in range(flushes):
        piece = rng.randbytes(size)
        await c.append(name, piece)
        await c.flush(name)
        data += piece
    return data


async def test_optimizer_merges_small_chunks_and_every_byte_reads_back(
    tmp_path: pathlib.Path, storage: ChunkStorage
) -> None:
    config = optimizer_config(tmp_path)
    async with running(config, storage) as (c, writer):
        data = await trickle(c, "s", 40, 3000)
        before = list(c._committed("s").chunks)
        assert len(before) == 40
        merged = await writer.optimizer.optimize()
        after = list(c._committed("s").chunks)
        assert merged == 1
        assert len(after) == 2  # 39 merged (117 KB < 256 KiB), the last kept
        assert after[-1] == before[-1]
        assert object_bytes(storage, after) == data
        assert after[0].crc32c == crc32c.crc32c(data[: after[0].length])
        assert c.info("s").chunk_count == 2
        # Replaced objects are deleted once GC's grace (0 here) is over.
        gone = {ch.name for ch in before[:-1]}
        await async_wait_for(
            lambda: not gone & {o.key for o in storage.list("")}, 10, "replaced objects deleted"
        )
        stats = writer.optimizer.statistics()
        assert stats.runs_merged == 1 and stats.chunks_replaced == 39
        assert stats.bytes_merged == after[0].length
        # Sources below 5 MiB: S3 reads and uploads them again (no UploadPartCopy).
        assert stats.bytes_reuploaded == after[0].length and stats.bytes_copied == 0
        assert (await c.read("s", 0, len(data))).data == data
        # GC finds nothing to delete: the new chunk is named.
        result = await writer.collect_garbage()
        assert result is not None and not result.deleted_keys
    # The swap was journaled: a restart replays it; cold reads come from the new chunk.
    shutil.rmtree(config.cache_dir)
    async with running(config, storage) as (c, _):
        assert [ch.name for ch in c._committed("s").chunks] == [ch.name for ch in after]
        assert (await c.read("s", 0, len(data))).data == data


async def test_optimizer_on_the_filesystem_binding_across_epochs(tmp_path: pathlib.Path) -> None:
    """The filesystem binding grows its last chunk within an epoch; a restart starts a new one."""
    storage = FileStorage(tmp_path / "tier2")
    config = optimizer_config(tmp_path)
    data = b""
    for i in range(6):
        async with running(config, storage) as (c, _):
            if i == 0:
                await c.create("s")
            piece = bytes([i]) * 1000
            await c.append("s", piece)
            await c.flush("s")
            data += piece
    async with running(config, storage) as (c, writer):
        assert len(c._committed("s").chunks) == 6
        before = list(c._committed("s").chunks)
        assert await writer.optimizer.optimize() == 1
        chunks = list(c._committed("s").chunks)
        assert len(chunks) == 2
        # The merged chunk carries the run's newest epoch (older than this process's), so
        # recovery from Tier 2 can still chain the older last chunk after it.
        assert chunks[0].epoch == max(ch.epoch for ch in before[:-1]) < writer.epoch
        assert names.chunk_epoch(chunks[0].name) == chunks[0].epoch
        assert object_bytes(storage, chunks) == data
        assert (await c.read("s", 0, len(data))).data == data
        # A flush after the merge appends to the (kept) last chunk, never to the merged one.
        await c.append("s", b"z" * 10)
        await c.flush("s")
        assert object_bytes(storage, c._committed("s").chunks) == data + b"z" * 10


class _HeldConcat(MemoryStorage):
    """Memory binding whose concat waits until the test lets it go on."""

    def __init__(self) -> None:
        super().__init__(supports_append=False)
        self.entered = threading.Event()
        self.release = threading.Event()

    def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> None:
        self.entered.set()
        assert self.release.wait(30)
        super().concat(key, sources, metadata, sizes=sizes)


async def test_a_truncation_during_a_merge_makes_the_swap_a_no_op(tmp_path: pathlib.Path) -> None:
    storage = _HeldConcat()
    config = optimizer_config(tmp_path)
    async with running(config, storage) as (c, writer):
        data = await trickle(c, "s", 8, 1000)
        before = list(c._committed("s").chunks)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.optimizer.optimize)
            await trio.to_thread.run_sync(storage.entered.wait, 10)
            # Reads during the merge see every byte.
            assert (await c.read("s", 0, len(data))).data == data
            await c.truncate("s", 2500)  # drops the first two chunks of the run
            storage.release.set()
        after = list(c._committed("s").chunks)
        assert [ch.name for ch in after] == [ch.name for ch in before[2:]]
        assert writer.optimizer.statistics().runs_abandoned == 1
        # The merged object is garbage and deleted.
        await async_wait_for(
            lambda: (
                {o.key for o in storage.list(names.chunks_prefix("node-1"))}
                == {ch.name for ch in after}
            ),
            10,
            "the abandoned merge deleted",
        )
        r = await c.read("s", 0, len(data), zeros_below_start=True)
        assert r.data == bytes(2500) + data[2500:]


async def test_readers_holding_the_old_list_read_until_the_grace_ends(
    tmp_path: pathlib.Path,
) -> None:
    storage = MemoryStorage(supports_append=False)
    config = optimizer_config(tmp_path, gc_grace="1h")
    async with running(config, storage) as (c, writer):
        data = await trickle(c, "s", 6, 500)
        old = list(c._committed("s").chunks)
        assert await writer.optimizer.optimize() == 1
        # A reader that took the list before the swap (another node's mount
        # until its refresh) still finds every old object.
        assert object_bytes(storage, old) == data
        # GC counts them as named while the grace lasts.
        result = await writer.collect_garbage()
        assert result is not None and not result.deleted_keys
        assert writer.optimizer.statistics().retired == 5
        # Online fsck counts them as GC does (not garbage overdue for deletion).
        target = live_target(c, writer=writer)
        assert {ch.name for ch in old} <= target.referenced()
        # Once their grace is over they are queued for deletion: still counted
        # while they go (an object replaced long after its upload is older
        # than GC's overdue age then; seen: the cluster torture's fsck).
        replaced = set(writer.optimizer.retired)
        writer.optimizer.retired.clear()
        for key in replaced:
            writer.housekeeping.delete_later(key, c.info("s").id)
        assert replaced <= target.referenced()
        await async_wait_for(lambda: not writer.housekeeping.deleting(), 10, "deleted")
        assert not replaced & {o.key for o in storage.list("")}


class _TimedConcat(MemoryStorage):
    """Memory binding that records every concat: (segment id, entered, left, bytes).

    The first ``hold`` concats wait for one another (5 s at most) before
    going on, so that a bound of ``hold`` merges at once is reached whatever
    the machine's load; each then takes ``pause`` seconds.
    """

    def __init__(self, hold: int = 1, pause: float = 0.0) -> None:
        super().__init__(supports_append=False)
        self.hold = hold
        self.pause = pause
        self.cond = threading.Condition()
        self.entered = self.inside = self.most = 0
        self.concats: list[tuple[str, float, float, int]] = []

    def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> None:
        entered = time.monotonic()
        with self.cond:
            self.entered += 1
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.entered >= self.hold, timeout=5)
        time.sleep(self.pause)
        super().concat(key, sources, metadata, sizes=sizes)
        with self.cond:
            self.inside -= 1
            self.concats.append((key.split("/")[-2], entered, time.monotonic(), sum(sizes or [])))


async def test_merges_overlap_up_to_defrag_concurrency_never_two_of_one_segment(
    tmp_path: pathlib.Path,
) -> None:
    storage = _TimedConcat(hold=3, pause=0.2)
    config = optimizer_config(tmp_path, defrag_concurrency=3)
    async with running(config, storage) as (c, writer):
        # Six segments of nine 60 KiB chunks: two runs of four each (240 KiB of 256 KiB).
        data = {f"s{i}": await trickle(c, f"s{i}", 9, 60 * KiB) for i in range(6)}
        assert await writer.optimizer.optimize() == 12
        assert storage.most == 3  # three at once, never more
        by_segment: dict[str, list[tuple[float, float]]] = {}
        for seg, entered, left, _ in storage.concats:
            by_segment.setdefault(seg, []).append((entered, left))
        assert sorted(len(v) for v in by_segment.values()) == [2] * 6
        for spans in by_segment.values():
            (_, left), (entered, _) = sorted(spans)
            assert left <= entered  # one segment's merges one after another
        for name, expected in data.items():
            chunks = c._committed(name).chunks
            assert [ch.length for ch in chunks] == [240 * KiB, 240 * KiB, 60 * KiB]
            assert object_bytes(storage, chunks) == expected
            assert (await c.read(name, 0, len(expected))).data == expected
        assert writer.optimizer.statistics().runs_merged == 12
        # Reloaded: one at a time from the next pass on.
        writer.reconfigure(dataclasses.replace(writer.cfg, defrag_concurrency=1))
        storage.hold, storage.most, storage.pause = 1, 0, 0.1
        more = {f"t{i}": await trickle(c, f"t{i}", 5, 60 * KiB) for i in range(4)}
        assert await writer.optimizer.optimize() == 4
        assert storage.most == 1
        for name, expected in more.items():
            assert len(c._committed(name).chunks) == 2
            assert (await c.read(name, 0, len(expected))).data == expected


async def test_merges_at_once_share_the_defrag_rate(tmp_path: pathlib.Path) -> None:
    """Four segments, one 40 KiB run each, four merges allowed at once, 100 KiB/s: each
    merge starts once the bytes of those before it fit the rate (0.4 s apart)."""
    storage = _TimedConcat()
    config = optimizer_config(tmp_path, defrag_concurrency=4, defrag_rate="100 KiB")
    async with running(config, storage) as (c, writer):
        data = {f"s{i}": await trickle(c, f"s{i}", 5, 10 * KiB) for i in range(4)}
        t = trio.current_time()
        assert await writer.optimizer.optimize() == 4
        assert trio.current_time() - t >= 1.2 - 0.05
        calls = sorted(storage.concats, key=lambda call: call[1])
        first = calls[0][1]
        started = 0
        for _, entered, _, nbytes in calls:
            assert nbytes == 40 * KiB
            # Bytes started by then: at most the rate's worth since the first, plus one run.
            assert started <= (entered - first + 0.05) * 100 * KiB
            started += nbytes
        for name, expected in data.items():
            assert len(c._committed(name).chunks) == 2
            assert (await c.read(name, 0, len(expected))).data == expected


async def test_a_pass_stopped_by_the_journal_keeps_the_segments_it_did_not_merge(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge whose swap the journal refuses stops the pass (not the segment's fault); the
    segments not merged are looked at in the next pass though they got no new chunks."""
    storage = MemoryStorage(supports_append=False)
    config = optimizer_config(tmp_path, defrag_concurrency=1)
    async with running(config, storage) as (c, writer):
        data = {f"s{i}": await trickle(c, f"s{i}", 5, 1000) for i in range(4)}
        journal_upload = writer.journal_upload

        async def refused(prepare: Any) -> Any:
            raise JournalClosed()

        monkeypatch.setattr(writer, "journal_upload", refused)
        assert await writer.optimizer.optimize() == 0
        assert [len(c._committed(n).chunks) for n in data] == [5, 5, 5, 5]
        monkeypatch.setattr(writer, "journal_upload", journal_upload)
        assert await writer.optimizer.optimize() == 4
        for name, expected in data.items():
            assert len(c._committed(name).chunks) == 2
            assert (await c.read(name, 0, len(expected))).data == expected
        assert writer.optimizer.statistics().failures == 0


async def test_optimizer_leaves_a_binding_without_concat_alone(tmp_path: pathlib.Path) -> None:
    storage = MemoryStorage(supports_append=False, supports_concat=False)
    async with running(optimizer_config(tmp_path), storage) as (c, writer):
        await trickle(c, "s", 6, 100)
        assert await writer.optimizer.optimize() == 0
        assert len(c._committed("s").chunks) == 6


async def test_sealed_segment_merges_its_last_chunk_too(tmp_path: pathlib.Path) -> None:
    storage = MemoryStorage(supports_append=False)
    async with running(optimizer_config(tmp_path), storage) as (c, writer):
        data = await trickle(c, "s", 5, 100)
        await c.seal("s")
        await async_wait_for(lambda: c.info("s").sealed_in_storage, 10, "sealed in storage")
        assert await writer.optimizer.optimize() == 1
        chunks = c._committed("s").chunks
        assert len(chunks) == 1 and object_bytes(storage, chunks) == data


async def test_recovery_from_tier2_chains_a_merged_chunk_with_older_ones_after_it() -> None:
    """A snapshot from before a merge: the merged object (the run's newest epoch) is chained
    by recovery from Tier 2 whether or not the replaced objects are still there, and the
    older-epoch chunk after it still follows."""
    from tests.test_tier2_rebuild import Tier2, by_name, segment, spans

    for replaced_left in (True, False):
        t2 = Tier2()
        a0 = t2.chunk(1, "a", 0, 100, 1)
        t2.snapshot(1, 2, segment(1, "a", a0))
        run = [t2.chunk(1, "a", 100, 50, 1), t2.chunk(1, "a", 150, 50, 2)]
        t2.chunk(1, "a", 200, 50, 2)  # the last chunk, not merged
        # Merged by a later process (epoch 3): the record and key carry epoch 2.
        t2.chunk(1, "a", 100, 100, max(c.epoch for c in run))
        if not replaced_left:
            for c in run:
                t2.storage.delete(c.name)
        a = by_name(await t2.recover())["a"]
        assert spans(a) == [(0, 100, 1), (100, 200, 2), (200, 250, 2)]
        assert a.length == 250
