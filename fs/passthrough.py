"""FUSE passthrough: the kernel reads sealed segments from local files, not the daemon.

When INIT granted passthrough, an open of a sealed segment (the plain view,
where byte N of the file is byte N of the segment) whose segment file
(`cache.segment_files`) exists hands the kernel that file as the open's
backing file: every read then goes from the kernel to the local file, with
its page cache and read-ahead, and the daemon sees none.

A sealed segment gets its file once the daemon has served reads covering
its whole length (`served` counts the bytes per segment; the file is then
made in the background, a few at a time, through the same read path, once
the daemon has served no read for `QUIET` seconds, so a query's other
segments are not read more slowly for it). By
then its bytes are normally in the RocksDB cache, so the copy costs no S3
GET, and a reader that wants a few bytes of a large segment (``head``, a
Spark task reading one split) never pays for a copy of all of it. Bytes
are counted, not ranges: overlapping reads (split boundaries, the page
cache dropped between two readers) may ask a little early, and the copy
then fetches what the cache lacks.

The kernel keeps one io mode per inode while files are open on it: pages
cached by the daemon's reads (``keep_cache`` opens), or passthrough with one
backing file; an open that would mix them fails with EIO. So this module
counts, per inode, the opens of each mode: passthrough only when no cached
open is held, one backing id per inode shared by its passthrough opens
(dropped at the last release), and an open that cannot join the inode's
mode (the file was truncated under a passthrough reader, say) gets direct
I/O, which belongs to neither. Direct I/O opens (active segments, O_DIRECT)
count for nothing.

Anything the kernel or the process cannot do -- no CAP_SYS_ADMIN (EPERM),
a stacked file system under the data directory (ELOOP) -- turns passthrough
off for the rest of the mount, logged once; the mount then works as without.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import math
import os
import pathlib
from collections.abc import Callable

import trio

from fs.segment_source import SegmentFileKey, SegmentFiles, SegmentSource, file_key
from fs.vfs import Opened
from gateway.buffers import Buffer
from gateway.container.segment import Segment

log = logging.getLogger(__name__)

#: Segment files made at once in the background.
MAKERS = 2
#: Segments whose served bytes are counted at once (`Passthrough.served`).
COUNTED = 4096
#: A file is made once the daemon has served no read for this long: the copy
#: (the segment read from the cache, written, synced) waits for a query to
#: finish instead of taking CPU and disk from the reads of its other segments.
QUIET = 1.0
#: ... or this long after it was asked for, when reads never stop.
MAX_DEFER = 30.0


@dataclasses.dataclass(slots=True)
class _Inode:
    """The opens the kernel holds on one inode, by io mode."""

    cached: int = 0
    passthrough: int = 0
    backing_id: int = 0
    key: SegmentFileKey | None = None


class Passthrough:
    """Which opens get a backing file, and the background making of segment files."""

    def __init__(
        self,
        source: SegmentSource,
        files: SegmentFiles,
        backing_open: Callable[[int], int],
        backing_close: Callable[[int], None],
    ) -> None:
        self.source = source
        self.files = files
        self._backing_open = backing_open
        self._backing_close = backing_close
        #: False once the kernel refused a backing file (or INIT did not grant it).
        self.active = False
        self._inodes: dict[int, _Inode] = {}
        #: Open handle -> (inode, "passthrough" | "cached").
        self._handles: dict[int, tuple[int, str]] = {}
        self._wanted: set[SegmentFileKey] = set()
        self._send, self._receive = trio.open_memory_channel[SegmentFileKey](math.inf)
        #: Cached open handle -> the file its reads count toward (no file yet).
        self._counting: dict[int, SegmentFileKey] = {}
        #: Segment id -> (its file, bytes of it the daemon has served so far, all
        #: opens), the most recently read last; at most `COUNTED` segments (a
        #: count dropped only delays a file), so segments read in part over
        #: months take no memory, and dropping one is O(1).
        self._served: collections.OrderedDict[int, tuple[SegmentFileKey, int]] = (
            collections.OrderedDict()
        )
        self.opens = 0
        self._last_read = -math.inf
        #: Segment files asked for (a sealed segment served in full).
        self.requested = 0

    def open(self, inode: int, seg: Segment | None, opened: Opened) -> Opened:
        """How the kernel should serve this open (``opened``: the daemon's answer).

        ``seg`` is the segment when ``inode`` is its plain-view file, else None.
        """
        state = self._inodes.setdefault(inode, _Inode())
        if state.passthrough:
            # The kernel refuses (EIO) any other kind of open of an inode held
            # in passthrough, direct I/O included: every open joins it. Its
            # file follows truncations (`on_truncated`); a deleted segment
            # has no name left to open.
            return self._passthrough(opened.fh, inode, state)
        key = file_key(seg) if seg is not None and self.active else None
        path = None
        if key is not None and not opened.direct_io:
            path = self.files.path(key)
        if path is not None and not state.cached:
            backing_id = self._open_backing(path)
            if backing_id:
                state.backing_id, state.key = backing_id, key
                return self._passthrough(opened.fh, inode, state)
        if not opened.direct_io:
            state.cached += 1
            self._handles[opened.fh] = (inode, "cached")
            if key is not None and path is None and self.files.fits(key):
                self._counting[opened.fh] = key
        self._forget_if_unused(inode, state)
        return opened

    def release(self, fh: int) -> None:
        """An open handle is gone: the inode's backing id goes with its last passthrough open."""
        found = self._handles.pop(fh, None)
        if found is None:
            return
        self._counting.pop(fh, None)
        inode, mode = found
        state = self._inodes[inode]
        if mode == "cached":
            state.cached -= 1
        else:
            state.passthrough -= 1
            if state.passthrough == 0:
                try:
                    self._backing_close(state.backing_id)
                except OSError as e:
                    log.warning("passthrough: closing backing id %d: %s", state.backing_id, e)
                state.backing_id, state.key = 0, None
        self._forget_if_unused(inode, state)

    def current(self, key: SegmentFileKey) -> bool:
        """Whether ``key`` is still what its segment's file must hold (not truncated,
        deleted or replaced since)."""
        seg = self.source.segment_by_id(key.segment_id)
        return seg is not None and file_key(seg) == key

    def served(self, fh: int, offset: int, size: int) -> None:
        """The daemon answered a read of ``size`` bytes at ``offset`` on handle ``fh``.

        Called for every read the daemon serves, so it does one dict lookup
        for handles that count toward nothing. Bytes below the start offset
        (zeros) do not count. Once a segment's count reaches its length the
        file is asked for.
        """
        self._last_read = trio.current_time()
        key = self._counting.get(fh)
        if key is None:
            return
        n = min(offset + size, key.length) - max(offset, key.start_offset)
        if n <= 0:
            return
        entry = self._served.get(key.segment_id)
        total = (entry[1] if entry is not None and entry[0] == key else 0) + n
        if total < key.length - key.start_offset:
            self._served[key.segment_id] = (key, total)
            self._served.move_to_end(key.segment_id)
            if len(self._served) > COUNTED:
                self._served.popitem(last=False)
            return
        self._served.pop(key.segment_id, None)
        del self._counting[fh]
        # Other handles of the segment may still count: they find it asked
        # for or made.
        if key not in self._wanted and key not in self.files:
            self._wanted.add(key)
            self.requested += 1
            self._send.send_nowait(key)

    async def run(self) -> None:
        """Make the segment files opens asked for, `MAKERS` at a time, until cancelled."""
        limiter = trio.CapacityLimiter(MAKERS)
        async with trio.open_nursery() as nursery:
            async for key in self._receive:
                await limiter.acquire_on_behalf_of(key)
                nursery.start_soon(self._make, key, limiter)

    def statistics(self) -> dict[str, int]:
        """Passthrough opens so far, backing ids held, files asked for, the segment files."""
        files = {f"segment_files_{k}": v for k, v in self.files.statistics().items()}
        held = sum(1 for s in self._inodes.values() if s.passthrough)
        return {
            "passthrough_opens": self.opens,
            "backing_ids": held,
            "segment_files_requested": self.requested,
            **files,
        }

    # -- NamespaceWatcher: a truncated or deleted segment's file goes -------------------

    def on_created(self, seg: Segment) -> None:
        """Nothing: files are made once a segment was served in full."""

    def on_sealed(self, seg: Segment) -> None:
        """Nothing: files are made once a segment was served in full."""

    def on_truncated(self, seg: Segment) -> None:
        """Bytes below the new start read as zeros: in the segment's file too.

        Punched in place (`SegmentFiles.truncate`), so readers holding it,
        and new opens that must share its backing file, see the zeros.
        """
        self._stop_counting(seg.id)  # what was served counts for the old bytes
        key = file_key(seg)
        if key is None:
            self.files.discard(seg.id)
        elif self.files.truncate(key):
            for state in self._inodes.values():
                if state.key is not None and state.key.segment_id == seg.id:
                    state.key = key

    def on_deleted(self, seg: Segment) -> None:
        """Unlink the segment's file (and forget what was served of it)."""
        self._stop_counting(seg.id)
        self.files.discard(seg.id)

    def on_stream_created(self, name: str) -> None:
        """Nothing to do."""

    def on_stream_deleted(self, name: str) -> None:
        """Nothing to do."""

    # -- inside ---------------------------------------------------------------------------

    def _passthrough(self, fh: int, inode: int, state: _Inode) -> Opened:
        state.passthrough += 1
        self._handles[fh] = (inode, "passthrough")
        self.opens += 1
        return Opened(fh, backing_id=state.backing_id)

    def _open_backing(self, path: pathlib.Path) -> int:
        """A backing id for ``path``, or 0 (then passthrough is off from now on)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0  # evicted or discarded a moment ago
        try:
            # The kernel holds its own reference to the file from here on.
            return self._backing_open(fd)
        except OSError as e:
            self.active = False
            why = {
                errno.EPERM: "the daemon lacks CAP_SYS_ADMIN",
                errno.ELOOP: "the data directory is on a stacked file system",
            }.get(e.errno or 0, "the kernel refused it")
            log.warning(
                "FUSE passthrough is off for this mount: a backing file for %s failed (%s: %s); "
                "the daemon serves every read",
                path,
                why,
                e.strerror,
            )
            return 0
        finally:
            os.close(fd)

    def _stop_counting(self, segment_id: int) -> None:
        """Forget the bytes served of the segment (it changed).

        Handles still open on it count toward their old file from zero; if
        they get there, `_make` finds the segment changed and makes nothing.
        """
        self._served.pop(segment_id, None)

    def _forget_if_unused(self, inode: int, state: _Inode) -> None:
        if not state.cached and not state.passthrough:
            self._inodes.pop(inode, None)

    async def _wait_quiet(self) -> None:
        """Until the daemon has served no read for `QUIET` seconds, or `MAX_DEFER` passed."""
        give_up = trio.current_time() + MAX_DEFER
        while True:
            now = trio.current_time()
            wait = min(self._last_read + QUIET, give_up) - now
            if wait <= 0:
                return
            await trio.sleep(wait)

    async def _make(self, key: SegmentFileKey, limiter: trio.CapacityLimiter) -> None:
        try:
            await self._wait_quiet()
            seg = self.source.segment_by_id(key.segment_id)
            if seg is None or file_key(seg) != key:
                return
            view = seg.view()

            async def read(offset: int, size: int) -> Buffer:
                return await self.source.read(view, offset, size)

            await self.files.make(key, read)
            if not self.current(key):
                self.files.discard(key.segment_id)  # truncated or deleted meanwhile
        finally:
            self._wanted.discard(key)
            limiter.release_on_behalf_of(key)
