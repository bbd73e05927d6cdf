"""Maintenance: throttling changes to what the node can hold, checkpoints, truncation.

Unflushed append data is pinned (in its journal file or in the cache) until
it is in Tier 2, and the journal's disk is finite: changes wait for room
(`Maintenance.wait_for_capacity`) and are refused after
``container.overload_timeout``, so memory and disk stay bounded.

Checkpoints snapshot the pending view at the moment of submission -- it holds
exactly the operations before the checkpoint in the journal. They roll
(docs/FORMATS.md): each holds the segments changed since the previous one,
the deletions, and the next share of the unchanged segments in name order, so
its cost follows the traffic, not the number of segments. Once a pass over
every name is done, the checkpoints since the pass began hold every live
segment; that is how far the journal may be truncated, and further only up to
the oldest file whose append data is still needed: data is needed unless it
is in Tier 2 (below the storage length), its segment was deleted, or it was
truncated away.

The unchanged segments a checkpoint rewrites are at least
``container.checkpoint_min_segments`` and about a quarter of the bytes
journaled since the previous checkpoint: the journal keeps about four times
the size of all records, and rewriting them costs about a quarter of the
journal's write rate, whatever the number of segments.

The checkpoint written to free a full disk is whole, though: it alone must
let every older file go. The journal's reserve holds one
(`Maintenance.whole_checkpoint_bytes`, told to the journal), so a node of
many segments still gets out of a full disk.
"""

from __future__ import annotations

import logging
from contextlib import suppress

import trio

from gateway.container.operations import OperationQueue, PendingOperation
from gateway.container.segment import Segment
from gateway.container.table import split_checkpoint
from gateway.errors import GatewayError, JournalError, Overloaded
from gateway.protocol.metadata_pb2 import ContainerSnapshot

#: Unchanged record bytes a rolling checkpoint rewrites per byte journaled since
#: the previous checkpoint: the journal then keeps about 1/this times the
#: records' size beyond what it needs for data.
REWRITE_SHARE = 0.25
#: A checkpoint larger than this (or half of ``journal.max_operation_bytes``) is
#: written in pieces (`split_checkpoint`).
MAX_PIECE_BYTES = 8 * 1024 * 1024
#: Segments sealed and in Tier 2 that did not change for this long go cold
#: (`gateway.container.segment.Segment.cool`).
COOL_INTERVAL = 30.0
#: Segments looked at between two yields to the event loop while cooling.
COOL_BATCH = 10_000
#: The pause after a failed checkpoint before the next attempt.
CHECKPOINT_RETRY_SECONDS = 0.5
#: Bytes of a segment record assumed until a checkpoint measured them (a cold
#: one takes ~150).
RECORD_BYTES = 200.0
#: Margin on the estimate of a whole checkpoint: records vary by segment.
WHOLE_MARGIN = 1.125

log = logging.getLogger(__name__)


class Maintenance:
    """Capacity waits, checkpoints and journal truncation for one container."""

    def __init__(self, queue: OperationQueue) -> None:
        self._queue = queue
        self._table = queue.table
        self._journal = queue.journal
        self.checkpoints = 0
        self.journal_files_truncated = 0
        #: Rolling checkpoints: the name the next share of unchanged segments
        #: starts after ("" = a new pass), the sequence of the checkpoint that
        #: began the pass in progress, and the table's sequence when the previous
        #: checkpoint was taken (what changed since goes in the next one).
        self._after = ""
        self._pass_start = 0
        self._stamp = self._table.changes_floor
        self._lock = trio.Lock()
        #: Average bytes of a segment record in the last checkpoint.
        self._record_bytes = RECORD_BYTES
        #: Average bytes of a record in the last whole checkpoint or complete pass
        #: (every segment), and the records and bytes of the pass in progress.
        self._whole_record_bytes = RECORD_BYTES
        self._pass_records = 0
        self._pass_bytes = 0
        #: Checkpoints written whole (of the ``checkpoints``), and the segment
        #: records and bytes written in all checkpoints (metrics).
        self.full_checkpoints = 0
        self.checkpoint_records = 0
        self.checkpoint_bytes = 0
        #: Segments cold (only their record in memory) after the last cooling pass.
        self.cold_segments = sum(1 for s in self._table.by_id.values() if s.cold)
        self._journal.estimate_checkpoints(self.whole_checkpoint_bytes)

    def whole_checkpoint_bytes(self) -> int:
        """An estimate of a checkpoint of every segment now (what a checkpoint for space
        writes): the segments, pending creates included, times a measured record size."""
        return int(len(self._table.by_name) * self._whole_record_bytes * WHOLE_MARGIN)

    # -- throttling ------------------------------------------------------------------

    def _pinned_room(self, nbytes: int) -> bool:
        index = self._table.read_index
        return index.store.pinned_room(nbytes, self._queue.pending_pinned + index.pinned_bytes)

    async def wait_for_capacity(self, nbytes: int, reserved: bool = False) -> None:
        """Wait until the journal and the cache can take ``nbytes``; else Overloaded.

        Unflushed append data is pinned (in its journal file or in the
        cache) until it is in Tier 2; when it reaches its share of the cache
        budget, appends wait for room
        (truncation, deletion, or a flush) and after ``overload_timeout`` are
        refused: memory and disk stay bounded. While the journal's disk is
        full, changes wait too, unless ``reserved`` (deletions and
        truncations, which free space).
        """
        journal = self._journal
        timeout = self._queue.config.overload_timeout
        if journal.has_space(nbytes, reserved) and self._pinned_room(nbytes):
            return
        if journal.short_of_space:
            self._queue.want_maintenance()  # a checkpoint may free space now
        with trio.move_on_after(timeout):
            await journal.wait_for_space(nbytes, reserved)
            while not self._pinned_room(nbytes):
                await self._queue.wait_pinned_freed()
            return
        if journal.short_of_space and not reserved:
            raise Overloaded(
                f"the journal disk is full; waited {timeout:g}s for "
                "flushes to Tier 2 and checkpoints to free space"
            )
        if not self._pinned_room(nbytes):
            raise Overloaded(
                "unflushed data fills its share of the cache budget "
                f"(cache.budget x cache.pinned_share); waited {timeout:g}s"
            )
        raise Overloaded(
            f"the journal has not caught up within {timeout:g}s (container.overload_timeout)"
        )

    # -- checkpoints and journal truncation --------------------------------------------

    async def checkpoint(self, roll: bool = False) -> int:
        """Journal a checkpoint, then truncate the journal as far as possible.

        ``roll``: in a new journal file, so every older file may go (see
        `Journal.submit_checkpoint`).
        """
        # One at a time: each continues the pass of the one before.
        async with self._lock:
            return await self._checkpoint(roll)

    async def _checkpoint(self, roll: bool) -> int:
        queue = self._queue
        # Room under max_pending_bytes for a piece of it (pieces are at most
        # MAX_PIECE_BYTES): asking for a whole one's size at 10^6 segments
        # (~170 MB, more than the limit) would wait for an empty queue, and
        # every append would queue behind that wait at each checkpoint.
        size = min(self.whole_checkpoint_bytes(), MAX_PIECE_BYTES)
        await self._journal.wait_for_space(size + 1024, reserved=True)
        # The snapshot is the pending view, but chunk lists and storage
        # lengths change only when an operation is applied. A chunk added,
        # sealed in storage or truncated away that is still in flight would
        # sit before the checkpoint in the journal yet be missing from its
        # snapshot: recovery replays it, then loads the snapshot over it and
        # loses it (seen: a later chunk then "starts past the storage
        # length"). So no such operation may be in flight when it is taken.
        while True:
            storage_ops = [op for op in queue.inflight if op.storage]
            if not storage_ops:
                break
            last = storage_ops[-1].ticket
            if last is not None:
                with suppress(JournalError):
                    await last.wait()
            queue.settle()
        queue.start(change=False)
        snapshot, completes = self._snapshot(roll)
        table = self._table
        # In pieces if need be, one right after the other (no await between:
        # all of them are of this instant).
        limit = min(MAX_PIECE_BYTES, self._journal.max_operation_bytes // 2)
        pieces = split_checkpoint(snapshot, limit)
        written = 0
        tickets = []
        for i, piece in enumerate(pieces):
            data = piece.SerializeToString()
            written += len(data)
            tickets.append(self._journal.submit_checkpoint(data, roll and i == 0))
        op = PendingOperation(queue, tickets[-1], None)
        op.internal = True
        queue.inflight.append(op)
        try:
            await op.wait()
            first, seq = tickets[0].result(), tickets[-1].result()
        except BaseException:
            # What it held is in no later checkpoint: the next one is whole.
            table.complete_from = None
            raise
        self.checkpoints += 1
        self.checkpoint_records += len(snapshot.segments)
        self.checkpoint_bytes += written
        if snapshot.segments:
            self._record_bytes = max(50.0, written / len(snapshot.segments))
        if not snapshot.partial:
            self.full_checkpoints += 1
            table.complete_from = first
            if snapshot.segments:
                self._whole_record_bytes = written / len(snapshot.segments)
        else:
            if self._pass_start == 0:
                self._pass_start = first
                self._pass_records = self._pass_bytes = 0
            self._pass_records += len(snapshot.segments)
            self._pass_bytes += written
            if completes:
                table.complete_from = self._pass_start
                self._pass_start = 0
                if self._pass_records:
                    self._whole_record_bytes = self._pass_bytes / self._pass_records
        limit = table.complete_from or seq
        keep_from = self._table.oldest_needed_file()
        storage = queue.storage
        if storage is not None and self._journal.would_truncate(limit, keep_from):
            # Files about to go may hold the only durable copy of bytes that
            # Tier 2 acknowledged from its page cache (the embedded server).
            try:
                await storage.durability_barrier()
            except GatewayError as e:
                log.warning("not truncating the journal: %s", e)
                return seq
        deleted = await self._journal.truncate(limit, keep_from)
        if deleted:
            self.journal_files_truncated += deleted
            self._table.forget_files_before(self._journal.oldest_file())
        log.debug("checkpoint at %d; truncated %d journal file(s)", seq, deleted)
        return seq

    def _snapshot(self, roll: bool) -> tuple[ContainerSnapshot, bool]:
        """The next checkpoint's snapshot, and whether it completes a pass.

        Whole when asked to ``roll`` (it alone must let every older file go),
        when no complete run of checkpoints is known (the first after a start
        from an old journal), when what changed is no longer known, or when
        the share would be everything anyway.
        """
        table = self._table
        changed = table.changed_since(self._stamp)
        self._stamp = table.seq
        share = max(
            self._queue.config.checkpoint_min_segments,
            int(self._journal.bytes_since_checkpoint * REWRITE_SHARE / self._record_bytes),
        )
        names = table.by_name
        if (
            roll
            or table.complete_from is None
            or changed is None
            or (not self._after and share >= len(names))
        ):
            self._after = ""
            self._pass_start = 0
            return table.pending_snapshot(), False
        segments: dict[int, Segment] = {s.id: s for s in changed[0]}
        deleted = {segment_id for segment_id, _ in changed[1]}
        for seg in self._queue.dirty:  # pending changes not yet applied
            segments[seg.id] = seg
        completes = True
        for taken, name in enumerate(
            names.irange(minimum=self._after or None, inclusive=(False, True))
        ):
            if taken >= share:
                completes = False
                break
            seg = names[name]
            segments[seg.id] = seg
            self._after = name
        if completes:
            self._after = ""
        for segment_id, seg in list(segments.items()):
            if seg.p_deleted:
                del segments[segment_id]
                deleted.add(segment_id)
        complete_from = table.complete_from
        if completes and self._pass_start:
            complete_from = self._pass_start  # this checkpoint ends the pass
        return table.partial_snapshot(segments.values(), deleted, complete_from), completes

    async def run_cooling(self) -> None:
        """Cool the segments that stayed unchanged for COOL_INTERVAL and may be (a
        task): a few hundred bytes each instead of a few kilobytes."""
        while True:
            since = self._table.seq
            await trio.sleep(COOL_INTERVAL)
            segments = list(self._table.by_id.values())
            cold = 0
            for i in range(0, len(segments), COOL_BATCH):
                batch = segments[i : i + COOL_BATCH]
                self._table.cool(batch, self._queue.dirty, since)
                cold += sum(1 for s in batch if s.cold)
                await trio.lowlevel.checkpoint()
            self.cold_segments = cold

    def _checkpoint_for_space(self) -> bool:
        """Whether the disk is full and a checkpoint in a new file would free journal files."""
        journal = self._journal
        return journal.short_of_space and journal.rolled_checkpoint_frees(
            self._table.oldest_needed_file()
        )

    async def run(self) -> None:
        """Checkpoints and journal truncation, when due or when space runs short (a task)."""
        while True:
            await self._queue.wait_maintenance_wanted()
            if self._queue.closing:
                return
            journal = self._journal
            # When space runs short, a checkpoint is due as soon as the
            # journal holds files of flushed data, however few operations
            # went by: it is the only way to give their space back.
            for_space = self._checkpoint_for_space()
            if for_space or journal.checkpoint_due():
                try:
                    await self.checkpoint(roll=for_space)
                except (GatewayError, OSError) as e:
                    log.warning("checkpoint failed: %s", e)
                    # Not at once again: on a full disk every operation
                    # wakes this task (seen: 20 failures a second, each a
                    # whole checkpoint built and refused).
                    await trio.sleep(CHECKPOINT_RETRY_SECONDS)
