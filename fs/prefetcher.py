"""Per-handle sequential prefetching for the mount.

Every open handle keeps its own `gateway.read.readahead.ReadAhead` (the one
read-ahead policy, Mountpoint-s3's doubling window up to ``tier2.read_ahead``
MiB) and hands the ranges it asks for to `ChunkReader.prefetch`, which turns
them into parallel ranged GETs and bounds all handles' read-ahead together
(``fuse.prefetch_memory``). Only bytes in Tier 2 are prefetched; bytes still
in the cache need no help.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.index import SegmentView
from gateway.read.readahead import INITIAL_WINDOW, ReadAhead

__all__ = ["INITIAL_WINDOW", "Prefetcher"]


class Fetcher(Protocol):
    """What fetches a range ahead of a reader (`ChunkReader.prefetch`, via the source)."""

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        """Fetch ``[start, stop)`` in the background; the blocks scheduled."""


class Prefetcher:
    """Read-ahead of one open file."""

    __slots__ = ("policy", "reader")

    def __init__(self, reader: Fetcher | None, max_window: int) -> None:
        self.reader = reader
        self.policy = ReadAhead(max_window)

    @property
    def window(self) -> int:
        """The current window (0 while the reader is not sequential)."""
        return self.policy.window

    @property
    def ahead_until(self) -> int:
        """Up to where read-ahead has been scheduled."""
        return self.policy.ahead_until

    def on_read(self, seg: SegmentView, offset: int, size: int) -> int:
        """Note a read of ``[offset, offset+size)`` and schedule read-ahead (returns blocks)."""
        ahead = self.policy.on_read(offset, size)
        if ahead is None or self.reader is None or ahead[0] >= seg.storage_length:
            return 0
        start, stop = ahead
        return self.reader.prefetch(seg.chunks, start, min(stop, seg.storage_length))
