"""The filesystem the mount shows, computed without FUSE (borg's ``vfs.py``).

Everything the mount decides lives here and is tested by calling it
(tests/test_fs_vfs.py), with no mount and no pyfuse3: inode numbers,
attributes and cache timeouts, lookups (the hidden ``.NAME.events`` files
included), directory listings, opening and reading files, extended
attributes, ``statfs``, and which kernel caches to invalidate when the
namespace changes. `fs.operations.SegmentFS` is the thin pyfuse3 adapter over
it; the segments come from a `fs.source.SegmentSource`.

Errors are `FsError(errno)`; the adapter raises them as FUSEError:

- a name that does not exist: ENOENT;
- an inode that no longer exists -- a file held open, or a cached entry,
  whose segment was deleted: ESTALE (like NFS; the bytes are gone, and
  pretending the file ended would be a lie). The kernel asks by inode only
  for inodes a lookup gave it, and retries path-based calls that get ESTALE
  with a fresh lookup, which answers ENOENT;
- a Tier-2 or cache failure: EIO, with a log line naming segment and offset;
- anything that would change the tree, a file or an attribute: EROFS.

Sealed segments never change again (short of a truncation), so their
attributes and names are cached for ``fuse.sealed_timeout`` and their pages
survive a reopen (``keep_cache``). Active segments grow: ``fuse.active_timeout``
(at most 1 s), so ``stat`` and ``tail -f`` see growth, and no ``keep_cache``.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fs.prefetcher import Prefetcher
from fs.source import SegmentSource
from fs.tree import SEGMENT_INODE_BASE, Tree
from gateway.buffers import Buffer
from gateway.config import FuseConfig
from gateway.container.attributes import EVENT_COUNT, is_core
from gateway.container.segment import Segment
from gateway.errors import GatewayError

log = logging.getLogger(__name__)

#: Preferred I/O size reported in st_blksize: ``cat`` and Python's buffered
#: files size their reads by it, and fewer, larger reads cost less here.
BLKSIZE = 1024 * 1024
#: A segment's event-boundary index shows as the hidden file ``.NAME.events``
#: beside it: found by name, never listed (so ``ls``, ``find`` and Spark's
#: listings do not see it), inode ``EVENTS_INODE_BASE + segment id``.
EVENTS_INODE_BASE = 2 * SEGMENT_INODE_BASE
EVENTS_NAME = re.compile(rb"^\.(.+)\.events$")
XATTR_PREFIX = b"user.segment."
#: Flags of an open that could change a file.
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT

#: An invalidation for the kernel: ("inode", inode, b"", attr_only) or
#: ("entry", parent inode, name, deleted inode).
Invalidation = tuple[str, int, bytes, int]


class FsError(Exception):
    """An operation's answer is this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))
        self.errno = code


@dataclass(frozen=True, slots=True)
class Attributes:
    """What ``stat`` shows of an entry, and how long the kernel may cache it."""

    inode: int
    mode: int
    nlink: int
    size: int
    blocks: int
    uid: int
    gid: int
    blksize: int
    #: atime = mtime = ctime.
    mtime_ns: int
    birthtime_ns: int
    #: Seconds the kernel may cache the attributes and the name.
    timeout: float


@dataclass(frozen=True, slots=True)
class Opened:
    """An open file: its handle and how the kernel should cache its pages."""

    fh: int
    keep_cache: bool = False
    direct_io: bool = False


@dataclass(frozen=True, slots=True)
class FsStats:
    """``statfs``: sizes in 4 KiB fragments, nothing free (read-only)."""

    bsize: int
    frsize: int
    blocks: int
    files: int
    namemax: int


def resolve_owner(config: FuseConfig) -> tuple[int, int]:
    """(uid, gid) every entry shows: from ``fuse.owner``/``fuse.group``, else the daemon's."""
    uid, gid = os.getuid(), os.getgid()
    if config.owner:
        uid = int(config.owner) if config.owner.isdigit() else pwd.getpwnam(config.owner).pw_uid
    if config.group:
        gid = int(config.group) if config.group.isdigit() else grp.getgrnam(config.group).gr_gid
    return uid, gid


def events_file(seg: Segment) -> bytes:
    """The ``.NAME.events`` content: indexed event-boundary offsets, one per line."""
    return "".join(f"{offset}\n" for offset in seg.event_index).encode()


class _Handle:
    """One open file (a segment, or a snapshot of its ``.events`` file)."""

    __slots__ = ("content", "prefetcher", "segment_id")

    def __init__(
        self, segment_id: int, prefetcher: Prefetcher | None, content: bytes | None = None
    ) -> None:
        self.segment_id = segment_id
        self.prefetcher = prefetcher
        self.content = content


class SegmentVFS:
    """Every live segment as a read-only file; directories implied by names.

    ``invalidate`` is called with each kernel cache entry to drop (the
    adapter queues them for a worker thread); it is also a
    `NamespaceWatcher` of the source, which keeps the tree in step.
    """

    def __init__(
        self,
        source: SegmentSource,
        config: FuseConfig,
        read_ahead: int,
        invalidate: Callable[[Invalidation], None] = lambda _: None,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.source = source
        self.config = config
        self.read_ahead = read_ahead
        self.invalidate = invalidate
        self.uid, self.gid = owner if owner is not None else resolve_owner(config)
        self.tree = Tree()
        for seg in source.segments():
            self.tree.add_segment(seg.id, seg.name)
        self._mounted_ns = time.time_ns()
        self._files: dict[int, _Handle] = {}
        #: Directory handle -> its entries when opened (stable readdir offsets).
        self._dirs: dict[int, list[tuple[str, int]]] = {}
        self._next_fh = 1
        self.reads = 0
        self.bytes_read = 0
        self.read_errors = 0

    # -- keeping the tree and the kernel's caches in step (NamespaceWatcher) -------

    def on_created(self, seg: Segment) -> None:
        """A new segment: show it (the kernel does not cache negative lookups here)."""
        self.tree.add_segment(seg.id, seg.name)

    def on_sealed(self, seg: Segment) -> None:
        """Sealed: the kernel refetches the attributes and caches them for long."""
        self.invalidate(("inode", self.tree.segment_inode(seg.id), b"", 1))

    def on_truncated(self, seg: Segment) -> None:
        """Bytes below the start offset are zeros now: drop cached pages too."""
        self.invalidate(("inode", self.tree.segment_inode(seg.id), b"", 0))

    def on_deleted(self, seg: Segment) -> None:
        """Gone: forget the name (and any directories it leaves empty), then its pages.

        Files held open must not go on answering from cached attributes and
        pages (a sealed segment's stay for ``fuse.sealed_timeout``): once
        the inode is invalidated, every ``fstat`` and read asks here and
        gets ESTALE, however warm the cache was.
        """
        inode = self.tree.segment_inode(seg.id)
        for parent, name, entry in self.tree.remove_segment(seg.id):
            self.invalidate(("entry", parent, name.encode(), entry))
        self.invalidate(("inode", inode, b"", 0))

    # -- attributes ------------------------------------------------------------------

    def segment(self, inode: int) -> Segment:
        """The segment behind a file inode (its ``.events`` file's too); ESTALE if gone."""
        if inode >= EVENTS_INODE_BASE:
            inode -= EVENTS_INODE_BASE - SEGMENT_INODE_BASE
        seg = self.source.segment_by_id(inode - SEGMENT_INODE_BASE)
        if seg is None or self.tree.segment_name(inode) is None:
            # The kernel had this inode from a lookup: it is stale, not unknown.
            raise FsError(errno.ESTALE)
        return seg

    def attributes(self, inode: int) -> Attributes:
        """What ``stat`` shows."""
        if self.tree.is_dir(inode):
            return Attributes(
                inode, stat.S_IFDIR | 0o555, 2, 0, 0, self.uid, self.gid, BLKSIZE,
                self._mounted_ns, 0, self.config.active_timeout,
            )  # fmt: skip
        seg = self.segment(inode)
        mode = stat.S_IFREG | 0o444
        modified = seg.last_modified_ms * 1_000_000
        if inode >= EVENTS_INODE_BASE:
            size = len(events_file(seg))
            # Changes with every MiB appended: never cached.
            return Attributes(
                inode, mode, 1, size, 0, self.uid, self.gid, BLKSIZE, modified, 0, 0
            )  # fmt: skip
        timeout = self.config.sealed_timeout if seg.sealed else self.config.active_timeout
        return Attributes(
            inode, mode, 1, seg.length, (seg.length + 511) // 512, self.uid, self.gid,
            BLKSIZE, modified, seg.created_at_ms * 1_000_000, timeout,
        )  # fmt: skip

    def lookup(self, parent_inode: int, name: bytes) -> Attributes:
        """The entry ``name`` in a directory."""
        if name == b".":
            return self.attributes(parent_inode)
        if name == b"..":
            parent = self.tree.parent(parent_inode)
            if parent is None:
                raise FsError(errno.ENOENT)
            return self.attributes(parent)
        inode = self.tree.lookup(parent_inode, name.decode("utf-8", "surrogateescape"))
        if inode is None:
            events = EVENTS_NAME.match(name)
            if events is not None:
                inode = self.tree.lookup(parent_inode, events.group(1).decode("utf-8", "replace"))
                if inode is not None and not self.tree.is_dir(inode):
                    return self.attributes(inode + EVENTS_INODE_BASE - SEGMENT_INODE_BASE)
            raise FsError(errno.ENOENT)
        return self.attributes(inode)

    # -- directories -----------------------------------------------------------------

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def opendir(self, inode: int) -> int:
        """Open a directory: its entries as of now are what `readdir` lists."""
        if not self.tree.is_dir(inode):
            raise FsError(errno.ENOTDIR if self.tree.parent(inode) else errno.ENOENT)
        fh = self._new_fh()
        self._dirs[fh] = self.tree.entries(inode)
        return fh

    def readdir(self, fh: int, start_id: int) -> Iterator[tuple[bytes, Attributes, int]]:
        """(name, attributes, next id) from index ``start_id`` of the directory as opened."""
        entries = self._dirs.get(fh)
        if entries is None:
            raise FsError(errno.EBADF)
        for i in range(start_id, len(entries)):
            name, inode = entries[i]
            try:
                attrs = self.attributes(inode)
            except FsError:
                continue  # deleted since the directory was opened
            yield name.encode(), attrs, i + 1

    def releasedir(self, fh: int) -> None:
        """Forget a directory handle."""
        self._dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------------

    def open(self, inode: int, flags: int) -> Opened:
        """Open a segment for reading; sealed ones keep their cached pages."""
        if flags & WRITE_FLAGS:
            raise FsError(errno.EROFS)
        if self.tree.is_dir(inode):
            raise FsError(errno.EISDIR)
        seg = self.segment(inode)
        fh = self._new_fh()
        if inode >= EVENTS_INODE_BASE:
            # A snapshot taken now; direct I/O, so its size as cached by the
            # kernel does not cut it short.
            self._files[fh] = _Handle(seg.id, None, events_file(seg))
            return Opened(fh, direct_io=True)
        self._files[fh] = _Handle(seg.id, Prefetcher(self.source, self.read_ahead))
        return Opened(fh, keep_cache=seg.sealed)

    async def read(self, fh: int, off: int, size: int) -> Buffer:
        """Bytes of the segment: zeros below its start offset, short at its end."""
        handle = self._files.get(fh)
        if handle is None:
            raise FsError(errno.EBADF)
        if handle.content is not None:
            return handle.content[off : off + size]
        seg = self.source.segment_by_id(handle.segment_id)
        if seg is None:
            raise FsError(errno.ESTALE)
        if off >= seg.length:
            return b""
        view = seg.view()
        assert handle.prefetcher is not None
        handle.prefetcher.on_read(view, off, size)
        try:
            data = await self.source.read(view, off, size)
        except GatewayError as e:
            if self.source.segment_by_id(handle.segment_id) is None:
                # Deleted while this read waited (its chunks go with it): stale, not broken.
                raise FsError(errno.ESTALE) from None
            self.read_errors += 1
            log.error("read of %r at offset %d (%d bytes) failed: %s", seg.name, off, size, e)
            raise FsError(errno.EIO) from None
        self.reads += 1
        self.bytes_read += len(data)
        return data

    def release(self, fh: int) -> None:
        """Forget a file handle."""
        self._files.pop(fh, None)

    # -- the filesystem and extended attributes -----------------------------------------

    def statfs(self) -> FsStats:
        """Size: the bytes of all segments; free: none (the mount is read-only)."""
        segments = self.source.segments()
        return FsStats(
            bsize=BLKSIZE,
            frsize=4096,
            blocks=sum(-(-seg.length // 4096) for seg in segments),
            files=len(segments) + self.tree.directories,
            namemax=255,
        )

    def xattr_values(self, inode: int) -> dict[bytes, int | str]:
        """The ``user.segment.*`` values by key (none for directories and ``.events``).

        ``node`` names the owner; ``tail_available`` is 0 when the owner does
        not answer, so the file ends at its flushed length (``length`` then
        says so too) and ``storage_length`` is all there is.
        """
        if self.tree.is_dir(inode) or inode >= EVENTS_INODE_BASE:
            return {}
        seg = self.segment(inode)
        owner, tail = self.source.owner(seg.id)
        return {
            b"node": owner,
            b"tail_available": int(tail),
            b"start_offset": seg.start_offset,
            b"length": seg.length,
            b"storage_length": seg.storage_length,
            b"sealed": int(seg.sealed),
            b"event_count": seg.attributes.get(EVENT_COUNT, 0),
            b"chunk_count": len(seg.chunks),
            b"writer_count": sum(1 for k in seg.attributes if not is_core(k)),
        }

    def getxattr(self, inode: int, name: bytes) -> bytes:
        """``user.segment.<key>`` as a decimal number; ENODATA for anything else."""
        if not name.startswith(XATTR_PREFIX):
            raise FsError(errno.ENODATA)
        value = self.xattr_values(inode).get(name[len(XATTR_PREFIX) :])
        if value is None:
            raise FsError(errno.ENODATA)
        return str(value).encode()

    def listxattr(self, inode: int) -> list[bytes]:
        """The ``user.segment.*`` names (none for directories)."""
        return [XATTR_PREFIX + k for k in self.xattr_values(inode)]

    def statistics(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        return {
            "open_files": len(self._files),
            "reads": self.reads,
            "bytes_read": self.bytes_read,
            "read_errors": self.read_errors,
            "hidden_segments": self.tree.hidden,
        }
