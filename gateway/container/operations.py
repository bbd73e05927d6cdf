"""The operation queue: operations in flight, applied in submission order.

Every part of the container prepares its operations through one
`OperationQueue`: `start` refuses when no change may go in, `submit` hands
the operation to the journal, `track` queues it with the function that
applies it. Operations are applied to the committed view strictly in
submission order, by whichever waiter runs first (`settle`).

If the journal refuses a group (disk full), it refuses everything queued
behind it, so when the queue drains the pending view is reset to the
committed one (`settle` undoes the refused operations' effects) and nothing
later can depend on a refused operation.

The queue also holds what every part's prepares and applies share: the
table, the journal, the clock, the listeners told about changes, and the
conditions under which nothing may change (closing, fenced, no lease).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import trio

from gateway.buffers import Buffer
from gateway.config import ContainerConfig
from gateway.container.interfaces import (
    JournalTicket,
    LeaseGate,
    NamespaceWatcher,
    OperationJournal,
    StorageListener,
)
from gateway.container.segment import Segment
from gateway.container.segment_names import validate_name
from gateway.container.table import SegmentTable
from gateway.errors import (
    GatewayError,
    JournalClosed,
    JournalError,
    JournalRefused,
    Overloaded,
    SegmentNotFound,
    Unavailable,
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class PendingOperation:
    """A prepared operation; `wait` returns its result once it is durable."""

    __slots__ = (
        "_apply",
        "_deferred",
        "_queue",
        "_result_fn",
        "error",
        "internal",
        "result",
        "settled",
        "storage",
        "ticket",
    )

    def __init__(
        self,
        queue: OperationQueue,
        ticket: JournalTicket | None,
        result: Any,
        apply: Callable[[int], None] | None = None,
        deferred: Callable[[], GatewayError] | None = None,
    ) -> None:
        self._queue = queue
        self.ticket = ticket
        self.result = result
        self._apply = apply
        #: For a failed writer condition: builds the error from the committed
        #: view once the operations in flight before it have settled.
        self._deferred = deferred
        self.error: GatewayError | None = None
        self._result_fn: Callable[[], Any] | None = None
        #: Changes what the pending view (and so a checkpoint's snapshot) does
        #: not carry until it is applied: chunks, the storage length, merge
        #: links, stream records. A checkpoint waits for these to apply.
        self.storage = False
        #: The node's own bookkeeping (chunks recorded, checkpoints), not a
        #: client's change: acknowledged to nobody, so not under the lease.
        self.internal = False
        #: Taken off the queue: applied, or its error set.
        self.settled = False

    def _with_result(self, fn: Callable[[], Any]) -> PendingOperation:
        """Compute the result when applied (e.g. the segment's new info)."""
        self._result_fn = fn
        return self

    async def wait(self) -> Any:
        """Wait until durable and applied; return the result or raise the error."""
        if self.ticket is not None:
            lease = self._queue.lease
            timeout = lease.ack_timeout if lease is not None and not self.internal else 0.0
            with trio.move_on_after(timeout or math.inf) as waited:
                with suppress(JournalError):  # settle maps it
                    await self.ticket.wait()
            if waited.cancelled_caught:
                # Replicated, and no ack quorum in time: not acknowledged. The
                # operation stays queued and may still become durable.
                assert lease is not None
                raise lease.not_acknowledged()
            self._queue.settle()
            while not self.settled and any(op is self for op in self._queue.inflight):
                # Settled in order, and an earlier one is still out: its
                # journal group waits for its quorum while this later one
                # failed already (replication stopped). Failed, it is refused
                # now (nothing of it is applied, ever); durable, it waits.
                failure = _journal_failure(self.ticket)
                if failure is not None:
                    self.error = failure
                    break
                head = self._queue.inflight[0]
                assert head.ticket is not None
                with suppress(JournalError):
                    await head.ticket.wait()
                self._queue.settle()
        if self.error is not None:
            raise self.error
        lease = self._queue.lease
        if lease is not None and not self.internal and not lease.held():
            # Durable here, but this node can no longer prove that no other
            # process took its node id over: it must not acknowledge (the
            # client retries; exactly-once writers are deduplicated).
            lease.check()
        if self._result_fn is not None:
            return self._result_fn()
        return self.result


def _journal_failure(ticket: JournalTicket) -> GatewayError | None:
    """The error a done ticket's operation gets (None: it is durable)."""
    try:
        ticket.result()
    except JournalRefused as e:
        return Overloaded(str(e))
    except JournalClosed:
        return Unavailable("the daemon is shutting down")
    except JournalError as e:
        return Unavailable(str(e))
    return None


class OperationQueue:
    """Operations submitted to the journal and not yet applied, and the state they share."""

    def __init__(
        self, config: ContainerConfig, table: SegmentTable, journal: OperationJournal
    ) -> None:
        self.config = config
        self.table = table
        self.journal = journal
        #: Wall-clock Unix milliseconds (a test may set its own clock).
        self.now_ms: Callable[[], int] = _now_ms
        #: Set when another process took this node id over: no more changes.
        self.fenced: GatewayError | None = None
        #: In a cluster: changes are admitted and acknowledged only while it is held.
        self.lease: LeaseGate | None = None
        #: The storage writer, once Tier 2 runs.
        self.storage: StorageListener | None = None
        #: Told about creates, seals, truncations and deletes (the mount).
        self.watchers: list[NamespaceWatcher] = []
        self.closing = False
        self.inflight: deque[PendingOperation] = deque()
        #: Segments whose pending view may differ from the committed one.
        self.dirty: set[Segment] = set()
        #: Append bytes submitted but not yet applied (and so not yet cached).
        self.pending_pinned = 0
        self._pinned_freed = trio.Event()
        self._maintenance = trio.Event()

    # -- the committed and the pending view ---------------------------------------------

    def committed(self, name: str) -> Segment:
        """The committed segment ``name``; SegmentNotFound if there is none."""
        seg = self.table.committed_named(name)
        if seg is None or not seg.durable or seg.gone:
            validate_name(name)
            raise SegmentNotFound(name)
        return seg

    def pending(self, name: str) -> Segment:
        """The segment ``name`` in the pending view; SegmentNotFound if it is gone."""
        seg = self.table.by_name.get(name)
        if seg is None or seg.p_deleted or seg.p_merged:
            validate_name(name)
            raise SegmentNotFound(name)
        return seg

    def pending_by_id(self, segment_id: int) -> Segment:
        """The segment with this id in the pending view; SegmentNotFound if it is gone."""
        seg = self.table.by_id.get(segment_id)
        if seg is None or seg.p_deleted:
            raise SegmentNotFound(f"segment id {segment_id}")
        return seg

    # -- preparing -------------------------------------------------------------------

    def start(self, change: bool = True) -> None:
        """Common start of every prepare: settle, and refuse if the journal failed.

        ``change``: a client's change (not the node's own bookkeeping), which
        also needs the lease.
        """
        self.settle()
        if self.closing:
            raise Unavailable("the daemon is shutting down")
        if self.journal.failed is not None:
            raise Unavailable(str(self.journal.failed))
        if self.fenced is not None:
            raise Unavailable(str(self.fenced))
        if change and self.lease is not None:
            self.lease.check()

    def submit(self, parts: Sequence[Buffer], reserved: bool = False) -> JournalTicket:
        """Submit to the journal; ``reserved`` for operations that free space (may use
        the journal's reserve when the disk is full)."""
        try:
            return self.journal.submit(parts, reserved)
        except JournalClosed as e:
            raise Unavailable("the daemon is shutting down") from e
        except JournalRefused as e:
            self.want_maintenance()  # a checkpoint may free space now
            raise Overloaded(str(e)) from e
        except JournalError as e:
            raise Unavailable(str(e)) from e

    def track(
        self, ticket: JournalTicket, result: Any, apply: Callable[[int], None], seg: Segment | None
    ) -> PendingOperation:
        """Queue a submitted operation; ``seg``: the segment whose pending view it changed."""
        op = PendingOperation(self, ticket, result, apply)
        self.inflight.append(op)
        if seg is not None:
            self.dirty.add(seg)
        return op

    def behind_tail(self) -> PendingOperation:
        """An operation with no journal entry of its own, done when the last one in flight is."""
        tail = self.inflight[-1].ticket if self.inflight else None
        return PendingOperation(self, tail, None)

    # -- settling: apply durable operations in order -----------------------------------

    def settle(self) -> None:
        """Apply the durable operations at the head of the queue; undo refused ones."""
        q = self.inflight
        while q and (q[0].ticket is None or q[0].ticket.done):
            op = q.popleft()
            op.settled = True
            if op._deferred is not None:
                op.error = op._deferred()
                continue
            assert op.ticket is not None
            failure = _journal_failure(op.ticket)
            if failure is not None:
                op.error = failure
            elif op._apply is not None:
                seq = op.ticket.result()
                self.table.seq = seq
                op._apply(seq)
        if not q:
            self.pending_pinned = 0  # refused appends never reach apply
        if not q and self.dirty:
            # Nothing in flight: pending must equal committed. It already does
            # unless the journal refused operations; then undo their effects.
            for seg in self.dirty:
                if not seg.durable:
                    self.table.remove(seg)
                else:
                    seg.reset_pending()
            self.dirty.clear()
            for name, stream in list(self.table.streams.items()):
                if not stream.durable:
                    del self.table.streams[name]
                stream.p_deleted = False
        if self.journal.checkpoint_due() or self.journal.short_of_space:
            self.want_maintenance()

    async def wait_settled(self) -> None:
        """Wait until everything submitted so far is durable (or failed) and applied."""
        if self.inflight:
            last = self.inflight[-1]
            if last.ticket is not None:
                with suppress(JournalError):
                    await last.ticket.wait()
            self.settle()
        else:
            await trio.lowlevel.checkpoint()

    # -- signals to the maintenance task and to appends waiting for room ---------------

    def want_maintenance(self) -> None:
        """Wake the maintenance task (a checkpoint may be due, or free space)."""
        self._maintenance.set()

    async def wait_maintenance_wanted(self) -> None:
        """Wait until `want_maintenance` was called since the last wait."""
        await self._maintenance.wait()
        self._maintenance = trio.Event()

    def signal_pinned_freed(self) -> None:
        """Pinned bytes went (truncated, deleted, or in Tier 2): appends may fit now."""
        self._pinned_freed.set()
        self._pinned_freed = trio.Event()

    async def wait_pinned_freed(self) -> None:
        """Wait for the next `signal_pinned_freed`."""
        await self._pinned_freed.wait()
