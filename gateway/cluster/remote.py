"""Another node's segments, as this node's mount shows them.

A `RemoteNode` keeps the committed metadata of one other node's segments:

- while the node answers over the protocol, from it: a listing every
  ``cluster.refresh_interval``, and the whole record (chunk list,
  attributes, event index) of each segment that changed; then the names of
  its streams (directories in the mount before their first segment);
- when it does not (down, stopped, or cut off), from what can be proven
  without it: its newest metadata snapshot in Tier 2, merged with the chunk
  lists already learnt from it. Each file then ends at its flushed length.

Reads of flushed bytes go straight to the chunks in Tier 2, through this
node's `ChunkReader` (its RocksDB cache and read-ahead), as for local
segments; bytes past the flushed length come from the owner over the
protocol, within a bounded time.

Remote segments get ids of their own on this node (`REMOTE_ID_BASE` and up,
never reused while the daemon runs), so their inodes never meet local ones.
"""

from __future__ import annotations

import logging

import trio
from google.protobuf.message import DecodeError

from gateway.buffers import Buffer
from gateway.client import Client
from gateway.container.interfaces import NamespaceWatcher
from gateway.container.results import ReadResult, SegmentInfo
from gateway.container.segment import Segment
from gateway.errors import GatewayError, SegmentNotFound, SegmentTruncated, SnapshotInvalid
from gateway.protocol.metadata_pb2 import MetadataSnapshot, SegmentRecord
from gateway.readindex import SegmentView
from gateway.tier2 import names
from gateway.tier2.layer import ChunkLayer
from gateway.tier2.reader import ChunkReader
from gateway.tier2.snapshots import check_snapshot

log = logging.getLogger(__name__)

#: Ids of remote segments on this node start here (local ids stay far below).
REMOTE_ID_BASE = 1 << 39
#: How long a read of an unflushed tail may wait for the owner.
TAIL_READ_TIMEOUT = 5.0


class TailUnavailable(GatewayError):
    """segment {!r}: bytes from offset {} are only on node {}, which does not answer"""

    exit_code = 27
    wire_code = "TIER2_UNAVAILABLE"


class MountIds:
    """This node's ids for other nodes' segments: stable while the daemon runs."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, int], int] = {}
        self._next = REMOTE_ID_BASE

    def forget(self, node: str, remote_id: int) -> None:
        """The segment is gone: drop its entry (its id is never given out again)."""
        self._ids.pop((node, remote_id), None)

    def get(self, node: str, remote_id: int) -> int:
        """The local id of segment ``remote_id`` of ``node`` (a new one the first time)."""
        key = (node, remote_id)
        mount_id = self._ids.get(key)
        if mount_id is None:
            mount_id = self._ids[key] = self._next
            self._next += 1
        return mount_id


def _covered(seg: Segment) -> int:
    """End of the bytes the known chunks hold (they are contiguous from the start)."""
    return max((c.start_offset + c.length for c in seg.chunks), default=0)


def _same(seg: Segment, info: SegmentInfo) -> bool:
    """Whether a listing shows nothing new about a known segment."""
    return (
        seg.length == info.length
        and seg.storage_length == info.storage_length
        and seg.sealed == info.sealed
        and seg.start_offset == info.start_offset
        and seg.last_modified_ms == info.last_modified_ms
        and len(seg.chunks) == info.chunk_count
    )


class RemoteNode:
    """One other node's segments (committed view), its state, and reads of them."""

    def __init__(
        self, node_id: str, layer: ChunkLayer, reader: ChunkReader | None, ids: MountIds
    ) -> None:
        self.node_id = node_id
        self.layer = layer
        self.reader = reader
        self.ids = ids
        #: Connected to the owner: unflushed tails are readable.
        self.client: Client | None = None
        #: Local id -> segment (its ``id`` is the local id).
        self.segments: dict[int, Segment] = {}
        self._by_name: dict[str, int] = {}
        #: Local id -> the owner's id of the segment.
        self._remote_ids: dict[int, int] = {}
        self.watchers: list[NamespaceWatcher] = []
        #: Names of its streams (directories in the mount, with or without segments).
        self.streams: set[str] = set()
        self._snapshot_key = ""
        self._snapshot: dict[str, SegmentRecord] = {}
        self._snapshot_streams: set[str] = set()
        self.refreshes = 0
        #: Set once the view has been filled once (live or from Tier 2).
        self.first_refresh = trio.Event()

    @property
    def tail_available(self) -> bool:
        """Whether bytes past the flushed length can be read (the owner answers)."""
        return self.client is not None

    def by_name(self, name: str) -> Segment | None:
        """The segment with this name, if this node has it."""
        mount_id = self._by_name.get(name)
        return None if mount_id is None else self.segments.get(mount_id)

    # -- keeping the view ---------------------------------------------------------------

    def _put(self, record: SegmentRecord, proven_only: bool) -> None:
        """Add or update a segment from its record, telling the watchers what changed."""
        seg = Segment.from_record(record)
        seg.id = self.ids.get(self.node_id, record.id)
        if proven_only:
            # Without the owner only the flushed bytes can be read.
            seg.length = max(seg.start_offset, min(seg.length, _covered(seg)))
            seg.storage_length = min(seg.storage_length, seg.length)
            if seg.sealed and seg.length < record.length:
                seg.sealed = False  # its end is not readable: not the sealed file
        old = self.segments.get(seg.id)
        self.segments[seg.id] = seg
        self._remote_ids[seg.id] = record.id
        self._by_name[seg.name] = seg.id
        for w in list(self.watchers):
            if old is None:
                w.on_created(seg)
            else:
                if seg.start_offset > old.start_offset or seg.length < old.length:
                    # Truncated, or cut back to its flushed length (owner
                    # gone): the kernel's size and pages must go at once.
                    w.on_truncated(seg)
                if seg.sealed and not old.sealed:
                    w.on_sealed(seg)

    def _remove(self, mount_id: int) -> None:
        seg = self.segments.pop(mount_id)
        # Forgotten, so that a node that churns through segments for months
        # does not grow this map; should the segment come back (an older
        # snapshot), it gets a new id, and so a new inode.
        self.ids.forget(self.node_id, self._remote_ids.pop(mount_id))
        if self._by_name.get(seg.name) == mount_id:
            del self._by_name[seg.name]
        for w in list(self.watchers):
            w.on_deleted(seg)

    def _set_streams(self, names: set[str]) -> None:
        """Its streams are these now: tell the watchers which went, then which came."""
        gone, came = sorted(self.streams - names), sorted(names - self.streams)
        self.streams = names
        for w in list(self.watchers):
            for name in gone:
                w.on_stream_deleted(name)
            for name in came:
                w.on_stream_created(name)

    async def refresh_live(self, client: Client) -> None:
        """Bring the view up to date from the owner (a listing, then changed records)."""
        infos = await client.list(local_only=True)
        seen: set[int] = set()
        changed: list[SegmentInfo] = []
        for info in infos:
            mount_id = self.ids.get(self.node_id, info.id)
            seen.add(mount_id)
            seg = self.segments.get(mount_id)
            if seg is None or not _same(seg, info):
                changed.append(info)
        records: dict[str, SegmentRecord] = {}
        failures: list[GatewayError] = []

        async def fetch(name: str) -> None:
            try:
                records[name] = await client.record(name)
            except SegmentNotFound:
                pass  # deleted since the listing: the next one drops it
            except GatewayError as e:
                failures.append(e)  # raised below as itself, not in a group

        async with trio.open_nursery() as nursery:
            for info in changed:
                nursery.start_soon(fetch, info.name)
        if failures:
            raise failures[0]
        # Removals first: a name deleted and created again must not meet its old self.
        for mount_id in [m for m in self.segments if m not in seen]:
            self._remove(mount_id)
        for info in changed:
            record = records.get(info.name)
            if record is not None:
                self._put(record, proven_only=False)
            elif self.ids.get(self.node_id, info.id) not in self.segments:
                self.ids.forget(self.node_id, info.id)  # deleted before we saw it
        # After the segments: a deleted stream's segments have gone by now.
        self._set_streams(set(await client.stream_names()))
        self.refreshes += 1

    async def refresh_proven(self) -> None:
        """The view without the owner: its newest snapshot and the chunks already known.

        Each segment ends at its flushed length; a segment neither in the
        snapshot nor known with flushed bytes is not shown.
        """
        listing = await self.layer.list(names.meta_prefix(self.node_id))
        # The newest epoch's newest snapshot: a fenced zombie's are of an older epoch.
        keys = sorted(
            (o.key for o in listing if names.parse_snapshot_key(o.key) is not None),
            key=lambda k: tuple(reversed(names.parse_snapshot_key(k) or (0, 0))),
        )
        if keys and keys[-1] != self._snapshot_key:
            key = keys[-1]
            size = next(o.size for o in listing if o.key == key)
            try:
                snap = MetadataSnapshot.FromString(await self.layer.read(key, 0, size))
            except DecodeError as e:
                raise SnapshotInvalid(key, f"does not decode: {e}") from e
            check_snapshot(snap, key)
            # Transactions are the owner's private business until committed.
            self._snapshot = {r.name: r for r in snap.container.segments if not r.txn_parent}
            self._snapshot_streams = {r.name for r in snap.container.streams}
            self._snapshot_key = key
        records: dict[str, SegmentRecord] = dict(self._snapshot)
        for seg in self.segments.values():
            known = seg.committed_record()
            known.id = self._remote_ids[seg.id]
            theirs = records.get(seg.name)
            if theirs is None or (
                theirs.id == known.id
                and sum(c.length for c in known.chunks) > sum(c.length for c in theirs.chunks)
            ):
                records[seg.name] = known
        keep = {self.ids.get(self.node_id, r.id) for r in records.values()}
        for mount_id in [m for m in self.segments if m not in keep]:
            self._remove(mount_id)
        for record in records.values():
            self._put(record, proven_only=True)
        # Streams known from the owner stay, like its segments: an empty
        # directory is all a stream shows by itself.
        self._set_streams(self._snapshot_streams | self.streams)
        self.refreshes += 1

    # -- reads --------------------------------------------------------------------------

    async def read_result(self, seg: Segment, offset: int, size: int, wait: float) -> ReadResult:
        """A protocol read on this node of the other node's segment.

        From the owner while it answers (future reads included); without
        it, the flushed bytes, and the segment ends where they end.
        """
        client = self.client
        if client is not None:
            with trio.move_on_after(TAIL_READ_TIMEOUT + wait):
                return await client.read(seg.name, offset, size, wait)
            raise TailUnavailable(seg.name, offset, self.node_id)
        if offset < seg.start_offset:
            raise SegmentTruncated(seg.name, offset, seg.start_offset)
        if offset >= seg.length:
            await trio.sleep(wait if not seg.sealed else 0)
            return ReadResult(offset, b"", seg.length, seg.start_offset, seg.sealed)
        data = await self.read(seg.view(), offset, size)
        return ReadResult(offset, bytes(data), seg.length, seg.start_offset, seg.sealed)

    async def read(self, view: SegmentView, offset: int, size: int) -> Buffer:
        """Committed bytes from ``offset``: zeros below the start, chunks, then the owner.

        Whole, up to ``size`` or the end of the segment: a short answer would
        read as the end of the file to the kernel.
        """
        end = min(view.length, offset + size)
        pieces: list[Buffer] = []
        while offset < end:
            piece = await self._read_piece(view, offset, end)
            if not len(piece):
                break  # the owner's segment is shorter than our view of it
            pieces.append(piece)
            offset += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _read_piece(self, view: SegmentView, offset: int, end: int) -> Buffer:
        if offset < view.start_offset:
            return bytes(min(end, view.start_offset) - offset)
        covered = min(view.storage_length, end)
        if offset < covered and view.chunks:
            if self.reader is None:
                raise TailUnavailable(view.name, offset, self.node_id)
            return await self.reader.read(
                view.id, view.name, view.chunks, offset, covered - offset, read_ahead=False
            )
        client = self.client
        if client is None:
            raise TailUnavailable(view.name, offset, self.node_id)
        with trio.move_on_after(TAIL_READ_TIMEOUT):
            result = await client.read(view.name, offset, end - offset)
            return result.data
        raise TailUnavailable(view.name, offset, self.node_id)
