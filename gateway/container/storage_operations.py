"""The storage writer's operations: what it moved to Tier 2, journaled.

The storage writer (`gateway.tier2.storage_writer`) uploads chunks and
attribute index batches, then records each here: a chunk added, a merged
source's chunks re-referenced by its target, an index batch, a sealed
segment whose bytes are all in Tier 2. These are the node's own bookkeeping
(``internal``: not under the lease) and change what the pending view does not
carry (``storage``: a checkpoint waits for them to apply). Each is
``reserved`` in the journal: recording Tier-2 progress is what lets the
journal shrink when its disk is full.
"""

from __future__ import annotations

from gateway import failpoints
from gateway.container.attribute_cache import AttributeCache
from gateway.container.operations import OperationQueue, PendingOperation
from gateway.errors import SegmentNotFound
from gateway.protocol.journal_pb2 import (
    AttributeIndexUpdated,
    ChunkAdded,
    ChunksReplaced,
    MergeCompleted,
    Operation,
    StorageSealed,
)
from gateway.protocol.metadata_pb2 import AttributeIndexRecord, ChunkRecord


def _bookkeeping(pending: PendingOperation) -> PendingOperation:
    pending.storage = True
    pending.internal = True
    return pending


class StorageOperations:
    """Prepares the operations that record Tier-2 progress."""

    def __init__(self, queue: OperationQueue, attributes: AttributeCache) -> None:
        self._queue = queue
        self._table = queue.table
        self._attributes = attributes

    def prepare_merge_completed(self, target_id: int, source_id: int) -> PendingOperation:
        """Re-reference a merged source's chunks as the target's (the storage writer)."""
        q = self._queue
        q.start(change=False)
        target = q.pending_by_id(target_id)
        source = self._table.by_id.get(source_id)
        if source is None or source.p_deleted:
            raise SegmentNotFound(f"segment id {source_id}")
        op = Operation(merge_completed=MergeCompleted(target_id=target_id, source_id=source_id))
        ticket = q.submit((op.SerializeToString(),), reserved=True)
        # Gone once this applies: nothing may be journaled for it after.
        source.p_deleted = True
        q.dirty.add(source)

        def apply(seq: int) -> None:
            dropped = self._table.apply_merge_completed(target, source)
            failpoints.hit("after_merge_completed")
            q.signal_pinned_freed()
            if q.storage is not None:
                q.storage.on_merged(target, source)
                if dropped:
                    q.storage.on_dropped(target, dropped, deleted=False)

        return _bookkeeping(q.track(ticket, None, apply, target))

    def prepare_chunk_added(
        self, segment_id: int, chunk: ChunkRecord, extends_last: bool
    ) -> PendingOperation:
        """Record an uploaded chunk (result: whether it was added; False if truncated away)."""
        q = self._queue
        q.start(change=False)
        seg = q.pending_by_id(segment_id)
        op = Operation(
            chunk_added=ChunkAdded(segment_id=segment_id, chunk=chunk, extends_last=extends_last)
        )
        # Reserved: recording Tier-2 progress is what lets the journal shrink.
        ticket = q.submit((op.SerializeToString(),), reserved=True)
        added: list[bool] = []

        def apply(seq: int) -> None:
            added.append(self._table.apply_chunk_added(seg, chunk, extends_last))
            q.signal_pinned_freed()

        pending = _bookkeeping(q.track(ticket, None, apply, seg))
        return pending._with_result(lambda: added[0])

    def prepare_chunks_replaced(
        self, segment_id: int, replaced: list[str], chunk: ChunkRecord
    ) -> PendingOperation:
        """Swap merged chunks for their merge (the storage optimizer).

        Result: the replaced records (garbage once GC's grace is over), or
        None when the swap did not apply (``chunk``'s object is garbage).
        """
        q = self._queue
        q.start(change=False)
        seg = q.pending_by_id(segment_id)
        op = Operation(
            chunks_replaced=ChunksReplaced(segment_id=segment_id, replaced=replaced, chunk=chunk)
        )
        # Reserved like every Tier-2 record: it shrinks checkpoints, never grows the journal's need.
        ticket = q.submit((op.SerializeToString(),), reserved=True)
        result: list[list[ChunkRecord] | None] = []

        def apply(seq: int) -> None:
            result.append(self._table.apply_chunks_replaced(seg, replaced, chunk))
            failpoints.hit("after_chunks_replaced")

        pending = _bookkeeping(q.track(ticket, None, apply, seg))
        return pending._with_result(lambda: result[0])

    def prepare_attribute_index_updated(
        self, segment_id: int, state: AttributeIndexRecord, chunk: ChunkRecord, through_seq: int
    ) -> PendingOperation:
        """Record an uploaded index batch (result: whether it applied; False: garbage)."""
        q = self._queue
        q.start(change=False)
        seg = q.pending_by_id(segment_id)
        op = Operation(
            attribute_index_updated=AttributeIndexUpdated(
                segment_id=segment_id,
                root_offset=state.root_offset,
                root_length=state.root_length,
                length=state.length,
                start=state.start,
                chunk=chunk,
                through_seq=through_seq,
            )
        )
        # Reserved: it lets memory and the journal shed attribute values.
        ticket = q.submit((op.SerializeToString(),), reserved=True)
        applied: list[bool] = []

        def apply(seq: int) -> None:
            dropped = self._table.apply_attribute_index(seg, state, chunk, through_seq)
            applied.append(chunk not in dropped)
            if dropped and q.storage is not None:
                q.storage.on_dropped(seg, dropped, deleted=False)
            self._attributes.evict(seg)

        pending = _bookkeeping(q.track(ticket, None, apply, seg))
        return pending._with_result(lambda: applied[0])

    def prepare_storage_sealed(self, segment_id: int) -> PendingOperation:
        """Mark a sealed segment whose bytes are all in Tier 2 as sealed there too."""
        q = self._queue
        q.start(change=False)
        seg = q.pending_by_id(segment_id)
        op = Operation(storage_sealed=StorageSealed(segment_id=segment_id))
        ticket = q.submit((op.SerializeToString(),), reserved=True)

        def apply(seq: int) -> None:
            self._table.apply_storage_sealed(seg)

        return _bookkeeping(q.track(ticket, None, apply, seg))
