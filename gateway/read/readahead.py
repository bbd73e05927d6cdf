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
and the mount's (per open file, `fs.prefetcher.Prefetcher`). The mount starts
small because the kernel already reads ahead and many opens read a few
pages, and it refills a window once half of it is used; protocol readers
start at the full window and top it up after every read, as they always did
(measured: the mount's way cost them 8-13% on 256 MiB scans with small
windows or small reads). The policy only
says which range to fetch; `ChunkReader.prefetch` fetches it, in parallel
GETs under one memory budget.
"""

from __future__ import annotations

#: Mountpoint-s3's first window: one MiB plus one maximal FUSE request.
INITIAL_WINDOW = 1024 * 1024 + 128 * 1024


class ReadAhead:
    """The read-ahead state of one reader."""

    __slots__ = ("ahead_until", "initial_window", "max_window", "next_offset", "top_up", "window")

    def __init__(
        self, max_window: int, initial_window: int = INITIAL_WINDOW, top_up: bool = False
    ) -> None:
        self.max_window = max_window
        #: The first window of a sequential run (then doubled up to the maximum).
        self.initial_window = min(initial_window, max_window)
        #: Keep the whole window ahead after every read, instead of refilling
        #: once half of it is used (fewer, larger prefetches: the mount's way).
        self.top_up = top_up
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
        if self.window and self.ahead_until - end >= (
            self.window if self.top_up else self.window // 2
        ):
            return None  # enough of the window is still ahead of the reader
        self.window = min(self.window * 2 if self.window else self.initial_window, self.max_window)
        if self.window <= 0:
            return None
        start = max(end, self.ahead_until)
        stop = end + self.window
        self.ahead_until = stop
        return start, stop
