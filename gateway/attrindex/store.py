"""`AttributeIndexStore`: segments' attribute indexes on Tier 2, with two cache levels.

Each segment's extended attributes live in an append-only B+tree
(`gateway.attrindex.btree`) written into the segment's *attribute segment*:
a byte space whose pages are in Tier 2 as chunks, one chunk per index batch
(``<node>/attributes/<segment id>/<offset, 20 digits>.e<epoch>.<uuid hex>``).
The container journals where the tree is (`AttributeIndexRecord`); this
module reads and writes pages:

- reads: parsed pages in a shared in-memory `PageCache` (the tree's upper
  levels stay there), raw pages in the RocksDB cache (keyed by chunk name
  and the page's offset in it, so they share the cache budget and its LRU
  with Tier-2 blocks), then a ranged Tier-2 read of exactly the page;
- writes (`write_batch`, for the storage writer): the batch's pages as one
  new object; the caller journals it, then calls `committed`.

Tree work is CPU-bound Python and runs in one worker thread at a time (the
page cache is not shared across threads); Tier-2 reads from that thread go
back to the event loop (`trio.from_thread`) for the retry policy.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import crc32c
import trio

from cache import CacheStore
from gateway.attrindex.btree import Batch, BTree, IndexCorrupt, PageCache, TreeState
from gateway.errors import ChunkNotFound, IndexMoved
from gateway.protocol.metadata_pb2 import AttributeIndexRecord, ChunkRecord
from gateway.storage import object_keys as names
from gateway.storage.layer import ChunkLayer

T = TypeVar("T")

#: Parsed pages kept in memory by default (the seed: a tree's second level of
#: a billion attributes is ~32 MiB).
DEFAULT_PAGE_CACHE = 64 * 1024 * 1024


#: Deleted chunk names remembered (readers holding an older record are brief).
_GONE_KEPT = 10_000
#: Lookups of at most this many ids try the parsed pages on the event loop first.
_INLINE_LOOKUP = 16


class _NotCached(Exception):
    """A page the in-memory cache lacks (the lookup moves to a worker thread)."""


def _not_cached(offset: int, length: int) -> bytes:
    raise _NotCached(offset)


def tree_state(index: AttributeIndexRecord) -> TreeState:
    """The B+tree position an index record holds."""
    return TreeState(index.root_offset, index.root_length, index.length, index.start)


@dataclass
class AttributeIndexStatistics:
    """Counters of an `AttributeIndexStore`."""

    lookups: int
    #: Of ``lookups``: answered from parsed pages on the event loop.
    inline_lookups: int
    ranges: int
    batches: int
    batch_bytes: int
    tier2_page_reads: int
    rocksdb_page_hits: int
    page_cache_hits: int
    page_cache_misses: int


class AttributeIndexStore:
    """Reads and writes attribute indexes in Tier 2 (the container's `AttributeStore`)."""

    def __init__(
        self,
        layer: ChunkLayer,
        node: str,
        cache: CacheStore | None = None,
        page_cache_bytes: int = DEFAULT_PAGE_CACHE,
        cache_writes: bool = True,
    ) -> None:
        self.layer = layer
        self.node = node
        self.cache = cache
        #: False: read the RocksDB cache but never fill it (fsck beside a daemon).
        self.cache_writes = cache_writes
        self.pages = PageCache(page_cache_bytes)
        self._thread = trio.CapacityLimiter(1)
        self.lookups = 0
        #: Lookups answered from parsed pages on the event loop (no thread, no read).
        self.inline_lookups = 0
        self.ranges = 0
        self.batches = 0
        self.batch_bytes = 0
        self.tier2_page_reads = 0
        self.rocksdb_page_hits = 0
        #: Chunks deleted lately (truncated away): a reader with an older
        #: record must neither read them nor cache their pages again.
        self._gone: set[str] = set()
        self._gone_order: deque[str] = deque()

    def tree(self, segment_id: int, index: AttributeIndexRecord, compaction: bool = True) -> BTree:
        """The tree ``index`` describes; its reader runs in a worker thread (`run_in_thread`)."""
        chunks = sorted(index.chunks, key=lambda c: c.start_offset)
        starts = [c.start_offset for c in chunks]

        def read(offset: int, length: int) -> bytes:
            i = bisect.bisect_right(starts, offset) - 1
            if i < 0 or offset + length > chunks[i].start_offset + chunks[i].length:
                raise IndexCorrupt(
                    f"attribute index of segment id {segment_id}: page [{offset}, "
                    f"{offset + length}) lies in no chunk (truncated away?)"
                )
            chunk = chunks[i]
            if chunk.name in self._gone:
                raise IndexMoved(segment_id, chunk.name)
            rel = offset - chunk.start_offset
            if self.cache is not None:
                data = self.cache.get_block(chunk.name, rel)
                if data is not None and len(data) == length:
                    self.rocksdb_page_hits += 1
                    return data
            try:
                data = trio.from_thread.run(self.layer.read, chunk.name, rel, length)
            except ChunkNotFound:
                raise IndexMoved(segment_id, chunk.name) from None
            self.tier2_page_reads += 1
            if len(data) != length:
                raise IndexCorrupt(
                    f"attribute index of segment id {segment_id}: {chunk.name} is short at "
                    f"{rel} (page [{offset}, {offset + length}))"
                )
            if self.cache is not None and self.cache_writes:
                self.cache.put_block(chunk.name, rel, data)
                if chunk.name in self._gone:  # deleted meanwhile: no stale copy stays
                    self.cache.drop_chunk(chunk.name)
            return data

        return BTree(
            tree_state(index), read, cache=self.pages, owner=segment_id, compaction=compaction
        )

    async def lookup(
        self, segment_id: int, index: AttributeIndexRecord, ids: Sequence[bytes]
    ) -> dict[bytes, int]:
        """The values ``index`` holds for ``ids`` (absent ones left out)."""
        self.lookups += 1
        # Warm (every page on the way parsed in memory), a lookup of a few ids
        # takes tens of microseconds: cheaper on the event loop than a thread
        # hop. A page to read sends it to a worker thread.
        if len(ids) <= _INLINE_LOOKUP:
            try:
                found = BTree(
                    tree_state(index), _not_cached, cache=self.pages, owner=segment_id
                ).get(ids)
            except _NotCached:
                pass
            else:
                self.inline_lookups += 1
                return found
        return await self._in_thread(self.tree(segment_id, index).get, list(ids))

    async def range(
        self, segment_id: int, index: AttributeIndexRecord, start: bytes, limit: int
    ) -> list[tuple[bytes, int]]:
        """Entries with ids >= ``start`` in order, at most ``limit`` (0: all)."""
        self.ranges += 1
        return await self._in_thread(self.tree(segment_id, index).range, start, limit)

    async def verify(self, segment_id: int, index: AttributeIndexRecord) -> list[str]:
        """fsck: the problems of one index ([] when it is healthy)."""
        return await self._in_thread(self.tree(segment_id, index).verify)

    async def count(self, segment_id: int, index: AttributeIndexRecord) -> int:
        """How many attributes the index holds (walks every leaf)."""
        return await self._in_thread(self.tree(segment_id, index).count)

    async def write_batch(
        self,
        segment_id: int,
        segment_name: str,
        index: AttributeIndexRecord,
        changes: Mapping[bytes, int | None],
        epoch: int,
        uploading: set[str],
        through: int | None = None,
    ) -> tuple[Batch, ChunkRecord]:
        """Write ``changes`` (None: removed) as one batch of pages in one new object.

        Returns the batch and its chunk for the caller to journal (then
        `committed`); when the tree did not change, the chunk is empty and no
        object is written (the journal record still says the values are
        indexed). The object's key is in
        ``uploading`` from before the upload (GC leaves it alone); the
        caller removes it once the batch is journaled or abandoned.
        ``through``: the journal sequence whose committed values ``changes``
        are (in the object's metadata, for recovery).
        """
        tree = self.tree(segment_id, index)
        batch = await self._in_thread(tree.prepare, dict(changes))
        crc = int(crc32c.crc32c(batch.data))
        key = names.attribute_chunk_key(self.node, segment_id, index.length, epoch)
        chunk = ChunkRecord(
            name=key, start_offset=index.length, length=len(batch.data), crc32c=crc, epoch=epoch
        )
        if batch.data:
            uploading.add(key)
            metadata = names.chunk_metadata(segment_name, index.length, len(batch.data), crc, epoch)
            # The tree after this batch, so that disaster recovery can find
            # the newest tree from the objects alone.
            st = batch.state
            metadata |= names.attribute_index_metadata(
                st.root_offset, st.root_length, st.length, st.start, through
            )
            await self.layer.write(key, batch.data, metadata)
        self.batches += 1
        self.batch_bytes += len(batch.data)
        return batch, chunk

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the one worker thread tree work uses at a time."""
        async with self._thread:
            return await trio.to_thread.run_sync(fn, *args)

    def committed(self, segment_id: int, index: AttributeIndexRecord, batch: Batch) -> None:
        """The batch is journaled: keep its pages parsed (the next batch starts from them)."""
        self.tree(segment_id, index).commit(batch)

    def forget_chunk(self, key: str) -> None:
        """A chunk of an attribute segment was deleted (called before its cache is dropped)."""
        if key in self._gone:
            return
        self._gone.add(key)
        self._gone_order.append(key)
        while len(self._gone_order) > _GONE_KEPT:
            self._gone.discard(self._gone_order.popleft())

    def forget(self, segment_id: int) -> None:
        """The segment is gone: drop its parsed pages."""
        self.pages.drop(segment_id)

    def statistics(self) -> AttributeIndexStatistics:
        """Counters, for metrics and benchmarks."""
        pages = self.pages.statistics()
        return AttributeIndexStatistics(
            lookups=self.lookups,
            inline_lookups=self.inline_lookups,
            ranges=self.ranges,
            batches=self.batches,
            batch_bytes=self.batch_bytes,
            tier2_page_reads=self.tier2_page_reads,
            rocksdb_page_hits=self.rocksdb_page_hits,
            page_cache_hits=pages.get("hits", 0),
            page_cache_misses=pages.get("misses", 0),
        )
