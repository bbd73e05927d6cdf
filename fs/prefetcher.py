"""Per-handle sequential prefetching for the mount (Mountpoint-s3's scheme).

The kernel hands a reader's bytes over in requests of at most 128 KiB-1 MiB;
fetching each from S3 when it arrives would cap a reader at one small GET
at a time. So every open handle watches its own reads: while they continue
one another, it keeps a *window* of bytes fetched ahead of the reader,
starting at 1 MiB + 128 KiB and doubling each time the reader has used half
of it, up to ``tier2.read_ahead`` MiB. The `ChunkReader` turns a window into
parallel ranged GETs of up to 8 MiB and bounds all handles' read-ahead
together (``fuse.prefetch_memory``).

A read that does not continue the previous one (a seek) resets the window:
random readers fetch only the blocks they touch. Only bytes in Tier 2 are
prefetched; bytes still in the cache need no help.
"""

from __future__ import annotations

from gateway.readindex import SegmentView
from gateway.tier2.reader import ChunkReader

#: Mountpoint-s3's first window: one MiB plus one maximal FUSE request.
INITIAL_WINDOW = 1024 * 1024 + 128 * 1024


class Prefetcher:
    """Read-ahead state of one open file."""

    __slots__ = ("ahead_until", "max_window", "next_offset", "reader", "window")

    def __init__(self, reader: ChunkReader | None, max_window: int) -> None:
        self.reader = reader
        self.max_window = max_window
        #: Where the next read must start to count as sequential (-1: no read yet).
        self.next_offset = -1
        #: The current window (0 while the reader is not sequential).
        self.window = 0
        #: Up to where read-ahead has been scheduled.
        self.ahead_until = 0

    def on_read(self, seg: SegmentView, offset: int, size: int) -> int:
        """Note a read of ``[offset, offset+size)`` and schedule read-ahead (returns blocks)."""
        end = offset + size
        # The first read of a handle at offset 0 is how `cat`, `dd` and
        # Spark start a scan: treat it as sequential, as Mountpoint does.
        sequential = offset == self.next_offset or (self.next_offset == -1 and offset == 0)
        self.next_offset = end
        if not sequential:
            self.window = 0
            self.ahead_until = end
            return 0
        if self.window and self.ahead_until - end >= self.window // 2:
            return 0  # more than half the window is still ahead of the reader
        self.window = min(INITIAL_WINDOW if not self.window else self.window * 2, self.max_window)
        if self.window <= 0:
            return 0
        start = max(end, self.ahead_until)
        stop = end + self.window
        self.ahead_until = stop
        if self.reader is None or start >= seg.storage_length:
            return 0
        return self.reader.prefetch(seg.chunks, start, min(stop, seg.storage_length))
