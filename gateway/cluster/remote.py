"""Another node's segments, as this node's mount shows them.

A `RemoteNode` keeps the committed metadata of one other node's segments:

- while the node answers over the protocol, from it, every
  ``cluster.refresh_interval``: what changed since the last refresh, from
  its change feed (`gateway.cluster.feed`: the whole record -- chunk list,
  attributes, event index -- of each segment that changed, the ids and
  names of those deleted, its stream names when they changed), so a
  refresh costs what changed, not what the node holds. The first refresh
  of a connection, and any the owner answers "resync", list the node in
  full and fetch the record of each segment that differs from the view;
  so does every refresh of an owner that does not serve the feed (older
  versions);
- when it does not (down, stopped, or cut off), from what can be proven
  without it: its newest metadata snapshot in Tier 2, merged with the chunk
  lists already learnt from it. Each file then ends at its flushed length.

Reads of flushed bytes go straight to the chunks in Tier 2, through this
node's `ChunkReader` (its RocksDB cache and read-ahead), as for local
segments; bytes past the flushed length come from the owner over the
protocol, within a bounded time. A read the owner does not answer in time
drops the connection (`lost`): the view falls back to what Tier 2 proves
at once, so later reads do not wait on a hung owner too.

Everything is checked before it is shown: snapshots must decode, be of
the node and epoch they claim, and have been stored before that epoch was
fenced (`FenceTimes`: a zombie's late uploads are not believed); each
segment record must hold the invariants readers rely on
(`record_problem`). What fails is skipped and reported once.

Remote segments get ids of their own on this node (`REMOTE_ID_BASE` and up,
never reused while the daemon runs), so their inodes never meet local ones.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable
from typing import NoReturn, Protocol, TypeVar

import trio

from gateway.buffers import Buffer
from gateway.client.client import Client
from gateway.cluster import feed
from gateway.cluster.fence import FenceTimes
from gateway.container.interfaces import AttributeStore, NamespaceWatcher
from gateway.container.results import ReadResult, SegmentInfo
from gateway.container.segment import Segment, blocks, coolable_record
from gateway.container.segment_names import validate_name
from gateway.errors import (
    ConnectionLost,
    GatewayError,
    InvalidName,
    SegmentNotFound,
    SegmentTruncated,
    SnapshotInvalid,
)
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.metadata_pb2 import MetadataSnapshot, SegmentRecord
from gateway.read.chunks import ChunkReader
from gateway.read.index import SegmentView
from gateway.storage import object_keys as names
from gateway.storage.interface import ObjectInfo
from gateway.storage.layer import ChunkLayer
from gateway.tier2.snapshot_store import deltas_of, with_newest_delta
from gateway.tier2.snapshots import check_snapshot, record_problem
from gateway.tier2.untrusted import Rejections

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Ids of remote segments on this node start here (local ids stay far below).
REMOTE_ID_BASE = 1 << 39
#: How long a read of an unflushed tail may wait for the owner.
TAIL_READ_TIMEOUT = 5.0
#: A snapshot larger than this is not read by followers (a million segments
#: make ~200 MiB; anything far beyond is not a snapshot).
MAX_SNAPSHOT_BYTES = 4 << 30


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

    def find(self, node: str, remote_id: int) -> int | None:
        """The local id of segment ``remote_id`` of ``node``, if it has one."""
        return self._ids.get((node, remote_id))

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


class ReplicaTails(Protocol):
    """This node's replicas of other nodes' journals, as the reads of a down owner's
    tail use them (`gateway.replication.store.ReplicaStore`)."""

    def holds(self, source: str) -> bool:
        """Whether a caught-up log of ``source``'s journal is here."""

    async def read_tail(self, source: str, segment_id: int, offset: int, size: int) -> bytes:
        """Up to ``size`` appended bytes of the owner's segment from ``offset``."""


class RemoteNode:
    """One other node's segments (committed view), its state, and reads of them."""

    def __init__(
        self,
        node_id: str,
        layer: ChunkLayer,
        reader: ChunkReader | None,
        ids: MountIds,
        rejections: Rejections | None = None,
        replicas: ReplicaTails | None = None,
    ) -> None:
        self.node_id = node_id
        #: This node's replicas of the owner's journal: while the owner does
        #: not answer, the unflushed bytes its files showed are read from them,
        #: so no file gets shorter (None: not replicated here).
        self.replicas = replicas
        self.layer = layer
        self.reader = reader
        self.ids = ids
        self.rejections = rejections or Rejections()
        #: Connected to the owner: unflushed tails are readable.
        self.client: Client | None = None
        #: Set while ``client`` is (`wait_attached`).
        self._attached = trio.Event()
        #: Cancels the live following when a read gets no answer (`lost`).
        self._live_scope: trio.CancelScope | None = None
        #: Why the connection was given up ("" while it is fine).
        self.lost_reason = ""
        #: Local id -> segment (its ``id`` is the local id).
        self.segments: dict[int, Segment] = {}
        #: 4 KiB blocks of those segments (the mount's statfs, without warming them).
        self.total_blocks = 0
        self._by_name: dict[str, int] = {}
        #: Local id -> the owner's id of the segment.
        self._remote_ids: dict[int, int] = {}
        self.watchers: list[NamespaceWatcher] = []
        #: Names of its streams (directories in the mount, with or without segments).
        self.streams: set[str] = set()
        self._snapshot_key = ""
        #: The newest object of the snapshot loaded (its newest delta, used or not).
        self._snapshot_tried = ""
        #: The whole snapshot last read, (key, snapshot): a newer delta of it
        #: is applied without reading it again.
        self._base: tuple[str, MetadataSnapshot] | None = None
        self._snapshot: dict[str, SegmentRecord] = {}
        self._snapshot_streams: set[str] = set()
        self.refreshes = 0
        #: Set once the view has been filled once (live or from Tier 2).
        self.first_refresh = trio.Event()
        # Live refreshes started and the last one finished (`refreshed`).
        self._live_started = 0
        self._live_done = 0
        self._live_finished = trio.Event()
        self._refresh_wanted = trio.Event()
        #: Where the change feed of the owner goes on from (None: list it in
        #: full first), and the digest of the stream names it last sent.
        self._cursor: wire.ChangeCursor | None = None
        self._streams_digest = 0
        #: What following the owner cost: full listings, record requests,
        #: change-feed requests, records the feed brought.
        self.listings = 0
        self.records_fetched = 0
        self.feed_requests = 0
        self.feed_records = 0
        #: Walks of the owner (a first sync, a resync) and their pages.
        self.walks = 0
        self.walk_pages = 0
        #: Seconds each request of a live refresh may take (None: no bound).
        self._deadline: float | None = None

    @property
    def tail_available(self) -> bool:
        """Whether bytes past the flushed length can be read (the owner answers)."""
        return self.client is not None

    def attach(self, client: Client, scope: trio.CancelScope) -> None:
        """Live from now: ``client`` is connected to the owner (``scope``: its following)."""
        self.client = client
        self._live_scope = scope
        self.lost_reason = ""
        # The view may have been cut to what Tier 2 proves meanwhile: list
        # the owner in full before following its changes again.
        self._cursor = None
        self._attached.set()

    async def wait_attached(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a connection to the owner; whether there is one."""
        with trio.move_on_after(seconds):
            await self._attached.wait()
        return self.client is not None

    def detach(self) -> None:
        """No longer connected to the owner: from now on every file ends at its flushed length.

        At once, from the chunk lists already known: the newest snapshot
        comes later (`refresh_proven`), and may not come at all while Tier 2
        is down -- which is also when the owner's heartbeat goes stale.
        Until then a file would show bytes that no read can return.
        """
        self.client = None
        self._live_scope = None
        if self._attached.is_set():
            self._attached = trio.Event()
        self._cut_to_flushed()

    def _tails_here(self) -> bool:
        return self.replicas is not None and self.replicas.holds(self.node_id)

    def _cut_to_flushed(self) -> None:
        """Every segment ends where its known chunks end (no I/O) -- unless this node
        holds a replica of the owner's journal: then the files keep their length."""
        if self._tails_here():
            return
        for seg in list(self.segments.values()):
            if seg.length > max(seg.start_offset, _covered(seg)):
                record = seg.committed_record()
                record.id = self._remote_ids[seg.id]
                self._put(record, proven_only=True, own_view=True)

    def lost(self, reason: str) -> None:
        """The owner did not answer a read in time: stop waiting on it, show what Tier 2 proves.

        Every read after this sees the proven view at once instead of
        waiting on the same silent owner; the following reconnects once the
        owner answers again.
        """
        if self.client is None:
            return
        self.lost_reason = reason
        self.client = None
        if self._attached.is_set():
            self._attached = trio.Event()
        self._cut_to_flushed()
        if self._live_scope is not None:
            self._live_scope.cancel()

    def by_name(self, name: str) -> Segment | None:
        """The segment with this name, if this node has it."""
        mount_id = self._by_name.get(name)
        return None if mount_id is None else self.segments.get(mount_id)

    # -- keeping the view ---------------------------------------------------------------

    def _put(self, record: SegmentRecord, proven_only: bool, own_view: bool = False) -> None:
        """Add or update a segment from its record, telling the watchers what changed.

        ``own_view``: ``record`` is this view's own segment as it stands (its
        event count may be of more bytes than the view shows).
        """
        if not proven_only and coolable_record(record):
            # Sealed and in Tier 2: cold until read (a follower of a million
            # sleeping segments keeps their records, not their objects).
            seg = Segment.cold_from_record(record, record.SerializeToString())
        else:
            seg = Segment.from_record(record)
        seg.id = self.ids.get(self.node_id, record.id)
        old = self.segments.get(seg.id)
        if proven_only:
            # Without the owner only the flushed bytes can be read -- and, where
            # this node holds a replica of its journal, what the view showed.
            shown = _covered(seg)
            if old is not None and self._tails_here():
                shown = max(shown, old.length)
            seg.length = max(seg.start_offset, min(seg.length, shown))
            seg.storage_length = min(seg.storage_length, seg.length)
            if seg.length < record.length:
                seg.sealed = False  # its end is not readable: not the sealed file
            # The record's count is of the whole segment, not of the part shown
            # (nor is it known again from the view's own record of a segment
            # cut already; a snapshot's record that ends where the view does
            # counts exactly what it shows).
            seg.events_unknown = seg.length < record.length or (
                own_view and old is not None and old.events_unknown
            )
        self.total_blocks += blocks(record.length if seg.cold else seg.length) - (
            blocks(old.length) if old is not None else 0
        )
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
        self.total_blocks -= blocks(seg.length)
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
        valid = set()
        for name in names:
            try:
                valid.add(validate_name(name))
            except InvalidName as e:
                self.rejections.reject(f"stream name from node {self.node_id}", name, str(e))
        names = valid
        gone, came = sorted(self.streams - names), sorted(names - self.streams)
        self.streams = names
        for w in list(self.watchers):
            for name in gone:
                w.on_stream_deleted(name)
            for name in came:
                w.on_stream_created(name)

    async def refreshed(self, seconds: float) -> bool:
        """Ask for a live refresh now; wait up to ``seconds`` for one begun after this call.

        Whether one finished: a segment the owner listed by then is in the view.
        """
        target = self._live_started + 1
        self._refresh_wanted.set()
        with trio.move_on_after(seconds):
            while self._live_done < target:
                await self._live_finished.wait()
        return self._live_done >= target

    async def pause(self, seconds: float) -> None:
        """Wait until the next live refresh is due: ``seconds``, or when one is asked for."""
        with trio.move_on_after(seconds):
            await self._refresh_wanted.wait()
        self._refresh_wanted = trio.Event()

    async def refresh_live(self, client: Client, deadline: float | None = None) -> None:
        """Bring the view up to date from the owner: its changes since the last
        refresh, or (first, or on "resync") a walk over all its records, or
        (from an owner without the feed, or without walks) a listing and the
        records that changed.

        ``deadline``: seconds each request may take (trio.TooSlowError past
        it). Not the whole refresh: a walk of a million segments is a hundred
        and more requests, and must not be given up and begun again forever.
        """
        self._deadline = deadline
        self._live_started += 1
        started = self._live_started
        cursor = await self._follow_changes(client) if self._cursor is not None else None
        if self._cursor is None and client.serves(feed.FEATURE):
            self._cursor = await self._refresh_by_walk(client)
        if self._cursor is None:
            if cursor is None and client.serves(feed.FEATURE):
                self.feed_requests += 1
                first = await self._ask(client.changes(streams_digest=self._streams_digest))
                cursor = first.cursor
            # The cursor is from before the listing: what changes in between comes again.
            await self._refresh_by_listing(client)
            self._cursor = cursor
        self.refreshes += 1
        self._live_done = started
        self._live_finished.set()
        self._live_finished = trio.Event()

    async def _follow_changes(self, client: Client) -> wire.ChangeCursor | None:
        """Apply the owner's changes since the cursor, page by page. If the owner
        says to resync, forget the cursor and return the one to list from."""
        while self._cursor is not None:
            self.feed_requests += 1
            digest = self._streams_digest
            page = await self._ask(client.changes(self._cursor, streams_digest=digest))
            if page.resync:
                self._cursor = None
                return page.cursor
            # Removals first: a name deleted and created again must not meet its old self.
            for gone in page.deleted:
                mount_id = self.ids.find(self.node_id, gone.id)
                if mount_id in self.segments:
                    self._remove(mount_id)
                elif mount_id is not None:
                    self.ids.forget(self.node_id, gone.id)
            self._take_records(page.records)
            self._cursor = page.cursor
            if page.more:
                continue
            # After the segments, from the last page: a deleted stream's
            # segments have gone by now.
            if page.streams_changed:
                self._streams_digest = page.streams_digest
                self._set_streams(set(page.streams))
            break
        return None

    async def _ask(self, request: Awaitable[T]) -> T:
        """One request of a refresh, within the refresh's per-request deadline."""
        if self._deadline is None:
            return await request
        with trio.fail_after(self._deadline):
            return await request

    def _take_records(self, records: Iterable[SegmentRecord], seen: set[int] | None = None) -> None:
        """Put the owner's records into the view (``seen``: add the ids of those taken)."""
        for record in records:
            self.feed_records += 1
            if record.txn_parent:
                continue  # transactions are the owner's business until committed
            held = self._by_name.get(record.name)
            if held is not None and seen is not None and self._remote_ids[held] == record.id:
                kept = self.segments[held].cold_record()
                if kept is not None and kept == record.SerializeToString():
                    # As held, cold: a walk again after a reconnect or the owner's
                    # restart costs a comparison for each sleeping segment.
                    seen.add(held)
                    continue
            problem = record_problem(record)
            if problem is not None:
                self.rejections.reject(f"segment record from node {self.node_id}",
                                       record.name, problem,
                                       (record.length, record.last_modified_ms))  # fmt: skip
                if seen is not None and held is not None:
                    seen.add(held)  # kept as it was, as in the feed
                continue
            if held is not None and self._remote_ids.get(held) != record.id:
                self._remove(held)  # its deletion is not in the feed: not its self
            self._put(record, proven_only=False)
            if seen is not None:
                seen.add(self._by_name[record.name])

    async def _refresh_by_walk(self, client: Client) -> wire.ChangeCursor | None:
        """The whole view from the owner's walk, a page of records at a time; the
        cursor to follow from (its first page's), or None if the owner does not walk.

        What changed while walking comes again from that cursor: a segment
        created behind the walk, one deleted after the walk passed it.
        """
        self.walks += 1
        start: wire.ChangeCursor | None = None
        seen: set[int] = set()
        after = ""
        while True:
            self.walk_pages += 1
            page = await self._ask(client.changes(limit=feed.MAX_LIMIT, walk_after=after,
                                                  streams_digest=self._streams_digest))  # fmt: skip
            if page.resync:
                return None  # an owner older than walks
            if start is not None and page.cursor.incarnation != start.incarnation:
                # The owner restarted while walking: its changes since the
                # first page's cursor are lost with that run. Walk again.
                self.walks += 1
                start, seen, after = None, set(), ""
                continue
            if start is None:
                start = page.cursor
            self._take_records(page.records, seen)
            if not page.more:
                break
            after = page.walk_last
        for mount_id in [m for m in self.segments if m not in seen]:
            self._remove(mount_id)
        if page.streams_changed:
            self._streams_digest = page.streams_digest
            self._set_streams(set(page.streams))
        return start

    async def _refresh_by_listing(self, client: Client) -> None:
        """The whole view from the owner: a listing, then the records that changed."""
        self.listings += 1
        infos = await self._ask(client.list(local_only=True))
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
                records[name] = await self._ask(client.record(name))
            except SegmentNotFound:
                pass  # deleted since the listing: the next one drops it
            except GatewayError as e:
                failures.append(e)  # raised below as itself, not in a group

        self.records_fetched += len(changed)
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
            problem = None if record is None else record_problem(record)
            if problem is not None:
                self.rejections.reject(f"segment record from node {self.node_id}", info.name,
                                       problem, (info.length, info.last_modified_ms))  # fmt: skip
                record = None
            if record is not None:
                self._put(record, proven_only=False)
            elif self.ids.get(self.node_id, info.id) not in self.segments:
                self.ids.forget(self.node_id, info.id)  # deleted before we saw it
        # After the segments: a deleted stream's segments have gone by now.
        names = await self._ask(client.stream_names())
        self._streams_digest = feed.streams_digest(names)
        self._set_streams(set(names))

    async def refresh_proven(self, fence_epoch: int = 0, deadline: float | None = None) -> None:
        """The view without the owner: its newest trusted snapshot and the chunks already known.

        Each segment ends at its flushed length; a segment neither in the
        snapshot nor known with flushed bytes is not shown. A snapshot is
        trusted if it decodes, is of this node, and was stored before its
        epoch was fenced (``fence_epoch``: the node id's highest epoch).
        """
        await self._pick_snapshot(fence_epoch, deadline)
        records: dict[str, SegmentRecord] = dict(self._snapshot)
        own: set[str] = set()
        # With a replica of the owner's journal here, the view as the owner last
        # showed it stands (its unflushed bytes are readable): a snapshot is older.
        tails = self._tails_here()
        for seg in self.segments.values():
            known = seg.committed_record()
            known.id = self._remote_ids[seg.id]
            theirs = records.get(seg.name)
            if (
                theirs is None
                or (tails and theirs.id == known.id)
                or (
                    theirs.id == known.id
                    and sum(c.length for c in known.chunks) > sum(c.length for c in theirs.chunks)
                )
            ):
                records[seg.name] = known
                own.add(seg.name)
        keep = {self.ids.get(self.node_id, r.id) for r in records.values()}
        for mount_id in [m for m in self.segments if m not in keep]:
            self._remove(mount_id)
        for record in records.values():
            self._put(record, proven_only=True, own_view=record.name in own)
        # Streams known from the owner stay, like its segments: an empty
        # directory is all a stream shows by itself.
        self._set_streams(self._snapshot_streams | self.streams)
        self.refreshes += 1

    async def _pick_snapshot(self, fence_epoch: int, deadline: float | None) -> None:
        """Load the newest usable snapshot, if it is not the one loaded already."""
        listing = await self.layer.list(names.meta_prefix(self.node_id), deadline=deadline)
        found = []
        for obj in listing:
            parsed = names.parse_snapshot_key(obj.key)
            if parsed is not None:
                found.append((parsed[1], parsed[0], obj))  # epoch, time
        self.rejections.forget_missing("snapshot", {o.key for o in listing})
        if not found:
            return
        fences: FenceTimes | None = None
        if any(epoch < fence_epoch for epoch, _, _ in found):
            fences = await FenceTimes.read(self.layer, self.node_id, deadline, self.rejections)
        for epoch, _, obj in sorted(found, key=lambda t: (t[0], t[1]), reverse=True):
            newest = next((d.key for d in deltas_of(listing, obj.key)), obj.key)
            if newest == self._snapshot_tried:
                return  # loaded already (or, a delta that failed, the best before it)
            version = (obj.size, obj.mtime)
            if self.rejections.current.get(("snapshot", obj.key), (None,))[0] == version:
                continue  # known bad
            if fences is not None and not fences.trusted(epoch, obj.mtime):
                self.rejections.reject(
                    "snapshot", obj.key,
                    f"stored after epoch {epoch} was fenced (a fenced process's upload)",
                    version,
                )  # fmt: skip
                continue
            try:
                if self._base is not None and self._base[0] == obj.key:
                    snap = self._base[1]  # read already: only a delta is new
                else:
                    snap = await self._load_snapshot(obj.key, obj.size, epoch, deadline)
            except SnapshotInvalid as e:
                self.rejections.reject("snapshot", obj.key, str(e), version)
                continue
            self.rejections.accept("snapshot", obj.key)
            self._base = (obj.key, snap)

            def trusted(o: ObjectInfo, epoch: int = epoch) -> bool:
                return fences is None or fences.trusted(epoch, o.mtime)

            def bad(key: str, why: str) -> None:
                self.rejections.reject("snapshot", key, why)

            key, snap, _ = await with_newest_delta(
                self.layer, listing, obj.key, snap, trusted, bad, deadline, MAX_SNAPSHOT_BYTES
            )
            records: dict[str, SegmentRecord] = {}
            for r in snap.container.segments:
                if r.txn_parent:
                    continue  # transactions are the owner's business until committed
                problem = record_problem(r)
                if problem is not None:
                    self.rejections.reject("segment record", f"{obj.key}#{r.name}", problem,
                                           version)  # fmt: skip
                    continue
                records[r.name] = r
            self._snapshot = records
            self._snapshot_streams = {r.name for r in snap.container.streams}
            self._snapshot_key = key
            self._snapshot_tried = newest
            return

    async def _load_snapshot(
        self, key: str, size: int, epoch: int, deadline: float | None
    ) -> MetadataSnapshot:
        if size > MAX_SNAPSHOT_BYTES:
            raise SnapshotInvalid(key, f"{size} bytes is more than this node reads")
        data = await self.layer.read(key, 0, max(size, 1), deadline=deadline)
        try:
            snap = MetadataSnapshot.FromString(data)
        except Exception as e:  # protobuf's DecodeError and worse: unusable either way
            raise SnapshotInvalid(key, f"does not decode: {e}") from e
        check_snapshot(snap, key)
        if snap.node != self.node_id or snap.epoch != epoch:
            raise SnapshotInvalid(
                key, f"it says node {snap.node!r} epoch {snap.epoch}, its key otherwise"
            )
        return snap

    # -- reads --------------------------------------------------------------------------

    async def read_result(self, seg: Segment, offset: int, size: int, wait: float) -> ReadResult:
        """A protocol read on this node of the other node's segment.

        From the owner while it answers (future reads included); without
        it, the flushed bytes, and the segment ends where they end.
        """
        client = self.client
        if client is not None:
            with trio.move_on_after(TAIL_READ_TIMEOUT + wait):
                try:
                    return await client.read(seg.name, offset, size, wait)
                except ConnectionLost as e:
                    self._gone(seg.name, offset, e)
            self.lost(f"a read of {seg.name!r} got no answer within {TAIL_READ_TIMEOUT:g}s")
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
            return await self._replica_piece(view, offset, end)
        with trio.move_on_after(TAIL_READ_TIMEOUT):
            try:
                result = await client.read(view.name, offset, end - offset)
            except ConnectionLost as e:
                self._gone(view.name, offset, e)
            return result.data
        self.lost(f"a read of {view.name!r} got no answer within {TAIL_READ_TIMEOUT:g}s")
        raise TailUnavailable(view.name, offset, self.node_id)

    async def _replica_piece(self, view: SegmentView, offset: int, end: int) -> Buffer:
        """Unflushed bytes of a down owner, from this node's replica of its journal."""
        owner_id = self._remote_ids.get(view.id)
        if self.replicas is None or owner_id is None or not self.replicas.holds(self.node_id):
            raise TailUnavailable(view.name, offset, self.node_id)
        data = await self.replicas.read_tail(self.node_id, owner_id, offset, end - offset)
        if not data:
            raise TailUnavailable(view.name, offset, self.node_id)
        return data

    def _gone(self, name: str, offset: int, e: ConnectionLost) -> NoReturn:
        """A read's connection to the owner broke (the owner died, or the following
        ended and closed it): like an owner that does not answer, not a client's
        broken connection."""
        self.lost(f"a read of {name!r}: {e}")
        raise TailUnavailable(name, offset, self.node_id) from e


async def remote_attributes(
    seg: Segment, store: AttributeStore | None, start: bytes, limit: int
) -> list[tuple[bytes, int]]:
    """Another node's segment's attributes as this node knows them, in id order.

    Its record's values (core ones, those not yet indexed) over its
    attribute index in Tier 2, which any node reads; at most ``limit`` (0:
    all) from ``start``. For when the owner does not answer.
    """
    merged: dict[bytes, int | None] = {}
    upper: bytes | None = None
    index = seg.attr_index
    if index is not None and index.root_length and store is not None:
        # Removed ids in the record hide index entries: ask for that many more.
        hidden = sum(1 for v in seg.attributes.values() if v is None)
        want = limit + hidden if limit else 0
        found = await store.range(seg.id, index, start, want)
        merged.update(found)
        if want and len(found) >= want:
            upper = found[-1][0]  # values past it cannot be placed among the index's
    for k, v in seg.attributes.items():
        if k >= start and (upper is None or k <= upper):
            merged[k] = v
    items = sorted((k, v) for k, v in merged.items() if v is not None)
    return items[:limit] if limit else items
