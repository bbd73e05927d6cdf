"""What container operations return: a leaf module the client library shares.

Nothing here imports the journal, the cache or RocksDB, so a writer process
or a Spark executor that only talks to a daemon loads none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gateway.protocol import wire_pb2 as wire
from gateway.protocol.codec import Codec


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
    #: The segment the bytes went to (a stream's current segment for a stream).
    segment: str = ""


#: A stream's policies, as StreamRecord / StreamPolicy / StreamInfo field names.
POLICY_FIELDS = ("roll_size", "roll_age_ms", "retain_size", "retain_age_ms")


@dataclass(frozen=True)
class StreamInfo:
    """A stream's effective policies (0: off), its own settings and its segments."""

    name: str
    created_at_ms: int
    roll_size: int
    roll_age_ms: int
    retain_size: int
    retain_age_ms: int
    #: The policies the stream sets itself; the others follow ``[streams]``.
    own: dict[str, int]
    #: Oldest first.
    segments: list[SegmentInfo]
    next_number: int
    #: The codec its segments are created with (raw, lines, framed); fixed at create.
    codec: str = "raw"

    def to_wire(self) -> wire.StreamInfo:
        """As the protocol's StreamInfo message."""
        return wire.StreamInfo(
            name=self.name,
            created_at_ms=self.created_at_ms,
            roll_size=self.roll_size,
            roll_age_ms=self.roll_age_ms,
            retain_size=self.retain_size,
            retain_age_ms=self.retain_age_ms,
            own=wire.StreamPolicy(**self.own),  # type: ignore[arg-type]
            segments=[s.to_wire() for s in self.segments],
            next_number=self.next_number,
            codec=Codec(self.codec).number,  # type: ignore[arg-type]
        )

    @classmethod
    def from_wire(cls, m: wire.StreamInfo) -> StreamInfo:
        """From the protocol's StreamInfo message."""
        own = {f: getattr(m.own, f) for f in POLICY_FIELDS if m.own.HasField(f)}
        return cls(
            name=m.name,
            created_at_ms=m.created_at_ms,
            roll_size=m.roll_size,
            roll_age_ms=m.roll_age_ms,
            retain_size=m.retain_size,
            retain_age_ms=m.retain_age_ms,
            own=own,
            segments=[SegmentInfo.from_wire(s) for s in m.segments],
            next_number=m.next_number,
            codec=Codec.from_number(m.codec).value,
        )


@dataclass(frozen=True)
class TransactionInfo:
    """A transaction: its name and parent; after commit, where its bytes landed."""

    name: str
    parent: str
    segment: str = ""
    offset: int = 0
    length: int = 0
    deadline_ms: int = 0

    def to_wire(self) -> wire.TransactionInfo:
        """As the protocol's TransactionInfo message (the same fields)."""
        return wire.TransactionInfo(**self.__dict__)

    @classmethod
    def from_wire(cls, m: wire.TransactionInfo) -> TransactionInfo:
        """From the protocol's TransactionInfo message."""
        return cls(m.name, m.parent, m.segment, m.offset, m.length, m.deadline_ms)


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
