"""The storage writer's work beside flushing: deleting dropped chunks, snapshots, GC.

Chunks dropped by truncation or deletion are deleted in the background, with
the retry policy; what fails is left to GC. After flushes, a metadata
snapshot is uploaded at most every ``tier2.snapshot_interval``, and GC runs
every ``tier2.gc_interval``. None of it runs while the node is fenced or
cannot confirm its lease: the objects may be another process's by now.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Protocol

import trio

from gateway.aio import crc32c_of
from gateway.attrindex.store import AttributeIndexStore
from gateway.config import Tier2Config
from gateway.container.container import SegmentContainer
from gateway.container.interfaces import LeaseGate
from gateway.container.segment import chunks_of, record_chunks
from gateway.errors import GatewayError, Tier2Error
from gateway.read.chunks import ChunkReader
from gateway.storage import object_keys as names
from gateway.storage.layer import ChunkLayer
from gateway.tier2 import gc
from gateway.tier2.optimizer import Optimizer
from gateway.tier2.snapshots import SnapshotEncoder, object_metadata


class WriterState(Protocol):
    """What housekeeping uses of its `StorageWriter` (which builds it)."""

    container: SegmentContainer
    attributes: AttributeIndexStore
    layer: ChunkLayer
    cfg: Tier2Config
    node: str
    epoch: int
    reader: ChunkReader
    uploading: set[str]
    optimizer: Optimizer
    fenced: GatewayError | None
    lease: LeaseGate | None

    def check_fence(self) -> None:
        """Raise if the writer may not touch Tier 2."""


__all__ = ["DELTAS_KEPT", "Housekeeper"]

log = logging.getLogger(__name__)

#: Deltas kept of each whole snapshot kept (the newest is the one readers use).
DELTAS_KEPT = 2
#: Chunk objects deleted at once in the background.
DELETES_IN_FLIGHT = 8


class Housekeeper:
    """Deletes the chunks a `StorageWriter` was told are dropped, snapshots and collects garbage."""

    def __init__(self, writer: WriterState) -> None:
        #: The writer whose node, binding, policy and fence this follows.
        self._writer = writer
        self._deletes: deque[tuple[str, int]] = deque()
        self._in_delete: set[str] = set()
        self._deletes_ready = trio.Event()
        self._flushed_since_snapshot = trio.Event()
        #: Keeps each segment's encoded record between snapshots.
        self._encoder = SnapshotEncoder()
        #: During a GC pass: the chunk names of the cold segments' records, the
        #: records, and their ids (`_read_cold`).
        self._cold_named: set[str] = set()
        self._cold_records: list[bytes] = []
        self._cold_parsed: set[int] = set()
        self.chunks_deleted = 0
        self.delete_failures = 0
        #: Snapshot uploads and their bytes, whole ones and deltas.
        self.snapshot_uploads = {"whole": 0, "delta": 0}
        self.snapshot_bytes = {"whole": 0, "delta": 0}
        self.snapshot_failures = 0
        self.gc_passes = 0
        self.gc_deleted = 0
        self.gc_failures = 0

    def deleting(self) -> set[str]:
        """Chunk objects queued for deletion or being deleted (online fsck counts
        them as named: they are going, not forgotten)."""
        return {key for key, _ in self._deletes} | self._in_delete

    def delete_later(self, key: str, seg_id: int) -> None:
        """Delete chunk object ``key`` of segment ``seg_id`` once nothing names it."""
        self._deletes.append((key, seg_id))
        self._deletes_ready.set()

    def flushed(self) -> None:
        """Something reached Tier 2: a snapshot is due (within ``snapshot_interval``)."""
        self._flushed_since_snapshot.set()

    def start(self, nursery: trio.Nursery) -> None:
        """Start the deleter, the snapshot uploader and the GC timer in ``nursery``."""
        nursery.start_soon(self._run_deletes)
        nursery.start_soon(self._run_snapshots)
        nursery.start_soon(self._run_gc)

    @property
    def snapshots(self) -> int:
        """Metadata snapshots uploaded, whole ones and deltas."""
        return sum(self.snapshot_uploads.values())

    # -- background deletion -------------------------------------------------------------

    def _still_named(self, key: str, seg_id: int) -> bool:
        seg = self._writer.container.segment_by_id(seg_id)
        if seg is None:
            return False
        if any(c.name == key for c in seg.chunks):
            return True
        return seg.attr_index is not None and any(c.name == key for c in seg.attr_index.chunks)

    async def _run_deletes(self) -> None:
        w = self._writer
        # Several at once: one at a time, the objects a trickle's merges
        # retire (thousands an hour) were deleted slower than they came.
        limiter = trio.CapacityLimiter(DELETES_IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            while True:
                if not self._deletes:
                    await self._deletes_ready.wait()
                    self._deletes_ready = trio.Event()
                    continue
                if w.lease is not None and not w.lease.held():
                    await trio.sleep(1.0)  # another process may own these objects by now
                    continue
                token = object()
                await limiter.acquire_on_behalf_of(token)
                if not self._deletes:
                    limiter.release_on_behalf_of(token)
                    continue
                key, seg_id = self._deletes.popleft()
                if key in w.uploading or self._still_named(key, seg_id):
                    limiter.release_on_behalf_of(token)
                    continue
                self._in_delete.add(key)
                nursery.start_soon(self._delete_one, key, limiter, token)

    async def _delete_one(self, key: str, limiter: trio.CapacityLimiter, token: object) -> None:
        try:
            try:
                await self._writer.layer.delete(key)
                self.chunks_deleted += 1
            except Tier2Error as e:
                self.delete_failures += 1
                log.warning("cannot delete chunk %s (GC will): %s", key, e)
            finally:
                self._in_delete.discard(key)
            await self._forget_chunk(key)
        finally:
            limiter.release_on_behalf_of(token)

    async def _forget_chunk(self, key: str) -> None:
        """A chunk object is gone: drop its blocks from memory and the cache store."""
        w = self._writer
        w.attributes.forget_chunk(key)  # first: a reader caching it now drops it again
        w.reader.drop_chunk(key)
        await trio.to_thread.run_sync(w.reader.store.drop_chunk, key)

    # -- metadata snapshots ----------------------------------------------------------------

    async def _run_snapshots(self) -> None:
        last = -math.inf
        while True:
            await self._flushed_since_snapshot.wait()
            wait_until = last + self._writer.cfg.snapshot_interval
            if trio.current_time() < wait_until:
                await trio.sleep_until(wait_until)
            self._flushed_since_snapshot = trio.Event()
            last = trio.current_time()
            try:
                await self.upload_snapshot()
            except Tier2Error as e:
                self.snapshot_failures += 1
                self._flushed_since_snapshot.set()  # try again next interval
                log.warning("metadata snapshot upload failed: %s", e)

    async def upload_snapshot(self, whole: bool = False) -> str:
        """Upload a metadata snapshot now -- a delta of the last whole one while
        that is much smaller (`SnapshotEncoder.capture_delta`), unless ``whole``
        -- and delete the whole ones beyond ``snapshots_kept`` and the deltas no
        longer needed."""
        w = self._writer
        w.check_fence()
        at_ms = int(time.time() * 1000)
        # The journal position of the committed view it holds (no await
        # between the two): recovery tells by it whether an attribute index
        # batch the snapshot does not name holds newer values than its records.
        applied_seq = w.container.applied_seq
        encoder = self._encoder
        delta = None if whole else encoder.capture_delta(w.container)
        if delta is None:
            head, records = encoder.capture(w.container)
            base, number = "", 0
            key = names.snapshot_key(w.node, at_ms, w.epoch)
        else:
            head, records = delta
            base, number = encoder.base_key, encoder.deltas + 1
            key = names.delta_key(base, number)
        snapshot = await trio.to_thread.run_sync(
            SnapshotEncoder.encode, head, records, w.node, w.epoch, at_ms, base, number
        )
        crc = await crc32c_of(snapshot)
        await w.layer.write(key, snapshot, object_metadata(crc, applied_seq))
        kind = "delta" if base else "whole"
        if base:
            encoder.deltas = number
        else:
            encoder.based(key, applied_seq, len(snapshot))
        self.snapshot_uploads[kind] += 1
        self.snapshot_bytes[kind] += len(snapshot)
        await self._prune_snapshots()
        return key

    async def _prune_snapshots(self) -> None:
        """Keep the newest ``snapshots_kept`` whole snapshots and the newest
        `DELTAS_KEPT` deltas of each (a reader that listed just before may still
        be reading the one before the newest)."""
        w = self._writer
        listing = await w.layer.list(names.meta_prefix(w.node))
        wholes = sorted(o.key for o in listing if o.key.endswith(".snapshot"))
        stale = wholes[: max(0, len(wholes) - w.cfg.snapshots_kept)]
        kept = set(wholes[len(stale) :])
        deltas: dict[str, list[tuple[int, str]]] = {}
        for obj in listing:
            parsed = names.parse_delta_key(obj.key)
            if parsed is not None:
                deltas.setdefault(parsed[0], []).append((parsed[1], obj.key))
        for base, found in deltas.items():
            found.sort()
            drop = found if base not in kept else found[:-DELTAS_KEPT]
            stale += [key for _, key in drop]
        for key in stale:
            await w.layer.delete(key)

    # -- garbage collection ----------------------------------------------------------------

    def _referenced(self) -> set[str]:
        named = set(self._cold_named)
        parsed = self._cold_parsed
        for seg in self._writer.container.segments():
            data = seg.cold_record()
            if data is None or id(data) not in parsed:  # (warmed or cooled since)
                named.update(c.name for c in chunks_of(seg))
        # Objects the optimizer replaced stay through GC's grace: readers
        # holding the old chunk list still read them.
        return named | self._writer.uploading | self._writer.optimizer.retired.keys()

    async def _read_cold(self) -> None:
        """The chunk names of the cold segments, read from their records in a
        thread (a million take seconds): `_referenced` then only looks up each
        record it finds unchanged, by identity."""
        records = [
            data
            for seg in self._writer.container.segments()
            if (data := seg.cold_record()) is not None
        ]
        self._cold_named = await trio.to_thread.run_sync(_chunk_names, records)
        self._cold_records = records  # alive, so that their ids stay theirs
        self._cold_parsed = {id(data) for data in records}

    async def _run_gc(self) -> None:
        while True:
            await trio.sleep(self._writer.cfg.gc_interval)
            await self.collect_garbage()

    async def collect_garbage(self) -> gc.GcResult | None:
        """One GC pass now; None if it failed (logged) or could not run (no lease)."""
        w = self._writer
        if w.fenced is not None or (w.lease is not None and not w.lease.held()):
            return None  # the objects may be another process's by now
        try:
            await self._read_cold()
            result = await gc.collect(w.layer, w.node, self._referenced, grace=w.cfg.gc_grace)
        except Tier2Error as e:
            self.gc_failures += 1
            log.warning("garbage collection failed: %s", e)
            return None
        finally:
            self._cold_named, self._cold_records, self._cold_parsed = set(), [], set()
        self.gc_passes += 1
        self.gc_deleted += result.deleted
        for key in result.deleted_keys:
            await self._forget_chunk(key)
        return result


def _chunk_names(records: list[bytes]) -> set[str]:
    """The chunk names (attribute index chunks too) the encoded records hold."""
    return {c.name for data in records for c in record_chunks(data)}
