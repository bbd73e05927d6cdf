"""The RocksDB cache store (cache/): key order, round trips, pinning, LRU, budget, disk, reopen."""

from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from cache import CacheStatistics, CacheStore, keys
from cache.store import KiB, MiB
from tests.helpers.wait import wait_for

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[CacheStore]:
    """A 32 MiB store, closed after the test."""
    s = CacheStore.open(tmp_path / "cache", 32 * MiB)
    yield s
    s.close()


def disk_bytes(directory: pathlib.Path) -> int:
    """Sum of the sizes of the files in ``directory`` (what the store costs on disk)."""
    total = 0
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):  # a compaction removed it meanwhile
            total += entry.stat().st_size
    return total


def held(s: CacheStore) -> int:
    st_ = s.statistics()
    return st_.pinned_bytes + st_.block_bytes


# Keys ----------------------------------------------------------------------


@given(st.lists(st.tuples(U64, U64), min_size=2, max_size=20))
def test_append_keys_sort_by_segment_then_offset(pairs: list[tuple[int, int]]) -> None:
    encoded = {keys.append_key(s, o): (s, o) for s, o in pairs}
    assert [encoded[k] for k in sorted(encoded)] == sorted(set(pairs))
    for key, pair in encoded.items():
        assert keys.decode_append_key(key) == pair
        begin, end = keys.segment_range(pair[0])
        assert begin <= key < end


# Names that are prefixes of each other or contain the escape bytes.
TRICKY_NAMES = ["", "a", "a\x00", "a\x00b", "a\x00\x01", "a\x01", "ab", "b", "\x00", "é", "a/b"]
CHUNK_NAMES = st.one_of(st.sampled_from(TRICKY_NAMES), st.text(max_size=12))


@given(st.lists(st.tuples(CHUNK_NAMES, U64), min_size=2, max_size=20))
def test_block_keys_sort_by_chunk_then_index(blocks: list[tuple[str, int]]) -> None:
    encoded = {keys.block_key(c, i): (c, i) for c, i in blocks}
    # UTF-8 byte order is code point order, i.e. Python's string order.
    assert [encoded[k] for k in sorted(encoded)] == sorted(set(blocks))
    for key, (chunk, index) in encoded.items():
        assert keys.decode_block_key(key) == (chunk, index)
        assert keys.decode_block_key(keys.block_meta_key(chunk, index)) == (chunk, index)
        # A chunk's range holds exactly that chunk's keys, whatever the other names.
        for space, make in ((keys.BLOCK, keys.block_key), (keys.BLOCK_META, keys.block_meta_key)):
            begin, end = keys.chunk_range(space, chunk)
            for other, other_index in blocks:
                inside = begin <= make(other, other_index) < end
                assert inside == (other == chunk), (chunk, other)


def test_key_spaces_do_not_overlap() -> None:
    assert keys.append_key(2**64 - 1, 2**64 - 1) < keys.block_key("", 0)
    assert keys.block_key("\U0010ffff" * 4, 2**64 - 1) < keys.block_meta_key("", 0)
    assert keys.block_meta_key("\U0010ffff" * 4, 2**64 - 1) < keys.END
    assert keys.segment_range(2**64 - 1)[1] == keys.BLOCK


@pytest.mark.parametrize(
    "bad",
    [b"", b"\x01" + bytes(15), b"\x02ab" + bytes(8), b"\x02a\x00b\x00\x01" + bytes(8), b"\x04"],
)
def test_malformed_keys_are_rejected(bad: bytes) -> None:
    with pytest.raises(keys.BadKey):
        if bad[:1] == keys.APPEND:
            keys.decode_append_key(bad)
        else:
            keys.decode_block_key(bad)


def test_out_of_range_integers_are_rejected() -> None:
    with pytest.raises(ValueError, match="segment id"):
        keys.append_key(-1, 0)
    with pytest.raises(ValueError, match="offset"):
        keys.append_key(0, 2**64)
    with pytest.raises(ValueError, match="block index"):
        keys.block_key("c", -1)


# Append data ---------------------------------------------------------------


def test_append_round_trip_and_replace(store: CacheStore) -> None:
    store.put_append(7, 0, b"hello")
    store.put_append(7, 5, bytearray(b" wide"))
    store.put_append(8, 0, memoryview(b"xyz123")[:3])
    assert store.get_append(7, 0) == b"hello"
    assert store.get_append(7, 5) == b" wide"
    assert store.get_append(8, 0) == b"xyz"
    assert store.get_append(7, 1) is None
    assert store.statistics().pinned_bytes == 13

    store.put_append(7, 0, b"hi")
    assert store.get_append(7, 0) == b"hi"
    stats = store.statistics()
    assert stats.pinned_bytes == 10
    assert (stats.hits, stats.misses, stats.inserts) == (4, 1, 4)


def test_unpin_deletes_entries_that_end_at_or_before_below(store: CacheStore) -> None:
    for offset in (0, 100, 200):
        store.put_append(1, offset, bytes([offset // 100]) * 100)
    store.put_append(2, 0, b"z" * 50)

    assert store.unpin_appends(1, 150) == 100  # [100, 200) straddles 150 and stays
    assert store.get_append(1, 0) is None
    assert store.get_append(1, 100) == b"\x01" * 100
    assert store.unpin_appends(1, 300) == 200
    assert store.get_append(1, 100) is None
    assert store.get_append(1, 200) is None
    assert store.unpin_appends(1, 10**9) == 0
    assert store.get_append(2, 0) == b"z" * 50
    assert store.statistics().pinned_bytes == 50


def test_drop_segment_deletes_only_that_segment(store: CacheStore) -> None:
    for offset in range(0, 1000, 100):
        store.put_append(3, offset, b"s" * 100)
        store.put_append(4, offset, b"t" * 100)
    assert store.drop_segment(3) == 1000
    assert all(store.get_append(3, o) is None for o in range(0, 1000, 100))
    assert store.get_append(4, 900) == b"t" * 100
    assert store.drop_segment(3) == 0
    assert store.statistics().pinned_bytes == 1000


# Tier-2 blocks -------------------------------------------------------------


def test_block_round_trip_and_replace(store: CacheStore) -> None:
    store.put_block("seg/1/chunk-a", 0, b"A" * 4096)
    store.put_block("seg/1/chunk-a", 1, memoryview(b"B" * 100))
    assert store.get_block("seg/1/chunk-a", 0) == b"A" * 4096
    assert store.get_block("seg/1/chunk-a", 1) == b"B" * 100
    assert store.get_block("seg/1/chunk-a", 2) is None
    assert store.get_block("seg/1/chunk-b", 0) is None
    store.put_block("seg/1/chunk-a", 0, b"C" * 10)
    assert store.get_block("seg/1/chunk-a", 0) == b"C" * 10
    stats = store.statistics()
    assert stats.block_bytes == 110
    assert stats.evictions == 0


def test_drop_chunk_spares_chunks_with_similar_names(store: CacheStore) -> None:
    names = ["a", "a\x00b", "ab", "a\x00"]
    for name in names:
        for index in range(3):
            store.put_block(name, index, name.encode() * 10)
    assert store.drop_chunk("a") == 3 * 10
    assert all(store.get_block("a", i) is None for i in range(3))
    for name in names[1:]:
        assert store.get_block(name, 2) == name.encode() * 10
    assert store.drop_chunk("a") == 0
    assert store.statistics().block_bytes == sum(30 * len(n.encode()) for n in names[1:])


def test_least_recently_used_block_is_evicted_first(tmp_path: pathlib.Path) -> None:
    s = CacheStore.open(tmp_path / "cache", 8 * MiB)
    try:
        for i in range(8):
            s.put_block("c", i, bytes([i]) * MiB)
        assert s.statistics().block_bytes == 8 * MiB
        assert s.get_block("c", 0) == b"\x00" * MiB  # now the most recently used
        s.put_block("c", 8, b"\x08" * MiB)
        assert s.get_block("c", 1) is None  # the oldest untouched block went
        assert s.get_block("c", 0) == b"\x00" * MiB
        s.put_block("c", 9, b"\x09" * MiB)
        assert s.get_block("c", 2) is None
        assert s.get_block("c", 3) == b"\x03" * MiB
        stats = s.statistics()
        assert stats.evictions == 2
        assert stats.block_bytes == 8 * MiB
    finally:
        s.close()


def test_block_larger_than_the_room_is_not_kept(tmp_path: pathlib.Path) -> None:
    s = CacheStore.open(tmp_path / "cache", 8 * MiB)
    try:
        s.put_append(1, 0, b"p" * (6 * MiB))
        s.put_block("c", 0, b"small")
        s.put_block("c", 0, b"x" * (3 * MiB))  # only 2 MiB of room: dropped, old copy too
        assert s.get_block("c", 0) is None
        assert s.statistics().block_bytes == 0
    finally:
        s.close()


# Budget --------------------------------------------------------------------


def test_pinned_data_evicts_blocks_and_is_limited_by_its_share(tmp_path: pathlib.Path) -> None:
    s = CacheStore.open(tmp_path / "cache", 8 * MiB, pinned_share=0.5)
    try:
        stats = s.statistics()
        assert (stats.budget_bytes, stats.pinned_limit_bytes) == (8 * MiB, 4 * MiB)
        for i in range(8):
            s.put_block("c", i, b"b" * MiB)
        assert s.pinned_room(4 * MiB)
        s.put_append(1, 0, b"a" * (2 * MiB))
        stats = s.statistics()
        assert (stats.pinned_bytes, stats.block_bytes, stats.evictions) == (2 * MiB, 6 * MiB, 2)
        assert s.pinned_room(2 * MiB)
        assert not s.pinned_room(2 * MiB + 1)

        # Not refused, but from now on the caller is told to push back.
        s.put_append(1, 2 * MiB, b"a" * (4 * MiB))
        assert held(s) <= 8 * MiB
        assert not s.pinned_room(1)
        assert s.unpin_appends(1, 6 * MiB) == 6 * MiB
        # With nothing pinned even an append larger than the share may go in.
        assert s.pinned_room(100 * MiB)
    finally:
        s.close()


@pytest.mark.parametrize("block_size", [4 * KiB, 64 * KiB, 1 * MiB])
def test_disk_stays_near_budget(tmp_path: pathlib.Path, block_size: int) -> None:
    budget = 32 * MiB
    directory = tmp_path / "cache"
    s = CacheStore.open(directory, budget)
    payload = os.urandom(block_size)
    count = (3 if block_size < 64 * KiB else 10) * budget // block_size
    peak = 0
    for i in range(count):
        s.put_block(f"prefix/node-1/chunks/{i % 97}/{i:020d}.e1", i % 8, payload)
        if i % 3 == 0 and i:  # reads of recent blocks, as readers would do
            assert s.get_block(f"prefix/node-1/chunks/{(i - 1) % 97}/{i - 1:020d}.e1", (i - 1) % 8)
        if i % 64 == 0:
            assert held(s) <= budget
            peak = max(peak, disk_bytes(directory))
    stats = s.statistics()
    assert stats.block_bytes == budget
    assert stats.evictions == count - budget // block_size
    # While compactions of the burst run, their inputs and outputs coexist
    # (measured peaks 2.5-3.7x); once writes stop the directory settles near
    # the budget by itself (measured 1.03-1.07x within 0.5 s, 40 runs of
    # 1 MiB blocks). Without CacheStore._settle RocksDB left 1.34x and 1.53x
    # for minutes in 2 of about 100 such runs (one failed CI here).
    assert peak < 5 * budget
    wait_for(
        lambda: disk_bytes(directory) < 1.2 * budget, 30, "the directory settled near the budget"
    )
    s.close()  # flushes one more memtable (1/16 of the budget)
    assert disk_bytes(directory) < 1.5 * budget


def test_drop_reclaims_disk(tmp_path: pathlib.Path) -> None:
    budget = 32 * MiB
    directory = tmp_path / "cache"
    s = CacheStore.open(directory, budget)
    try:
        payload = os.urandom(64 * KiB)
        for i in range(128):  # 8 MiB of blocks
            s.put_block(f"chunk-{i // 16}", i % 16, payload)
        for i in range(320):  # 20 MiB of appends, most of it flushed to files by now
            s.put_append(5, i * len(payload), payload)
        wait_for(lambda: disk_bytes(directory) > 20 * MiB, 10, "the appends on disk")
        assert s.drop_segment(5) == 20 * MiB
        assert sum(s.drop_chunk(f"chunk-{i}") for i in range(4)) == 4 * MiB
        # No more writes come: the store itself must get the space back.
        wait_for(lambda: disk_bytes(directory) < 8 * MiB, 10, "the dropped space reclaimed")
        assert s.get_block("chunk-7", 15) == payload
    finally:
        s.close()


# Restart -------------------------------------------------------------------


def test_reopen_drops_appends_and_keeps_blocks(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "cache"
    s = CacheStore.open(directory, 8 * MiB)
    for i in range(4):
        s.put_block("c", i, bytes([i]) * MiB)
    s.put_block("d", 0, b"tiny")
    s.put_append(1, 0, b"a" * (2 * MiB))
    s.close()
    before = disk_bytes(directory)

    s = CacheStore.open(directory, 8 * MiB)
    try:
        stats = s.statistics()
        assert stats == CacheStatistics(
            hits=0,
            misses=0,
            inserts=0,
            evictions=0,
            pinned_bytes=0,
            block_bytes=4 * MiB + 4,
            budget_bytes=8 * MiB,
            pinned_limit_bytes=4 * MiB,
        )
        assert s.get_append(1, 0) is None
        assert s.get_block("c", 3) == b"\x03" * MiB
        assert s.get_block("d", 0) == b"tiny"
        # The dropped appends' space is back.
        assert disk_bytes(directory) < before - MiB
        # LRU order was rebuilt from insertion order (reads are not on disk):
        # c/0 goes first, then c/1; c/3 was just read, so it stays.
        s.put_block("e", 0, b"e" * (4 * MiB))
        s.put_block("e", 1, b"e" * MiB)
        assert s.statistics().evictions == 2
        assert [s.get_block("c", i) is not None for i in range(4)] == [False, False, True, True]
    finally:
        s.close()


def test_reopen_with_a_smaller_budget_evicts_the_oldest(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "cache"
    s = CacheStore.open(directory, 16 * MiB)
    for i in range(12):
        s.put_block("c", i, bytes([i]) * MiB)
    s.close()
    s = CacheStore.open(directory, 8 * MiB)
    try:
        stats = s.statistics()
        assert (stats.block_bytes, stats.evictions) == (8 * MiB, 4)
        assert [s.get_block("c", i) is not None for i in range(12)] == [False] * 4 + [True] * 8
    finally:
        s.close()


# RocksDB usage -------------------------------------------------------------


def test_writes_skip_the_wal(store: CacheStore, tmp_path: pathlib.Path) -> None:
    for i in range(64):
        store.put_block("c", i, b"w" * (64 * KiB))
        store.put_append(1, i * 100, b"a" * 100)
    wal = [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".log"]
    assert wal
    assert all(p.stat().st_size == 0 for p in wal)


class _StallingDB:
    """Wraps an Rdict; its first ``stalls`` writes fail the way RocksDB's no_slowdown does."""

    def __init__(self, db: Any, stalls: int) -> None:
        self._db = db
        self.stalls = stalls

    def write(self, batch: Any, options: Any) -> None:
        if self.stalls:
            self.stalls -= 1
            self._db.write(batch, options)  # consumes the batch, like the real failure
            raise Exception("Result incomplete: Write stall")
        self._db.write(batch, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_stalled_write_waits_and_retries(store: CacheStore) -> None:
    stalling = _StallingDB(store._db, stalls=3)
    store._db = stalling  # type: ignore[assignment]
    store.put_block("c", 0, b"retried")
    assert stalling.stalls == 0
    assert store.get_block("c", 0) == b"retried"
    assert store.statistics().write_waits == 3


def test_closed_store(tmp_path: pathlib.Path) -> None:
    s = CacheStore.open(tmp_path / "cache", 8 * MiB)
    s.close()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.put_block("c", 0, b"x")
    with pytest.raises(ValueError, match="closed"):
        s.get_append(1, 0)


@pytest.mark.parametrize("budget, share", [(1 * MiB, 0.5), (8 * MiB, 0.0), (8 * MiB, 1.5)])
def test_bad_arguments(tmp_path: pathlib.Path, budget: int, share: float) -> None:
    with pytest.raises(ValueError):
        CacheStore.open(tmp_path / "cache", budget, share)


# Threads -------------------------------------------------------------------


def test_open_in_one_thread_use_in_others(tmp_path: pathlib.Path) -> None:
    opened: list[CacheStore] = []
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: opened.append(CacheStore.open(tmp_path / "c", 8 * MiB)))
    t.start()
    t.join()
    s = opened[0]
    payload = os.urandom(256 * KiB)
    stop = threading.Event()

    def writer() -> None:
        try:
            for i in range(200):  # 50 MiB through an 8 MiB budget: constant eviction
                s.put_block(f"c{i % 7}", i, payload)
                s.put_append(1, i, b"a")
                s.unpin_appends(1, i)
        except BaseException as e:
            errors.append(e)
        finally:
            stop.set()

    def reader() -> None:
        try:
            i = 0
            while not stop.is_set():
                value = s.get_block(f"c{i % 7}", i)
                assert value is None or value == payload
                i = (i + 1) % 200
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (writer, reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    try:
        stats = s.statistics()
        assert stats.pinned_bytes == 1
        assert stats.pinned_bytes + stats.block_bytes <= 8 * MiB
        # The bookkeeping matches what RocksDB holds (which blocks survived
        # depends on what the readers refreshed, but the newest always does).
        kept = stats.block_bytes // len(payload)
        assert kept >= 30
        present = [i for i in range(200) if s.get_block(f"c{i % 7}", i) is not None]
        assert len(present) == kept
        assert 199 in present
    finally:
        s.close()


async def test_gets_inline_cost_less_than_a_thread_hop(tmp_path: pathlib.Path) -> None:
    """The measurement behind calling small gets inline (numbers in cache/store.py)."""
    s = await trio.to_thread.run_sync(CacheStore.open, tmp_path / "cache", 32 * MiB)
    try:
        for size in (4 * KiB, 64 * KiB):
            await trio.to_thread.run_sync(s.put_block, f"c{size}", 0, os.urandom(size))

        def median_us(samples: list[int]) -> float:
            return statistics.median(samples) / 1000

        inline: dict[int, list[int]] = {4 * KiB: [], 64 * KiB: []}
        hops: list[int] = []
        for _ in range(200):
            for size, samples in inline.items():
                t0 = time.perf_counter_ns()
                s.get_block(f"c{size}", 0)
                samples.append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns()
            await trio.to_thread.run_sync(lambda: None)
            hops.append(time.perf_counter_ns() - t0)
        hop = median_us(hops)
        for samples in inline.values():
            assert median_us(samples) < hop
    finally:
        await trio.to_thread.run_sync(s.close)
