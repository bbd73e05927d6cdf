"""Transactions (Pravega's merge): begin, commit, abort, timeouts and outcomes.

A transaction is a hidden segment under ``TXN_DIR`` with a parent (a segment
or a stream) and a deadline. A commit seals it and merges it at the end of
its parent in one journaled operation; an abort deletes it; the timed policy
run (`Transactions.expire`) aborts those past their deadline. A commit or
abort sent again after the transaction ended is answered from the record of
finished transactions (`gateway.container.outcomes`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from typing import Protocol

from gateway import failpoints
from gateway.config import StreamsConfig
from gateway.container.attribute_cache import AttributeCache
from gateway.container.attributes import CODEC, EVENT_COUNT, EVENT_END, AttributesNotLoaded, is_core
from gateway.container.operations import OperationQueue, PendingOperation
from gateway.container.results import TransactionInfo
from gateway.container.segment import Segment
from gateway.container.streams import TXN_DIR, is_hidden
from gateway.errors import (
    BadRequest,
    GatewayError,
    LimitExceeded,
    NotATransaction,
    SegmentNotFound,
    SegmentSealed,
    TransactionAborted,
    TransactionCommitted,
    TransactionTimedOut,
    Unavailable,
)
from gateway.journal.format import attribute_records
from gateway.protocol.codec import Codec
from gateway.protocol.journal_pb2 import MergeSegment, Operation
from gateway.protocol.metadata_pb2 import TXN_COMMITTED, TXN_TIMED_OUT

log = logging.getLogger(__name__)

_LINES = Codec.LINES.number

#: Prepares one operation of a timed policy run, saying what it is: ``start(what, prepare)``.
Start = Callable[[str, Callable[[], PendingOperation]], None]


class PrepareCreate(Protocol):
    """The container's create of a segment with resolved attribute values."""

    def __call__(
        self,
        name: str,
        values: Mapping[bytes, int | None],
        txn_parent: str = "",
        txn_deadline_ms: int = 0,
        attributes_from: Segment | None = None,
    ) -> PendingOperation: ...


class Transactions:
    """Prepares the operations of transactions; counts how they end."""

    def __init__(
        self,
        queue: OperationQueue,
        attributes: AttributeCache,
        config: StreamsConfig,
        *,
        create: PrepareCreate,
        seal: Callable[[str], PendingOperation],
        delete: Callable[[str, bool], PendingOperation],
        append_target: Callable[[str], Segment],
    ) -> None:
        self._queue = queue
        self._table = queue.table
        self._attributes = attributes
        self._config = config
        self._create = create
        self._seal = seal
        self._delete = delete
        self._append_target = append_target
        #: The container's node id, named in every transaction's name so that
        #: any node can send a client to wherever the container runs ("": none).
        self.node_id = ""
        self.begun = 0
        self.committed = 0
        self.aborted = 0
        self.timed_out = 0

    def prepare_begin(self, parent: str, timeout: float = 0.0) -> PendingOperation:
        """Start a transaction on a segment or stream (result: TransactionInfo).

        Append to the transaction's name like to any segment; `prepare_commit`
        merges it into ``parent`` (a stream: its current segment then).
        """
        q = self._queue
        q.start()
        cfg = self._config
        timeout = timeout or cfg.txn_timeout
        if not 0 < timeout <= cfg.max_txn_timeout:
            raise LimitExceeded(
                f"transaction timeout {timeout:g}s is above streams.max_txn_timeout "
                f"({cfg.max_txn_timeout:g}s)"
            )
        stream = self._table.streams.get(parent)
        values: dict[bytes, int | None] = {}
        if stream is None or stream.p_deleted:
            target = q.pending(parent)
            if target.hidden:
                raise BadRequest(f"{parent!r} is a transaction; transactions do not nest")
            if target.p_sealed:
                raise SegmentSealed(parent)
            codec = target.pending_attributes().get(CODEC)
            if codec is not None:  # its events are checked alike
                values[CODEC] = codec
        elif stream.codec is not Codec.RAW:
            values[CODEC] = stream.codec.number
        # `.txn/<node>/<hex>`: the node id lets every node route it (its
        # owner may be down, or hosted elsewhere, and no node follows
        # transactions); `.txn/<hex>` without one (a single node) as before.
        where = f"{self.node_id}/" if self.node_id else ""
        name = f"{TXN_DIR}/{where}{uuid.uuid4().hex}"
        deadline = q.now_ms() + int(timeout * 1000)
        op = self._create(name, values, txn_parent=parent, txn_deadline_ms=deadline)
        self.begun += 1
        return op._with_result(lambda: TransactionInfo(name, parent, deadline_ms=deadline))

    def _transaction(self, name: str) -> Segment:
        """The open transaction ``name`` (pending view)."""
        if not is_hidden(name):  # only `begin` creates names there
            raise NotATransaction(name)
        return self._queue.pending(name)

    def _finished_transaction(self, name: str, commit: bool) -> PendingOperation | None:
        """A commit (or abort) of a transaction that has ended, or is ending.

        None while ``name`` is open, or unknown. Otherwise the answer comes
        from the record of finished transactions once the operations in
        flight have applied (a commit sent again while the first is still
        being journaled waits for it): a commit of a committed transaction
        gets the same TransactionInfo again, an abort of an aborted one
        succeeds; the others are refused, saying how it ended.
        """
        if not is_hidden(name):
            return None
        seg = self._table.by_name.get(name)
        if seg is not None and not (seg.p_merged or seg.p_deleted):
            return None
        if seg is None and self._table.outcomes.get(name, self._queue.now_ms()) is None:
            return None
        return self._queue.behind_tail()._with_result(partial(self._outcome_answer, name, commit))

    def _outcome_answer(self, name: str, commit: bool) -> TransactionInfo | None:
        """What a commit or abort of the ended transaction ``name`` is answered."""
        record = self._table.outcomes.get(name, self._queue.now_ms())
        if record is None:
            seg = self._table.by_name.get(name)
            if seg is not None and not (seg.p_merged or seg.p_deleted):
                # The operation that was ending it was refused by the journal.
                raise Unavailable(f"transaction {name!r} did not end: send it again")
            raise SegmentNotFound(name)
        if record.outcome == TXN_COMMITTED:
            if not commit:
                raise TransactionCommitted(name, record.segment, record.offset)
            return TransactionInfo(
                name, record.parent, record.segment, record.offset, record.length
            )
        if not commit:
            return None  # aborted already: what an abort wants holds
        if record.outcome == TXN_TIMED_OUT:
            raise TransactionTimedOut(name)
        raise TransactionAborted(name)

    def _commit_too_late(self, txn: Segment) -> PendingOperation:
        """A commit at or after the deadline: abort the transaction, then refuse.

        The deadline holds to the millisecond, not only when the timeout
        sweep (every ``streams.interval``) comes round.
        """
        log.info(
            "transaction %s on %s: commit after its deadline; aborted", txn.name, txn.txn_parent
        )
        error = TransactionTimedOut(txn.name)

        def refuse() -> None:
            raise error

        try:
            aborting = self._delete(txn.name, True)
        except GatewayError as e:
            # Not journaled now (e.g. a full disk): the sweep aborts it later;
            # the commit is refused all the same.
            log.warning("abort of %s: %s", txn.name, e)
            raise error from None
        self.timed_out += 1
        return PendingOperation(self._queue, aborting.ticket, None)._with_result(refuse)

    def prepare_commit(self, name: str) -> PendingOperation:
        """Merge a transaction into its parent atomically (result: TransactionInfo).

        The transaction is sealed, then appended to the end of its parent's
        (pending) length in one journaled operation: readers of the parent see
        all of its bytes at once or none. Its event count adds to the
        parent's, and its writers' event numbers move over. Sent again after
        it ended, it answers from the record of finished transactions
        (`_finished_transaction`); at or after the deadline it aborts the
        transaction and is refused (TransactionTimedOut).
        """
        q = self._queue
        q.start()
        finished = self._finished_transaction(name, commit=True)
        if finished is not None:
            return finished
        txn = self._transaction(name)
        if q.now_ms() >= txn.txn_deadline_ms:
            return self._commit_too_late(txn)
        target = self._append_target(txn.txn_parent)
        if target.p_sealed:
            raise SegmentSealed(target.name)
        source = txn.pending_attributes()
        missing = target.missing_attributes(list(source))
        if missing:
            raise AttributesNotLoaded(target.name, missing)
        current = target.pending_attributes()
        values: dict[bytes, int | None] = {
            EVENT_COUNT: (current.get(EVENT_COUNT) or 0) + (source.get(EVENT_COUNT) or 0)
        }
        for k, v in source.items():
            if not is_core(k) and v is not None:
                old = current.get(k)
                values[k] = v if old is None else max(v, old)
        self._attributes.check_room(target, values)
        if not txn.p_sealed:
            self._seal(name)
        offset = target.p_length
        length = txn.p_length
        if (current.get(CODEC) or 0) == _LINES:
            # The sealed transaction ends with a whole event, newline or not.
            values[EVENT_END] = offset + length
        at_ms = q.now_ms()
        op = Operation(
            merge_segment=MergeSegment(
                target_id=target.id,
                source_id=txn.id,
                offset=offset,
                attributes=attribute_records(values),
                at_ms=at_ms,
            )
        )
        ticket = q.submit((op.SerializeToString(),))
        target.p_length = offset + length
        target.set_pending_attributes(values)
        txn.p_merged = True
        q.dirty.add(txn)
        self.committed += 1

        def apply(seq: int) -> None:
            self._table.apply_merge(target, txn, offset, values, at_ms)
            failpoints.hit("txn_commit_merged")
            if q.storage is not None:
                q.storage.on_append(target)

        info = TransactionInfo(name, txn.txn_parent, target.name, offset, length)
        pending = q.track(ticket, info, apply, target)
        pending.storage = True  # the pending view does not carry the merge link
        return pending

    def prepare_abort(self, name: str) -> PendingOperation:
        """Drop a transaction that is not committed (result: None).

        Idempotent: an abort of one already aborted or timed out succeeds;
        one of a committed transaction raises TransactionCommitted.
        """
        self._queue.start()
        finished = self._finished_transaction(name, commit=False)
        if finished is not None:
            return finished
        self._transaction(name)
        op = self._delete(name, False)
        self.aborted += 1
        return op

    def expire(self, now: int, start: Start) -> None:
        """Abort the transactions past their deadline (``start`` prepares each abort).

        Also forgets the outcomes of finished transactions older than
        ``streams.txn_outcome_age``.
        """
        for seg in list(self._table.transactions):
            if (
                seg.durable
                and not seg.p_merged
                and not seg.p_deleted
                and seg.txn_deadline_ms <= now
            ):
                log.info("transaction %s on %s timed out: aborted", seg.name, seg.txn_parent)
                self.timed_out += 1
                start(f"abort of {seg.name}", partial(self._delete, seg.name, True))
        self._table.outcomes.prune(now)
