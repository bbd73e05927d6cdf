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

__all__ = [
    "METADATA_VERSION",
    "SNAPSHOT_VERSION",
    "SnapshotEncoder",
    "build_snapshot",
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


def check_snapshot(snap: MetadataSnapshot, what: str) -> MetadataSnapshot:
    """``snap`` if this code can use it, else SnapshotInvalid naming ``what``."""
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

    def capture(self, view: CommittedView) -> tuple[ContainerSnapshot, list[bytes]]:
        """The committed view now: all but the records, and the records' bytes
        (no await: the two are of the same instant)."""
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
        out = []
        for seg in view.segments():
            data = seg.cold_record()
            if data is not None:
                cache.pop(seg.id, None)  # (cooled since)
            else:
                data = cache.get(seg.id)
                if data is None:
                    data = cache[seg.id] = seg.committed_record().SerializeToString()
                    self.encoded += 1
            out.append(data)
        return view.committed_snapshot(segments=False), out

    @staticmethod
    def encode(
        head: ContainerSnapshot, records: list[bytes], node: str, epoch: int, at_ms: int
    ) -> bytes:
        """The MetadataSnapshot bytes of a `capture` (blocking: run it in a thread)."""
        container = head.SerializeToString() + b"".join(_field(_SEGMENTS_FIELD, r) for r in records)
        wrapper = build_snapshot(ContainerSnapshot(), node, epoch, at_ms)
        wrapper.ClearField("container")
        return wrapper.SerializeToString() + _field(_CONTAINER_FIELD, container)
