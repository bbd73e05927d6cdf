"""The record of finished transactions: what a commit or abort sent again is told.

A client whose commit's answer was lost (a broken connection, a daemon
restart) sends it again; by then the transaction's segment is gone. This
record remembers how each transaction ended -- committed (into which
segment, at which offset), aborted, timed out -- so the retry gets the
first try's answer, or a clear refusal, instead of "does not exist".

It is part of the committed view: the segment table adds to it when a
merge or a transaction's delete is applied (live and in a replay, from the
journaled operations), and checkpoints carry it (`ContainerSnapshot
.txn_outcomes`), so it survives restarts. It is bounded: at most
``limit`` records (the oldest go first) and none older than ``max_age_ms``
(`streams.txn_outcomes`, `streams.txn_outcome_age`, set by the container).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from gateway.protocol.metadata_pb2 import (
    TXN_ABORTED,
    TXN_COMMITTED,
    TXN_TIMED_OUT,
    TransactionOutcomeRecord,
)

#: The outcomes a record may carry (others, from a newer version, are skipped).
KNOWN = (TXN_COMMITTED, TXN_ABORTED, TXN_TIMED_OUT)


class TransactionOutcomes:
    """Finished transactions by name, in the order they finished."""

    def __init__(self) -> None:
        # OrderedDict: dropping the oldest is O(1) (a dict's first key is not).
        self._by_name: OrderedDict[str, TransactionOutcomeRecord] = OrderedDict()
        #: At most this many records (None: unbounded, until `configure`;
        #: a replay keeps everything until the container sets the bounds).
        self.limit: int | None = None
        #: Records older than this are forgotten (None: kept).
        self.max_age_ms: int | None = None

    def __len__(self) -> int:
        return len(self._by_name)

    def configure(self, limit: int, max_age_ms: int) -> None:
        """Set the bounds (the container's ``streams`` settings) and apply the count."""
        self.limit = limit
        self.max_age_ms = max_age_ms
        self._trim()

    def add(self, record: TransactionOutcomeRecord) -> None:
        """A transaction finished (applied from its journaled operation)."""
        self._by_name.pop(record.name, None)
        self._by_name[record.name] = record
        self._trim()

    def get(self, name: str, now_ms: int) -> TransactionOutcomeRecord | None:
        """How ``name`` ended, if it is remembered (and not older than the age bound)."""
        record = self._by_name.get(name)
        if record is None or self._expired(record, now_ms):
            return None
        return record

    def prune(self, now_ms: int) -> int:
        """Forget records older than the age bound; returns how many went."""
        # Oldest first, but clocks may step back: look at every record.
        old = [n for n, r in self._by_name.items() if self._expired(r, now_ms)]
        for n in old:
            del self._by_name[n]
        return len(old)

    def records(self) -> list[TransactionOutcomeRecord]:
        """Every record, oldest first (for checkpoints and snapshots)."""
        return list(self._by_name.values())

    def load(self, records: Iterable[TransactionOutcomeRecord]) -> None:
        """Replace the record by a checkpoint's; entries without a name or a known
        outcome (damaged, or from a newer version) are skipped."""
        self._by_name = OrderedDict()
        for r in records:
            if r.name and r.outcome in KNOWN:
                copy = TransactionOutcomeRecord()
                copy.CopyFrom(r)
                self._by_name[r.name] = copy
        self._trim()

    def _expired(self, record: TransactionOutcomeRecord, now_ms: int) -> bool:
        return self.max_age_ms is not None and record.at_ms + self.max_age_ms <= now_ms

    def _trim(self) -> None:
        if self.limit is None:
            return
        while len(self._by_name) > self.limit:
            self._by_name.popitem(last=False)
