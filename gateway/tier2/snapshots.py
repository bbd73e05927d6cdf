"""Tier-2 metadata snapshots: the one place that builds and checks them.

A `MetadataSnapshot` (metadata.proto) is a node's committed metadata as the
storage writer uploads it to ``<prefix>/<node>/meta/``, as ``export-metadata``
writes it, and as fsck, ``import-metadata`` and disaster recovery read it.
It wraps the container's own checkpoint snapshot (`ContainerSnapshot`,
`gateway.container.table.SNAPSHOT_VERSION`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import gateway
from gateway.container.segment import Segment
from gateway.container.segment_names import validate_name
from gateway.container.table import SNAPSHOT_VERSION
from gateway.errors import InvalidName, SnapshotInvalid
from gateway.protocol.metadata_pb2 import ContainerSnapshot, MetadataSnapshot, SegmentRecord
from gateway.storage import object_keys as names

#: The MetadataSnapshot format version this code writes and reads.
METADATA_VERSION = 1

#: A delta is uploaded instead of a whole snapshot while its records take at
#: most this share of the whole snapshot's bytes (deltas are cumulative: past
#: it, a new whole snapshot is cheaper than the deltas that would follow).
DELTA_SHARE = 0.25

__all__ = [
    "DELTA_SHARE",
    "METADATA_VERSION",
    "SNAPSHOT_VERSION",
    "SnapshotEncoder",
    "apply_delta",
    "build_snapshot",
    "check_delta",
    "check_snapshot",
    "object_metadata",
    "record_problem",
]


def build_snapshot(
    container: ContainerSnapshot, node: str, epoch: int, at_ms: int | None = None
) -> MetadataSnapshot:
    """``container`` as a MetadataSnapshot of ``node`` taken by ``epoch`` (at ``at_ms``, or now)."""
    return MetadataSnapshot(
        version=METADATA_VERSION,
        node=node,
        epoch=epoch,
        created_at_ms=int(time.time() * 1000) if at_ms is None else at_ms,
        software_version=gateway.__version__,
        container=container,
    )


def object_metadata(crc: int, applied_seq: int | None = None) -> dict[str, str]:
    """The user metadata a snapshot object carries (for inspection with any S3 tool).

    ``applied_seq``: the journal sequence of the committed view it holds
    (recovery orders it against attribute index batches by it).
    """
    md = {
        "crc32c": f"{crc:08x}",
        "format-version": str(METADATA_VERSION),
        "software-version": gateway.__version__,
    }
    if applied_seq is not None:
        md[names.APPLIED_SEQ] = str(applied_seq)
    return md


def record_problem(r: SegmentRecord) -> str | None:
    """Why a segment record read from Tier 2 (or another node) cannot be used; None if it can.

    The invariants every reader relies on: a valid name, ``start_offset <=
    length``, ``storage_length <= length``, chunks that leave no gap from
    the start, event boundaries in order within the segment.
    """
    try:
        validate_name(r.name)
    except InvalidName as e:
        return str(e)
    if r.start_offset > r.length:
        return f"segment {r.name!r}: start offset {r.start_offset} is past its length {r.length}"
    if r.storage_length > r.length:
        return (
            f"segment {r.name!r}: storage length {r.storage_length} is past its length {r.length}"
        )
    end = r.start_offset
    for c in r.chunks:
        if not c.name or len(c.name) > 2048:
            return f"segment {r.name!r} has a chunk without a usable name"
        if c.start_offset > end:
            return f"segment {r.name!r} has no chunk at offset {end}"
        end = max(end, c.start_offset + c.length)
    previous = -1
    for offset in r.event_index:
        if offset <= previous or offset > r.length:
            return f"segment {r.name!r}: its event index is out of order or past its length"
        previous = offset
    return None


def check_snapshot(snap: MetadataSnapshot, what: str, delta: bool = False) -> MetadataSnapshot:
    """``snap`` if this code can use it, else SnapshotInvalid naming ``what``
    (``delta``: a delta is wanted, else a whole snapshot)."""
    if bool(snap.delta_of) != delta:
        raise SnapshotInvalid(what, "it is a delta" if snap.delta_of else "it is not a delta")
    if snap.version != METADATA_VERSION:
        raise SnapshotInvalid(what, f"format version {snap.version} is unknown")
    if not snap.HasField("container") or snap.container.version != SNAPSHOT_VERSION:
        raise SnapshotInvalid(what, f"container version {snap.container.version} is unknown")
    for r in snap.container.segments:
        end = r.start_offset
        for c in r.chunks:
            if c.start_offset > end:
                raise SnapshotInvalid(what, f"segment {r.name!r} has no chunk at offset {end}")
            end = max(end, c.start_offset + c.length)
    return snap


class CommittedView(Protocol):
    """What `SnapshotEncoder` reads of a segment container."""

    @property
    def applied_seq(self) -> int:
        """Journal sequence of the last operation applied to the committed view."""

    def segments(self) -> Sequence[Segment]:
        """Every committed live segment."""

    def changed_since(self, seq: int) -> tuple[list[Segment], list[tuple[int, str]]] | None:
        """What changed and what was deleted after ``seq`` (None: too long ago)."""

    def committed_snapshot(self, segments: bool = True) -> ContainerSnapshot:
        """The committed view (``segments=False``: without the records)."""


def _field(number: int, data: bytes) -> bytes:
    """``data`` as a length-delimited protobuf field (wire type 2)."""
    n = len(data)
    out = bytearray([number << 3 | 2])
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + data


#: `ContainerSnapshot.segments` and `MetadataSnapshot.container`.
_SEGMENTS_FIELD = ContainerSnapshot.DESCRIPTOR.fields_by_name["segments"].number
_CONTAINER_FIELD = MetadataSnapshot.DESCRIPTOR.fields_by_name["container"].number


class SnapshotEncoder:
    """Builds a node's Tier-2 metadata snapshots, encoding only the segment records
    that changed since the previous one (the container's change log): a cold
    segment's record is its own bytes, a warm one's is kept from the snapshot
    before unless it changed. A snapshot of a node whose million segments
    mostly sleep so costs the event loop the changed records and a pass that
    gathers the others' bytes; `encode` joins them, off the event loop."""

    def __init__(self) -> None:
        #: Warm segment id -> its encoded committed record, as of ``_stamp``.
        self._records: dict[int, bytes] = {}
        self._stamp = -1
        #: Records encoded in all (the unchanged ones are not).
        self.encoded = 0
        #: The whole snapshot deltas are taken against ("": none yet): its key,
        #: the journal sequence of its view, its bytes; and deltas uploaded of it.
        self.base_key = ""
        self.base_seq = -1
        self.base_bytes = 0
        self.deltas = 0

    def _refresh(self, view: CommittedView) -> None:
        """Forget the kept records of the segments changed since the last capture."""
        cache = self._records
        changed = view.changed_since(self._stamp) if self._stamp >= 0 else None
        if changed is None:
            cache.clear()
        else:
            for seg in changed[0]:
                cache.pop(seg.id, None)
            for segment_id, _ in changed[1]:
                cache.pop(segment_id, None)
        self._stamp = view.applied_seq

    def _bytes(self, seg: Segment) -> bytes:
        """The segment's committed record, encoded (a cold one's own bytes)."""
        data = seg.cold_record()
        if data is not None:
            self._records.pop(seg.id, None)  # (cooled since)
            return data
        data = self._records.get(seg.id)
        if data is None:
            data = self._records[seg.id] = seg.committed_record().SerializeToString()
            self.encoded += 1
        return data

    def capture(self, view: CommittedView) -> tuple[ContainerSnapshot, list[bytes]]:
        """The committed view now: all but the records, and the records' bytes
        (no await: the two are of the same instant)."""
        self._refresh(view)
        out = [self._bytes(seg) for seg in view.segments()]
        return view.committed_snapshot(segments=False), out

    def capture_delta(self, view: CommittedView) -> tuple[ContainerSnapshot, list[bytes]] | None:
        """What changed since the base (`base_key`), as `capture` gives the whole:
        the container's state marked partial with the ids deleted since, and the
        changed records' bytes. None: upload a whole snapshot instead (no base;
        the change log no longer reaches back to it; the records would pass
        `DELTA_SHARE` of it)."""
        if not self.base_key:
            return None
        found = view.changed_since(self.base_seq)
        if found is None:
            return None
        self._refresh(view)
        changed, deleted = found
        budget = self.base_bytes * DELTA_SHARE
        out = []
        for seg in changed:
            out.append(self._bytes(seg))
            budget -= len(out[-1])
            if budget < 0:
                return None
        head = view.committed_snapshot(segments=False)
        head.partial = True
        head.deleted_ids.extend(segment_id for segment_id, _ in deleted)
        return head, out

    def based(self, key: str, seq: int, size: int) -> None:
        """A whole snapshot of the view at ``seq`` was uploaded: the next deltas are of it."""
        self.base_key, self.base_seq, self.base_bytes, self.deltas = key, seq, size, 0

    @staticmethod
    def encode(
        head: ContainerSnapshot,
        records: list[bytes],
        node: str,
        epoch: int,
        at_ms: int,
        delta_of: str = "",
        delta_number: int = 0,
    ) -> bytes:
        """The MetadataSnapshot bytes of a `capture` or `capture_delta` (with the
        base's key and the delta's number) (blocking: run it in a thread)."""
        container = head.SerializeToString() + b"".join(_field(_SEGMENTS_FIELD, r) for r in records)
        wrapper = build_snapshot(ContainerSnapshot(), node, epoch, at_ms)
        wrapper.ClearField("container")
        wrapper.delta_of, wrapper.delta_number = delta_of, delta_number
        return wrapper.SerializeToString() + _field(_CONTAINER_FIELD, container)


def check_delta(delta: MetadataSnapshot, base_key: str, base: MetadataSnapshot, what: str) -> None:
    """SnapshotInvalid naming ``what`` unless ``delta`` is a usable delta of ``base``."""
    check_snapshot(delta, what, delta=True)
    if delta.delta_of != base_key or not delta.container.partial:
        raise SnapshotInvalid(what, f"it is not a delta of {base_key}")
    if delta.node != base.node or delta.epoch != base.epoch:
        raise SnapshotInvalid(what, "its node or epoch is not its base's")


def apply_delta(base: MetadataSnapshot, delta: MetadataSnapshot) -> MetadataSnapshot:
    """The whole snapshot ``base`` with ``delta`` applied (checked by `check_delta`):
    the delta's state, its records, and the base's records of the segments it
    neither changed nor deleted. Blocking (a million records take seconds)."""
    out = MetadataSnapshot()
    out.CopyFrom(delta)
    out.ClearField("delta_of")
    out.ClearField("delta_number")
    container = out.container
    container.ClearField("partial")
    container.ClearField("deleted_ids")
    gone = {r.id for r in delta.container.segments}
    gone.update(delta.container.deleted_ids)
    container.segments.extend(r for r in base.container.segments if r.id not in gone)
    return out
