"""`LargestSegments`: the largest segments by length, kept as they change (the status page).

A node may hold a million segments, most of them cold (only their encoded
record kept, `gateway.container.segment`): ranking them by a pass per request
would read every length, decoding every cold record (about 5 us each, so
seconds at 10^6) or warming them all. Instead the table tells this tracker
each length as it changes -- an append or merge grows a segment, a checkpoint
loads it, a deletion removes it -- and it keeps the KEEP longest ones (their
exact lengths) and `bound`, a length no segment outside them is longer than.
An append to a segment that is not among them costs a dict look-up and a
comparison with `bound` (`grew`).

What it shows is exact while the members at least as long as `bound` fill
the ranking asked for (`top`). Deletions of members can leave too few: then
a recount (`Recount`, a pass over every segment's length, cold ones read
from their records without warming them) is the only way back, which the
status page runs in the background, a slice at a time, at most once per
`gateway.status.RECOUNT_INTERVAL`. Transaction segments are not ranked
(they are merged and deleted, or aborted).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from gateway.container.segment import Segment
from gateway.protocol.metadata_pb2 import SegmentRecord

#: Segments whose exact length the tracker keeps. The page shows far fewer,
#: so that many deletions of large segments are needed before a recount.
KEEP = 256


def committed_length(seg: Segment) -> int:
    """The segment's committed length, without warming a cold one (decodes its record)."""
    data = seg.cold_record()
    return seg.length if data is None else SegmentRecord.FromString(data).length


class LargestSegments:
    """The KEEP longest segments (exact) and a bound on the length of all others."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        #: Segment id -> its length (exact) for the longest ones.
        self.members: dict[int, int] = {}
        #: (length, id) of the members, with stale entries (a member that went, or
        #: grew: lengths only grow, so its entry is a lower bound): the shortest
        #: member is found without a pass (`_shortest`).
        self._heap: list[tuple[int, int]] = []
        #: No live segment outside `members` is longer than this.
        self.bound = 0
        #: While a recount runs: the longest length turned away or evicted since
        #: it began (what it may have read shorter).
        self._since: int | None = None
        #: Recounts finished.
        self.recounts = 0

    def grew(self, seg_id: int, length: int) -> None:
        """The segment is ``length`` bytes long now (it grew, or was loaded)."""
        members = self.members
        if seg_id in members:
            members[seg_id] = length  # its heap entry is now too short: `_shortest` fixes it
            return
        if len(members) < self.keep:
            members[seg_id] = length
            self._push(length, seg_id)
            return
        if length <= self.bound:
            # Stays outside: the bound still holds (but a recount may have read it shorter).
            if self._since is not None and length > self._since:
                self._since = length
            return
        shortest, shortest_id = self._shortest()
        if length > shortest:
            del members[shortest_id]
            members[seg_id] = length
            self._push(length, seg_id)
            self._outside(shortest)
        else:
            self._outside(length)

    def removed(self, seg_id: int) -> None:
        """The segment was deleted."""
        self.members.pop(seg_id, None)

    def reset(self) -> None:
        """Every segment is about to be loaded again (a checkpoint's snapshot)."""
        self.members.clear()
        self._heap.clear()
        self.bound = 0

    def top(self, n: int) -> tuple[list[tuple[int, int]], bool]:
        """The ``n`` longest as (id, length), longest first, and whether that is exact
        (else a recount is needed: segments outside may be longer than the last ones)."""
        ranked = sorted(self.members.items(), key=lambda m: m[1], reverse=True)[:n]
        exact = all(length >= self.bound for _, length in ranked) and (
            len(ranked) == n or self.bound == 0
        )
        return ranked, exact

    def begin_recount(self) -> Recount:
        """Start a pass over every segment (fed by the caller in slices)."""
        self._since = 0
        return Recount(self)

    def _outside(self, length: int) -> None:
        if length > self.bound:
            self.bound = length
        if self._since is not None and length > self._since:
            self._since = length

    def _push(self, length: int, seg_id: int) -> None:
        heapq.heappush(self._heap, (length, seg_id))
        if len(self._heap) > 4 * self.keep:
            self._heap = [(n, i) for i, n in self.members.items()]
            heapq.heapify(self._heap)

    def _shortest(self) -> tuple[int, int]:
        heap, members = self._heap, self.members
        while True:
            length, seg_id = heap[0]
            now = members.get(seg_id)
            if now == length:
                return length, seg_id
            if now is None:
                heapq.heappop(heap)  # no longer a member
            else:
                heapq.heapreplace(heap, (now, seg_id))  # it grew since


class Recount:
    """One pass over every segment that makes a `LargestSegments` exact again.

    Fed in slices (`feed`) while the node goes on: lengths that change
    meanwhile reach the tracker as usual, and `finish` merges what the pass
    read with them so that the bound holds for every segment (one read
    shorter than it is now either grew through `grew`, which kept it or
    raised the bound, or is read again at the end).
    """

    def __init__(self, tracker: LargestSegments) -> None:
        self.tracker = tracker
        #: The pass's longest (length, id), at most keep of them.
        self._heap: list[tuple[int, int]] = []
        #: The longest length the pass read and did not keep.
        self._dropped = 0
        self.seen = 0

    def feed(self, segments: Iterable[Segment]) -> None:
        """Read these segments' lengths (cold ones without warming them)."""
        heap, keep = self._heap, self.tracker.keep
        for seg in segments:
            if not seg.durable or seg.txn_parent:
                continue
            self.seen += 1
            item = (committed_length(seg), seg.id)
            if len(heap) < keep:
                heapq.heappush(heap, item)
            else:
                out = heapq.heappushpop(heap, item)
                self._dropped = max(self._dropped, out[0])

    def finish(self, lookup: Callable[[int], Segment | None]) -> None:
        """Install the result (``lookup``: the live segment with an id, or None)."""
        t = self.tracker
        lengths = dict(t.members)
        for _, seg_id in self._heap:
            seg = lookup(seg_id)
            if seg is not None and seg_id not in lengths:
                lengths[seg_id] = committed_length(seg)
        ranked = sorted(lengths.items(), key=lambda m: m[1], reverse=True)
        t.members = dict(ranked[: t.keep])
        t._heap = [(n, i) for i, n in t.members.items()]
        heapq.heapify(t._heap)
        left_out = ranked[t.keep][1] if len(ranked) > t.keep else 0
        t.bound = max(self._dropped, left_out, t._since or 0)
        t._since = None
        t.recounts += 1
