"""The one sequential read-ahead policy (Mountpoint-s3's doubling window).

A reader's bytes arrive in requests far smaller than a good ranged GET
(FUSE: at most 128 KiB-1 MiB); fetching each when it is asked for would cap
a reader at one small GET at a time. So a reader is watched: while its reads
continue one another it keeps a *window* of bytes fetched ahead of it,
starting at 1 MiB + 128 KiB and doubling each time it has used half of it,
up to a maximum. A read that does not continue the previous one (a seek)
resets the window: random readers fetch only what they touch. The first read
at offset 0 counts as sequential: it is how ``cat``, ``dd`` and Spark start a
scan.

Both read paths use it: the protocol's (per segment, in `ChunkReader.read`)
and the mount's (per open file, `fs.prefetcher.Prefetcher`). The policy only
says which range to fetch; `ChunkReader.prefetch` fetches it, in parallel
GETs under one memory budget.
"""

from __future__ import annotations

#: Mountpoint-s3's first window: one MiB plus one maximal FUSE request.
INITIAL_WINDOW = 1024 * 1024 + 128 * 1024


class ReadAhead:
    """The read-ahead state of one reader."""

    __slots__ = ("ahead_until", "max_window", "next_offset", "window")

    def __init__(self, max_window: int) -> None:
        self.max_window = max_window
        #: Where the next read must start to count as sequential (-1: no read yet).
        self.next_offset = -1
        #: The current window (0 while the reader is not sequential).
        self.window = 0
        #: Up to where read-ahead has been scheduled.
        self.ahead_until = 0

    def on_read(self, offset: int, size: int) -> tuple[int, int] | None:
        """Note a read of ``[offset, offset+size)``; the range to fetch ahead now, if any."""
        end = offset + size
        sequential = offset == self.next_offset or (self.next_offset == -1 and offset == 0)
        self.next_offset = end
        if not sequential:
            self.window = 0
            self.ahead_until = end
            return None
        if self.window and self.ahead_until - end >= self.window // 2:
            return None  # more than half the window is still ahead of the reader
        self.window = min(INITIAL_WINDOW if not self.window else self.window * 2, self.max_window)
        if self.window <= 0:
            return None
        start = max(end, self.ahead_until)
        stop = end + self.window
        self.ahead_until = stop
        return start, stop
