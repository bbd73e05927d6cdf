"""One segment's metadata: the committed view and the pending view.

The *committed* view is what has been acknowledged (its operations are
durable in the journal); reads, ``stat`` and listings use it. The *pending*
view runs ahead of it by the operations that were validated and submitted to
the journal but are not durable yet; new operations are validated against
it, so pipelined operations see the effect of the ones before them (Pravega's
operation metadata updater). When nothing is in flight the two are equal.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Collection, Iterable, Mapping
from contextlib import suppress

from gateway.container.attributes import CODEC, EVENT_COUNT, EVENT_END, is_core
from gateway.container.results import SegmentInfo
from gateway.protocol.codec import Codec
from gateway.protocol.metadata_pb2 import (
    AttributeIndexRecord,
    AttributeValue,
    ChunkRecord,
    SegmentRecord,
)
from gateway.read.index import SegmentView

_LINES = Codec.LINES.number


class Segment:
    """Metadata of one segment (committed and pending views).

    A segment sealed and wholly in Tier 2 with nothing in memory that its
    record lacks may be *cold* (`cool`): it keeps only its id, name and the
    fields every pass over all segments reads (`EAGER`), and its committed
    record encoded (``_cold``); the first read of any other field *warms*
    it from that record (`__getattr__`). A node with a million sleeping
    segments so keeps a few hundred bytes for each (issue 33).
    """

    __slots__ = (
        "_cold",
        "attr_dirty",
        "attr_evictions",
        "attr_index",
        "attr_moved",
        "attributes",
        "chunks",
        "created_at_ms",
        "durable",
        "event_index",
        "events_unknown",
        "id",
        "last_modified_ms",
        "length",
        "merge_offset",
        "merged_into",
        "merges",
        "name",
        "p_attributes",
        "p_deleted",
        "p_length",
        "p_merged",
        "p_sealed",
        "p_start_offset",
        "sealed",
        "sealed_in_storage",
        "start_offset",
        "storage_length",
        "txn_deadline_ms",
        "txn_parent",
    )  # fmt: skip

    def __init__(self, segment_id: int, name: str, created_at_ms: int) -> None:
        self._cold: bytes | None = None
        self.id = segment_id
        self.name = name
        # Committed view (invariants: start_offset <= length, storage_length <= length).
        self.start_offset = 0
        self.length = 0
        self.storage_length = 0
        self.sealed = False
        self.sealed_in_storage = False
        self.created_at_ms = created_at_ms
        self.last_modified_ms = created_at_ms
        #: Core attributes, and the extended ones memory holds: those not yet
        #: in the attribute index (``attr_dirty``) and recently used ones
        #: (a first-level cache over the index). ``None``: known to have no
        #: value (removed, or absent from the index when looked up).
        self.attributes: dict[bytes, int | None] = {}
        #: Extended ids whose committed value is not in the index yet -> the
        #: journal sequence of the operation that last changed them.
        self.attr_dirty: dict[bytes, int] = {}
        #: The attribute index (None: none yet, so memory holds every value).
        self.attr_index: AttributeIndexRecord | None = None
        #: Counts evictions from ``attributes`` (a lookup that overlapped one
        #: looks again: its answer may predate a change).
        self.attr_evictions = 0
        #: The extended attributes moved to the stream's next segment.
        self.attr_moved = False
        self.chunks: list[ChunkRecord] = []
        #: Sparse event boundaries (metadata.proto SegmentRecord.event_index).
        self.event_index: list[int] = []
        #: Another node's segment shown cut to its flushed length (its owner
        #: down): how many events that holds is not known.
        self.events_unknown = False
        #: Whether the create operation is durable (a pending create is not).
        self.durable = False
        #: A transaction: the segment or stream it commits into, and when it
        #: is aborted unless committed ("" and 0 for other segments).
        self.txn_parent = ""
        self.txn_deadline_ms = 0
        #: A committed transaction not yet merged in Tier 2: the target's id
        #: (0: none) and where its bytes start there.
        self.merged_into = 0
        self.merge_offset = 0
        #: A target's merged sources still waiting for `MergeCompleted`, by offset.
        self.merges: list[Segment] = []
        # Pending view.
        self.p_start_offset = 0
        self.p_length = 0
        self.p_sealed = False
        self.p_deleted = False
        #: Committed into another segment (its merge is submitted).
        self.p_merged = False
        #: Attribute values set by operations in flight (over ``attributes``).
        self.p_attributes: dict[bytes, int | None] = {}

    # -- cold segments -----------------------------------------------------------------

    def __getattr__(self, name: str) -> object:
        # Only reached for a slot not set: a cold segment's lazy fields.
        if name in _LAZY and object.__getattribute__(self, "_cold") is not None:
            self._warm()
            return object.__getattribute__(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def cold_from_record(cls, r: SegmentRecord, data: bytes) -> Segment:
        """A cold durable segment from its record and the record's bytes (see
        `coolable_record`: only such records)."""
        s = cls.__new__(cls)
        s._cold = data
        s.id = r.id
        s.name = r.name
        s.durable = True
        s.txn_parent = ""
        s.merged_into = 0
        s.p_deleted = False
        s.p_merged = False
        return s

    @property
    def cold(self) -> bool:
        """Whether the segment is cold (only its record is kept)."""
        return self._cold is not None

    def warm(self) -> None:
        """Make a cold segment whole again (before it changes)."""
        if self._cold is not None:
            self._warm()

    def _warm(self) -> None:
        """Fill the lazy fields from the record (only those not set since)."""
        data = self._cold
        assert data is not None
        self._cold = None
        fresh = Segment.from_record(SegmentRecord.FromString(data))
        for name in _LAZY:
            try:
                object.__getattribute__(self, name)
            except AttributeError:
                object.__setattr__(self, name, object.__getattribute__(fresh, name))

    def cold_record(self) -> bytes | None:
        """The encoded committed record of a cold segment, without warming it;
        None if it is warm.

        Trusts that no field of a cold segment is written before one is read
        (which warms it): every change validates against the segment first,
        and `SegmentTable.touch` warms before each committed change.
        """
        return self._cold

    def coolable(self) -> bool:
        """Whether `cool` may drop everything but the record: sealed and wholly in
        Tier 2, and nothing in memory that the record lacks or that readers of
        the pending view need (no attribute not yet indexed, nothing in flight)."""
        return (
            self._cold is None
            and self.durable
            and self.sealed
            and self.sealed_in_storage
            and self.storage_length == self.length
            and not self.txn_parent
            and not self.merged_into
            and not self.merges
            and not self.attr_dirty
            and not self.p_attributes
            and not self.p_deleted
            and self.p_sealed
            and self.p_length == self.length
            and self.p_start_offset == self.start_offset
            and not self.events_unknown
            and not any(not is_core(k) for k in self.attributes if self.attr_index is None)
        )

    def cool(self) -> None:
        """Keep only the committed record (the caller checked `coolable`)."""
        data = self.committed_record().SerializeToString()
        for name in _LAZY:
            with suppress(AttributeError):
                object.__delattr__(self, name)
        self._cold = data

    def pending_attributes(self) -> Mapping[bytes, int | None]:
        """Attribute values including operations in flight (what memory holds)."""
        if not self.p_attributes:
            return self.attributes
        return ChainMap(self.p_attributes, self.attributes)

    def set_pending_attributes(self, values: Mapping[bytes, int | None]) -> None:
        """Record attribute values of an operation in flight."""
        self.p_attributes.update(values)

    def missing_attributes(self, ids: Iterable[bytes]) -> list[bytes]:
        """Extended ids whose value only the attribute index knows (to load first)."""
        if self.attr_index is None or not self.attr_index.root_length:
            return []  # no index, or an empty one: memory knows every value
        return [
            i
            for i in ids
            if i not in self.attributes and i not in self.p_attributes and not is_core(i)
        ]

    def commit_attributes(self, values: Mapping[bytes, int | None], seq: int) -> None:
        """Committed attribute values of an operation at journal sequence ``seq``."""
        self.attributes.update(values)
        dirty = self.attr_dirty
        for k in values:
            if not is_core(k):
                dirty[k] = seq

    def load_attributes(self, values: Mapping[bytes, int | None]) -> None:
        """Values read from the index for ids memory does not hold (never over newer ones)."""
        for k, v in values.items():
            if k not in self.attributes and k not in self.p_attributes:
                self.attributes[k] = v

    def evict_attributes(self, keep: int, protect: Collection[bytes] = ()) -> int:
        """Forget indexed extended values, oldest loaded first, down to ``keep`` in memory.

        Core attributes, values not yet indexed, values of operations in
        flight and ``protect`` (just loaded for a caller) stay. Returns how
        many went.
        """
        over = len(self.attributes) - keep
        if over <= 0 or self.attr_index is None:
            return 0
        victims = []
        for k in self.attributes:
            if (
                not is_core(k)
                and k not in self.attr_dirty
                and k not in self.p_attributes
                and k not in protect
            ):
                victims.append(k)
                if len(victims) >= over:
                    break
        for k in victims:
            del self.attributes[k]
        if victims:
            self.attr_evictions += 1
        return len(victims)

    def give_attributes(self) -> AttributeIndexRecord | None:
        """Hand the extended attributes over to a successor: returns the index; keeps none."""
        index, self.attr_index = self.attr_index, None
        self.attr_moved = True
        self.attr_dirty.clear()
        for k in [k for k in self.attributes if not is_core(k)]:
            del self.attributes[k]
        return index

    def extended_in_memory(self) -> int:
        """Extended values memory must keep: not yet indexed, or set in flight."""
        return len(self.attr_dirty) + len(self.p_attributes)

    def reset_pending(self) -> None:
        """Make the pending view equal the committed view (nothing in flight)."""
        self.p_start_offset = self.start_offset
        self.p_length = self.length
        self.p_sealed = self.sealed
        self.p_deleted = False
        self.p_merged = self.merged_into != 0
        self.p_attributes = {}

    def core(self, attribute_id: bytes) -> int:
        """A core attribute's committed value (0 when absent)."""
        return self.attributes.get(attribute_id) or 0

    @property
    def hidden(self) -> bool:
        """A transaction's segment: not listed, not in the mount."""
        return bool(self.txn_parent)

    @property
    def codec(self) -> Codec:
        """The event codec declared when the segment was created (raw if none)."""
        return Codec.from_number(self.core(CODEC))

    @property
    def event_end(self) -> int:
        """Where the last complete event ends (committed view; docs/FORMATS.md).

        The length, but for an active ``lines`` segment whose last append
        cut a line: there, just past the last newline. Never below the start
        offset. The mount shows this as the file's size, so no reader sees
        half a line; the rest follows once its newline is appended, or once
        the segment is sealed (a sealed segment's last line is whole).
        """
        if self.sealed or self.core(CODEC) != _LINES:
            return self.length
        return max(self.start_offset, min(self.length, self.core(EVENT_END)))

    @property
    def gone(self) -> bool:
        """Merged into another segment: clients no longer see it (committed view)."""
        return self.merged_into != 0

    def view(self) -> SegmentView:
        """What the read index needs of the committed view."""
        return SegmentView(
            self.id,
            self.name,
            self.start_offset,
            self.length,
            self.sealed,
            self.storage_length,
            self.chunks,
            tuple((s.merge_offset, s.view()) for s in self.merges),
        )

    def info(self) -> SegmentInfo:
        """The committed view as a SegmentInfo."""
        return SegmentInfo(
            name=self.name,
            id=self.id,
            start_offset=self.start_offset,
            length=self.length,
            storage_length=self.storage_length,
            sealed=self.sealed,
            sealed_in_storage=self.sealed_in_storage,
            created_at_ms=self.created_at_ms,
            last_modified_ms=self.last_modified_ms,
            event_count=-1 if self.events_unknown else self.core(EVENT_COUNT),
            attribute_count=sum(1 for v in self.attributes.values() if v is not None),
            chunk_count=len(self.chunks),
        )

    def pending_record(self) -> SegmentRecord:
        """The pending view as a snapshot record (checkpoints snapshot it)."""
        data = self.cold_record()
        if data is not None:
            return SegmentRecord.FromString(data)  # cold: nothing pending
        return self._record(
            self.p_start_offset, self.p_length, self.p_sealed, self.pending_attributes()
        )

    def committed_record(self) -> SegmentRecord:
        """The committed view as a snapshot record (Tier-2 metadata snapshots)."""
        data = self.cold_record()
        if data is not None:
            return SegmentRecord.FromString(data)
        return self._record(self.start_offset, self.length, self.sealed, self.attributes)

    def _record_attributes(self, attributes: Mapping[bytes, int | None]) -> list[AttributeValue]:
        """What a record keeps: core values, and extended ones the index lacks."""
        if self.attr_index is None:
            keys: Iterable[bytes] = attributes.keys()
        else:
            keys = [k for k in attributes if is_core(k) or k in self.attr_dirty]
            keys += [k for k in self.p_attributes if k not in self.attr_dirty and not is_core(k)]
        out = []
        for k in keys:
            v = attributes.get(k)
            if v is None:
                # Without an index, absent from memory means absent.
                if self.attr_index is not None and not is_core(k):
                    out.append(AttributeValue(id=k, removed=True))
            else:
                out.append(AttributeValue(id=k, value=v))
        return out

    def _record(
        self, start_offset: int, length: int, sealed: bool, attributes: Mapping[bytes, int | None]
    ) -> SegmentRecord:
        # Storage fields change only when applied, so both views share them.
        return SegmentRecord(
            id=self.id,
            name=self.name,
            start_offset=start_offset,
            length=length,
            storage_length=self.storage_length,
            sealed=sealed,
            sealed_in_storage=self.sealed_in_storage,
            created_at_ms=self.created_at_ms,
            last_modified_ms=self.last_modified_ms,
            attributes=self._record_attributes(attributes),
            chunks=self.chunks,
            # Like the storage fields, kept by applied operations only: a
            # checkpoint may lack the entries of appends still in flight,
            # which a sparse index can afford.
            event_index=self.event_index,
            txn_parent=self.txn_parent,
            txn_deadline_ms=self.txn_deadline_ms,
            merged_into=self.merged_into,
            merge_offset=self.merge_offset,
            attribute_index=self.attr_index,
            attributes_moved=self.attr_moved,
        )

    @classmethod
    def from_record(cls, r: SegmentRecord, seq: int = 0) -> Segment:
        """A durable segment from a snapshot record (a checkpoint at journal sequence ``seq``).

        Its extended values are taken as changed at ``seq``: only an index
        batch taken after the checkpoint surely holds them.
        """
        s = cls(r.id, r.name, r.created_at_ms)
        s.start_offset = r.start_offset
        s.length = r.length
        s.storage_length = r.storage_length
        s.sealed = r.sealed
        s.sealed_in_storage = r.sealed_in_storage
        s.last_modified_ms = r.last_modified_ms
        s.attributes = {a.id: None if a.removed else a.value for a in r.attributes}
        if r.HasField("attribute_index"):
            s.attr_index = AttributeIndexRecord()
            s.attr_index.CopyFrom(r.attribute_index)
        s.attr_dirty = {k: seq for k in s.attributes if not is_core(k)}
        s.attr_moved = r.attributes_moved
        s.chunks = list(r.chunks)
        s.event_index = list(r.event_index)
        s.txn_parent = r.txn_parent
        s.txn_deadline_ms = r.txn_deadline_ms
        # The target links its sources (`merges`) once every record is loaded.
        s.merged_into = r.merged_into
        s.merge_offset = r.merge_offset
        s.durable = True
        s.reset_pending()
        return s


#: Fields a cold segment keeps: what passes over every segment read (the
#: mount's tree, listings' filters, the live count).
EAGER = ("_cold", "id", "name", "durable", "txn_parent", "merged_into", "p_deleted", "p_merged")
#: Fields a cold segment drops, filled again from its record when read.
_LAZY = frozenset(Segment.__slots__) - frozenset(EAGER)


def blocks(length: int) -> int:
    """4 KiB blocks a file of ``length`` bytes takes (as statfs and ``du`` count)."""
    return -(-length // 4096)


def chunks_of(seg: Segment) -> Iterable[ChunkRecord]:
    """The segment's chunks and its attribute index's (GC, fsck), without warming
    a cold segment."""
    data = seg.cold_record()
    if data is not None:
        return record_chunks(data)
    if seg.attr_index is None:
        return seg.chunks
    return [*seg.chunks, *seg.attr_index.chunks]


def record_chunks(record: SegmentRecord | bytes) -> list[ChunkRecord]:
    """Every chunk a segment record (or its encoding) names: its bytes' and its
    attribute index's."""
    r = SegmentRecord.FromString(record) if isinstance(record, bytes) else record
    return [*r.chunks, *r.attribute_index.chunks]


def coolable_record(r: SegmentRecord) -> bool:
    """Whether a loaded record may make a cold segment: sealed, wholly in Tier 2,
    no transaction or merge, and no extended attribute value (which a record
    carries only when not yet indexed)."""
    return (
        r.sealed
        and r.sealed_in_storage
        and r.storage_length == r.length
        and not r.txn_parent
        and not r.merged_into
        and all(is_core(a.id) for a in r.attributes)
    )
