"""One segment's metadata: the committed view and the pending view.

The *committed* view is what has been acknowledged (its operations are
durable in the journal); reads, ``stat`` and listings use it. The *pending*
view runs ahead of it by the operations that were validated and submitted to
the journal but are not durable yet; new operations are validated against
it, so pipelined operations see the effect of the ones before them (Pravega's
operation metadata updater). When nothing is in flight the two are equal.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.codec import Codec
from gateway.container.attributes import CODEC, EVENT_COUNT, EVENT_END
from gateway.container.results import SegmentInfo
from gateway.protocol.metadata_pb2 import AttributeValue, ChunkRecord, SegmentRecord
from gateway.readindex import SegmentView

_LINES = Codec.LINES.number


class Segment:
    """Metadata of one segment (committed and pending views)."""

    __slots__ = (
        "attributes",
        "chunks",
        "created_at_ms",
        "durable",
        "event_index",
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
        self.attributes: dict[bytes, int] = {}
        self.chunks: list[ChunkRecord] = []
        #: Sparse event boundaries (metadata.proto SegmentRecord.event_index).
        self.event_index: list[int] = []
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
        #: None while equal to ``attributes`` (copied on first pending change).
        self.p_attributes: dict[bytes, int] | None = None

    def pending_attributes(self) -> Mapping[bytes, int]:
        """Attribute values including operations in flight."""
        return self.attributes if self.p_attributes is None else self.p_attributes

    def set_pending_attributes(self, values: Mapping[bytes, int]) -> None:
        """Record attribute values of an operation in flight."""
        if self.p_attributes is None:
            self.p_attributes = dict(self.attributes)
        self.p_attributes.update(values)

    def reset_pending(self) -> None:
        """Make the pending view equal the committed view (nothing in flight)."""
        self.p_start_offset = self.start_offset
        self.p_length = self.length
        self.p_sealed = self.sealed
        self.p_deleted = False
        self.p_merged = self.merged_into != 0
        self.p_attributes = None

    @property
    def hidden(self) -> bool:
        """A transaction's segment: not listed, not in the mount."""
        return bool(self.txn_parent)

    @property
    def codec(self) -> Codec:
        """The event codec declared when the segment was created (raw if none)."""
        return Codec.from_number(self.attributes.get(CODEC, 0))

    @property
    def event_end(self) -> int:
        """Where the last complete event ends (committed view; docs/FORMATS.md).

        The length, but for an active ``lines`` segment whose last append
        cut a line: there, just past the last newline. Never below the start
        offset. The mount shows this as the file's size, so no reader sees
        half a line; the rest follows once its newline is appended, or once
        the segment is sealed (a sealed segment's last line is whole).
        """
        if self.sealed or self.attributes.get(CODEC, 0) != _LINES:
            return self.length
        return max(self.start_offset, min(self.length, self.attributes.get(EVENT_END, 0)))

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
            event_count=self.attributes.get(EVENT_COUNT, 0),
            attribute_count=len(self.attributes),
            chunk_count=len(self.chunks),
        )

    def pending_record(self) -> SegmentRecord:
        """The pending view as a snapshot record (checkpoints snapshot it)."""
        return self._record(
            self.p_start_offset, self.p_length, self.p_sealed, self.pending_attributes()
        )

    def committed_record(self) -> SegmentRecord:
        """The committed view as a snapshot record (Tier-2 metadata snapshots)."""
        return self._record(self.start_offset, self.length, self.sealed, self.attributes)

    def _record(
        self, start_offset: int, length: int, sealed: bool, attributes: Mapping[bytes, int]
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
            attributes=[AttributeValue(id=k, value=v) for k, v in attributes.items()],
            chunks=self.chunks,
            # Like the storage fields, kept by applied operations only: a
            # checkpoint may lack the entries of appends still in flight,
            # which a sparse index can afford.
            event_index=self.event_index,
            txn_parent=self.txn_parent,
            txn_deadline_ms=self.txn_deadline_ms,
            merged_into=self.merged_into,
            merge_offset=self.merge_offset,
        )

    @classmethod
    def from_record(cls, r: SegmentRecord) -> Segment:
        """A durable segment from a snapshot record."""
        s = cls(r.id, r.name, r.created_at_ms)
        s.start_offset = r.start_offset
        s.length = r.length
        s.storage_length = r.storage_length
        s.sealed = r.sealed
        s.sealed_in_storage = r.sealed_in_storage
        s.last_modified_ms = r.last_modified_ms
        s.attributes = {a.id: a.value for a in r.attributes}
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
