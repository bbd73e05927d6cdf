"""The segment table: every segment's metadata and the changes that apply to it.

Each change to the committed view is written once, here, and used both when
a live operation becomes durable (`gateway.container.container`) and when a
replay of the journal repeats it (`gateway.container.replayer`). The table
also knows which journal file holds which segment's appended bytes, which is
what decides how far the journal may be truncated, and it reads and writes
the checkpoint snapshot (`ContainerSnapshot`).

The table keeps the read index in step with the metadata (an append's bytes
are indexed when it is applied); it knows nothing of the journal itself, of
Tier 2 or of waiting.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import pathlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from sortedcontainers import SortedDict

from gateway.buffers import Buffer
from gateway.container.attributes import EVENT_END
from gateway.container.largest import LargestSegments
from gateway.container.outcomes import TransactionOutcomes
from gateway.container.segment import Segment, blocks, coolable_record
from gateway.container.streams import Stream, split_member
from gateway.errors import GatewayError
from gateway.protocol.codec import Codec
from gateway.protocol.metadata_pb2 import (
    TXN_ABORTED,
    TXN_COMMITTED,
    TXN_TIMED_OUT,
    AttributeIndexRecord,
    ChunkRecord,
    ContainerSnapshot,
    SegmentRecord,
    StreamRecord,
    TransactionOutcomeRecord,
)
from gateway.read.index import ReadIndex

#: The ContainerSnapshot format version this code writes and reads (the
#: journal's checkpoints and, inside a MetadataSnapshot, Tier 2's).
SNAPSHOT_VERSION = 1
#: Deletions remembered for `SegmentTable.changed_since` (followers further
#: behind list the node in full).
KEEP_DELETIONS = 100_000
#: About one event-boundary index entry per this many bytes of a segment.
EVENT_INDEX_SPACING = 1024 * 1024


class ContainerCorrupt(GatewayError):
    """container metadata in the journal is inconsistent: {}. Run `segment-gateway fsck`"""

    exit_code = 3


class SegmentTable:
    """Segments by name (including pending creates) and by id, over a read index."""

    def __init__(self, read_index: ReadIndex) -> None:
        self.read_index = read_index
        #: In name order: a listing is a range of it (`names_from`).
        self.by_name: SortedDict[str, Segment] = SortedDict()
        self.by_id: dict[int, Segment] = {}
        #: Name -> the segments a pending create took the name from while their
        #: deletions were in flight, oldest first (`add`): the committed view
        #: still has the one whose deletion did not apply yet (`committed_named`),
        #: and a refused deletion gives the name back (`remove`).
        self.replaced: dict[str, list[Segment]] = {}
        self.next_id = 1
        #: Journal file (first sequence number) -> segment id -> end offset of
        #: that segment's last append in the file. Decides journal truncation.
        self.file_usage: dict[int, dict[int, int]] = {}
        #: Streams by name (pending creates included).
        self.streams: dict[str, Stream] = {}
        #: Transaction segments (merged ones too, until their merge is done).
        self.transactions: set[Segment] = set()
        #: How finished transactions ended (committed view; checkpointed).
        self.outcomes = TransactionOutcomes()
        #: Journal sequence of the operation being applied (set by the caller:
        #: the container, or a replay); attribute changes are tagged with it.
        self.seq = 0
        #: Live segment id -> journal sequence of its last committed change,
        #: in the order of those changes (a change moves the id to the end),
        #: so what changed since a sequence is a walk back from the end
        #: (`changed_since`). Only changes after `changes_floor` are here.
        self.changes: dict[int, int] = {}
        #: Deleted segment id -> (journal sequence of the deletion, name), oldest
        #: first; the oldest go beyond `KEEP_DELETIONS` (`changes_floor` rises).
        self.deletions: dict[int, tuple[int, str]] = {}
        #: `changed_since` answers for sequences at or after this one only: the
        #: state was loaded whole there (a checkpoint), or deletions were dropped.
        self.changes_floor = 0
        #: Live segments (committed, not deleted), and how many of them are
        #: sealed, kept as segments come and go (metrics read them per scrape).
        self.live_count = 0
        self.sealed_count = 0
        #: 4 KiB blocks of the live segments (each length rounded up), for the
        #: mount's statfs (as ``du`` counts them).
        self.total_blocks = 0
        #: The longest segments, kept as lengths change (the status page).
        self.largest = LargestSegments()
        #: The journal sequence from which on the journal's checkpoints hold every
        #: live segment (`ContainerSnapshot.complete_from`), as a replay found it;
        #: None if unknown (then the next checkpoint is a full one).
        self.complete_from: int | None = None

    # -- membership ----------------------------------------------------------------

    def touch(self, seg: Segment) -> None:
        """The segment's committed view changes (at `seq`); a cold one warms first."""
        seg.warm()
        changes = self.changes
        changes.pop(seg.id, None)
        changes[seg.id] = self.seq

    def changed_since(self, seq: int) -> tuple[list[Segment], list[tuple[int, str]]] | None:
        """Segments changed and (id, name) of those deleted after journal sequence
        ``seq``, newest first; None if that is older than `changes_floor`."""
        if seq < self.changes_floor:
            return None
        changed = []
        for segment_id in reversed(self.changes):
            if self.changes[segment_id] <= seq:
                break
            changed.append(self.by_id[segment_id])
        deleted = []
        for segment_id in reversed(self.deletions):
            at, name = self.deletions[segment_id]
            if at <= seq:
                break
            deleted.append((segment_id, name))
        return changed, deleted

    def _note_deletion(self, seg: Segment) -> None:
        self.changes.pop(seg.id, None)
        self.deletions[seg.id] = (self.seq, seg.name)
        if len(self.deletions) > KEEP_DELETIONS:
            oldest = next(iter(self.deletions))
            self.changes_floor = max(self.changes_floor, self.deletions.pop(oldest)[0])

    def add(self, seg: Segment) -> None:
        """A new segment (pending until its create is durable); one whose name is
        still held by a segment being deleted takes the name over (`replaced`)."""
        old = self.by_name.get(seg.name)
        if old is not None and old is not seg and old.p_deleted:
            self.replaced.setdefault(seg.name, []).append(old)
        self.by_name[seg.name] = seg
        self.by_id[seg.id] = seg
        self.next_id = max(self.next_id, seg.id + 1)
        if seg.txn_parent:
            self.transactions.add(seg)
        stream = self.stream_of(seg.name)
        if stream is not None:
            stream[0].add_member(seg, stream[1])

    def remove(self, seg: Segment) -> None:
        """Forget the segment (deleted, or its create was refused)."""
        gone = self.replaced.get(seg.name)
        if self.by_name.get(seg.name) is seg:
            del self.by_name[seg.name]
            if gone:  # a refused create: the name goes back to the segment it took it from
                self.by_name[seg.name] = gone.pop()
        elif gone and seg in gone:
            gone.remove(seg)
        if gone is not None and not gone:
            del self.replaced[seg.name]
        if self.by_id.pop(seg.id, None) is not None and seg.durable:
            self.live_count -= 1
            self.sealed_count -= seg.sealed
            self.total_blocks -= blocks(seg.length)
            self._note_deletion(seg)
        self.largest.removed(seg.id)
        self.transactions.discard(seg)
        stream = self.stream_of(seg.name)
        if stream is not None and seg in stream[0].members:
            stream[0].members.remove(seg)

    def stream_of(self, name: str) -> tuple[Stream, int] | None:
        """The stream whose segment ``name`` is, and its number there."""
        member = split_member(name)
        if member is None:
            return None
        stream = self.streams.get(member[0])
        return None if stream is None else (stream, member[1])

    def names_from(self, prefix: str, start_after: str = "") -> Iterator[str]:
        """Names starting with ``prefix`` and above ``start_after``, in order (pending
        creates included), without looking at any other name."""
        low = max(prefix, start_after)
        # ``low`` itself is wanted unless it is ``start_after``.
        for name in self.by_name.irange(minimum=low, inclusive=(prefix > start_after, True)):
            if not name.startswith(prefix):
                return
            yield name

    def committed(self) -> Iterator[Segment]:
        """Every committed live segment."""
        replaced = (s for same in self.replaced.values() for s in same if s.durable)
        return itertools.chain((s for s in self.by_name.values() if s.durable), replaced)

    def committed_named(self, name: str) -> Segment | None:
        """The segment of the committed view named ``name`` if any (else the pending
        one, or None): one being deleted while its name went to a pending create."""
        seg = self.by_name.get(name)
        if seg is not None and not seg.durable and name in self.replaced:
            return next((s for s in self.replaced[name] if s.durable), seg)
        return seg

    # -- changes to the committed view ---------------------------------------------

    def apply_create(
        self, seg: Segment, values: Mapping[bytes, int | None], attributes_from: int = 0
    ) -> None:
        """The segment's create is durable (``attributes_from``: a predecessor's id)."""
        seg.durable = True
        self.live_count += 1
        self.touch(seg)
        seg.commit_attributes(values, self.seq)
        pred = self.by_id.get(attributes_from) if attributes_from else None
        if pred is not None:
            seg.attr_index = pred.give_attributes()
            self.touch(pred)
        stream = self.stream_of(seg.name)
        if stream is not None:
            record = stream[0].record
            record.next_number = max(record.next_number, stream[1] + 1)

    def apply_append(
        self,
        seg: Segment,
        offset: int,
        data: Buffer,
        values: Mapping[bytes, int | None],
        at_ms: int,
        file: int,
        where: tuple[pathlib.Path, int] | None = None,
    ) -> None:
        """An append landed in journal file ``file``: grow the segment, index the bytes.

        ``where``: the path of that file and where the data lies in it, if known
        (the read index then reads it from there rather than keeping a copy).
        """
        self.touch(seg)
        if offset != seg.length:
            raise ContainerCorrupt(
                f"append to segment {seg.name!r} at offset {offset}, but its length is {seg.length}"
            )
        end = offset + len(data)
        self.total_blocks += blocks(end) - blocks(offset)
        seg.length = end
        if not seg.txn_parent:
            self.largest.grew(seg.id, end)
        index = seg.event_index
        if (not index or offset - index[-1] >= EVENT_INDEX_SPACING) and (
            seg.codec is not Codec.LINES or seg.core(EVENT_END) == offset
        ):
            # A lines segment's appends may cut lines: only an append that
            # starts just past a newline starts an event.
            index.append(offset)
        seg.commit_attributes(values, self.seq)
        seg.last_modified_ms = at_ms
        self.note_file_usage(file, seg.id, end)
        self.read_index.on_append(seg.id, offset, data, where)

    def note_file_usage(self, file: int, segment_id: int, end: int) -> None:
        """Journal file ``file`` holds the segment's bytes up to ``end``."""
        usage = self.file_usage.get(file)
        if usage is None:
            usage = self.file_usage[file] = {}
        usage[segment_id] = end

    def apply_seal(self, seg: Segment, at_ms: int) -> None:
        """The segment is sealed: its length is final."""
        self.touch(seg)
        self.sealed_count += not seg.sealed
        seg.sealed = True
        seg.last_modified_ms = at_ms
        self.read_index.on_change(seg.id)

    def apply_truncate(self, seg: Segment, offset: int, at_ms: int) -> list[ChunkRecord]:
        """Raise the start offset; returns the chunks now wholly below it (garbage)."""
        self.touch(seg)
        seg.start_offset = max(seg.start_offset, offset)
        seg.last_modified_ms = at_ms
        index = seg.event_index
        del index[: bisect.bisect_left(index, seg.start_offset)]
        if not index or index[0] != seg.start_offset:
            # Readers (the trimmed view, the segments sources) start at the
            # first indexed boundary at or after the start offset: index the
            # first one the cached appends show, or up to a MiB of events
            # after it would be out of their reach.
            first = (
                seg.start_offset
                if self._is_boundary(seg, seg.start_offset)
                else self.read_index.first_event_at_or_after(
                    seg.id, seg.start_offset, seg.codec is Codec.LINES
                )
            )
            if first is not None and first < seg.length and (not index or first < index[0]):
                index.insert(0, first)
        # Bytes below the start offset never need flushing.
        seg.storage_length = max(seg.storage_length, seg.start_offset)
        n = 0
        while n < len(seg.chunks) and seg.chunks[n].start_offset + seg.chunks[n].length <= offset:
            n += 1
        dropped = list(seg.chunks[:n])
        del seg.chunks[:n]  # in place: readers hold the list
        self.read_index.on_truncate(seg.id, seg.start_offset)
        return dropped

    def _is_boundary(self, seg: Segment, offset: int) -> bool:
        """Whether ``offset`` is known to be where an append starts or ends.

        Known: the committed length, the ends of chunks (a flush uploads up
        to a length, which is an append's end) and the appends still in the
        read index. Other offsets may be boundaries too; nobody can tell
        without the data.
        """
        if seg.codec is Codec.LINES:
            # Appends may cut lines: an append's end is a line's end only
            # if it ends with a newline (known while its bytes are cached).
            return (
                offset == seg.core(EVENT_END) or self.read_index.byte_before(seg.id, offset) == 0x0A
            )
        if offset == seg.length:
            return True
        if any(c.start_offset == offset or c.start_offset + c.length == offset for c in seg.chunks):
            return True
        return self.read_index.is_entry_boundary(seg.id, offset)

    def apply_chunk_added(self, seg: Segment, chunk: ChunkRecord, extends_last: bool) -> bool:
        """Add (or grow) a chunk; False if it lies wholly below the storage length.

        A chunk that grew while a truncation dropped its old record is added
        as a new one: its object holds the bytes, and the storage writer does
        not delete objects that a segment names.
        """
        self.touch(seg)
        end = chunk.start_offset + chunk.length
        if end > seg.length:
            raise ContainerCorrupt(
                f"chunk {chunk.name!r} of {seg.name!r} ends at {end}, past the length {seg.length}"
            )
        if extends_last and seg.chunks and seg.chunks[-1].name == chunk.name:
            seg.chunks[-1] = chunk
        elif end <= seg.storage_length:
            return False
        elif chunk.start_offset > seg.storage_length:
            raise ContainerCorrupt(
                f"chunk {chunk.name!r} of {seg.name!r} starts at {chunk.start_offset}, "
                f"past the storage length {seg.storage_length}"
            )
        else:
            seg.chunks.append(chunk)
        seg.storage_length = max(seg.storage_length, end)
        self.read_index.on_flushed(seg.id, seg.storage_length)
        return True

    def apply_chunks_replaced(
        self, seg: Segment, replaced: Sequence[str], chunk: ChunkRecord
    ) -> list[ChunkRecord] | None:
        """Swap a run of adjacent chunks for one merged chunk (the storage optimizer).

        Only if the segment still holds exactly the chunks named ``replaced``,
        adjacent and in order, covering exactly ``chunk``'s range; returns the
        replaced records (their objects are garbage now), or None when it
        does not apply (a truncation, delete or merge came between: then
        ``chunk``'s object is the garbage).
        """
        chunks = seg.chunks
        if not replaced:
            return None
        first = next((i for i, c in enumerate(chunks) if c.name == replaced[0]), None)
        if first is None or first + len(replaced) > len(chunks):
            return None
        run = chunks[first : first + len(replaced)]
        end = chunk.start_offset
        for c, name in zip(run, replaced, strict=True):
            if c.name != name or c.start_offset != end:
                return None
            end = c.start_offset + c.length
        if run[0].start_offset != chunk.start_offset or end != chunk.start_offset + chunk.length:
            return None
        self.touch(seg)
        chunks[first : first + len(replaced)] = [chunk]  # in place: readers hold the list
        return run

    def apply_storage_sealed(self, seg: Segment) -> None:
        """Every byte of the sealed segment is in Tier 2."""
        self.touch(seg)
        seg.sealed_in_storage = True

    def apply_delete(
        self, seg: Segment, txn_timed_out: bool = False, at_ms: int = 0
    ) -> list[Segment]:
        """The segment is gone, and its bytes with it; returns every segment removed.

        A target's merged sources that wait for their Tier-2 merge go with it.
        A transaction's delete is its abort (``txn_timed_out``: for its
        deadline), recorded in `outcomes` as of ``at_ms``.
        """
        if seg.txn_parent:
            self.outcomes.add(
                TransactionOutcomeRecord(
                    name=seg.name,
                    parent=seg.txn_parent,
                    outcome=TXN_TIMED_OUT if txn_timed_out else TXN_ABORTED,
                    at_ms=at_ms or seg.last_modified_ms,
                )
            )
        removed = [*seg.merges, seg]
        seg.merges = []
        for s in removed:
            self.remove(s)
            self.read_index.on_delete(s.id)
        return removed

    def apply_merge(
        self,
        target: Segment,
        source: Segment,
        offset: int,
        values: Mapping[bytes, int | None],
        at_ms: int,
    ) -> None:
        """The sealed ``source`` is appended to ``target`` at ``offset`` (its length)."""
        self.touch(target)
        self.touch(source)
        if offset != target.length or not source.sealed or source.merged_into:
            raise ContainerCorrupt(
                f"merge of {source.name!r} into {target.name!r} at {offset}: the target's "
                f"length is {target.length}, the source sealed={source.sealed}, "
                f"merged into id {source.merged_into}"
            )
        if target.sealed:
            raise ContainerCorrupt(f"merge into {target.name!r}, which is sealed")
        target.length = offset + source.length
        self.total_blocks += blocks(target.length) - blocks(offset)
        self.largest.grew(target.id, target.length)
        index = target.event_index
        if source.length > source.start_offset:
            if not index or index[-1] != offset:
                index.append(offset)
            index.extend(offset + e for e in source.event_index if e > 0)
        target.commit_attributes(values, self.seq)
        target.last_modified_ms = at_ms
        source.merged_into = target.id
        source.merge_offset = offset
        target.merges.append(source)
        self.read_index.on_change(target.id)
        if source.txn_parent:
            self.outcomes.add(
                TransactionOutcomeRecord(
                    name=source.name,
                    parent=source.txn_parent,
                    outcome=TXN_COMMITTED,
                    segment=target.name,
                    offset=offset,
                    length=source.length,
                    at_ms=at_ms,
                )
            )

    def apply_merge_completed(self, target: Segment, source: Segment) -> list[ChunkRecord]:
        """The source's chunks become the target's; returns chunks truncated away (garbage)."""
        self.touch(target)
        if not target.merges or target.merges[0] is not source:
            raise ContainerCorrupt(
                f"merge of {source.name!r} into {target.name!r} completes out of order"
            )
        offset = source.merge_offset
        end = offset + source.length
        if target.storage_length < offset or source.storage_length < source.length:
            raise ContainerCorrupt(
                f"merge of {source.name!r} into {target.name!r} completes before both are "
                f"in Tier 2 ({target.storage_length} < {offset} or {source.storage_length} "
                f"< {source.length})"
            )
        dropped: list[ChunkRecord] = []
        for c in source.chunks:
            shifted = ChunkRecord(
                name=c.name,
                start_offset=offset + c.start_offset,
                length=c.length,
                crc32c=c.crc32c,
                epoch=c.epoch,
            )
            # The target may have been truncated past some of them meanwhile.
            if shifted.start_offset + shifted.length <= target.storage_length:
                dropped.append(shifted)
            else:
                target.chunks.append(shifted)
        target.storage_length = max(target.storage_length, end)
        target.merges.pop(0)
        self.remove(source)
        self.read_index.on_delete(source.id)
        self.read_index.on_flushed(target.id, target.storage_length)
        return dropped

    def apply_set_stream(self, record: StreamRecord) -> Stream:
        """A stream was created or its policies changed."""
        stream = self.streams.get(record.name)
        if stream is None:
            stream = self.streams[record.name] = Stream(StreamRecord())
            for seg in self.by_name.values():
                member = split_member(seg.name)
                if member is not None and member[0] == record.name:
                    stream.add_member(seg, member[1])
        next_number = max(stream.record.next_number, record.next_number)
        stream.record.CopyFrom(record)
        stream.record.next_number = next_number
        stream.p_next_number = max(stream.p_next_number, next_number)
        stream.durable = True
        return stream

    def apply_delete_stream(self, name: str) -> None:
        """A stream is gone (its segments were deleted before)."""
        self.streams.pop(name, None)

    def apply_attributes(
        self, seg: Segment, values: Mapping[bytes, int | None], at_ms: int
    ) -> None:
        """Attribute values changed."""
        self.touch(seg)
        seg.commit_attributes(values, self.seq)
        seg.last_modified_ms = at_ms

    def apply_attribute_index(
        self, seg: Segment, state: AttributeIndexRecord, chunk: ChunkRecord, through_seq: int
    ) -> list[ChunkRecord]:
        """A batch of the segment's extended attributes is in its index.

        ``state`` carries the new root, length and start (its chunk list is
        ignored); ``chunk`` holds the batch's pages. Values changed at or
        before ``through_seq`` and not since are indexed now. Returns the
        chunks the new start leaves behind (garbage), or ``[chunk]`` itself
        when the batch no longer applies (the index moved to a successor, or
        another batch went first).
        """
        self.touch(seg)
        index = seg.attr_index
        old_length = index.length if index is not None else 0
        if chunk.start_offset != old_length or seg.attr_moved:
            return [chunk]
        if index is None:
            index = seg.attr_index = AttributeIndexRecord()
        index.root_offset = state.root_offset
        index.root_length = state.root_length
        index.length = state.length
        index.start = state.start
        if chunk.length:
            index.chunks.append(chunk)
        dropped = [c for c in index.chunks if c.start_offset + c.length <= state.start]
        if dropped:
            kept = [c for c in index.chunks if c.start_offset + c.length > state.start]
            del index.chunks[:]
            index.chunks.extend(kept)
        dirty = seg.attr_dirty
        for k in [k for k, s in dirty.items() if s <= through_seq]:
            del dirty[k]
        return dropped

    # -- journal truncation ----------------------------------------------------------

    def oldest_needed_file(self) -> int | None:
        """The oldest journal file holding append data that is still needed.

        Data is needed unless it is in Tier 2 (below the storage length), its
        segment was deleted, or it was truncated away.
        """
        for f in sorted(self.file_usage):
            for seg_id, end in self.file_usage[f].items():
                seg = self.by_id.get(seg_id)
                if seg is not None and end > max(seg.start_offset, seg.storage_length):
                    return f
        return None

    def forget_files_before(self, first: int) -> None:
        """Journal files before ``first`` were deleted."""
        for f in [f for f in self.file_usage if f < first]:
            del self.file_usage[f]

    # -- snapshots ---------------------------------------------------------------------

    def pending_snapshot(self) -> ContainerSnapshot:
        """The pending view whole: exactly the state after everything submitted so far."""
        return self.partial_snapshot(
            (s for s in self.by_name.values() if not s.p_deleted), (), 0, partial=False
        )

    def partial_snapshot(
        self,
        segments: Iterable[Segment],
        deleted_ids: Iterable[int],
        complete_from: int,
        partial: bool = True,
    ) -> ContainerSnapshot:
        """A rolling checkpoint: the pending records of ``segments``, the ids deleted
        since the previous checkpoint, and the small state (streams, outcomes, next id)
        whole. ``complete_from``: see `ContainerSnapshot.complete_from`."""
        snap = ContainerSnapshot(
            version=SNAPSHOT_VERSION,
            next_segment_id=self.next_id,
            streams=[_pending_record(s) for s in self.streams.values()],
            # Committed records: the operations that add them are applied
            # before a checkpoint is taken (the container waits for them).
            txn_outcomes=self.outcomes.records(),
            partial=partial,
            deleted_ids=sorted(deleted_ids),
            complete_from=complete_from,
        )
        records = snap.segments
        for seg in segments:
            data = seg.cold_record()
            if data is not None:
                # Decoded in place: no record object copied in (a whole
                # checkpoint at 10^6 segments is a pass on the event loop).
                records.add().MergeFromString(data)
            else:
                records.append(seg.pending_record())
        return snap

    def committed_snapshot(self, segments: bool = True) -> ContainerSnapshot:
        """The committed view of every segment (Tier-2 metadata snapshots, export);
        without ``segments``, all but their records."""
        return ContainerSnapshot(
            version=SNAPSHOT_VERSION,
            next_segment_id=self.next_id,
            segments=[s.committed_record() for s in self.committed()] if segments else (),
            streams=[s.record for s in self.streams.values() if s.durable],
            txn_outcomes=self.outcomes.records(),
        )

    def load_snapshot(
        self, data: bytes | ContainerSnapshot, records: Iterable[SegmentRecord] | None = None
    ) -> None:
        """Replace every segment by those of a checkpoint's full snapshot, or by
        ``records`` (gathered from rolling checkpoints) with ``data``'s small state."""
        snap = ContainerSnapshot.FromString(data) if isinstance(data, bytes) else data
        if snap.version != SNAPSHOT_VERSION:
            raise ContainerCorrupt(f"checkpoint snapshot version {snap.version} is unknown")
        self.by_name = SortedDict()
        self.by_id = {}
        self.replaced = {}
        self.changes = {}
        self.deletions = {}
        self.changes_floor = self.seq
        self.streams = {}
        self.transactions = set()
        self.outcomes.load(snap.txn_outcomes)
        for sr in snap.streams:
            self.apply_set_stream(sr)
        self.total_blocks = 0
        self.largest.reset()
        # No cyclic collection while a million long-lived segments are built:
        # each full one would walk all those built so far again (synchronous,
        # so no other task runs meanwhile).
        paused = gc.isenabled()
        gc.disable()
        try:
            for r in snap.segments if records is None else records:
                self.total_blocks += blocks(r.length)
                if not r.txn_parent:
                    self.largest.grew(r.id, r.length)
                if coolable_record(r):
                    check_record_chunks(r)
                    self.add(Segment.cold_from_record(r, r.SerializeToString()))
                else:
                    self.add(Segment.from_record(r, self.seq))
        finally:
            if paused:
                gc.enable()
        self.live_count = sum(1 for s in self.by_id.values() if s.durable)
        self.sealed_count = sum(
            1 for s in self.by_id.values() if s.durable and (s.cold or s.sealed)
        )
        merged = [s for s in self.by_id.values() if s.merged_into]  # never cold
        for seg in sorted(merged, key=lambda s: s.merge_offset):
            if seg.merged_into:
                target = self.by_id.get(seg.merged_into)
                if target is None:
                    raise ContainerCorrupt(
                        f"{seg.name!r} is merged into unknown segment id {seg.merged_into}"
                    )
                target.merges.append(seg)
        self.next_id = snap.next_segment_id

    # -- after a replay ------------------------------------------------------------------

    def settle_replayed(self, check: bool = True) -> None:
        """After a replay: pending = committed, the read index trimmed to what is needed.

        ``check=False`` leaves the invariants to the caller (fsck reports
        every violation instead of stopping at the first).
        """
        index = self.read_index
        for seg in self.by_name.values():
            if seg.cold:
                # Wholly in Tier 2 and checked when loaded: only data the
                # replay indexed for it (before the checkpoint) may go.
                if index.holds(seg.id):
                    index.on_flushed(seg.id, seg.storage_length)
                continue
            seg.reset_pending()
            index.on_truncate(seg.id, seg.start_offset)
            index.on_flushed(seg.id, seg.storage_length)
            if check:
                check_chunks(seg)
        if check:
            index.check_coverage([s.view() for s in self.by_name.values() if not s.cold])

    # -- cold segments -------------------------------------------------------------------

    def cool(self, segments: Iterable[Segment], keep: Collection[Segment], since: int) -> int:
        """Cool those of ``segments`` that may be (`Segment.coolable`), are not in
        ``keep`` (pending changes) and did not change after sequence ``since``;
        how many cooled."""
        n = 0
        changes = self.changes
        for seg in segments:
            if seg.cold or seg in keep or changes.get(seg.id, 0) > since:
                continue
            if seg.coolable() and not self.read_index.holds(seg.id):
                seg.cool()
                n += 1
        return n


def split_checkpoint(snap: ContainerSnapshot, limit: int) -> list[ContainerSnapshot]:
    """``snap`` as checkpoints of about ``limit`` bytes at most, in journal order.

    One that fits is itself. Otherwise its records are shared out over pieces
    and only the last carries the rest of the state (streams, outcomes, and
    for a rolling one its ``complete_from``): a replay can take the state
    from the last piece only. A whole one's pieces are numbered
    (`ContainerSnapshot.whole_pieces`, `piece`); a rolling one's deletions go
    in its first piece. A record larger than the room left is a piece of its own.
    """
    if snap.ByteSize() <= limit:
        return [snap]
    head = ContainerSnapshot(streams=snap.streams, txn_outcomes=snap.txn_outcomes).ByteSize()
    room = max(limit - head - 64, limit // 4)
    groups: list[list[SegmentRecord]] = [[]]
    size = 0
    for r in snap.segments:
        n = r.ByteSize() + 8
        if groups[-1] and size + n > room:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += n
    whole = not snap.partial
    pieces = []
    for i, records in enumerate(groups):
        last = i == len(groups) - 1
        pieces.append(
            ContainerSnapshot(
                version=snap.version,
                next_segment_id=snap.next_segment_id,
                segments=records,
                streams=snap.streams if last else (),
                txn_outcomes=snap.txn_outcomes if last else (),
                partial=True,
                deleted_ids=snap.deleted_ids if i == 0 else (),
                complete_from=snap.complete_from if last and not whole else 0,
                whole_pieces=len(groups) if whole else 0,
                piece=i + 1 if whole else 0,
            )
        )
    return pieces


def check_record_chunks(r: SegmentRecord) -> None:
    """`check_chunks` of a record (a segment loaded cold)."""
    _check_cover(r.name, r.start_offset, r.storage_length, r.chunks)


def check_chunks(seg: Segment) -> None:
    """The chunks cover [start_offset, storage_length) without gaps or overlaps."""
    _check_cover(seg.name, seg.start_offset, seg.storage_length, seg.chunks)


def _check_cover(
    name: str, start_offset: int, storage_length: int, chunks: Iterable[ChunkRecord]
) -> None:
    need = start_offset
    for c in chunks:
        if c.start_offset > need:
            raise ContainerCorrupt(f"{name!r} has no chunk for [{need}, {c.start_offset})")
        need = max(need, c.start_offset + c.length)
    if need < storage_length:
        raise ContainerCorrupt(
            f"{name!r} is in Tier 2 up to {storage_length}, its chunks end at {need}"
        )


def _pending_record(stream: Stream) -> StreamRecord:
    """A stream's record with the next number of the pending view (checkpoints)."""
    r = StreamRecord()
    r.CopyFrom(stream.record)
    r.next_number = max(r.next_number, stream.p_next_number)
    return r
