"""What container operations return: a leaf module the client library shares.

Nothing here imports the journal, the cache or RocksDB, so a writer process
or a Spark executor that only talks to a daemon loads none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gateway.protocol import wire_pb2 as wire


@dataclass(frozen=True)
class SegmentInfo:
    """A segment's committed metadata, as ``stat`` and the protocol show it."""

    name: str
    id: int
    start_offset: int
    length: int
    storage_length: int
    sealed: bool
    sealed_in_storage: bool
    created_at_ms: int
    last_modified_ms: int
    event_count: int
    attribute_count: int
    chunk_count: int

    def to_wire(self) -> wire.SegmentInfo:
        """As the protocol's SegmentInfo message (the same fields, by name)."""
        return wire.SegmentInfo(**{name: getattr(self, name) for name in _INFO_FIELDS})

    @classmethod
    def from_wire(cls, m: wire.SegmentInfo) -> SegmentInfo:
        """From the protocol's SegmentInfo message."""
        return cls(**{name: getattr(m, name) for name in _INFO_FIELDS})


#: The fields of SegmentInfo, which wire.proto's SegmentInfo has too, by the
#: same names (tests/test_proto.py keeps the two in step).
_INFO_FIELDS = tuple(f.name for f in fields(SegmentInfo))


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed."""

    offset: int
    length: int


@dataclass(frozen=True)
class ReadResult:
    """Bytes read from a segment, and its committed state when they were read."""

    offset: int
    data: bytes
    length: int
    start_offset: int
    sealed: bool

    @property
    def end_of_segment(self) -> bool:
        """Sealed and read to the end: no byte will ever follow."""
        return self.sealed and self.offset + len(self.data) >= self.length
