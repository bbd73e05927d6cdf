"""Tier-2 metadata snapshots: the one place that builds and checks them.

A `MetadataSnapshot` (metadata.proto) is a node's committed metadata as the
storage writer uploads it to ``<prefix>/<node>/meta/``, as ``export-metadata``
writes it, and as fsck, ``import-metadata`` and disaster recovery read it.
It wraps the container's own checkpoint snapshot (`ContainerSnapshot`,
`gateway.container.table.SNAPSHOT_VERSION`).
"""

from __future__ import annotations

import time

import gateway
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
