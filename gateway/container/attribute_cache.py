"""The attribute cache: segments' extended attribute values held in memory.

A segment keeps its core attributes and the extended values not yet in its
attribute index in memory; values already indexed are loaded from the index
(in Tier 2, through an `AttributeStore`) when an operation conditions on them
or a client reads them, and evicted again, oldest loaded first, to stay
within ``container.max_attributes`` (Pravega's attribute pipeline).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence

from gateway.container.attributes import CODEC, EVENT_COUNT, EVENT_END, check_id, is_core
from gateway.container.interfaces import AttributeStore
from gateway.container.operations import OperationQueue
from gateway.container.segment import Segment
from gateway.errors import IndexMoved, LimitExceeded, Overloaded, SegmentNotFound, Unavailable

#: The core attributes there are (they count against ``max_attributes``).
CORE_IDS = (EVENT_COUNT, CODEC, EVENT_END)


class AttributeCache:
    """Loads attribute values from the attribute index, evicts them, and bounds memory."""

    def __init__(self, queue: OperationQueue) -> None:
        self._queue = queue
        self._table = queue.table
        #: Reads attribute indexes in Tier 2 (set with the storage writer).
        self.store: AttributeStore | None = None
        #: Extended attribute values read from attribute indexes, and evicted.
        self.loaded = 0
        self.evicted = 0

    @property
    def _limit(self) -> int:
        return self._queue.config.max_attributes

    async def get(self, name: str, ids: Iterable[bytes] = ()) -> dict[bytes, int]:
        """Committed attribute values (all, or those of ``ids`` that exist).

        Waits first until every operation submitted before this call has
        settled, so a writer reconnecting after a broken connection sees the
        outcome of all its earlier appends.
        """
        await self._queue.wait_settled()
        seg = self._holder(name)
        if seg is None:
            return {}
        wanted = list(ids)
        for i in wanted:
            check_id(name, i, client=False)
        if not wanted:
            return dict(await self.range(name, b"", 0))
        seg = await self._loaded(seg, wanted)
        found = {i: seg.attributes.get(i) for i in wanted}
        return {i: v for i, v in found.items() if v is not None}

    def _holder(self, name: str) -> Segment | None:
        """The segment whose attributes ``name`` answers with (None: an empty stream)."""
        stream = self._table.streams.get(name)
        if stream is None or not stream.durable:
            return self._queue.committed(name)
        # A stream's writers: the newest segment carries their event numbers.
        members = stream.committed_members()
        return members[-1] if members else None

    async def _loaded(self, seg: Segment, ids: Sequence[bytes]) -> Segment:
        """``seg`` once memory holds the values of ``ids`` (no await after it returns)."""
        while seg.missing_attributes(ids):
            await self.load(seg.name, ids)
            now = self._table.by_name.get(seg.name)
            if now is None or now is not seg:
                raise SegmentNotFound(seg.name)
        return seg

    async def load(self, name: str, ids: Sequence[bytes]) -> None:
        """Bring the values of ``ids`` from the segment's attribute index into memory.

        The prefetch before an operation that conditions on them (Pravega's
        attribute pipeline): a value already in memory is never overwritten
        by the index's older one, and a lookup that overlapped an eviction
        (whose value it may predate) looks again.
        """
        while True:
            seg = self._table.by_name.get(name)
            if seg is None:
                return
            missing = seg.missing_attributes(ids)
            if not missing:
                return
            if self.store is None:
                raise Unavailable(f"the attribute index of {name!r} is in Tier 2, which is off")
            assert seg.attr_index is not None
            evictions = seg.attr_evictions
            where = seg.attr_index.length
            # The store takes what it needs of the record before it awaits.
            try:
                found = await self.store.lookup(seg.id, seg.attr_index, missing)
            except IndexMoved:
                if seg.attr_index is None or seg.attr_index.length == where:
                    raise  # not moved on: a chunk really is missing
                continue
            if self._table.by_name.get(name) is not seg or seg.attr_evictions != evictions:
                continue
            seg.load_attributes({k: found.get(k) for k in missing})
            self.loaded += len(missing)
            # All of the caller's ids stay, loaded now or before (memory may
            # exceed the limit by one request's ids until the next eviction).
            self.evict(seg, keep=ids)
            return

    def evict(self, seg: Segment, keep: Sequence[bytes] = ()) -> None:
        """Keep the segment's attributes in memory within ``container.max_attributes``.

        ``keep``: values just loaded for a waiting caller, which must find them.
        """
        limit = self._limit
        if len(seg.attributes) > limit:
            # Oldest loaded first, down to 7/8 of the limit: one pass over
            # the values now and then, not one per value loaded.
            self.evicted += seg.evict_attributes(limit - limit // 8, set(keep))

    async def range(
        self, name: str, start: bytes = b"", limit: int = 0
    ) -> builtins.list[tuple[bytes, int]]:
        """Attributes with ids >= ``start`` in id order (core ones first), at most ``limit``.

        Memory's committed values (core, not yet indexed, cached) over the
        index's; 0 = no limit.
        """
        await self._queue.wait_settled()
        seg = self._holder(name)
        if seg is None:
            return []
        out: builtins.list[tuple[bytes, int]] = []
        index_items: builtins.list[tuple[bytes, int]] = []
        index = seg.attr_index
        want = 0
        if index is not None and index.root_length:
            if self.store is None:
                raise Unavailable(f"the attribute index of {name!r} is in Tier 2, which is off")
            # Removed ids still in memory hide index entries: ask for that many more.
            hidden = sum(1 for v in seg.attributes.values() if v is None)
            want = limit + hidden if limit else 0
            for attempt in range(10):
                where = index.length
                try:
                    index_items = await self.store.range(seg.id, index, start, want)
                except IndexMoved:
                    # Look again with the record as it is now, unless it did
                    # not move (a chunk is really missing) or keeps moving.
                    if seg.attr_index is not index or index.length == where or attempt == 9:
                        raise
                    continue
                if seg.attr_index is index and index.length == where:
                    break
                # A batch went into the index while it was read: values it took
                # from memory may be evicted now and in the new index only (a
                # writer's second event read back as its first, under load).
                # Read the index as it is now.
                if attempt == 9:
                    raise Unavailable(f"the attribute index of {name!r} keeps moving; retry")
                if seg.attr_index is None or not seg.attr_index.root_length:
                    index_items = []
                    break
                index = seg.attr_index
            if self._table.by_name.get(seg.name) is not seg:
                raise SegmentNotFound(seg.name)
        merged: dict[bytes, int | None] = dict(index_items)
        # Unless the index gave everything from ``start`` on, memory's values
        # past its last answer cannot be placed among the index's.
        complete = not want or len(index_items) < want
        upper = None if complete else index_items[-1][0]
        for k, v in seg.attributes.items():
            if k >= start and (upper is None or k <= upper):
                merged[k] = v
        for k in sorted(merged):
            v = merged[k]
            if v is not None:
                out.append((k, v))
        return out[:limit] if limit else out

    def check_room(self, seg: Segment, values: Mapping[bytes, int | None]) -> None:
        """Refuse changes memory cannot hold until the attribute index takes some.

        Extended values not yet indexed stay in memory; ``max_attributes``
        bounds them. With Tier 2 the storage writer indexes them soon (the
        caller is told Overloaded, to retry); without it nothing can.
        """
        new_ids = sum(
            1
            for k in values
            if not is_core(k) and k not in seg.attr_dirty and k not in seg.p_attributes
        )
        if not new_ids:
            return
        core = sum(1 for k in CORE_IDS if k in seg.attributes or k in values)
        if core + seg.extended_in_memory() + new_ids <= self._limit:
            return
        limit = self._limit
        storage = self._queue.storage
        if storage is not None and not seg.hidden:
            storage.on_attributes(seg)
            raise Overloaded(
                f"segment {seg.name!r} has {seg.extended_in_memory()} attribute changes "
                f"waiting for its attribute index (container.max_attributes = {limit})"
            )
        raise LimitExceeded(f"segment {seg.name!r} would have more than {limit} attributes")
