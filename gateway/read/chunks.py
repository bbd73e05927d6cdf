"""`ChunkReader`: reading flushed segment bytes back from Tier-2 chunks.

Pulsar's offload reader and Mountpoint-s3's prefetcher in one small piece:
a chunk is read in aligned **blocks** of `BLOCK_SIZE` bytes with ranged GETs.
Each block is looked up, in order, in

1. a small in-memory map of blocks fetched moments ago (read-ahead lands
   there, so a sequential reader takes them without a RocksDB round trip),
2. the cache store's Tier-2 block key space (immutable blocks, kept across
   restarts, evicted LRU; filled by reads that ask for a block, not by
   read-ahead, so a scan does not flush the cache),
3. Tier 2 itself: one ranged GET per block, coalesced when several readers
   want the same block.

Protocol readers of a segment get read-ahead by the one policy
(`gateway.read.readahead.ReadAhead`, a doubling window up to `read_ahead`
blocks, across chunk boundaries); the mount keeps one per open file and calls
`prefetch` itself. Either way the window is fetched in parallel in the
background, in GETs of up to `FETCH_BLOCKS` blocks, so a sequential reader
reads at the speed of several large GETs at once rather than one small one.
Random readers fetch only the blocks they ask for; a caller that knows its
reader is not sequential (the mount, for a file with no read-ahead window)
says so with `random_access`, and a block missing from memory and the cache
store is then not fetched whole: one ranged GET of just the pages the read
needs (`RANDOM_FETCH` aligned). A 1 MiB GET to answer a 4 KiB read cost 4x
its time to the first byte and a third of the IOPS of the 4 KiB GET that
boto3 makes (bench/fuse_read.py). Those bytes are not kept (they are not a
block; the kernel's page cache holds what the mount read).

A block fetched for a chunk that later grows (bindings with append) may be
shorter than the block is now; a cached block shorter than expected is
fetched again. When a block is the whole chunk, its CRC32C is checked.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import crc32c
import trio

from cache import CacheStore
from gateway.buffers import Buffer
from gateway.errors import ChunkCorrupt, GatewayError
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.readahead import ReadAhead
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

BLOCK_SIZE = 1024 * 1024
#: A sequential reader's GETs cover up to this many blocks (8 MiB): a GET
#: costs ~3 ms of CPU on client and server whatever its size, so 1 MiB GETs
#: cap a 2-core machine at a third of what 8 MiB GETs reach (bench/tier2.py).
FETCH_BLOCKS = 8
#: Fetched blocks waiting to be written to the cache store beyond this are
#: not cached (the cache is only a copy; a scan must not queue up memory).
CACHE_QUEUE_BYTES = 32 * 1024 * 1024

#: A random reader's GET covers the pages it reads, aligned to this (the
#: kernel's page: FUSE asks for whole pages anyway).
RANDOM_FETCH = 4 * 1024

BlockId = tuple[str, int]

_random_access: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "random_access", default=False
)


@contextlib.contextmanager
def random_access() -> Iterator[None]:
    """Reads made within are by a reader that is not sequential: fetch only what they need.

    A context variable rather than an argument: the read goes through the
    read index, which only passes it on. Trio's child tasks inherit it.
    """
    token = _random_access.set(True)
    try:
        yield
    finally:
        _random_access.reset(token)


def in_random_access() -> bool:
    """Whether the current read is within `random_access`."""
    return _random_access.get()


def _chunk_start(c: ChunkRecord) -> int:
    return int(c.start_offset)


class ChunkReader:
    """Reads segment ranges from chunks, block by block, with read-ahead."""

    def __init__(
        self,
        layer: ChunkLayer,
        store: CacheStore,
        read_ahead: int = 32,
        memory_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.layer = layer
        self.store = store
        self.read_ahead = read_ahead
        self._memory_limit = max(memory_bytes, (read_ahead + 2 * FETCH_BLOCKS) * BLOCK_SIZE)
        self._ready: OrderedDict[BlockId, Buffer] = OrderedDict()
        self._ready_bytes = 0
        self._inflight: dict[BlockId, trio.Event] = {}
        #: segment id -> read-ahead state of the protocol's readers of it.
        self._read_ahead: dict[int, ReadAhead] = {}
        self._nursery: trio.Nursery | None = None
        self._cache_writes = trio.CapacityLimiter(1)
        self._cache_queue_bytes = 0
        self.cache_writes_skipped = 0
        self.gets = 0
        #: GETs of a random reader's pages only (`random_access`), in ``gets`` too.
        self.range_gets = 0
        self.blocks_fetched = 0
        self.bytes_fetched = 0
        self.blocks_from_memory = 0
        self.blocks_from_cache = 0
        self.read_ahead_blocks = 0
        self.read_ahead_skipped = 0
        #: Bytes of read-ahead GETs in flight (bounded by half the memory budget).
        self._ahead_bytes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background tasks (read-ahead, cache writes) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def forget_segment(self, segment_id: int) -> None:
        """The segment is gone: drop its access-pattern state."""
        self._read_ahead.pop(segment_id, None)

    async def read(
        self,
        segment_id: int,
        name: str,
        chunks: Sequence[ChunkRecord],
        offset: int,
        length: int,
        read_ahead: bool = True,
    ) -> Buffer:
        """Bytes ``[offset, offset+length)`` of a segment, all of which lie in ``chunks``.

        A view into a fetched block where one block holds them all (no copy).

        With ``read_ahead``, a read that continues the previous read of the
        segment schedules read-ahead by the `ReadAhead` policy. Callers that track
        their readers themselves (the mount's per-handle prefetcher) pass
        False and call `prefetch`.
        """
        end = offset + length
        wanted = list(self._blocks(name, chunks, offset, end))
        small = in_random_access()
        if read_ahead and self.read_ahead:
            policy = self._read_ahead.get(segment_id)
            if policy is None:
                window = self.read_ahead * BLOCK_SIZE
                policy = self._read_ahead[segment_id] = ReadAhead(window, window, top_up=True)
            ahead = policy.on_read(offset, length)
            if ahead is not None:
                self.prefetch(chunks, *ahead)
        if len(wanted) == 1:
            return await self._piece(*wanted[0], small, view=False)
        results: list[Buffer] = [b""] * len(wanted)
        failures: list[GatewayError] = []

        async def one(i: int, chunk: ChunkRecord, index: int, lo: int, hi: int) -> None:
            try:
                results[i] = await self._piece(chunk, index, lo, hi, small, view=True)
            except GatewayError as e:
                # Raised below as itself: callers (the mount's EIO, the
                # protocol's error answer) handle a Tier2Error, not a group.
                failures.append(e)

        async with trio.open_nursery() as nursery:
            for i, piece in enumerate(wanted):
                nursery.start_soon(one, i, *piece)
        if failures:
            raise failures[0]
        return b"".join(results)

    async def _piece(
        self, chunk: ChunkRecord, index: int, lo: int, hi: int, small: bool, view: bool
    ) -> Buffer:
        """Bytes ``[lo, hi)`` of block ``index``; with ``small``, only they are fetched.

        ``view``: a memoryview of the block, never a copy (the caller joins pieces).
        """
        data = await self._at_hand(chunk, index) if small else None
        if small and data is None:
            return await self._fetch_range(chunk, index * BLOCK_SIZE + lo, hi - lo)
        if data is None:
            data = await self._block(chunk, index)
        if (lo, hi) == (0, len(data)):
            return data
        return memoryview(data)[lo:hi] if view else data[lo:hi]

    @staticmethod
    def _blocks(
        name: str, chunks: Sequence[ChunkRecord], offset: int, end: int
    ) -> list[tuple[ChunkRecord, int, int, int]]:
        """(chunk, block index, slice start, slice end) covering ``[offset, end)``."""
        out = []
        k = bisect.bisect_right(chunks, offset, key=_chunk_start) - 1
        while offset < end:
            if k < 0 or k >= len(chunks):
                raise ChunkCorrupt(name, f"no chunk holds offset {offset}")
            c = chunks[k]
            c_start, c_end = int(c.start_offset), int(c.start_offset + c.length)
            if not c_start <= offset < c_end:
                raise ChunkCorrupt(name, f"no chunk holds offset {offset}")
            rel = offset - c_start
            index = rel // BLOCK_SIZE
            block_start = index * BLOCK_SIZE
            take = min(end, c_end, c_start + block_start + BLOCK_SIZE) - offset
            out.append((c, index, rel - block_start, rel - block_start + take))
            offset += take
            if offset >= c_end:
                k += 1
        return out

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        """Fetch the blocks of ``[start, stop)`` (clipped to ``chunks``) in the background.

        Blocks already in memory, in flight or in the cache store are
        skipped; so is everything once read-ahead in flight reaches half the
        memory budget (the global prefetch budget: readers then fetch on
        demand until it drains). Returns the blocks scheduled.
        """
        if self._nursery is None or not chunks:
            return 0
        last = chunks[-1]
        stop = min(stop, int(last.start_offset + last.length))
        start = max(start, int(chunks[0].start_offset))
        if start >= stop:
            return 0
        scheduled = 0
        for chunk, index, _, _ in self._blocks("", chunks, start, stop):
            if self._ahead_bytes >= self._memory_limit // 2:
                self.read_ahead_skipped += 1
                break
            key = (chunk.name, index)
            if key in self._ready or key in self._inflight:
                continue
            cached = self.store.block_size(chunk.name, index)
            if cached is not None and cached >= self._expected(chunk, index):
                continue
            # One GET from here to the end of this fetch unit (or the
            # first block already there), claimed now so the next blocks
            # of this loop see it in flight.
            claimed = self._claim(chunk, index, FETCH_BLOCKS - index % FETCH_BLOCKS)
            self.read_ahead_blocks += claimed
            scheduled += claimed
            nbytes = claimed * BLOCK_SIZE
            self._ahead_bytes += nbytes
            self._nursery.start_soon(self._prefetch, chunk, index, claimed, nbytes)
        return scheduled

    async def _prefetch(self, chunk: ChunkRecord, index: int, count: int, nbytes: int) -> None:
        try:
            await self._fetch(chunk, index, count, cache=False)
        except GatewayError as e:
            # The reader fetches it again when it gets there, and reports then.
            log.debug("read-ahead of %s blocks %d+%d failed: %s", chunk.name, index, count, e)
        finally:
            self._ahead_bytes -= nbytes

    def _claim(self, chunk: ChunkRecord, index: int, most: int) -> int:
        """Mark blocks ``index``.. (at most ``most``, within the chunk) as being fetched."""
        blocks = -(-int(chunk.length) // BLOCK_SIZE)
        count = 0
        while count < most and index + count < blocks:
            key = (chunk.name, index + count)
            if key in self._inflight or (count and key in self._ready):
                break
            self._inflight[key] = trio.Event()
            count += 1
        return count

    def _expected(self, chunk: ChunkRecord, index: int) -> int:
        return min(BLOCK_SIZE, int(chunk.length) - index * BLOCK_SIZE)

    async def _block(self, chunk: ChunkRecord, index: int) -> Buffer:
        """Block ``index`` of ``chunk``: exactly its bytes within the chunk's length."""
        data = await self._at_hand(chunk, index)
        if data is not None:
            return data
        self._claim(chunk, index, 1)
        return (await self._fetch(chunk, index, 1))[0]

    async def _at_hand(self, chunk: ChunkRecord, index: int) -> Buffer | None:
        """Block ``index`` from memory, a GET in flight or the cache store; None if none has it."""
        key = (chunk.name, index)
        expected = self._expected(chunk, index)
        while True:
            data = self._ready.get(key)
            if data is not None and len(data) >= expected:
                self._ready.move_to_end(key)
                self.blocks_from_memory += 1
                return data if len(data) == expected else data[:expected]
            event = self._inflight.get(key)
            if event is None:
                break
            await event.wait()
        # Inline: a RocksDB get holds the GIL anyway (see cache.store).
        data = self.store.get_block(chunk.name, index)
        if data is not None and len(data) >= expected:
            self.blocks_from_cache += 1
            # Kept in memory too: a reader taking 128 KiB at a time (FUSE)
            # would otherwise get the whole MiB from RocksDB eight times.
            self._remember(key, data)
            return data if len(data) == expected else data[:expected]
        return None

    async def _fetch_range(self, chunk: ChunkRecord, at: int, length: int) -> Buffer:
        """``length`` bytes at ``at`` in ``chunk``, in one GET of the `RANDOM_FETCH` pages."""
        start = at - at % RANDOM_FETCH
        end = min(int(chunk.length), -(-(at + length) // RANDOM_FETCH) * RANDOM_FETCH)
        self.gets += 1
        self.range_gets += 1
        data = await self.layer.read(chunk.name, start, end - start)
        if len(data) != end - start:
            raise ChunkCorrupt(
                chunk.name,
                f"[{start}, {end}) has {len(data)} bytes, the chunk record says {end - start}",
            )
        self.bytes_fetched += len(data)
        if (start, end) == (at, at + length):
            return data
        return memoryview(data)[at - start : at - start + length]

    async def _fetch(
        self, chunk: ChunkRecord, index: int, count: int, cache: bool = True
    ) -> list[Buffer]:
        """GET the claimed blocks ``index``..``index+count-1`` in one ranged read.

        Read-ahead passes ``cache=False``: a sequential scan does not go
        through the cache store (scan resistance, like RocksDB's own
        ``fill_cache=false`` for iterators). Writing each scanned MiB to
        RocksDB holds the GIL for the copy and cost a third of the cold
        read rate (bench/tier2.py: 0.52x -> 0.81x of raw GETs without it);
        blocks a reader asks for directly (random reads) are cached.
        """
        keys = [(chunk.name, index + i) for i in range(count)]
        try:
            start = index * BLOCK_SIZE
            end = min(int(chunk.length), (index + count) * BLOCK_SIZE)
            self.gets += 1
            data = await self.layer.read(chunk.name, start, end - start)
            if len(data) != end - start:
                raise ChunkCorrupt(
                    chunk.name,
                    f"[{start}, {end}) has {len(data)} bytes, the chunk record says {end - start}",
                )
            if start == 0 and end == chunk.length and crc32c.crc32c(data) != chunk.crc32c:
                raise ChunkCorrupt(chunk.name, "its CRC32C does not match the chunk record")
            if count == 1:
                blocks: list[Buffer] = [data]
            else:
                # Views, not copies: copying a GET into its blocks took a
                # third of the daemon's time in a cold sequential read
                # (bench/fuse_read.py, py-spy). The blocks keep the GET's
                # buffer alive while any of them is in memory.
                view = memoryview(data)
                blocks = [view[i : i + BLOCK_SIZE] for i in range(0, len(data), BLOCK_SIZE)]
            self.blocks_fetched += count
            self.bytes_fetched += len(data)
            for key, block in zip(keys, blocks, strict=True):
                self._remember(key, block)
            if cache:
                if self._nursery is not None and self._cache_queue_bytes < CACHE_QUEUE_BYTES:
                    self._cache_queue_bytes += len(data)
                    self._nursery.start_soon(self._cache, keys, blocks)
                else:
                    self.cache_writes_skipped += count
            return blocks
        finally:
            for key in keys:
                event = self._inflight.pop(key, None)
                if event is not None:
                    event.set()

    def _remember(self, key: BlockId, data: Buffer) -> None:
        old = self._ready.pop(key, None)
        if old is not None:
            self._ready_bytes -= len(old)
        self._ready[key] = data
        self._ready_bytes += len(data)
        while self._ready_bytes > self._memory_limit:
            _, gone = self._ready.popitem(last=False)
            self._ready_bytes -= len(gone)

    async def _cache(self, keys: list[BlockId], blocks: list[Buffer]) -> None:
        """Keep fetched blocks in the cache store (one writer at a time, off the loop)."""

        def put() -> None:
            for (chunk, index), block in zip(keys, blocks, strict=True):
                self.store.put_block(chunk, index, block)

        try:
            await trio.to_thread.run_sync(put, limiter=self._cache_writes)
        except Exception as e:  # the cache is only a copy
            log.warning("cannot cache blocks of %s: %s", keys[0][0], e)
        finally:
            self._cache_queue_bytes -= sum(len(b) for b in blocks)

    def drop_chunk(self, name: str) -> None:
        """A chunk is gone (truncated, deleted, garbage): forget its blocks in memory."""
        for key in [k for k in self._ready if k[0] == name]:
            self._ready_bytes -= len(self._ready.pop(key))

    def statistics(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        return {
            "blocks_fetched": self.blocks_fetched,
            "bytes_fetched": self.bytes_fetched,
            "blocks_from_memory": self.blocks_from_memory,
            "blocks_from_cache": self.blocks_from_cache,
            "read_ahead_blocks": self.read_ahead_blocks,
            "read_ahead_skipped": self.read_ahead_skipped,
            "gets": self.gets,
            "range_gets": self.range_gets,
            "cache_writes_skipped": self.cache_writes_skipped,
            "memory_bytes": self._ready_bytes,
        }
