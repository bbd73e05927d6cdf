"""What container operations return: a leaf module the client library shares.

Nothing here imports the journal, the cache or RocksDB, so a writer process
or a Spark executor that only talks to a daemon loads none of them.
"""

from __future__ import annotations

from dataclasses import dataclass


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
