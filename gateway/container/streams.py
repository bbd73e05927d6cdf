"""Streams: a directory of segments that rolls and expires (DESIGN.md, "Streams over time").

A stream ``clicks`` holds the segments ``clicks/000000000001``,
``clicks/000000000002``, ...: twelve zero-padded digits, so names sort in
creation order, and a number is never given twice (the stream record keeps
the next one, also across retention). The last segment, unless sealed, is
the stream's *current* segment: appends to the stream go there. Rolling
seals it and the next append starts its successor.

This module holds the stream's metadata and the pure decisions over it --
which policy applies, when a segment is due to roll, what retention
removes; the segment container (`gateway.container.container`) journals and
applies them, and a transaction segment's names live here too.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gateway.config import StreamsConfig
from gateway.container.segment import Segment
from gateway.protocol.codec import Codec
from gateway.protocol.metadata_pb2 import StreamRecord

#: Digits of a stream segment's number.
NUMBER_DIGITS = 12
#: Transactions are segments below this directory: hidden from listings and
#: the mount, and no client may create a segment there.
TXN_DIR = ".txn"


def segment_name(stream: str, number: int) -> str:
    """The name of a stream's segment ``number``."""
    return f"{stream}/{number:0{NUMBER_DIGITS}d}"


def split_member(name: str) -> tuple[str, int] | None:
    """``(stream, number)`` if ``name`` has the shape of a stream segment's name."""
    parent, _, last = name.rpartition("/")
    if parent and len(last) == NUMBER_DIGITS and last.isdigit():
        return parent, int(last)
    return None


def _number(seg: Segment) -> int:
    member = split_member(seg.name)
    assert member is not None
    return member[1]


def is_hidden(name: str) -> bool:
    """Whether the segment is a transaction's (not listed, not in the mount)."""
    return name.startswith(TXN_DIR + "/")


@dataclass
class Policy:
    """A stream's effective policies; 0 turns one off."""

    roll_size: int
    roll_age_ms: int
    retain_size: int
    retain_age_ms: int


@dataclass
class Stream:
    """One stream: its record (policies, next number) and its segments, oldest first."""

    record: StreamRecord
    #: Segments of the stream, in number order, pending creates included.
    members: list[Segment] = field(default_factory=list)
    #: Whether its creation is durable.
    durable: bool = False
    #: Its deletion is submitted (pending view).
    p_deleted: bool = False
    #: The next number to give in the pending view (a refused create may skip one).
    p_next_number: int = 1

    @property
    def name(self) -> str:
        """The stream's name (its directory)."""
        return self.record.name

    @property
    def codec(self) -> Codec:
        """The codec its segments are created with (raw for streams from before codecs)."""
        return Codec.from_number(self.record.codec)

    def policy(self, defaults: StreamsConfig) -> Policy:
        """The stream's own policies, else the configured defaults."""
        r = self.record
        return Policy(
            roll_size=r.roll_size if r.HasField("roll_size") else defaults.roll_size,
            roll_age_ms=(
                r.roll_age_ms if r.HasField("roll_age_ms") else int(defaults.roll_age * 1000)
            ),
            retain_size=r.retain_size if r.HasField("retain_size") else defaults.retain_size,
            retain_age_ms=(
                r.retain_age_ms if r.HasField("retain_age_ms") else int(defaults.retain_age * 1000)
            ),
        )

    def add_member(self, seg: Segment, number: int) -> None:
        """A segment of the stream exists (kept in number order)."""
        if self.members and number < _number(self.members[-1]):
            numbers = [_number(m) for m in self.members]
            self.members.insert(bisect.bisect(numbers, number), seg)
        else:
            self.members.append(seg)  # the usual case: the newest
        self.p_next_number = max(self.p_next_number, number + 1)

    def pending_current(self) -> Segment | None:
        """The segment appends go to now (pending view), if there is one."""
        if self.members:
            last = self.members[-1]
            if not last.p_deleted and not last.p_sealed:
                return last
        return None

    def committed_members(self) -> list[Segment]:
        """The stream's committed segments, oldest first."""
        return [m for m in self.members if m.durable]


def roll_due_by_size(seg: Segment, policy: Policy) -> bool:
    """Whether the next append must go to a successor (the pending size reached the bound)."""
    return policy.roll_size > 0 and seg.p_length >= policy.roll_size


def roll_due_by_age(seg: Segment, policy: Policy, now_ms: int) -> bool:
    """Whether a current segment holding bytes has lived longer than the roll age."""
    return (
        policy.roll_age_ms > 0
        and seg.p_length > seg.p_start_offset
        and now_ms - seg.created_at_ms >= policy.roll_age_ms
    )


@dataclass
class RetentionPlan:
    """What retention removes from one stream now."""

    delete: list[Segment] = field(default_factory=list)
    #: The oldest remaining segment and the offset to truncate it at, if any.
    truncate: tuple[Segment, int] | None = None
    #: Why data due to go stays: not in Tier 2 yet (and retention may not delete it).
    held_unflushed: int = 0


def plan_retention(
    members: list[Segment], policy: Policy, now_ms: int, allow_unflushed: bool
) -> RetentionPlan:
    """What to remove so that only the newest ``retain_size`` bytes and ``retain_age`` remain.

    Nothing newer than either bound goes: a sealed segment is deleted only
    when every byte after it still makes ``retain_size`` (or when it was
    last changed before ``now - retain_age``); the oldest remaining segment
    is truncated, at an event boundary, when it alone holds more than
    needed. Unless ``allow_unflushed``, bytes not yet in Tier 2 stay.
    """
    plan = RetentionPlan()
    if not policy.retain_size and not policy.retain_age_ms:
        return plan
    live = [m for m in members if m.durable and not m.p_deleted]
    # Every member's size only for a size bound: an age bound looks at the
    # oldest ones only (the others may be cold, and stay so).
    sizes = [m.length - m.start_offset for m in live] if policy.retain_size > 0 else []
    total = sum(sizes)
    k = 0
    while k < len(live) and live[k].sealed:
        seg = live[k]
        size = sizes[k] if sizes else seg.length - seg.start_offset
        by_size = policy.retain_size > 0 and total - size >= policy.retain_size
        by_age = policy.retain_age_ms > 0 and now_ms - seg.last_modified_ms >= policy.retain_age_ms
        if not (by_size or by_age):
            break
        if not allow_unflushed and seg.storage_length < seg.length:
            plan.held_unflushed += size
            break
        plan.delete.append(seg)
        total -= size
        k += 1
    if k < len(live) and policy.retain_size > 0 and total > policy.retain_size:
        seg = live[k]
        # Every byte of the later segments is kept, and this one's newest.
        keep_here = max(0, policy.retain_size - (total - sizes[k]))
        bound = seg.length - keep_here
        if not allow_unflushed:
            bound = min(bound, seg.storage_length)
        # Readers start at event boundaries: cut at the last indexed one.
        i = bisect.bisect_right(seg.event_index, bound) - 1
        if i >= 0 and seg.event_index[i] > seg.start_offset:
            plan.truncate = (seg, seg.event_index[i])
    return plan
