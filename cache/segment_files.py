"""Sealed segments as plain local files, for FUSE passthrough (`fs.passthrough`).

A segment file holds exactly the segment's bytes at the same offsets (byte N
of the file is byte N of the segment; a hole, reading as zeros, below its
start offset), so the kernel can serve a mounted file from it without the
daemon. Files are immutable: written under a temporary name, synced and
renamed into place, and unlinked when the segment is deleted (a reader that
has one open keeps the bytes it opened, as with any local file). A
truncation punches a hole below the new start instead (`truncate`): the
kernel serves every open of an inode held in passthrough from the one
backing file it has, so that file must show what new opens must see.
Like the RocksDB cache the files are never the source of truth: a file
that is missing is made again from the read path.

Layout, under ``<node.data_dir>/segment-files/`` (same file system as the
journal and cache, which must not be a stacked one such as overlayfs: the
kernel refuses those as backing files):

    <segment id>.<created ms>.<start offset>.<length>    a finished file
    .tmp.<anything>                                     being written; removed at start

The name is the whole identity of the bytes: a segment that was truncated,
or deleted and its id reused, has another name, so a file left from before a
restart is either exactly right or removed (`retain`).

A byte budget bounds the files together; past it the least recently opened
files are unlinked.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import logging
import os
import pathlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from gateway.buffers import Buffer

log = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp."
#: Bytes asked of the read path at a time while a file is made.
PIECE = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SegmentFileKey:
    """What a segment file's bytes are: one sealed segment at one start offset."""

    segment_id: int
    created_ms: int
    start_offset: int
    length: int

    @property
    def name(self) -> str:
        """The file's name in the store."""
        return f"{self.segment_id}.{self.created_ms}.{self.start_offset}.{self.length}"

    @classmethod
    def parse(cls, name: str) -> SegmentFileKey | None:
        """The key a file name stands for, or None if it is no segment file."""
        parts = name.split(".")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            return None
        sid, created, start, length = map(int, parts)
        return cls(sid, created, start, length) if start <= length else None


#: Reads ``size`` bytes of the segment from ``offset`` (may return fewer).
ReadSegment = Callable[[int, int], Awaitable[Buffer]]


class SegmentFiles:
    """The store of segment files: lookup, making, LRU eviction, removal."""

    def __init__(self, directory: pathlib.Path, budget: int) -> None:
        self.directory = directory
        self.budget = budget
        #: Finished files, least recently opened first: key -> size.
        self._files: collections.OrderedDict[SegmentFileKey, int] = collections.OrderedDict()
        #: The same keys by segment id (normally one each): a truncation or
        #: deletion finds its segment's files without a pass over all of them.
        self._by_id: dict[int, set[SegmentFileKey]] = {}
        self.bytes = 0
        self.made = 0
        self.evicted = 0
        self.failed = 0
        self._serial = 0

    def start(self) -> None:
        """Create the directory, remove temporary files, index the finished ones.

        Files are taken in modification order (the oldest evicted first).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        found = []
        for entry in os.scandir(self.directory):
            key = SegmentFileKey.parse(entry.name)
            st = entry.stat(follow_symlinks=False)
            if key is None or not entry.is_file(follow_symlinks=False) or st.st_size != key.length:
                # A temporary file of a daemon that stopped while writing it,
                # or something that is not ours to serve.
                log.info("segment files: removing %s", entry.name)
                _unlink(pathlib.Path(entry.path))
                continue
            found.append((st.st_mtime_ns, key, st.st_size))
        for _, key, size in sorted(found, key=lambda f: f[0]):
            self._add(key, size)
        self._make_room(0)  # the budget may be smaller than last time

    def retain(self, current: Callable[[SegmentFileKey], bool]) -> None:
        """Remove every file for which ``current(key)`` is false (its segment was
        deleted or truncated since). Asks about the files here only, not about
        every segment: a node of a million cold segments warms none of them."""
        for key in [k for k in self._files if not current(k)]:
            log.info("segment files: removing %s (its segment changed or is gone)", key.name)
            self._remove(key)

    def path(self, key: SegmentFileKey) -> pathlib.Path | None:
        """The finished file for ``key``, marked as just opened; None if there is none."""
        if key not in self._files:
            return None
        self._files.move_to_end(key)
        return self.directory / key.name

    def __contains__(self, key: object) -> bool:
        """Whether the finished file for ``key`` is here (not marked as opened)."""
        return key in self._files

    def fits(self, key: SegmentFileKey) -> bool:
        """Whether a file for ``key`` can be kept at all (it is within the budget)."""
        return key.length <= self.budget

    async def make(self, key: SegmentFileKey, read: ReadSegment) -> bool:
        """Write the file for ``key`` from ``read``; whether it is in place now.

        Bytes below the start offset are a hole (zeros). Older files are
        evicted first to make room. A read or write failure leaves no file
        behind and is logged.
        """
        if key in self._files or not self.fits(key):
            return key in self._files
        self._serial += 1
        temp = self.directory / f"{TEMP_PREFIX}{key.name}.{self._serial}"
        try:
            fd = await trio.to_thread.run_sync(
                os.open, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
            )
            try:
                offset = key.start_offset
                while offset < key.length:
                    data = await read(offset, min(PIECE, key.length - offset))
                    if not data:
                        raise OSError(f"the read path ended at {offset} < {key.length}")
                    await trio.to_thread.run_sync(_pwrite_all, fd, data, offset)
                    offset += len(data)
                # The length even when the end is a hole; then on disk before
                # the name says the file is whole.
                await trio.to_thread.run_sync(os.ftruncate, fd, key.length)
                await trio.to_thread.run_sync(os.fdatasync, fd)
            finally:
                os.close(fd)
            self._make_room(key.length)
            await trio.to_thread.run_sync(os.rename, temp, self.directory / key.name)
        except Exception as e:
            self.failed += 1
            log.warning("segment files: cannot make %s: %s", key.name, e)
            _unlink(temp)
            return False
        self._add(key, key.length)
        self.made += 1
        return True

    def truncate(self, key: SegmentFileKey) -> bool:
        """The segment was truncated to ``key.start_offset``: punch its file to match.

        The one change made to a finished file, and only to what the segment
        itself now reads as zeros: the bytes below the new start become a
        hole (the size stays, so no reader gets a short read or SIGBUS), and
        the file takes its new name. Readers that hold it open see zeros
        there from now on, exactly as the daemon's reads show a truncated
        segment. False when there was no file or it could not be punched
        (then it is unlinked: `discard`).
        """
        old = next(iter(self._by_id.get(key.segment_id, ())), None)
        if old is None or (old.created_ms, old.length) != (key.created_ms, key.length):
            self.discard(key.segment_id)
            return False
        path = self.directory / old.name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                _punch_hole(fd, old.start_offset, key.start_offset - old.start_offset)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            os.rename(path, self.directory / key.name)
        except OSError as e:
            log.warning("segment files: cannot punch %s to %d: %s", old.name, key.start_offset, e)
            self.discard(key.segment_id)
            return False
        size = self._files[old]
        self._forget(old)
        self._add(key, size)
        return True

    def discard(self, segment_id: int) -> None:
        """Unlink the segment's files (it was truncated or deleted).

        Readers holding one open keep reading it; new opens do not find it.
        """
        for key in list(self._by_id.get(segment_id, ())):
            self._remove(key)

    def statistics(self) -> dict[str, int]:
        """Files and bytes held, the budget, files made, evicted, failed."""
        return {
            "files": len(self._files),
            "bytes": self.bytes,
            "budget": self.budget,
            "made": self.made,
            "evicted": self.evicted,
            "failed": self.failed,
        }

    def _make_room(self, size: int) -> None:
        while self._files and self.bytes + size > self.budget:
            key = next(iter(self._files))
            self._remove(key)
            self.evicted += 1

    def _add(self, key: SegmentFileKey, size: int) -> None:
        self._files[key] = size
        self._by_id.setdefault(key.segment_id, set()).add(key)
        self.bytes += size

    def _forget(self, key: SegmentFileKey) -> None:
        """Drop ``key`` from the index only (its file is gone or renamed)."""
        self.bytes -= self._files.pop(key)
        keys = self._by_id[key.segment_id]
        keys.discard(key)
        if not keys:
            del self._by_id[key.segment_id]

    def _remove(self, key: SegmentFileKey) -> None:
        self._forget(key)
        _unlink(self.directory / key.name)


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def _punch_hole(fd: int, offset: int, length: int) -> None:
    """Deallocate ``[offset, offset + length)`` of ``fd``: it reads as zeros, the size stays."""
    if length <= 0:
        return
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _unlink(path: pathlib.Path) -> None:
    path.unlink(missing_ok=True)
