"""Maintenance: throttling changes to what the node can hold, checkpoints, truncation.

Unflushed append data is pinned (in its journal file or in the cache) until
it is in Tier 2, and the journal's disk is finite: changes wait for room
(`Maintenance.wait_for_capacity`) and are refused after
``container.overload_timeout``, so memory and disk stay bounded.

Checkpoints snapshot the pending view at the moment of submission -- it holds
exactly the operations before the checkpoint in the journal -- and after one
is durable the journal is truncated up to the oldest file whose append data
is still needed: data is needed unless it is in Tier 2 (below the storage
length), its segment was deleted, or it was truncated away.
"""

from __future__ import annotations

import logging
from contextlib import suppress

import trio

from gateway.container.operations import OperationQueue, PendingOperation
from gateway.errors import GatewayError, JournalError, Overloaded

log = logging.getLogger(__name__)


class Maintenance:
    """Capacity waits, checkpoints and journal truncation for one container."""

    def __init__(self, queue: OperationQueue) -> None:
        self._queue = queue
        self._table = queue.table
        self._journal = queue.journal
        self.checkpoints = 0
        self.journal_files_truncated = 0

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
        queue = self._queue
        await self._journal.wait_for_space(64 * len(self._table.by_name) + 1024, reserved=True)
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
        ticket = self._journal.submit_checkpoint(self._table.pending_snapshot(), roll)
        op = PendingOperation(queue, ticket, None)
        op.internal = True
        queue.inflight.append(op)
        await op.wait()
        seq = ticket.result()
        self.checkpoints += 1
        keep_from = self._table.oldest_needed_file()
        storage = queue.storage
        if storage is not None and self._journal.would_truncate(seq, keep_from):
            # Files about to go may hold the only durable copy of bytes that
            # Tier 2 acknowledged from its page cache (the embedded server).
            try:
                await storage.durability_barrier()
            except GatewayError as e:
                log.warning("not truncating the journal: %s", e)
                return seq
        deleted = await self._journal.truncate(seq, keep_from)
        if deleted:
            self.journal_files_truncated += deleted
            self._table.forget_files_before(self._journal.oldest_file())
        log.debug("checkpoint at %d; truncated %d journal file(s)", seq, deleted)
        return seq

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
