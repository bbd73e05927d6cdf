"""What a node reads from Tier 2 is checked field by field before it is used.

Records other processes write into the shared bucket -- node records,
name claims, epoch fences, metadata snapshots, chunk user metadata -- may
be malformed (a hand edit, a bug, a future version), old, or written by a
process that has since been fenced. A reader takes each through a
validator that either returns a typed value or raises `BadRecord` saying
which field is wrong; the caller skips the record and tells `Rejections`,
which logs it once per version of the object (not at every poll) and
counts it for the metrics. Nothing read from Tier 2 may stop a node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Largest integer a record field may hold (what protobuf's int64 holds).
MAX_INT = (1 << 63) - 1


class BadRecord(ValueError):
    """A record read from Tier 2 that this version cannot use (the message says why)."""


def want_int(doc: Mapping[str, Any], key: str, *, low: int = 0, high: int = MAX_INT) -> int:
    """``doc[key]`` as an int within [low, high] (bools and floats are refused)."""
    if key not in doc:
        raise BadRecord(f"field {key!r} is missing")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecord(f"field {key!r} is {type(value).__name__} {_short(value)}, not an integer")
    if not low <= value <= high:
        raise BadRecord(f"field {key!r} is {value}, outside {low}..{high}")
    return value


def want_str(
    doc: Mapping[str, Any], key: str, *, default: str | None = None, max_len: int = 4096
) -> str:
    """``doc[key]`` as a string of at most ``max_len`` characters (``default`` if absent)."""
    if key not in doc:
        if default is None:
            raise BadRecord(f"field {key!r} is missing")
        return default
    value = doc[key]
    if not isinstance(value, str):
        raise BadRecord(f"field {key!r} is {type(value).__name__} {_short(value)}, not a string")
    if len(value) > max_len:
        raise BadRecord(f"field {key!r} is longer than {max_len} characters")
    return value


def decimal(text: str, what: str, *, low: int = 0, high: int = MAX_INT) -> int:
    """A decimal number from object metadata or a key, within [low, high]."""
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise BadRecord(f"{what} {_short(text)} is not a decimal number")
    value = int(text)
    if not low <= value <= high:
        raise BadRecord(f"{what} {value} is outside {low}..{high}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Rejections:
    """Records skipped as unusable: each reported once per version, and counted.

    ``version`` is whatever tells one state of an object from the next (its
    size and modification time, an ETag, a hash): the same bad object read
    at every poll is logged once, a changed one again.
    """

    #: Objects rejected so far, by kind ("node record", "snapshot", ...).
    total: dict[str, int] = field(default_factory=dict)
    #: What is bad right now: (kind, key) -> (version, reason).
    current: dict[tuple[str, str], tuple[object, str]] = field(default_factory=dict)

    def reject(self, kind: str, key: str, reason: str, version: object = None) -> None:
        """``key`` of ``kind`` is unusable because of ``reason``; log it if new."""
        seen = self.current.get((kind, key))
        if seen is not None and seen[0] == version:
            return
        self.current[(kind, key)] = (version, reason)
        self.total[kind] = self.total.get(kind, 0) + 1
        log.warning("tier2: skipping %s %s: %s", kind, key, reason)

    def accept(self, kind: str, key: str) -> None:
        """``key`` is usable (again): a later problem with it is news."""
        if self.current.pop((kind, key), None) is not None:
            log.info("tier2: %s %s is usable again", kind, key)

    def forget_missing(self, kind: str, present: set[str]) -> None:
        """Objects of ``kind`` no longer in Tier 2 are no longer bad."""
        for k in [k for k in self.current if k[0] == kind and k[1] not in present]:
            del self.current[k]

    def bad_now(self) -> dict[str, int]:
        """How many objects of each kind are unusable right now."""
        out: dict[str, int] = {}
        for kind, _ in self.current:
            out[kind] = out.get(kind, 0) + 1
        return out
