"""Journal files on disk: naming, the directory lock, preallocated writes.

Files are ``<first sequence number, 20 digits>.wal`` in one directory. They are
preallocated in steps with ``posix_fallocate`` so that an fdatasync after a
write does not also have to persist a file-size change, and so that running
out of disk shows up as an allocation failure *before* anything is written.
All functions here block; the journal calls them from one worker thread at a
time.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import JournalFull, JournalLocked
from gateway.journal.format import Buffer

SUFFIX = ".wal"
_NAME = re.compile(r"^([0-9]{20})\.wal$")
LOCK_NAME = "LOCK"


def file_name(first_sequence: int) -> str:
    """The name of the journal file whose first operation is ``first_sequence``."""
    return f"{first_sequence:020d}{SUFFIX}"


@dataclass(frozen=True, order=True)
class JournalFileName:
    """A journal file found in the directory."""

    first_sequence: int
    path: pathlib.Path


def list_files(directory: pathlib.Path) -> list[JournalFileName]:
    """The journal files in ``directory``, oldest first. Other names are ignored."""
    found = []
    for entry in os.scandir(directory):
        m = _NAME.match(entry.name)
        if m and entry.is_file(follow_symlinks=False):
            found.append(JournalFileName(int(m.group(1)), pathlib.Path(entry.path)))
    return sorted(found)


def fsync_directory(directory: pathlib.Path) -> None:
    """Make creations, renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryLock:
    """An exclusive ``flock`` on ``<dir>/LOCK`` that keeps a second daemon out.

    The lock file holds the owner's pid for the error message; the lock itself
    is the flock, which the kernel drops when the process dies (even SIGKILL),
    so a stale file never blocks a restart.
    """

    def __init__(self, directory: pathlib.Path) -> None:
        self.path = directory / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise JournalLocked(str(directory), f"pid {owner}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournalFile:
    """One open journal file being appended to, with preallocated space."""

    def __init__(self, path: pathlib.Path, first_sequence: int, preallocate_step: int) -> None:
        self.path = path
        self.first_sequence = first_sequence
        self._step = preallocate_step
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        #: Bytes of frames written (and, once synced, durable).
        self.size = 0
        self._allocated = 0

    @classmethod
    def create(
        cls, directory: pathlib.Path, first_sequence: int, preallocate_step: int, initial: int
    ) -> JournalFile:
        """Create, preallocate and make durable a new file; raise JournalFull if no space."""
        f = cls(directory / file_name(first_sequence), first_sequence, preallocate_step)
        try:
            f.ensure_space(initial)
            fsync_directory(directory)
        except BaseException:
            f.close()
            f.path.unlink(missing_ok=True)
            raise
        return f

    def ensure_space(self, nbytes: int) -> None:
        """Preallocate so that ``nbytes`` more bytes fit; raise JournalFull if the disk is full.

        Nothing is written on failure, so the caller may refuse the operations
        that needed the space and go on.
        """
        need = self.size + nbytes
        if need <= self._allocated:
            return
        steps = -(-(need - self._allocated) // self._step)
        new_allocated = self._allocated + steps * self._step
        try:
            os.posix_fallocate(self._fd, self._allocated, new_allocated - self._allocated)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise JournalFull(
                    new_allocated - self._allocated, str(self.path), e.strerror
                ) from e
            raise
        self._allocated = new_allocated

    def write(self, buffers: Sequence[Buffer]) -> None:
        """Write ``buffers`` at the end of the data, in one or more pwritev calls."""
        offset = self.size
        pending = list(buffers)
        iov_max = os.sysconf("SC_IOV_MAX")
        while pending:
            chunk = pending[:iov_max]
            written = os.pwritev(self._fd, chunk, offset)
            offset += written
            # Drop fully written buffers; keep the unwritten tail of a partial one.
            for i, b in enumerate(chunk):
                if written >= len(b):
                    written -= len(b)
                    continue
                pending = [b[written:], *chunk[i + 1 :], *pending[len(chunk) :]]
                break
            else:
                pending = pending[len(chunk) :]
        self.size = offset

    def sync(self) -> None:
        """fdatasync: after it returns, everything written is durable."""
        os.fdatasync(self._fd)

    def seal(self) -> None:
        """Give back preallocated space past the data and close (the file is full).

        Not synced: a crash before the size change is durable leaves zeros
        past the data, which recovery reads as the clean end of the file.
        """
        os.ftruncate(self._fd, self.size)
        self.close()

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
