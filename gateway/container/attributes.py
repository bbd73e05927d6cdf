"""Segment attributes: 16-byte ids with int64 values, and the update verbs.

After Pravega's segment attributes: Replace, ReplaceIfGreater,
ReplaceIfEquals (compare-and-set; with ``expect_absent``, "only if absent"),
Accumulate and Remove. Ids whose first 15 bytes are zero are *core*
attributes kept by the gateway itself (always in memory); clients may read
them but not set them. All other ids are *extended* attributes: they live in
the segment's attribute index (`gateway.attrindex`) and memory holds only
those recently used or not yet indexed. In memory, an extended id mapped to
``None`` is known to have no value (removed, or looked up and absent).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import BadAttributeUpdate, ConditionalCheckFailed, Overloaded

ID_BYTES = 16
_CORE_PREFIX = bytes(15)
#: Core attribute: events appended (an append counts its event_count, or 1).
EVENT_COUNT = _CORE_PREFIX + b"\x01"
#: Core attribute: the segment's event codec (`gateway.protocol.codec.Codec.number`),
#: set when it is created; absent means raw.
CODEC = _CORE_PREFIX + b"\x02"
#: Core attribute of a ``lines`` segment: the offset just past its last
#: newline (the end of its last complete event). Absent means 0.
EVENT_END = _CORE_PREFIX + b"\x03"
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class Verb(enum.IntEnum):
    """How an update combines with the current value (wire.proto AttributeVerb)."""

    REPLACE = 0
    REPLACE_IF_GREATER = 1
    REPLACE_IF_EQUALS = 2
    ACCUMULATE = 3
    REMOVE = 4


@dataclass(frozen=True, slots=True)
class AttributeUpdate:
    """One requested change to an attribute."""

    id: bytes
    verb: Verb
    value: int
    compare_value: int = 0
    expect_absent: bool = False


class _VerbAndValue(Protocol):
    @property
    def verb(self) -> int: ...
    @property
    def value(self) -> int: ...


def closes_writers(updates: Iterable[_VerbAndValue]) -> bool:
    """Whether ``updates`` only close exactly-once writers (`gateway.client.writer.close_writer`).

    A closed writer's event number is negative, set by compare-and-set. Such
    an update is tiny and keeps appends from landing late, so it may use the
    journal's reserve while the disk is full (like a deletion). ``updates``
    may be `AttributeUpdate`s or a request's wire updates as they came (the
    verbs are the same numbers), so the server decides admission without
    decoding them first.
    """
    found = False
    for u in updates:
        if u.verb != Verb.REPLACE_IF_EQUALS or u.value >= 0:
            return False
        found = True
    return found


class AttributesNotLoaded(Overloaded):
    """attributes of {} are not in memory yet"""

    # Raised by a prepare that needs extended attribute values which only
    # the attribute index has: the caller loads them
    # (`SegmentContainer.load_attributes`) and prepares again. Never meant to
    # reach a client; if it did, it is Overloaded (retried).

    def __init__(self, segment: str, ids: list[bytes]) -> None:
        super().__init__(segment)
        self.segment = segment
        self.ids = ids


def is_core(attribute_id: bytes) -> bool:
    """Whether the id belongs to the gateway's core attributes."""
    return attribute_id[:15] == _CORE_PREFIX


def check_id(segment: str, attribute_id: bytes, client: bool = True) -> None:
    """Raise BadAttributeUpdate unless ``attribute_id`` is a usable id."""
    if len(attribute_id) != ID_BYTES:
        raise BadAttributeUpdate(
            segment, f"attribute id must be {ID_BYTES} bytes, got {len(attribute_id)}"
        )
    if client and is_core(attribute_id):
        raise BadAttributeUpdate(
            segment, f"attribute {attribute_id.hex()} is a core attribute kept by the gateway"
        )


def resolve(
    segment: str,
    current: Mapping[bytes, int | None],
    updates: Iterable[AttributeUpdate],
    into: dict[bytes, int | None],
) -> None:
    """Check ``updates`` against ``current`` (and earlier updates in ``into``).

    Adds the resulting values to ``into``. Raises ConditionalCheckFailed when
    a condition does not hold, BadAttributeUpdate for an invalid update; in
    both cases nothing is changed for the caller, who applies ``into`` only
    on success. A removal puts ``None`` into ``into``.
    """
    for u in updates:
        check_id(segment, u.id)
        if not INT64_MIN <= u.value <= INT64_MAX:
            raise BadAttributeUpdate(segment, f"value {u.value} is not a signed 64-bit integer")
        old = into[u.id] if u.id in into else current.get(u.id)
        new: int | None
        if u.verb == Verb.REMOVE:
            new = None
        elif u.verb == Verb.REPLACE:
            new = u.value
        elif u.verb == Verb.REPLACE_IF_GREATER:
            if old is not None and u.value <= old:
                raise ConditionalCheckFailed(
                    segment, f"attribute {u.id.hex()} is {old}, not less than {u.value}"
                )
            new = u.value
        elif u.verb == Verb.REPLACE_IF_EQUALS:
            if u.expect_absent:
                if old is not None:
                    raise ConditionalCheckFailed(
                        segment, f"attribute {u.id.hex()} is {old}, expected no value"
                    )
            elif old != u.compare_value:
                shown = "no value" if old is None else old
                raise ConditionalCheckFailed(
                    segment, f"attribute {u.id.hex()} is {shown}, expected {u.compare_value}"
                )
            new = u.value
        elif u.verb == Verb.ACCUMULATE:
            new = (old or 0) + u.value
            if not INT64_MIN <= new <= INT64_MAX:
                raise BadAttributeUpdate(segment, f"attribute {u.id.hex()} would overflow int64")
        else:  # pragma: no cover - Verb is closed
            raise BadAttributeUpdate(segment, f"unknown verb {u.verb}")
        into[u.id] = new


def needs_current(updates: Iterable[AttributeUpdate]) -> list[bytes]:
    """Extended ids whose current value the updates depend on (all but Replace/Remove)."""
    return [
        u.id
        for u in updates
        if u.verb not in (Verb.REPLACE, Verb.REMOVE) and len(u.id) == ID_BYTES and not is_core(u.id)
    ]
