"""`StorageWriter`: moves committed bytes to Tier 2 in the background (Pravega's storage writer).

Per segment, the bytes between its storage length and its length are
*unflushed*: pinned in the cache and needed in the journal. A segment is
flushed when

- its unflushed bytes reach ``tier2.flush_size``,
- its oldest unflushed byte is older than ``tier2.flush_interval``,
- it is sealed (then it is also marked sealed in storage), or
- someone asks (`StorageWriter.flush`, the ``flush`` command).

The same flush also writes the segment's extended attributes that changed
since its last index batch into its attribute index (`gateway.attrindex`):
only the latest value of each, as one batch of B+tree pages in one new
object, then journals ``AttributeIndexUpdated``; after that memory may drop
them. Attributes alone make a segment due when ``container.max_attributes``
/ 2 of them wait (or memory is full of them), else by ``flush_interval``.

A flush reads the unflushed bytes through the read index, uploads them as a
new chunk -- or, on bindings with append, appends them to the segment's last
chunk if this epoch wrote it and it is below ``tier2.max_chunk_size`` --, and
only then journals ``ChunkAdded``. Applying that advances the storage length
and unpins the cache entries; the next checkpoint lets the journal drop
files that held only flushed data. A crash between the upload and the
journal leaves an object nobody names (garbage for GC), never a hole.

Chunks dropped by truncation or deletion are deleted in the background, and
metadata snapshots and GC run beside the flushes (`gateway.tier2.housekeeping`),
and so does the storage optimizer, which merges runs of small chunks
(`gateway.tier2.optimizer`).

While Tier 2 is unreachable, flushes fail and are retried with backoff; the
unflushed bytes grow until the cache's pinned share pushes back on appends
(the container's ``wait_for_capacity``: delayed, then ``Overloaded``). When
Tier 2 returns, the backlog drains.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import crc32c
import trio

from gateway import failpoints
from gateway.attrindex.store import AttributeIndexStore
from gateway.buffers import Buffer
from gateway.config import Tier2Config
from gateway.container.container import PendingOperation, SegmentContainer
from gateway.container.interfaces import LeaseGate
from gateway.container.segment import Segment
from gateway.errors import FlushTimeout, GatewayError, Overloaded, SegmentNotFound, Tier2Error
from gateway.protocol.metadata_pb2 import AttributeIndexRecord, ChunkRecord
from gateway.read.chunks import ChunkReader
from gateway.storage import object_keys as names
from gateway.storage.layer import ChunkLayer
from gateway.tier2 import gc
from gateway.tier2.housekeeping import Housekeeper
from gateway.tier2.optimizer import Optimizer

log = logging.getLogger(__name__)

#: Longest wait before retrying a segment whose flush failed.
MAX_RETRY_WAIT = 30.0
#: Longest wait before retrying a failed flush that a `flush` request waits for.
REQUESTED_RETRY_WAIT = 1.0
#: Longest wait between attempts to journal an uploaded chunk the journal refused.
MAX_RECORD_WAIT = 2.0


def _join_and_crc(pieces: list[Buffer], crc: int) -> tuple[bytes, int]:
    """The pieces as one buffer, and the CRC32C continued over it (worker thread)."""
    data = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)
    return data, int(crc32c.crc32c(data, crc))


@dataclass
class _Failure:
    count: int
    retry_at: float
    error: Exception
    #: When the segment's oldest byte not in Tier 2 became due, as it was before
    #: the first of these failures: a failed attempt leaves the bytes as old as
    #: they were (`StorageWriter.oldest_unflushed_age`).
    since: float


@dataclass(frozen=True)
class StorageWriterStatistics:
    """Counters of a `StorageWriter`."""

    flushes: int
    bytes_flushed: int
    chunks_created: int
    chunk_appends: int
    flush_failures: int
    unflushed_segments: int
    unflushed_bytes: int
    chunks_deleted: int
    delete_failures: int
    snapshots: int
    snapshot_failures: int
    gc_passes: int
    gc_deleted: int
    gc_failures: int


class StorageWriter:
    """Flushes segments to Tier 2; also runs chunk deletion, snapshots and GC."""

    def __init__(
        self,
        container: SegmentContainer,
        layer: ChunkLayer,
        config: Tier2Config,
        node: str,
        epoch: int,
        reader: ChunkReader,
        attributes: AttributeIndexStore | None = None,
    ) -> None:
        self.container = container
        #: Writes and reads attribute indexes (the container reads through it too).
        self.attributes = attributes or AttributeIndexStore(layer, node, reader.store)
        self.layer = layer
        self.cfg = config
        self.node = node
        self.epoch = epoch
        self.reader = reader
        #: segment id -> trio time of its oldest unflushed byte (or of the
        #: event that made it need a flush: seal, request).
        self._unflushed: dict[int, float] = {}
        #: Segments to flush now, whatever the policy says: segment id -> the
        #: length that must reach Tier 2 (a request's or a seal's); once it
        #: has, the segment is back under the policy.
        self._urgent: dict[int, int] = {}
        self._busy: set[int] = set()
        self._failures: dict[int, _Failure] = {}
        #: Segment id -> `flush` calls waiting for it (with ``retry``): its
        #: failed flushes are retried at most `REQUESTED_RETRY_WAIT` apart.
        self._waiting: dict[int, int] = {}
        #: Object keys being uploaded and not yet named by applied metadata:
        #: GC and the deleter must leave them alone.
        self.uploading: set[str] = set()
        self._wake = trio.Event()
        self._progress = trio.Event()
        self._limiter = trio.CapacityLimiter(config.flush_concurrency)
        self._nursery: trio.Nursery | None = None
        self.flushes = 0
        self.bytes_flushed = 0
        self.chunks_created = 0
        self.chunk_appends = 0
        self.flush_failures = 0
        #: Set when this node id was taken over: nothing is uploaded any more.
        self.fenced: GatewayError | None = None
        #: In a cluster: nothing is uploaded or deleted while it is not held
        #: (another process may be taking this node id over).
        self.lease: LeaseGate | None = None
        #: Deletes dropped chunks, uploads snapshots, collects garbage.
        self.housekeeping = Housekeeper(self)
        #: Merges runs of small chunks (``tier2.defrag``).
        self.optimizer = Optimizer(self)
        #: Segments whose waiting attribute changes must be indexed now.
        self._attr_urgent: set[int] = set()

    def oldest_unflushed_age(self) -> float:
        """Seconds since the oldest byte not yet in Tier 2 became due (0 if none).

        Failed flushes do not make it younger: while Tier 2 is down it keeps
        growing (``pending_flush_oldest_seconds``, which the alerting rules watch).
        """
        if not self._unflushed:
            return 0.0
        failures = self._failures
        oldest = min(
            min(since, f.since) if (f := failures.get(seg_id)) is not None else since
            for seg_id, since in self._unflushed.items()
        )
        return max(0.0, trio.current_time() - oldest)

    def backlog(self) -> list[tuple[int, float, int, str]]:
        """Segments with bytes not yet in Tier 2, as (segment id, age of the oldest in
        seconds, flushes failed in a row, the last failure): the status page's backlog."""
        now = trio.current_time()
        out = []
        for seg_id, since in self._unflushed.items():
            failed = self._failures.get(seg_id)
            count, error = (failed.count, str(failed.error)) if failed is not None else (0, "")
            out.append((seg_id, max(0.0, now - since), count, error))
        return out

    def unflushed_bytes(self) -> int:
        """Bytes of live segments not yet in Tier 2: of those waiting for a flush
        only, so the cost follows the active segments, not all of them."""
        total = 0
        for seg_id in self._unflushed:
            seg = self.container.segment_by_id(seg_id)
            if seg is not None:
                total += max(0, seg.length - max(seg.storage_length, seg.start_offset))
        return total

    def reconfigure(self, config: Tier2Config) -> None:
        """Take a new flush/offload policy (SIGHUP): sizes, intervals, concurrency, GC.

        Keys that choose or reach the binding (url, endpoint, region,
        timeouts) are read once at start; the caller warns about those.
        """
        self.cfg = config
        self._limiter.total_tokens = config.flush_concurrency
        self._wake.set()  # due times are computed from the new interval at once

    # -- told by the container (committed changes) ------------------------------------

    def on_append(self, seg: Segment) -> None:
        """The segment grew."""
        if seg.id not in self._unflushed:
            self._unflushed[seg.id] = trio.current_time()
            self._wake.set()
        elif seg.length - seg.storage_length >= self.cfg.flush_size and seg.id not in self._busy:
            self._wake.set()
        if seg.attr_dirty and seg.id not in self._attr_urgent and self._attributes_due(seg):
            self._attr_urgent.add(seg.id)
            self._wake.set()

    def on_attributes(self, seg: Segment) -> None:
        """Extended attributes changed; index them soon if many wait."""
        if seg.id not in self._unflushed:
            self._unflushed[seg.id] = trio.current_time()
            self._wake.set()
        if self._attributes_due(seg) and seg.id not in self._attr_urgent:
            self._attr_urgent.add(seg.id)
            self._wake.set()

    def _attributes_due(self, seg: Segment) -> bool:
        return len(seg.attr_dirty) * 2 >= self.container.max_attributes or (
            seg.extended_in_memory() >= self.container.max_attributes
        )

    @staticmethod
    def _attributes_waiting(seg: Segment) -> bool:
        """Extended attribute changes this writer can index (not a transaction's)."""
        return bool(seg.attr_dirty) and not seg.hidden and not seg.attr_moved

    def on_seal(self, seg: Segment) -> None:
        """A sealed segment is flushed right away and sealed in storage."""
        self._unflushed.setdefault(seg.id, trio.current_time())
        self._urgent[seg.id] = seg.length
        self._wake.set()

    def on_merged(self, target: Segment, source: Segment) -> None:
        """A merge is done in Tier 2: the source's bytes are the target's now."""
        self._unflushed.pop(source.id, None)
        self._urgent.pop(source.id, None)
        self._failures.pop(source.id, None)
        self.reader.forget_segment(source.id)
        self.optimizer.on_chunk_added(target.id)
        self._wake.set()
        self._signal_progress()

    def on_dropped(self, seg: Segment, chunks: list[ChunkRecord], deleted: bool) -> None:
        """Delete the objects of chunks that left the metadata, in the background."""
        for c in chunks:
            self.housekeeping.delete_later(c.name, seg.id)
        if deleted:
            self._unflushed.pop(seg.id, None)
            self._urgent.pop(seg.id, None)
            self._failures.pop(seg.id, None)
            self._attr_urgent.discard(seg.id)
            self.reader.forget_segment(seg.id)
            self.attributes.forget(seg.id)
        self._wake.set()
        self._signal_progress()  # flush waiters re-check: the segment may be gone

    def _signal_progress(self) -> None:
        """Wake every `flush` waiting (a new event for the next wait: none spins on a set one)."""
        self._progress.set()
        self._progress = trio.Event()

    # -- the flush loop ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush by policy, delete dropped chunks, snapshot and collect garbage until cancelled."""
        now = trio.current_time()
        for seg in self.container.segments():
            if self._needs_flush(seg):
                # Unknown age (recovered): treat it as old, flush soon.
                self._unflushed[seg.id] = now - self.cfg.flush_interval
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.housekeeping.start(nursery)
            self.optimizer.start(nursery)
            task_status.started()
            while True:
                next_due = self._start_due_flushes()
                with trio.move_on_at(next_due):
                    await self._wake.wait()
                self._wake = trio.Event()

    def fence(self, error: GatewayError) -> None:
        """This node id was taken over (a higher epoch): upload, delete and collect nothing more.

        The objects under the node's prefix are the new owner's now; this
        process's flushes, snapshots, deletions and GC all stop, and later
        requests for them raise ``error``.
        """
        self.fenced = error
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._progress.set()

    def check_fence(self) -> None:
        """Raise if this writer may not touch Tier 2: fenced, or its lease not confirmed."""
        if self.fenced is not None:
            raise self.fenced
        if self.lease is not None and not self.lease.held():
            raise Tier2Error(
                "this node cannot confirm its lease in Tier 2: nothing is uploaded or "
                "deleted until it can"
            )

    def _needs_flush(self, seg: Segment) -> bool:
        if seg.cold:
            return False  # sealed, wholly in Tier 2, nothing waiting
        return (
            seg.storage_length < seg.length
            or (seg.sealed and not seg.sealed_in_storage)
            or self._attributes_waiting(seg)
        )

    def _start_due_flushes(self) -> float:
        """Start the flushes that are due; return when the next one will be."""
        assert self._nursery is not None
        now = trio.current_time()
        next_due = math.inf
        for seg_id, since in list(self._unflushed.items()):
            if seg_id in self._busy:
                continue
            seg = self.container.segment_by_id(seg_id)
            if seg is None or not self._needs_flush(seg):
                del self._unflushed[seg_id]
                self._urgent.pop(seg_id, None)
                continue
            failure = self._failures.get(seg_id)
            if failure is not None and failure.retry_at > now:
                next_due = min(next_due, failure.retry_at)
                continue
            if (
                seg.merges
                and seg.storage_length >= seg.merges[0].merge_offset
                and not self._merge_ready(seg)
            ):
                # Waits for the merged source's flush, which wakes the loop.
                source = seg.merges[0]
                if source.id not in self._unflushed:
                    self._unflushed[source.id] = now
                    next_due = now
                self._urgent.setdefault(source.id, source.length)
                continue
            due = since + self.cfg.flush_interval
            if (
                self._is_urgent(seg)
                or seg_id in self._attr_urgent
                or self._merge_ready(seg)
                or seg.length - seg.storage_length >= self.cfg.flush_size
                or (seg.sealed and seg.storage_length >= seg.length)
                or due <= now
            ):
                self._busy.add(seg_id)
                self._nursery.start_soon(self._flush_task, seg_id)
            else:
                next_due = min(next_due, due)
        return next_due

    @staticmethod
    def _merge_ready(seg: Segment) -> bool:
        """Whether the segment's next merge can be completed in Tier 2 now."""
        if not seg.merges:
            return False
        src = seg.merges[0]
        # Sealed in storage too: nothing more of the source is journaled after
        # the merge completes (a later StorageSealed would name a segment
        # that is gone).
        return (
            seg.storage_length >= src.merge_offset
            and src.storage_length >= src.length
            and src.sealed_in_storage
        )

    def _is_urgent(self, seg: Segment) -> bool:
        """Whether a request or a seal still waits for this segment's bytes to reach Tier 2.

        A flush requested while one is running must not leave the segment
        urgent after that flush already took its bytes: the next append
        would then be uploaded at once, whatever ``flush_interval`` says.
        """
        target = self._urgent.get(seg.id)
        if target is None:
            return False
        if seg.storage_length >= target and (not seg.sealed or seg.sealed_in_storage):
            del self._urgent[seg.id]
            return False
        return True

    async def _flush_task(self, seg_id: int) -> None:
        try:
            async with self._limiter:
                await self._flush_segment(seg_id)
            self._failures.pop(seg_id, None)
        except SegmentNotFound:
            self._unflushed.pop(seg_id, None)
        except (GatewayError, OSError) as e:
            # Tier 2 down, the journal's disk full (Overloaded), the daemon
            # stopping: all pass, and the journal keeps the data meanwhile.
            # The flush task must never take the daemon down with it.
            self.flush_failures += 1
            old = self._failures.get(seg_id)
            count = old.count + 1 if old else 1
            # Read before `finally` moves the due time on (for the next attempt).
            since = old.since if old else self._unflushed.get(seg_id, trio.current_time())
            wait = min(MAX_RETRY_WAIT, 0.5 * 2 ** (count - 1))
            if self._waiting.get(seg_id):
                wait = min(wait, REQUESTED_RETRY_WAIT)  # the backoff is for nobody waiting
            self._failures[seg_id] = _Failure(count, trio.current_time() + wait, e, since)
            log.warning("flush of segment id %d failed (retry in %.1fs): %s", seg_id, wait, e)
        finally:
            self._busy.discard(seg_id)
            seg = self.container.segment_by_id(seg_id)
            if seg is not None and seg_id in self._unflushed:
                if self._needs_flush(seg):
                    # What arrived during the flush is as old as the flush.
                    self._unflushed[seg_id] = max(self._unflushed[seg_id], trio.current_time())
                else:
                    del self._unflushed[seg_id]
            self._wake.set()
            self._signal_progress()

    async def _flush_segment(self, seg_id: int) -> None:
        """Upload everything unflushed of one segment (one flush at a time per segment)."""
        seg = self.container.segment_by_id(seg_id)
        # Up to the length now: bytes that arrive meanwhile wait for the policy
        # (else a steady trickle would be uploaded in tiny pieces, back to back).
        target = seg.length if seg is not None else 0
        while True:
            seg = self.container.segment_by_id(seg_id)
            if seg is None:
                raise SegmentNotFound(f"segment id {seg_id}")
            start = seg.storage_length
            if start >= target:
                break
            merge = seg.merges[0] if seg.merges else None
            if merge is not None and start >= merge.merge_offset:
                # A merged transaction comes next: once its own bytes are all
                # in Tier 2, its chunks become this segment's (no copy).
                if merge.storage_length < merge.length or not merge.sealed_in_storage:
                    self._flush_source(merge)
                    break
                failpoints.hit("before_merge_completed")
                await self.container.prepare_merge_completed(seg.id, merge.id).wait()
                continue
            last = seg.chunks[-1] if seg.chunks else None
            # Grow the last chunk where the binding can and this epoch wrote it.
            extends = (
                last
                if self.layer.storage.supports_append
                and last is not None
                and last.epoch == self.epoch
                and last.start_offset + last.length == start
                and last.length < self.cfg.max_chunk_size
                else None
            )
            room = self.cfg.max_chunk_size - (extends.length if extends else 0)
            n = min((merge.merge_offset if merge else seg.length) - start, room)
            pieces = await self.container.read_index.read_pieces(seg.view(), start, n)
            # Joining and checksumming up to max_chunk_size bytes takes tens
            # of milliseconds: in a worker thread, not on the event loop.
            data, crc = await trio.to_thread.run_sync(
                _join_and_crc, pieces, extends.crc32c if extends else 0
            )
            await self._upload(seg, start, data, crc, extends)
        if seg.sealed and not seg.sealed_in_storage and seg.storage_length >= seg.length:
            await self.container.prepare_storage_sealed(seg.id).wait()
            self.optimizer.on_chunk_added(seg.id)  # a final merge may be due
        await self._flush_attributes(seg_id)

    async def _flush_attributes(self, seg_id: int) -> None:
        """Write the segment's waiting attribute changes into its index (one batch)."""
        self._attr_urgent.discard(seg_id)
        seg = self.container.segment_by_id(seg_id)
        if seg is None or not self._attributes_waiting(seg):
            return
        # The committed values now, and the journal position they reflect:
        # a value changed after this stays waiting for the next batch.
        through = self.container.applied_seq
        changes = {k: seg.attributes.get(k) for k in seg.attr_dirty}
        index = AttributeIndexRecord()
        if seg.attr_index is not None:
            index.CopyFrom(seg.attr_index)
        self.check_fence()
        written = await self.attributes.write_batch(
            seg.id, seg.name, index, changes, self.epoch, self.uploading, through
        )
        batch, chunk = written
        try:
            failpoints.hit("after_attribute_upload")
            state = AttributeIndexRecord(
                root_offset=batch.state.root_offset,
                root_length=batch.state.root_length,
                length=batch.state.length,
                start=batch.state.start,
            )
            applied = await self._journal_upload(
                lambda: self.container.prepare_attribute_index_updated(
                    seg.id, state, chunk, through
                )
            )
            if not applied and self.container.segment_by_id(seg.id) is None and chunk.length:
                self.housekeeping.delete_later(chunk.name, seg.id)  # the segment went meanwhile
        finally:
            self.uploading.discard(chunk.name)
        if applied:
            self.attributes.committed(seg.id, index, batch)
            self.flushes += 1
            self.housekeeping.flushed()

    def _flush_source(self, source: Segment) -> None:
        """A merged source must reach Tier 2 before its target can go on."""
        self._unflushed.setdefault(source.id, trio.current_time())
        self._urgent[source.id] = max(source.length, self._urgent.get(source.id, 0))
        self._wake.set()

    async def _upload(
        self, seg: Segment, start: int, data: bytes, crc: int, extend: ChunkRecord | None
    ) -> None:
        """Upload one piece (``crc``: of the whole chunk after it), journal it, account for it."""
        key = extend.name if extend else names.chunk_key(self.node, seg.id, start, self.epoch)
        record = ChunkRecord(
            name=key,
            start_offset=extend.start_offset if extend else start,
            length=(extend.length if extend else 0) + len(data),
            crc32c=crc,
            epoch=self.epoch,
        )
        metadata = names.chunk_metadata(
            seg.name, record.start_offset, record.length, record.crc32c, self.epoch
        )
        self.check_fence()
        self.uploading.add(key)
        try:
            if extend is not None:
                await self.layer.append(key, extend.length, data, metadata)
            else:
                await self.layer.write(key, data, metadata)
            failpoints.hit("after_chunk_upload")
            added = await self._record_chunk(seg, record, extend is not None)
        finally:
            self.uploading.discard(key)
        if not added:
            # Truncated past it or deleted while it was uploading.
            self.housekeeping.delete_later(key, seg.id)
            if not self.container.segment_by_id(seg.id):
                raise SegmentNotFound(seg.name)
            return
        self.flushes += 1
        self.bytes_flushed += len(data)
        if extend is not None:
            self.chunk_appends += 1
        else:
            self.chunks_created += 1
            self.optimizer.on_chunk_added(seg.id)
        self.housekeeping.flushed()

    async def _record_chunk(self, seg: Segment, record: ChunkRecord, extends: bool) -> bool:
        """Journal an uploaded chunk; whether it was added (False: truncated away or deleted)."""
        added: bool = await self._journal_upload(
            lambda: self.container.prepare_chunk_added(seg.id, record, extends_last=extends)
        )
        return added

    async def journal_upload(self, prepare: Callable[[], PendingOperation]) -> Any:
        """Journal what an upload did (the storage optimizer's swap too): `_journal_upload`."""
        return await self._journal_upload(prepare)

    async def _journal_upload(self, prepare: Callable[[], PendingOperation]) -> Any:
        """Journal what an upload did; its result (False if the segment is gone).

        While the journal refuses (its disk full: the reserve exhausted, or a
        client group refused ahead of this record), try again for up to
        ``retry_deadline`` rather than upload the bytes again.
        """
        give_up = trio.current_time() + self.cfg.retry_deadline
        wait = 0.05
        while True:
            try:
                return await prepare().wait()
            except SegmentNotFound:
                return False
            except Overloaded:
                if trio.current_time() + wait > give_up:
                    raise
            await trio.sleep(wait)
            wait = min(MAX_RECORD_WAIT, wait * 2)

    async def durability_barrier(self) -> None:
        """Everything flushed so far survives a power loss of the Tier-2 server."""
        await self.layer.durability_barrier()

    # -- flush on request --------------------------------------------------------------

    async def flush(
        self,
        segment_ids: list[int] | None = None,
        within: float | None = None,
        retry: bool = False,
    ) -> None:
        """Flush now and wait until every byte committed before the call is in Tier 2.

        ``None`` flushes every segment. Without ``retry``, the error of a
        flush attempt that failed after the call is raised at once (the
        caller may retry). With ``retry``, failed attempts are retried (at
        most `REQUESTED_RETRY_WAIT` apart while the call waits) until
        ``within`` seconds have passed, or ``tier2.retry_deadline`` when
        ``within`` is None: a Tier 2 that is back within that time (an
        embedded server restarting) does not fail the call. ``within``
        bounds the whole wait; past it, `FlushTimeout` says what was still
        to be uploaded and the last attempt's error.
        """
        self.check_fence()
        if segment_ids is None:
            segment_ids = [s.id for s in self.container.segments() if self._needs_flush(s)]
        targets: dict[int, int] = {}
        through = self.container.applied_seq
        for seg_id in segment_ids:
            seg = self.container.segment_by_id(seg_id)
            if seg is not None and self._needs_flush(seg):
                targets[seg_id] = seg.length
                if self._attributes_waiting(seg):
                    self._attr_urgent.add(seg_id)
                self._unflushed.setdefault(seg_id, trio.current_time())
                self._urgent[seg_id] = max(seg.length, self._urgent.get(seg_id, 0))
                # A request skips the backoff of earlier failures.
                failure = self._failures.get(seg_id)
                if failure is not None:
                    failure.retry_at = 0.0
        started = trio.current_time()
        deadline = math.inf if within is None else started + within
        # Failures are waited through until then (retry), else the first one raises.
        retry_until = -math.inf
        if retry:
            retry_until = deadline if within is not None else started + self.cfg.retry_deadline
        self._wake.set()
        waiting = list(targets) if retry else []
        for seg_id in waiting:
            self._waiting[seg_id] = self._waiting.get(seg_id, 0) + 1
        try:
            await self._wait_flushed(targets, through, started, deadline, retry_until, retry)
        finally:
            for seg_id in waiting:
                self._waiting[seg_id] -= 1
                if not self._waiting[seg_id]:
                    del self._waiting[seg_id]

    async def _wait_flushed(
        self,
        targets: dict[int, int],
        through: int,
        started: float,
        deadline: float,
        retry_until: float,
        retry: bool,
    ) -> None:
        """`flush`'s wait: until every target is in Tier 2, or the deadline."""
        while targets:
            failed: list[tuple[Segment, _Failure]] = []
            for seg_id, target in list(targets.items()):
                seg = self.container.segment_by_id(seg_id)
                done = seg is None or (
                    seg.storage_length >= target
                    and (not seg.sealed or seg.sealed_in_storage or seg.length > target)
                    and not (
                        self._attributes_waiting(seg)
                        and any(s <= through for s in seg.attr_dirty.values())
                    )
                )
                if done:
                    del targets[seg_id]
                    continue
                assert seg is not None
                failure = self._failures.get(seg_id)
                if failure is not None and failure.retry_at > started and seg_id not in self._busy:
                    failed.append((seg, failure))
            if not targets:
                return
            now = trio.current_time()
            if failed and now >= retry_until:
                seg, failure = failed[0]
                if retry:
                    raise FlushTimeout(self._still_to_flush(targets, now - started, failure))
                raise Tier2Error(f"flush of {seg.name!r} failed: {failure.error}")
            if now >= deadline:
                raise FlushTimeout(self._still_to_flush(targets, now - started, None))
            for _seg, failure in failed:
                # An attempt begun before this wait counted took the backoff's wait.
                if retry and failure.retry_at > now + REQUESTED_RETRY_WAIT:
                    failure.retry_at = now + REQUESTED_RETRY_WAIT
                    self._wake.set()
            # Woken by each attempt's end; at the deadline, or when failures stop being retried.
            with trio.move_on_at(min(deadline, retry_until) if failed else deadline):
                await self._progress.wait()
            self.check_fence()

    def _still_to_flush(
        self, targets: dict[int, int], waited: float, failure: _Failure | None
    ) -> str:
        """What a flush that ran out of time was still waiting for (its `FlushTimeout`)."""
        names, left = [], 0
        for seg_id, target in targets.items():
            seg = self.container.segment_by_id(seg_id)
            if seg is not None:
                names.append(repr(seg.name))
                left += max(0, target - seg.storage_length)
        if failure is None:
            for seg_id in targets:
                failure = self._failures.get(seg_id) or failure
        what = names[0] if len(names) == 1 else f"{len(names)} segments ({', '.join(names[:3])}"
        what += "" if len(names) == 1 else (", ...)" if len(names) > 3 else ")")
        why = (
            f"; the storage writer keeps retrying, its last attempt failed: {failure.error}"
            if failure is not None
            else "; still uploading"
        )
        return f"flush of {what}: {left} byte(s) not in Tier 2 after waiting {waited:.1f}s{why}"

    # -- beside flushing (`gateway.tier2.housekeeping`) ---------------------------------------

    @property
    def chunks_deleted(self) -> int:
        """Dropped chunks deleted in the background so far."""
        return self.housekeeping.chunks_deleted

    async def upload_snapshot(self, whole: bool = False) -> str:
        """Upload a metadata snapshot now (a delta of the last whole one where that
        pays, unless ``whole``); its key. Older ones beyond what is kept go."""
        return await self.housekeeping.upload_snapshot(whole)

    async def collect_garbage(self) -> gc.GcResult | None:
        """One GC pass now; None if it failed (logged) or could not run (no lease)."""
        return await self.housekeeping.collect_garbage()

    # -- observability -----------------------------------------------------------------------

    def statistics(self) -> StorageWriterStatistics:
        """Counters now."""
        unflushed = 0
        for seg_id in self._unflushed:
            seg = self.container.segment_by_id(seg_id)
            if seg is not None:
                unflushed += seg.length - seg.storage_length
        h = self.housekeeping
        return StorageWriterStatistics(
            flushes=self.flushes,
            bytes_flushed=self.bytes_flushed,
            chunks_created=self.chunks_created,
            chunk_appends=self.chunk_appends,
            flush_failures=self.flush_failures,
            unflushed_segments=len(self._unflushed),
            unflushed_bytes=unflushed,
            chunks_deleted=h.chunks_deleted,
            delete_failures=h.delete_failures,
            snapshots=h.snapshots,
            snapshot_failures=h.snapshot_failures,
            gc_passes=h.gc_passes,
            gc_deleted=h.gc_deleted,
            gc_failures=h.gc_failures,
        )
