"""Replaying the journal into a segment table: at start, for fsck and for export.

The journal hands every durable operation, in order, to `Replayer.replay`
(from a worker thread: nothing here touches trio). Until the state is known
-- a full checkpoint, or the rolling checkpoint that completes the records of
every live segment (docs/FORMATS.md) -- only where appended bytes lie
matters; from then on, each operation is applied through the same
`SegmentTable` methods the live container uses, so a replay and the live run
cannot disagree.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable
from typing import cast

from cache import CacheStore
from gateway.buffers import Buffer
from gateway.container.segment import Segment
from gateway.container.table import ContainerCorrupt, SegmentTable
from gateway.journal import ReplayResult, replay_journal
from gateway.protocol.journal_pb2 import Operation
from gateway.protocol.metadata_pb2 import (
    AttributeIndexRecord,
    AttributeValue,
    ChunkRecord,
    ContainerSnapshot,
    SegmentRecord,
)
from gateway.read.index import ReadIndex


class Replayer:
    """Rebuilds a segment table's committed view from the journal's operations."""

    def __init__(self, table: SegmentTable) -> None:
        self.table = table
        self.file = 0
        #: Whether the state so far is complete: the journal starts at
        #: sequence 1, or a checkpoint has been loaded.
        self.based = False
        self.first_seq = 0
        #: Sequence of the first checkpoint replayed, and the newest record of each
        #: segment in the rolling checkpoints since (until the state is known).
        self._first_checkpoint = 0
        self._records: dict[int, SegmentRecord] = {}
        #: The records of the pieces of a whole checkpoint read so far, and the
        #: sequence of its first piece.
        self._whole: dict[int, SegmentRecord] | None = None
        self._whole_from = 0
        #: Where the data of the append replayed next lies (`on_data`), if known.
        self._where: tuple[pathlib.Path, int] | None = None

    def on_file(self, first_seq: int) -> None:
        """The operations that follow are in the journal file starting at ``first_seq``."""
        self.file = first_seq

    def on_data(self, path: pathlib.Path, at: int) -> None:
        """The data of the append replayed next lies in ``path`` at ``at``: the read
        index reads it from there instead of copying it into the cache."""
        self._where = (path, at)

    def replay(self, seq: int, op: Operation) -> None:
        """Apply one durable operation."""
        t = self.table
        kind = op.WhichOneof("kind")
        where, self._where = self._where, None
        if not self.first_seq:
            self.first_seq = seq
            self.based = seq == 1
        t.seq = seq
        if kind == "checkpoint":
            self._checkpoint(seq, ContainerSnapshot.FromString(op.checkpoint.snapshot))
            return
        if kind == "append" and not self.based:
            # Before the first checkpoint of a truncated journal: the state is
            # in that checkpoint, but the data (and where it lies) still matters.
            a = op.append
            t.note_file_usage(self.file, a.segment_id, a.offset + len(a.data))
            t.read_index.on_append(a.segment_id, a.offset, a.data, where)
            return
        if not self.based or kind == "epoch_started":
            return
        if kind == "append":
            a = op.append
            seg = self._segment(a.segment_id, seq)
            values = _values(a.attributes)
            t.apply_append(seg, a.offset, a.data, values, a.at_ms, self.file, where)
        elif kind == "create_segment":
            cs = op.create_segment
            if cs.name in t.by_name or cs.segment_id in t.by_id:
                raise ContainerCorrupt(f"sequence {seq} creates {cs.name!r}, which exists")
            seg = Segment(cs.segment_id, cs.name, cs.created_at_ms)
            seg.txn_parent = cs.txn_parent
            seg.txn_deadline_ms = cs.txn_deadline_ms
            t.add(seg)
            t.apply_create(seg, _values(cs.attributes), cs.attributes_from)
        elif kind == "seal_segment":
            s = op.seal_segment
            t.apply_seal(self._segment(s.segment_id, seq), s.at_ms)
        elif kind == "truncate_segment":
            tr = op.truncate_segment
            t.apply_truncate(self._segment(tr.segment_id, seq), tr.offset, tr.at_ms)
        elif kind == "delete_segment":
            d = op.delete_segment
            t.apply_delete(self._segment(d.segment_id, seq), d.txn_timed_out, d.at_ms)
        elif kind == "update_attributes":
            u = op.update_attributes
            values = _values(u.attributes)
            t.apply_attributes(self._segment(u.segment_id, seq), values, u.at_ms)
        elif kind == "chunk_added":
            a2 = op.chunk_added
            # A copy: a sub-message would keep the whole frame's message
            # (appended data included) alive as long as the chunk record.
            chunk = ChunkRecord()
            chunk.CopyFrom(a2.chunk)
            t.apply_chunk_added(self._segment(a2.segment_id, seq), chunk, a2.extends_last)
        elif kind == "storage_sealed":
            t.apply_storage_sealed(self._segment(op.storage_sealed.segment_id, seq))
        elif kind == "merge_segment":
            m = op.merge_segment
            t.apply_merge(
                self._segment(m.target_id, seq),
                self._segment(m.source_id, seq),
                m.offset,
                _values(m.attributes),
                m.at_ms,
            )
        elif kind == "merge_completed":
            mc = op.merge_completed
            t.apply_merge_completed(
                self._segment(mc.target_id, seq), self._segment(mc.source_id, seq)
            )
        elif kind == "attribute_index_updated":
            ai = op.attribute_index_updated
            chunk = ChunkRecord()
            chunk.CopyFrom(ai.chunk)
            state = AttributeIndexRecord(
                root_offset=ai.root_offset,
                root_length=ai.root_length,
                length=ai.length,
                start=ai.start,
            )
            t.apply_attribute_index(self._segment(ai.segment_id, seq), state, chunk, ai.through_seq)
        elif kind == "chunks_replaced":
            cr = op.chunks_replaced
            chunk = ChunkRecord()
            chunk.CopyFrom(cr.chunk)
            t.apply_chunks_replaced(self._segment(cr.segment_id, seq), list(cr.replaced), chunk)
        elif kind == "set_stream":
            t.apply_set_stream(op.set_stream.stream)
        elif kind == "delete_stream":
            t.apply_delete_stream(op.delete_stream.name)
        else:
            raise ContainerCorrupt(f"sequence {seq}: unknown operation kind {kind!r}")

    def _checkpoint(self, seq: int, snap: ContainerSnapshot) -> None:
        """A full checkpoint is the whole state, and so are the pieces of a whole
        one once its last is read; a rolling one adds to the records gathered
        since the first checkpoint of the replay, and once they hold every live
        segment (its ``complete_from`` is among them) they are the state. Once
        the state is known, later checkpoints repeat what the replayed
        operations did, and are skipped."""
        t = self.table
        if not self._first_checkpoint:
            self._first_checkpoint = seq
        if not snap.partial:
            t.load_snapshot(snap)
            t.complete_from = seq
            self._records = {}
            self._based_here()
            return
        if not 0 <= snap.complete_from <= seq or snap.piece > snap.whole_pieces:
            raise ContainerCorrupt(
                f"sequence {seq}: a rolling checkpoint complete from {snap.complete_from}, "
                f"piece {snap.piece} of {snap.whole_pieces}"
            )
        if snap.complete_from:
            t.complete_from = snap.complete_from
        if snap.whole_pieces:
            self._whole_piece(seq, snap)
            return
        if self.based:
            return
        records = self._records
        for r in snap.segments:
            records[r.id] = r
        for segment_id in snap.deleted_ids:
            records.pop(segment_id, None)
        if snap.complete_from and snap.complete_from >= self._first_checkpoint:
            t.load_snapshot(snap, records.values())
            self._records = {}
            self._based_here()

    def _whole_piece(self, seq: int, snap: ContainerSnapshot) -> None:
        """A piece of a whole checkpoint: once all its pieces were read, one right
        after the other, their records are the state -- as a whole checkpoint's
        are, even where the state was known before (a journal that an import
        began holds nothing else)."""
        if snap.piece == 1:
            self._whole = {}
            self._whole_from = seq
        elif self._whole is None or seq != self._whole_from + snap.piece - 1:
            self._whole = None  # its first pieces are not in this replay: no use
            return
        self._whole.update((r.id, r) for r in snap.segments)
        if snap.piece < snap.whole_pieces:
            return
        self.table.complete_from = self._whole_from
        self.table.load_snapshot(snap, self._whole.values())
        self._records = {}
        self._whole = None
        self._based_here()

    def _based_here(self) -> None:
        """The state is known from here on. The read index holds every append
        replayed before; the live node had let go of those that were flushed or
        truncated away by then, and what later operations find there (a
        truncation's first event) must be the same."""
        self.based = True
        index = self.table.read_index
        for seg in self.table.by_id.values():
            if index.holds(seg.id):  # (a cold segment stays cold otherwise)
                index.on_truncate(seg.id, seg.start_offset)
                index.on_flushed(seg.id, seg.storage_length)

    def _segment(self, segment_id: int, seq: int) -> Segment:
        seg = self.table.by_id.get(segment_id)
        if seg is None:
            raise ContainerCorrupt(f"sequence {seq} refers to unknown segment id {segment_id}")
        return seg

    def finish(self, check: bool = True) -> None:
        """End the replay; ``check=False`` leaves the invariants to the caller (fsck)."""
        if self.first_seq and not self.based:
            raise ContainerCorrupt(
                f"the journal starts at sequence {self.first_seq} without a checkpoint"
            )
        self.table.settle_replayed(check)


def _values(attributes: Iterable[AttributeValue]) -> dict[bytes, int | None]:
    """Journaled attribute values (a removal is None)."""
    return {v.id: None if v.removed else v.value for v in attributes}


class _DiscardedData:
    """Stands in for the cache store when only metadata is wanted: drops append data."""

    def put_append(self, segment_id: int, offset: int, data: Buffer) -> None:
        """Nothing to keep."""

    def unpin_appends(self, segment_id: int, below: int) -> int:
        """Nothing was kept."""
        return 0

    def drop_segment(self, segment_id: int) -> int:
        """Nothing was kept."""
        return 0


def replay_metadata(journal_dir: pathlib.Path) -> tuple[ContainerSnapshot, int]:
    """The committed metadata a journal holds, and the highest epoch in it (blocking).

    For ``export-metadata --offline``: the journal is replayed exactly as a
    starting node replays it, but read-only (no lock, no repair: a torn tail
    is simply where the replay stops, as in ``journal-dump``) and without
    keeping append data. Raises JournalCorrupt or ContainerCorrupt.
    """
    table, result = _replay_read_only(journal_dir, check=True)
    return table.committed_snapshot(), result.max_epoch


def replay_for_fsck(journal_dir: pathlib.Path) -> SegmentTable:
    """The committed view a journal holds, for fsck to inspect (blocking).

    Replayed as `replay_metadata` does, but the invariants are not checked,
    so that fsck can report every violation rather than stop at the first;
    the read index still tells which bytes the journal holds. Raises
    JournalCorrupt or ContainerCorrupt (an operation that does not apply).
    """
    return _replay_read_only(journal_dir, check=False)[0]


def _replay_read_only(journal_dir: pathlib.Path, check: bool) -> tuple[SegmentTable, ReplayResult]:
    store = cast(CacheStore, _DiscardedData())
    table = SegmentTable(ReadIndex(store))
    replayer = Replayer(table)
    result = replay_journal(journal_dir, replayer.replay, False, replayer.on_file)
    replayer.finish(check=check)
    return table, result
