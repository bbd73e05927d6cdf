"""Event codecs: how a segment's bytes are cut into events (docs/FORMATS.md, "Event codecs").

A segment may declare its codec when it is created (the core attribute
`gateway.container.attributes.CODEC`); the gateway then knows where its
events end:

- ``raw`` (the default, and every segment created before codecs existed):
  every append is one or more whole events, so every append boundary is an
  event boundary and the length is one;
- ``lines``: each event ends with ``\\n``. Appends may cut a line (a raw
  append of a chunk of a log file); the gateway keeps the offset just past
  the last newline (core attribute ``EVENT_END``), and while the segment is
  active the mount shows it ending there, so no reader meets half a line;
- ``framed``: a 4-byte big-endian length, then the event. Every append must
  hold whole frames; one that does not is refused, so the length is always
  an event boundary.
"""

from __future__ import annotations

import enum
import struct

from gateway.buffers import Buffer

_LENGTH = struct.Struct(">I")


class Codec(enum.Enum):
    """How events are laid out in a segment's bytes."""

    RAW = "raw"
    LINES = "lines"
    FRAMED = "framed"

    @property
    def number(self) -> int:
        """The value stored in the CODEC attribute (and on the wire)."""
        return _NUMBERS[self]

    @classmethod
    def from_number(cls, number: int) -> Codec:
        """The codec a stored CODEC value names; raw for an unknown one."""
        return _BY_NUMBER.get(number, cls.RAW)


_NUMBERS = {Codec.RAW: 0, Codec.LINES: 1, Codec.FRAMED: 2}
_BY_NUMBER = {v: k for k, v in _NUMBERS.items()}


def lines_end(offset: int, data: Buffer, previous_end: int) -> int:
    """Where the last complete line ends after appending ``data`` at ``offset``."""
    view = memoryview(data)
    if len(view) and view[-1] == 10:  # a newline last, as writers send: no search at all
        return offset + len(view)
    k = (data if isinstance(data, bytes | bytearray) else view.tobytes()).rfind(b"\n")
    return offset + k + 1 if k >= 0 else previous_end


def whole_frames(data: Buffer) -> str:
    """Why ``data`` is not a run of whole frames ("" when it is).

    A Python step per frame: about 0.2 us, so 64 KiB of 100-byte events
    costs ~0.1 ms (docs/PERFORMANCE.md measures it in the framed ingest).
    """
    view = memoryview(data)
    n = len(view)
    pos = 0
    unpack = _LENGTH.unpack_from
    while pos + 4 <= n:
        pos += 4 + unpack(view, pos)[0]
    if pos == n:
        return ""
    if pos < n:
        return f"{n - pos} byte(s) at {pos} are not a whole 4-byte length"
    return f"the event at the end needs {pos - n} more byte(s)"
