"""Reading a node's metadata snapshots back from Tier 2: a whole snapshot, and
the newest usable delta of it applied (docs/FORMATS.md, "Metadata snapshots
in Tier 2"). Recovery, fsck and other nodes' proven views read through here;
`gateway.tier2.housekeeping` writes them and `gateway.tier2.snapshots` builds
and checks them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from gateway.errors import ChunkNotFound, SnapshotInvalid
from gateway.protocol.metadata_pb2 import MetadataSnapshot
from gateway.storage import object_keys as names
from gateway.storage.interface import ObjectInfo
from gateway.storage.layer import ChunkLayer
from gateway.tier2.snapshots import apply_delta, check_delta, check_snapshot

__all__ = [
    "SnapshotReport",
    "Trusted",
    "deltas_of",
    "newest_snapshot",
    "optional_int",
    "read_snapshot",
    "trust_all",
    "with_newest_delta",
]

log = logging.getLogger(__name__)

#: Whether an object of an epoch, stored at a time (Unix s), may be believed:
#: false for what a fenced process uploaded after its fence
#: (`gateway.cluster.fence.FenceTimes.trusted`).
Trusted = Callable[[int, float], bool]


def trust_all(epoch: int, mtime: float) -> bool:
    """The `Trusted` of a caller that knows of no fence."""
    return True


class SnapshotReport(Protocol):
    """What `newest_snapshot` reports (recovery's report)."""

    #: (key, why) of each snapshot or delta skipped.
    bad_snapshots: list[tuple[str, str]]
    #: The highest epoch a snapshot key names.
    max_epoch: int
    #: The journal sequence the snapshot used is of (object metadata), if known.
    snapshot_applied_seq: int | None


def optional_int(text: str | None) -> int | None:
    """A decimal from object metadata, or None (absent or unusable)."""
    return int(text) if text is not None and text.isdigit() and len(text) < 19 else None


async def read_snapshot(
    layer: ChunkLayer, key: str, deadline: float | None = None, max_bytes: int = 0
) -> tuple[MetadataSnapshot, ObjectInfo]:
    """A snapshot (or delta) object, whole, its CRC32C checked, decoded -- not
    yet checked (`check_snapshot`, `check_delta`). ``max_bytes``: refuse a
    larger object (0: any)."""
    import crc32c

    info = await layer.stat(key, deadline=deadline)
    if max_bytes and info.size > max_bytes:
        raise SnapshotInvalid(key, f"{info.size} bytes is more than this node reads")
    data = await layer.read(key, 0, max(info.size, 1), deadline=deadline)
    if len(data) != info.size:
        raise SnapshotInvalid(key, f"read {len(data)} of {info.size} bytes")
    want = info.metadata.get("crc32c")
    if want is not None and int(want, 16) != crc32c.crc32c(data):
        raise SnapshotInvalid(key, "its CRC32C does not match")
    try:
        return MetadataSnapshot.FromString(data), info
    except Exception as e:  # protobuf's DecodeError; any failure means unusable
        raise SnapshotInvalid(key, f"does not decode: {e}") from e


def deltas_of(listing: Sequence[ObjectInfo], base_key: str) -> list[ObjectInfo]:
    """The deltas of the whole snapshot ``base_key`` in ``listing``, newest first."""
    deltas = []
    for obj in listing:
        parsed = names.parse_delta_key(obj.key)
        if parsed is not None and parsed[0] == base_key:
            deltas.append((parsed[1], obj))
    return [obj for _, obj in sorted(deltas, key=lambda t: t[0], reverse=True)]


async def with_newest_delta(
    layer: ChunkLayer,
    listing: Sequence[ObjectInfo],
    base_key: str,
    base: MetadataSnapshot,
    trusted: Callable[[ObjectInfo], bool],
    bad: Callable[[str, str], None],
    deadline: float | None = None,
    max_bytes: int = 0,
) -> tuple[str, MetadataSnapshot, ObjectInfo | None]:
    """``base`` (the whole snapshot ``base_key``, checked) with its newest usable
    delta in ``listing`` applied: (the delta's key, the merged snapshot, the
    delta object's info); or (``base_key``, ``base``, None) if it has none.

    Deltas are cumulative, so the newest one that reads and checks is all that
    is needed; one that does not (``bad`` is told why) or that ``trusted``
    refuses (a fenced process's upload) gives way to the one before it.
    """
    for obj in deltas_of(listing, base_key):
        if not trusted(obj):
            continue
        try:
            delta, info = await read_snapshot(layer, obj.key, deadline, max_bytes)
            check_delta(delta, base_key, base, obj.key)
        except (SnapshotInvalid, ChunkNotFound) as e:
            bad(obj.key, str(e))
            continue
        merged = await trio.to_thread.run_sync(apply_delta, base, delta)
        return obj.key, merged, info
    return base_key, base, None


async def newest_snapshot(
    layer: ChunkLayer, node: str, report: SnapshotReport, trusted: Trusted = trust_all
) -> tuple[str, MetadataSnapshot] | None:
    """The newest readable snapshot of ``node`` (by epoch, then time), or None.

    Unreadable ones (bad CRC, unknown version, another node's) and ones a
    fenced process stored after its fence (``trusted``) are skipped and
    reported; the next older one is tried. The one found comes with its newest
    usable delta applied (`gateway.tier2.snapshot_store`); the key returned is
    then the delta's.
    """
    listing = await layer.list(names.meta_prefix(node))
    found: list[tuple[int, int, ObjectInfo]] = []
    for obj in listing:
        parsed = names.parse_snapshot_key(obj.key)
        if parsed is not None:
            at_ms, epoch = parsed
            found.append((epoch, at_ms, obj))
            report.max_epoch = max(report.max_epoch, epoch)
    for epoch, _, obj in sorted(found, key=lambda t: (t[0], t[1]), reverse=True):
        if not _trusted(epoch, trusted, report, obj):
            continue
        try:
            snap, info = await read_snapshot(layer, obj.key)
            check_snapshot(snap, obj.key)
            if snap.node != node:
                raise SnapshotInvalid(obj.key, f"it is of node {snap.node!r}")
            if snap.epoch != epoch:
                raise SnapshotInvalid(obj.key, f"it says epoch {snap.epoch}, its key {epoch}")
        except (SnapshotInvalid, ChunkNotFound) as e:
            _bad(report, obj.key, str(e))
            continue
        # Its newest usable delta, if any: the node's metadata of later.
        key, snap, delta_info = await with_newest_delta(
            layer, listing, obj.key, snap, functools.partial(_trusted, epoch, trusted, report),
            functools.partial(_bad, report),
        )  # fmt: skip
        info = delta_info or info
        report.snapshot_applied_seq = optional_int(info.metadata.get(names.APPLIED_SEQ))
        return key, snap
    return None


def _bad(report: SnapshotReport, key: str, why: str) -> None:
    report.bad_snapshots.append((key, why))
    log.warning("recovery: snapshot %s ignored: %s", key, why)


def _trusted(epoch: int, trusted: Trusted, report: SnapshotReport, obj: ObjectInfo) -> bool:
    """Whether a snapshot (or delta) object was stored before its epoch was fenced."""
    if trusted(epoch, obj.mtime):
        return True
    _bad(report, obj.key, f"stored after epoch {epoch} was fenced (a fenced process's upload)")
    return False
