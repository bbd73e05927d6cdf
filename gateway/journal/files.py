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

from gateway.buffers import Buffer
from gateway.errors import JournalFull, JournalLocked, JournalRefused

SUFFIX = ".wal"
_NAME = re.compile(r"^([0-9]{20})\.wal$")
LOCK_NAME = "LOCK"
RESERVE_NAME = "RESERVE"
#: errno values of a full file system: the operation may succeed once space is freed.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: errno values of running out of descriptors or kernel memory while opening a
#: file: a resource shortage of the moment, not a failed disk.
_NO_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)
_PAGE = 4096
#: Bytes per call of a `copy_range`.
_COPY_BLOCK = 8 * 1024 * 1024
#: copy_file_range errors meaning "not here" rather than "failed": crossing file
#: systems (kernels before 5.3), no such call, or a file system without support.
_NO_COPY_FILE_RANGE = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


def _refusal(e: OSError, what: str, path: pathlib.Path) -> JournalRefused | None:
    """The refusal for a shortage that may pass (full disk, no descriptors), else None."""
    if e.errno in _NO_SPACE or e.errno in _NO_RESOURCES:
        return JournalRefused(f"cannot {what} {path}: {e.strerror}")
    return None


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


def copy_range(source: pathlib.Path, dest: int, begin: int, end: int) -> int:
    """Copy the bytes [begin, end) of ``source`` to ``dest`` at its file position; how many.

    Fewer than ``end - begin`` if ``source`` ends before ``end`` (it was cut
    meanwhile, say): the caller decides what that means. In the kernel with
    ``copy_file_range`` where the file system can, else read and written here.
    """
    done = 0
    count = end - begin
    if count <= 0:
        return 0
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            while done < count:
                n = os.copy_file_range(src, dest, min(_COPY_BLOCK, count - done), begin + done)
                if n == 0:
                    return done
                done += n
        except OSError as e:
            # The failing call copied nothing, so the loop below goes on from
            # `done` when the kernel only lacks support.
            if e.errno not in _NO_COPY_FILE_RANGE:
                raise
        while done < count:
            block = os.pread(src, min(_COPY_BLOCK, count - done), begin + done)
            if not block:
                break
            view = memoryview(block)
            while view:
                view = view[os.write(dest, view) :]
            done += len(block)
    finally:
        os.close(src)
    return done


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
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            refusal = _refusal(e, "create", path)
            if refusal is None:
                raise
            raise refusal from e
        #: Bytes of frames written (and, once synced, durable).
        self.size = 0
        self._allocated = 0

    @classmethod
    def create(
        cls,
        directory: pathlib.Path,
        first_sequence: int,
        preallocate_step: int,
        initial: int,
        exact: bool = False,
    ) -> JournalFile:
        """Create, preallocate and make durable a new file.

        Raises JournalFull if there is no space, JournalRefused if no file
        descriptor is free: either way nothing is left behind. ``exact``: as
        in `ensure_space`.
        """
        f = cls(directory / file_name(first_sequence), first_sequence, preallocate_step)
        try:
            f.ensure_space(initial, exact)
            try:
                fsync_directory(directory)
            except OSError as e:
                refusal = _refusal(e, "open the directory of", f.path)
                if refusal is None:
                    raise
                raise refusal from e
        except BaseException:
            f.close()
            f.path.unlink(missing_ok=True)
            raise
        return f

    @property
    def allocated(self) -> int:
        """Bytes of the file preallocated so far (data included)."""
        return self._allocated

    def ensure_space(self, nbytes: int, exact: bool = False) -> None:
        """Preallocate so that ``nbytes`` more bytes fit; raise JournalFull if the disk is full.

        Space is taken in whole preallocation steps, or with ``exact`` in
        whole pages only (the journal's reserve pays for that: see
        `ReserveFile`). Nothing is written on failure, so the caller may
        refuse the operations that needed the space and go on.
        """
        need = self.size + nbytes
        if need <= self._allocated:
            return
        step = _PAGE if exact else self._step
        steps = -(-(need - self._allocated) // step)
        new_allocated = self._allocated + steps * step
        try:
            os.posix_fallocate(self._fd, self._allocated, new_allocated - self._allocated)
        except OSError as e:
            if e.errno in _NO_SPACE:
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

    @property
    def closed(self) -> bool:
        """Whether the descriptor is closed (sealed or closed)."""
        return self._fd < 0

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ReserveFile:
    """Disk space kept back for the operations that free space (``<dir>/RESERVE``).

    A preallocated file of zeros in the journal directory, never read. When
    the disk is full, client appends are refused, but the operations that
    record Tier-2 progress and checkpoints -- the ones that let the journal
    be truncated -- give back as much of this file as they need and take it
    at once (`release`, then an exact preallocation). The journal grows it
    back (`grow_to`) when there is room again, before clients may write.
    Keeping it across restarts means a node restarted on a full disk can
    still journal its new epoch and flush its way out. A file of its own,
    not space inside a journal file, so that it survives journal rolls and
    truncation.
    """

    def __init__(self, directory: pathlib.Path) -> None:
        self.path = directory / RESERVE_NAME
        # Open for the journal's lifetime: using the reserve must not need a
        # free descriptor at the moment descriptors may have run out.
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @property
    def size(self) -> int:
        """Bytes held now."""
        return os.fstat(self._fd).st_size

    def grow_to(self, target: int) -> bool:
        """Hold ``target`` bytes; False if the disk has no room for that now."""
        if self.size >= target:
            return True
        try:
            os.posix_fallocate(self._fd, 0, target)
        except OSError as e:
            if e.errno in _NO_SPACE:
                return False
            raise
        return True

    def release(self, nbytes: int) -> int:
        """Give ``nbytes`` back to the file system (fewer if it holds less); return how many."""
        size = self.size
        keep = max(0, size - -(-nbytes // _PAGE) * _PAGE)
        os.ftruncate(self._fd, keep)
        return size - keep

    def close(self) -> None:
        """Close the descriptor; the file and its space stay for the next start."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
