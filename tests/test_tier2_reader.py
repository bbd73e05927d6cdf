"""`ChunkReader`: what a random reader fetches and what a sequential one still does."""

from __future__ import annotations

import pathlib
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import crc32c
import trio

from cache import CacheStore
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.chunks import BLOCK_SIZE, RANDOM_FETCH, ChunkReader, random_access
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage

KiB = 1024
MiB = 1024 * KiB


class CountingStorage(MemoryStorage):
    """`MemoryStorage` that remembers every ranged read (key, offset, length)."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[str, int, int]] = []

    def read(self, key: str, offset: int, length: int) -> bytes:
        self.ranges.append((key, offset, length))
        return super().read(key, offset, length)


@asynccontextmanager
async def reader(
    tmp_path: pathlib.Path, data: bytes, chunk_size: int
) -> AsyncIterator[tuple[ChunkReader, CountingStorage, list[ChunkRecord]]]:
    """A running `ChunkReader` over ``data`` cut into chunks of ``chunk_size``."""
    storage = CountingStorage()
    chunks = []
    for start in range(0, len(data), chunk_size):
        piece = data[start : start + chunk_size]
        name = f"c{start:020d}"
        storage.write(name, piece, {})
        chunks.append(
            ChunkRecord(
                name=name, start_offset=start, length=len(piece), crc32c=crc32c.crc32c(piece)
            )
        )
    store = await trio.to_thread.run_sync(CacheStore.open, tmp_path / "cache", 256 * MiB)
    r = ChunkReader(ChunkLayer(storage, max_concurrency=4), store, read_ahead=4)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(r.run)
            yield r, storage, chunks
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def test_a_random_read_fetches_only_its_pages(tmp_path: pathlib.Path) -> None:
    data = random.Random(1).randbytes(5 * MiB + 3000)
    async with reader(tmp_path, data, 2 * MiB) as (r, storage, chunks):
        rng = random.Random(2)
        for _ in range(50):
            offset = rng.randrange(len(data))
            length = rng.choice([1, 4 * KiB, 5000, 128 * KiB, 1 * MiB + 7])
            storage.ranges.clear()
            with random_access():
                got = await r.read(1, "s", chunks, offset, min(length, len(data) - offset), False)
            assert bytes(got) == data[offset : offset + length]
            for _, at, n in storage.ranges:
                # Page-aligned, no more than the read's pages (and never a whole block).
                assert at % RANDOM_FETCH == 0
                assert n <= min(length, BLOCK_SIZE) + 2 * RANDOM_FETCH
        # One GET per piece: a read across a chunk's end gets one from each.
        storage.ranges.clear()
        with random_access():
            got = await r.read(1, "s", chunks, 2 * MiB - 100, 200, False)
        assert bytes(got) == data[2 * MiB - 100 : 2 * MiB + 100]
        assert sorted(storage.ranges) == [
            ("c00000000000000000000", 2 * MiB - RANDOM_FETCH, RANDOM_FETCH),
            ("c00000000000002097152", 0, RANDOM_FETCH),
        ]
        # The chunk's last, partial page.
        storage.ranges.clear()
        with random_access():
            got = await r.read(1, "s", chunks, len(data) - 10, 10, False)
        assert bytes(got) == data[-10:]
        assert storage.ranges == [("c00000000000004194304", MiB, 3000)]
        assert r.statistics()["range_gets"] >= 52
        assert r.statistics()["blocks_fetched"] == 0


async def test_a_random_read_takes_a_block_already_at_hand(tmp_path: pathlib.Path) -> None:
    data = random.Random(3).randbytes(4 * MiB)
    async with reader(tmp_path, data, 4 * MiB) as (r, storage, chunks):
        # Read as before (not random): the whole block is fetched and kept.
        assert bytes(await r.read(1, "s", chunks, 10, 100, False)) == data[10:110]
        assert storage.ranges == [("c00000000000000000000", 0, BLOCK_SIZE)]
        with random_access():
            assert bytes(await r.read(1, "s", chunks, 5000, 100, False)) == data[5000:5100]
        assert len(storage.ranges) == 1, "a block in memory was fetched again"


async def test_sequential_reads_still_fetch_whole_blocks_and_read_ahead(
    tmp_path: pathlib.Path,
) -> None:
    data = random.Random(4).randbytes(8 * MiB)
    async with reader(tmp_path, data, 8 * MiB) as (r, storage, chunks):
        offset = 0
        while offset < len(data):
            got = await r.read(1, "s", chunks, offset, 128 * KiB)
            assert bytes(got) == data[offset : offset + 128 * KiB]
            offset += len(got)
        assert r.statistics()["range_gets"] == 0
        assert all(n >= BLOCK_SIZE for _, _, n in storage.ranges)
        assert r.statistics()["read_ahead_blocks"] > 0
