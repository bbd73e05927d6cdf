"""Rebuilding a node's metadata from Tier 2 alone (disaster recovery, import).

When a node's SSD is lost, Tier 2 still holds, under ``<node>/``:

- metadata snapshots (``meta/``): the committed metadata of every segment,
  chunk lists included, uploaded after flushes; and
- chunk objects (``chunks/``), whose key carries the segment id, start offset
  and epoch, and whose user metadata carries the segment name, offset,
  length, CRC32C and epoch (`gateway.storage.object_keys`).

`rebuild_metadata` starts from the newest readable snapshot and replays the
chunks written after it, the way Pravega's SystemJournal rebuilds storage
metadata from the chunks themselves. Per segment, in offset order:

1. The snapshot's chunks are checked against a listing. Leading chunks that
   are gone were truncated away (or the segment deleted) after the snapshot:
   the segment now starts at the first chunk that is left. A chunk missing
   after that is a hole: nothing past it can be read, so the segment ends
   there. A segment whose every chunk is gone is taken as deleted.
2. A chunk the snapshot does not name extends the segment if it starts
   exactly at the segment's current storage end and its epoch is not below
   that of the chunk before it (an older epoch's object past a newer one is
   left over from before an earlier recovery). Among several such chunks
   the newest epoch wins, then the longest: a crashed epoch's unjournaled
   upload loses to the re-upload of the epoch after it. On bindings that
   append, the snapshot's last chunk may have grown since: its metadata says
   how far.
3. Chunks that overlap what is already covered, start after a gap, or have
   unusable metadata are ignored and reported; GC deletes them later.
4. Segments created after the snapshot (ids at or above its
   ``next_segment_id``) come back from their chunks alone, named by the
   chunk metadata. Chunks of ids below it that the snapshot does not list
   belong to segments deleted before the snapshot, and chunks of epochs
   below the snapshot's that it does not name are garbage it already
   outlived: neither is looked at.

Every recovered segment then has ``length == storage_length ==`` the end of
its contiguous chunks. What only the lost journal held cannot come back:
bytes not yet flushed, and every change after the newest snapshot that no
chunk records -- seals, attribute updates (exactly-once writers' event
numbers included), truncations that deleted no whole chunk, deletions whose
chunk deletes had not run. docs/OPERATIONS.md says so to operators.

Attribute indexes (``attributes/``) are rebuilt the same way: each batch
object's metadata also says where the tree was after it, so a segment's
index is the newest chain of batches that ends at the newest batch (each
starting where the one before ended, back to its truncation offset); its
values are those of that batch. An index whose chunks are gone is dropped
(its segment then has only the attribute values its record carries).

`rebuild` without chunk replay is the check ``import-metadata`` runs on an
exported snapshot: the same verification and clamping, nothing added.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import trio

from gateway.container.attributes import is_core
from gateway.container.segment_names import validate_name
from gateway.container.streams import split_member
from gateway.errors import (
    ChunkNotFound,
    GatewayError,
    InvalidName,
    NothingToRecover,
)
from gateway.protocol.metadata_pb2 import (
    AttributeIndexRecord,
    ChunkRecord,
    ContainerSnapshot,
    MetadataSnapshot,
    SegmentRecord,
)
from gateway.storage import object_keys as names
from gateway.storage.interface import ObjectInfo
from gateway.storage.layer import ChunkLayer
from gateway.tier2.snapshot_store import Trusted, newest_snapshot, optional_int, trust_all
from gateway.tier2.snapshots import SNAPSHOT_VERSION
from gateway.tier2.untrusted import BadRecord, decimal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FoundChunk:
    """A chunk object as its key and user metadata describe it."""

    key: str
    segment_id: int
    segment: str
    start_offset: int
    length: int
    crc32c: int
    epoch: int
    #: Last modification, Unix seconds.
    mtime: float

    @property
    def end(self) -> int:
        """Segment offset just past the chunk."""
        return self.start_offset + self.length

    def record(self) -> ChunkRecord:
        """The chunk as segment metadata lists it."""
        return ChunkRecord(
            name=self.key,
            start_offset=self.start_offset,
            length=self.length,
            crc32c=self.crc32c,
            epoch=self.epoch,
        )


@dataclass
class RebuildReport:
    """What a rebuild found, used and left out -- for the log and the CLI."""

    #: The snapshot the rebuild started from ("" = none).
    snapshot_key: str = ""
    snapshot_epoch: int = 0
    snapshot_created_ms: int = 0
    #: The journal sequence of the snapshot's committed view (its object's
    #: ``applied-seq``; None: not recorded, an older snapshot).
    snapshot_applied_seq: int | None = None
    #: Snapshots that could not be used (newer ones first), and why.
    bad_snapshots: list[tuple[str, str]] = field(default_factory=list)
    #: Chunk objects listed under the node's prefix.
    chunks_listed: int = 0
    #: Chunk objects whose metadata was read (HEAD) because no snapshot named them.
    chunks_examined: int = 0
    #: Unnamed chunk objects skipped without a look: older than the snapshot,
    #: or of segments deleted before it (garbage for GC).
    chunks_skipped: int = 0
    segments: int = 0
    #: Bytes of all recovered segments in Tier 2 (from start offset to length).
    stored_bytes: int = 0
    #: Segment -> bytes it gained from chunks written after the snapshot.
    extended: dict[str, int] = field(default_factory=dict)
    #: Segments created after the snapshot, recovered from chunk metadata alone.
    new_segments: list[str] = field(default_factory=list)
    #: Segment -> bytes the snapshot counted that Tier 2 does not hold (lost).
    lost_bytes: dict[str, int] = field(default_factory=dict)
    #: Segment -> its new start offset, its leading chunks being gone.
    raised_start: dict[str, int] = field(default_factory=dict)
    #: Segments left out, and why.
    dropped: list[tuple[str, str]] = field(default_factory=list)
    #: Chunks named by the snapshot whose objects are gone (or too short).
    missing_chunks: list[str] = field(default_factory=list)
    #: Segments whose attribute index could not be rebuilt, and why.
    lost_attribute_indexes: list[tuple[str, str]] = field(default_factory=list)
    #: Chunk objects not used, and why.
    ignored_chunks: list[tuple[str, str]] = field(default_factory=list)
    #: Highest epoch in any snapshot, chunk key or chunk record seen.
    max_epoch: int = 0

    def summary(self) -> list[str]:
        """Human-readable lines: totals first, then every exception."""
        base = (
            f"snapshot {self.snapshot_key} (epoch {self.snapshot_epoch})"
            if self.snapshot_key
            else "no snapshot"
        )
        lines = [
            f"rebuilt {self.segments} segment(s), {self.stored_bytes} byte(s) in Tier 2, from "
            f"{base} and {self.chunks_examined} newer chunk object(s) of "
            f"{self.chunks_listed} listed; highest epoch seen {self.max_epoch}"
        ]
        lines += [f"snapshot {k} unusable: {why}" for k, why in self.bad_snapshots]
        for n, b in sorted(self.extended.items()):
            if n in self.new_segments:
                lines.append(f"{n!r}: created after the snapshot, {b} byte(s) from its chunks")
            else:
                lines.append(f"{n!r}: {b} byte(s) from chunks newer than the snapshot")
        for n, b in sorted(self.lost_bytes.items()):
            lines.append(f"{n!r}: LOST {b} byte(s) that were only in the journal")
        for n, o in sorted(self.raised_start.items()):
            lines.append(f"{n!r}: its first chunks are gone, it now starts at {o}")
        lines += [f"{n!r} left out: {why}" for n, why in self.dropped]
        lines += [f"{n!r}: {why}" for n, why in self.lost_attribute_indexes]
        lines += [f"chunk {k} named by the snapshot is gone" for k in self.missing_chunks]
        lines += [f"chunk {k} ignored: {why}" for k, why in self.ignored_chunks]
        if self.chunks_skipped:
            lines.append(
                f"{self.chunks_skipped} chunk object(s) older than the snapshot or of segments "
                "deleted before it were not looked at (garbage)"
            )
        return lines


@dataclass(frozen=True)
class Rebuilt:
    """The outcome of a rebuild: the metadata to install, and the report."""

    container: ContainerSnapshot
    report: RebuildReport

    @property
    def max_epoch(self) -> int:
        """The new node's journal must start above this epoch."""
        return self.report.max_epoch


def _decode_chunk(key: str, info: ObjectInfo) -> FoundChunk | str:
    """The chunk that ``key``'s metadata describes, or why it cannot be used."""
    parsed = names.parse_chunk_key(key)
    assert parsed is not None
    segment_id, key_offset, key_epoch = parsed
    md = info.metadata
    try:
        chunk = FoundChunk(
            key=key,
            segment_id=segment_id,
            segment=validate_name(md["segment"]),
            start_offset=decimal(md["offset"], "offset"),
            length=decimal(md["length"], "length"),
            crc32c=_crc(md["crc32c"]),
            epoch=decimal(md["epoch"], "epoch"),
            mtime=info.mtime,
        )
    except KeyError:
        return "its user metadata lacks segment, offset, length, crc32c or epoch"
    except (BadRecord, InvalidName) as e:
        return f"its user metadata is unusable: {e}"
    version = md.get("format-version", str(names.CHUNK_FORMAT_VERSION))
    if version != str(names.CHUNK_FORMAT_VERSION):
        return f"chunk format version {version} is unknown"
    if chunk.start_offset != key_offset or chunk.epoch != key_epoch:
        return "its metadata disagrees with its key (offset or epoch)"
    if chunk.length > info.size:
        return f"its metadata says {chunk.length} bytes, the object holds {info.size}"
    return chunk


def _crc(text: str) -> int:
    """A CRC32C as object metadata writes it: 8 hex digits."""
    if len(text) != 8 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise BadRecord(f"crc32c {text[:20]!r} is not 8 hex digits")
    return int(text, 16)


async def _stat_all(layer: ChunkLayer, keys: list[str]) -> dict[str, ObjectInfo | None]:
    """HEAD every key at once (the layer bounds the concurrency); None: gone."""
    found: dict[str, ObjectInfo | None] = {}

    async def one(key: str) -> None:
        try:
            found[key] = await layer.stat(key)
        except ChunkNotFound:
            found[key] = None

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    return found


def _extend(
    end: int, last_epoch: int, candidates: list[FoundChunk], limit: int | None
) -> tuple[list[FoundChunk], list[tuple[FoundChunk, str]]]:
    """Chain candidates onto a segment whose storage ends at ``end`` (rule 2).

    Returns the chunks used, in offset order, and the others with the reason.
    ``limit``: a sealed segment's length, which no chunk may pass.
    """
    by_start: dict[int, list[FoundChunk]] = defaultdict(list)
    for c in candidates:
        by_start[c.start_offset].append(c)
    picked: list[FoundChunk] = []
    while True:
        options = [
            c
            for c in by_start.get(end, ())
            if c.length > 0 and c.epoch >= last_epoch and (limit is None or c.end <= limit)
        ]
        if not options:
            break
        best = max(options, key=lambda c: (c.epoch, c.length, c.key))
        picked.append(best)
        end, last_epoch = best.end, best.epoch
    used = {c.key for c in picked}
    ignored: list[tuple[FoundChunk, str]] = []
    for c in sorted(candidates, key=lambda c: (c.start_offset, c.key)):
        if c.key in used:
            continue
        if c.length == 0:
            why = "empty"
        elif limit is not None and c.end > limit:
            why = f"ends at {c.end}, past the sealed length {limit}"
        elif c.start_offset < end:
            why = f"overlaps bytes already recovered (up to {end})"
        elif c.start_offset > end:
            why = f"starts at {c.start_offset}, after a gap at {end}"
        else:
            why = f"epoch {c.epoch} is below the epoch {last_epoch} of the chunk before it (stale)"
        ignored.append((c, why))
    return picked, ignored


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@dataclass
class _Outcome:
    """One recovered segment, before name conflicts are settled."""

    record: SegmentRecord
    #: Bytes gained from chunks newer than the snapshot.
    gained: int
    #: Created after the snapshot (recovered from its chunks alone).
    new: bool


async def rebuild(
    layer: ChunkLayer,
    node: str,
    base: MetadataSnapshot | None,
    *,
    replay_chunks: bool,
    report: RebuildReport | None = None,
    trusted: Trusted = trust_all,
) -> Rebuilt:
    """Metadata for ``node`` from ``base`` (may be None) checked against Tier 2.

    With ``replay_chunks``, chunks written after ``base`` are added (disaster
    recovery); without, ``base`` is only verified and clamped to what Tier 2
    holds (import of an exported snapshot). Raises Tier2Error if Tier 2
    fails after retries.
    """
    report = report or RebuildReport()
    container = base.container if base is not None else ContainerSnapshot(version=SNAPSHOT_VERSION)
    listing = await layer.list(names.chunks_prefix(node))
    objects: dict[str, tuple[int, int, int]] = {}
    sizes: dict[str, int] = {}
    mtimes = {obj.key: obj.mtime for obj in listing}
    max_epoch = base.epoch if base is not None else 0
    for obj in listing:
        parsed = names.parse_chunk_key(obj.key)
        if parsed is None:
            continue  # not a chunk: GC counts such keys, recovery has no use for them
        objects[obj.key] = parsed
        sizes[obj.key] = obj.size
        max_epoch = max(max_epoch, parsed[2])
    report.chunks_listed = len(objects)
    for obj in await layer.list(names.meta_prefix(node)):
        snapshot = names.parse_snapshot_key(obj.key)
        if snapshot is not None:
            max_epoch = max(max_epoch, snapshot[1])
    named: set[str] = set()
    for r in container.segments:
        for c in r.chunks:
            named.add(c.name)
            max_epoch = max(max_epoch, c.epoch)
    report.max_epoch = max(report.max_epoch, max_epoch)
    known = {r.id for r in container.segments}

    # Which unnamed objects matter (rule 4), and the snapshot's last chunks,
    # which may have grown on a binding that appends: one HEAD each.
    unnamed: list[str] = []
    last_chunks: list[str] = []
    if replay_chunks:
        for key, (segment_id, _, epoch) in objects.items():
            if key in named:
                continue
            older = base is not None and epoch < base.epoch
            deleted = segment_id < container.next_segment_id and segment_id not in known
            if older or deleted:
                report.chunks_skipped += 1
            elif not trusted(epoch, mtimes[key]):
                report.ignored_chunks.append(
                    (key, f"stored after epoch {epoch} was fenced (a fenced process's upload)")
                )
            else:
                unnamed.append(key)
        report.chunks_examined = len(unnamed)
        if layer.storage.supports_append:
            last_chunks = [r.chunks[-1].name for r in container.segments if r.chunks]
    stats = await _stat_all(layer, unnamed + last_chunks)

    candidates: dict[int, list[FoundChunk]] = defaultdict(list)
    for key in unnamed:
        info = stats.get(key)
        if info is None:
            continue  # deleted since the listing
        found = _decode_chunk(key, info)
        if isinstance(found, str):
            report.ignored_chunks.append((key, found))
        else:
            candidates[found.segment_id].append(found)

    outcomes: list[_Outcome] = []
    for r in container.segments:
        grown = stats.get(r.chunks[-1].name) if r.chunks else None
        outcome = _rebuild_segment(r, sizes, grown, candidates.pop(r.id, []), report)
        if outcome is not None:
            outcomes.append(outcome)
    for segment_id in sorted(candidates):
        outcome = _new_segment(segment_id, candidates[segment_id], report)
        if outcome is not None:
            outcomes.append(outcome)

    # Two live segments with one name: the one created later (the larger id)
    # is the one that exists; the other was deleted and its chunks not yet.
    by_name: dict[str, _Outcome] = {}
    for o in sorted(outcomes, key=lambda o: o.record.id, reverse=True):
        rec = o.record
        if rec.name in by_name:
            later = by_name[rec.name].record.id
            report.dropped.append(
                (rec.name, f"id {rec.id}: id {later}, created later, has the name")
            )
            continue
        by_name[rec.name] = o
    kept = sorted(by_name.values(), key=lambda o: o.record.id)
    _keep_pending_merges([o.record for o in kept], report)
    for o in kept:
        if o.new:
            report.new_segments.append(o.record.name)
        if o.gained:
            report.extended[o.record.name] = o.gained
    records = [o.record for o in kept]
    epoch = base.epoch if base is not None else 0
    await _rebuild_attribute_indexes(layer, node, records, replay_chunks, report, epoch, trusted)
    report.segments = len(kept)
    report.stored_bytes = sum(o.record.length - o.record.start_offset for o in kept)
    max_id = max((i for i, _, _ in objects.values()), default=0)
    result = ContainerSnapshot(
        version=SNAPSHOT_VERSION,
        next_segment_id=max(container.next_segment_id, max_id + 1, 1),
        segments=[o.record for o in kept],
        streams=container.streams,
    )
    return Rebuilt(result, report)


def _keep_pending_merges(records: list[SegmentRecord], report: RebuildReport) -> None:
    """Committed transactions not yet merged in Tier 2: keep the merge where it still fits.

    A target is rebuilt from its chunks, which end at the merge offset; its
    merged bytes are the (sealed, hidden) source's. If the target lost bytes
    below the merge offset, the merge cannot stand: the transaction is left
    uncommitted (sealed, hidden), for its writer to commit again or abort.
    """
    by_id = {r.id: r for r in records}
    for src in sorted((r for r in records if r.merged_into), key=lambda r: r.merge_offset):
        target = by_id.get(src.merged_into)
        if target is not None and not target.sealed and target.length == src.merge_offset:
            target.length += src.length
            continue
        report.dropped.append(
            (src.name, f"its merge into segment id {src.merged_into} at {src.merge_offset} "
             "no longer fits the rebuilt target: left uncommitted")
        )  # fmt: skip
        src.merged_into = 0
        src.merge_offset = 0


def _rebuild_segment(
    r: SegmentRecord,
    sizes: dict[str, int],
    grown: ObjectInfo | None,
    candidates: list[FoundChunk],
    report: RebuildReport,
) -> _Outcome | None:
    """One segment of the snapshot, checked (rule 1) and extended (rule 2).

    ``sizes``: every chunk object listed; ``grown``: the metadata of the
    snapshot's last chunk now, if it was read (bindings that append).
    """

    def present(c: ChunkRecord) -> bool:
        return sizes.get(c.name, -1) >= c.length

    chunks = list(r.chunks)
    first = 0
    while first < len(chunks) and not present(chunks[first]):
        report.missing_chunks.append(chunks[first].name)
        first += 1
    if chunks and first == len(chunks):
        if not candidates:
            why = "every chunk the snapshot names is gone: deleted (or truncated past its "
            report.dropped.append((r.name, why + "last chunk) after the snapshot"))
            return None
        start = max(r.start_offset, min(c.start_offset for c in candidates))
    elif first:
        start = max(r.start_offset, chunks[first].start_offset)
    else:
        start = r.start_offset
    if start > r.start_offset:
        report.raised_start[r.name] = start
    kept: list[ChunkRecord] = []
    end = start
    hole = False
    for c in chunks[first:]:
        if c.start_offset + c.length <= end and not kept:
            continue  # wholly below the start offset: garbage
        if c.start_offset > end or not present(c):
            hole = True
            break
        kept.append(c)
        end = c.start_offset + c.length
    if hole:
        # Nothing past a hole can be read, whatever else is there.
        for c in chunks[first + len(kept) :]:
            if present(c):
                report.ignored_chunks.append((c.name, f"after a hole at {end}"))
            else:
                report.missing_chunks.append(c.name)
        report.ignored_chunks += [(fc.key, f"after a hole at {end}") for fc in candidates]
        candidates = []
    snapshot_end = end
    limit = r.length if r.sealed else None
    modified_ms = r.last_modified_ms
    if not hole and kept and kept[-1].name == chunks[-1].name and grown is not None:
        g = _decode_chunk(kept[-1].name, grown)
        if (
            isinstance(g, FoundChunk)
            and g.length > kept[-1].length
            and (limit is None or g.end <= limit)
        ):
            kept[-1] = g.record()
            end = g.end
            modified_ms = max(modified_ms, _ms(g.mtime))
    usable = []
    for fc in candidates:
        if fc.segment == r.name:
            usable.append(fc)
        else:
            why = f"its metadata names {fc.segment!r}, segment id {r.id} is {r.name!r}"
            report.ignored_chunks.append((fc.key, why))
    picked, ignored = _extend(end, kept[-1].epoch if kept else 0, usable, limit)
    report.ignored_chunks += [(c.key, why) for c, why in ignored]
    if picked:
        end = picked[-1].end
    if r.length > end:
        report.lost_bytes[r.name] = r.length - end
    rec = SegmentRecord()
    rec.CopyFrom(r)
    rec.start_offset = start
    rec.length = rec.storage_length = end
    rec.sealed_in_storage = rec.sealed
    del rec.chunks[:]
    rec.chunks.extend(kept)
    rec.chunks.extend(c.record() for c in picked)
    del rec.event_index[:]
    rec.event_index.extend(x for x in r.event_index if start <= x < end)
    if picked:
        modified_ms = max(modified_ms, _ms(max(c.mtime for c in picked)))
    rec.last_modified_ms = modified_ms
    return _Outcome(rec, end - snapshot_end, new=False)


def _new_segment(
    segment_id: int, candidates: list[FoundChunk], report: RebuildReport
) -> _Outcome | None:
    """A segment the snapshot does not know, from its chunks alone (rule 4)."""
    nonempty = [c for c in candidates if c.length > 0]
    if not nonempty:
        report.ignored_chunks += [(c.key, "empty") for c in candidates]
        return None
    first = min(nonempty, key=lambda c: (c.start_offset, -c.epoch, -c.length))
    name = first.segment
    try:
        validate_name(name)
    except GatewayError as e:
        report.dropped.append((name, f"id {segment_id}: {e}"))
        report.ignored_chunks += [(c.key, "its segment name is invalid") for c in candidates]
        return None
    same = []
    for c in candidates:
        if c.segment == name:
            same.append(c)
        else:
            why = f"its metadata names {c.segment!r}, segment id {segment_id} is {name!r}"
            report.ignored_chunks.append((c.key, why))
    picked, ignored = _extend(first.start_offset, 0, same, None)
    report.ignored_chunks += [(c.key, why) for c, why in ignored]
    start, end = first.start_offset, picked[-1].end
    record = SegmentRecord(
        id=segment_id,
        name=name,
        start_offset=start,
        length=end,
        storage_length=end,
        created_at_ms=_ms(picked[0].mtime),
        last_modified_ms=_ms(max(c.mtime for c in picked)),
        chunks=[c.record() for c in picked],
        # Offset 0 is where the first append began; other chunk starts need
        # not be event boundaries (a chunk may roll inside an append).
        event_index=[0] if start == 0 else [],
    )
    return _Outcome(record, end - start, new=True)


async def rebuild_metadata(layer: ChunkLayer, node: str, trusted: Trusted = trust_all) -> Rebuilt:
    """Disaster recovery: ``node``'s metadata from its newest snapshot and newer chunks.

    ``trusted`` leaves out what fenced processes stored after their fence.
    Raises NothingToRecover when Tier 2 holds neither a snapshot nor a chunk
    of ``node`` (most likely a wrong ``tier2.url`` or ``node.id``).
    """
    report = RebuildReport()
    newest = await newest_snapshot(layer, node, report, trusted)
    base = None
    if newest is not None:
        report.snapshot_key, base = newest
        report.snapshot_epoch = base.epoch
        report.snapshot_created_ms = base.created_at_ms
    rebuilt = await rebuild(layer, node, base, replay_chunks=True, report=report, trusted=trusted)
    if base is None and not report.chunks_listed:
        detail = "; ".join(f"{k}: {why}" for k, why in report.bad_snapshots)
        raise NothingToRecover(
            f"Tier 2 holds no usable metadata snapshot and no chunk under {node!r}/"
            + (f" ({detail})" if detail else "")
            + ": check tier2.url and node.id; a new, empty node starts without "
            "--recover-from-tier2"
        )
    return rebuilt


def _drop_extended_attributes(r: SegmentRecord) -> None:
    """Leave only core attributes in ``r``: its extended ones are older than its index."""
    core = [a for a in r.attributes if is_core(a.id)]
    del r.attributes[:]
    r.attributes.extend(core)


async def _batch_is_newer(
    layer: ChunkLayer,
    newest: tuple[int, int, str, int],
    snapshot_length: int,
    snapshot_epoch: int,
    snapshot_seq: int | None,
) -> bool:
    """Whether the ``newest`` batch holds values committed after the snapshot's record.

    The record holds the extended values not yet indexed at the snapshot. A
    batch it does not name was prepared after it (and holds them all, as
    new or newer) or before it, journaled after (the record's are newer).
    By the journal positions both objects carry, else (older objects) a
    later epoch or a batch past the snapshot's index's end.
    """
    offset, epoch, key, _ = newest
    if epoch != snapshot_epoch:
        return epoch > snapshot_epoch
    if snapshot_seq is not None:
        try:
            info = await layer.stat(key)
        except ChunkNotFound:
            info = None
        through = optional_int(info.metadata.get(names.INDEX_THROUGH)) if info else None
        if through is not None:
            return through >= snapshot_seq
    return offset > snapshot_length


async def _rebuild_attribute_indexes(
    layer: ChunkLayer,
    node: str,
    records: list[SegmentRecord],
    replay_chunks: bool,
    report: RebuildReport,
    snapshot_epoch: int = 0,
    trusted: Trusted = trust_all,
) -> None:
    """Point each record at its newest complete attribute index in Tier 2 (or none).

    When that index is newer than the snapshot's (`_batch_is_newer`), the
    record's extended values go: they would hide the index's newer ones
    (an exactly-once writer's event number taken back). Batches a fenced
    process stored after its fence are not used, as its chunks are not.
    """
    listing = await layer.list(names.attributes_prefix(node))
    by_segment: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    for obj in listing:
        parsed = names.parse_attribute_chunk_key(obj.key)
        if parsed is not None:
            segment_id, offset, epoch = parsed
            if replay_chunks and not trusted(epoch, obj.mtime):
                report.ignored_chunks.append(
                    (obj.key, f"stored after epoch {epoch} was fenced (a fenced process's upload)")
                )
                continue
            by_segment[segment_id].append((offset, epoch, obj.key, obj.size))
    listed = {obj.key for obj in listing}
    live = {r.id for r in records}
    gone = {i for i in by_segment if i not in live}
    for r in records:
        index = r.attribute_index
        # A stream's segment may hold an index it took over from the segment
        # before it: those batches' keys carry that segment's id, and their
        # offsets go on in the same attribute segment.
        ids = {r.id}
        for c in index.chunks:
            parsed = names.parse_attribute_chunk_key(c.name)
            if parsed is not None:
                ids.add(parsed[0])
        if split_member(r.name) is not None:
            # ...and that one may be gone by now (retention), unnamed by any
            # record: the chain of batches (each ending where the next
            # starts) decides which of those objects belong.
            ids |= gone
        found = [item for i in sorted(ids) for item in by_segment.get(i, [])]
        if replay_chunks and by_segment.get(r.id):
            newest = max(found)  # the largest offset, then the newest epoch
            if not r.HasField("attribute_index") or newest[0] >= index.length:
                had = index.length if r.HasField("attribute_index") else 0
                rebuilt = await _index_from_batches(layer, r.name, found, newest, report)
                if rebuilt is not None:
                    if await _batch_is_newer(
                        layer, newest, had, snapshot_epoch, report.snapshot_applied_seq
                    ):
                        _drop_extended_attributes(r)
                    r.attribute_index.CopyFrom(rebuilt)
                    continue
        if r.HasField("attribute_index") and any(c.name not in listed for c in index.chunks):
            report.lost_attribute_indexes.append(
                (r.name, "its attribute index lost chunks in Tier 2: attribute values "
                 "not in its record are gone")
            )  # fmt: skip
            r.ClearField("attribute_index")


async def _index_from_batches(
    layer: ChunkLayer,
    segment: str,
    found: list[tuple[int, int, str, int]],
    newest: tuple[int, int, str, int],
    report: RebuildReport,
) -> AttributeIndexRecord | None:
    """The index after the ``newest`` batch, with the chain of batches it needs."""
    info = await layer.stat(newest[2])
    md = info.metadata
    try:
        state = AttributeIndexRecord(
            root_offset=int(md["index-root-offset"]),
            root_length=int(md["index-root-length"]),
            length=int(md["index-length"]),
            start=int(md["index-start"]),
        )
    except (KeyError, ValueError):
        report.ignored_chunks.append((newest[2], "attribute batch metadata lacks the tree"))
        return None
    # Back from the newest batch: each batch starts where an earlier one ended.
    by_end: dict[int, tuple[int, int, str, int]] = {}
    for item in sorted(found):
        end = item[0] + item[3]
        if end not in by_end or item[1] > by_end[end][1]:
            by_end[end] = item
    chain = [newest]
    while chain[-1][0] > state.start:
        before = by_end.get(chain[-1][0])
        if before is None:
            report.lost_attribute_indexes.append(
                (segment, f"its attribute index misses the batch ending at {chain[-1][0]}")
            )
            return None
        chain.append(before)
    for offset, epoch, key, size in reversed(chain):
        if offset + size > state.start:
            info = await layer.stat(key)
            try:
                _crc(info.metadata.get("crc32c", "00000000"))
            except BadRecord as e:
                report.ignored_chunks.append((key, f"attribute batch metadata: {e}"))
                return None
            state.chunks.append(
                ChunkRecord(
                    name=key,
                    start_offset=offset,
                    length=size,
                    crc32c=_crc(info.metadata.get("crc32c", "00000000")),
                    epoch=epoch,
                )
            )
    return state
