"""The FUSE `Operations`: segments as read-only files (DESIGN.md, "FUSE").

A thin translation layer (borg's ``fuse.py`` over ``vfs.py``): names and
inodes come from `fs.tree.Tree`, metadata and bytes from the segment
container and its read index -- the same read path as the protocol. Only
`pyfuse3.FUSEError` leaves a method here; domain errors become errno at this
boundary (S3QL's ``fs.py``):

- a name that does not exist: ENOENT;
- an inode that no longer exists -- a file held open, or a cached entry,
  whose segment was deleted: ESTALE (like NFS; the bytes are gone, and
  pretending the file ended would be a lie). The kernel asks by inode only
  for inodes a lookup gave it, and retries path-based calls that get ESTALE
  with a fresh lookup, which answers ENOENT;
- a Tier-2 or cache failure: EIO, with a log line naming segment and offset;
- anything that would change the tree, a file or an attribute: EROFS (the
  mount is also read-only in the kernel, which refuses most of these first).

The kernel caches attributes, names and pages; the mount tells it what may
be cached for how long. Sealed segments never change again (short of a
truncation), so their attributes and names are cached for
``fuse.sealed_timeout`` and their pages survive a reopen (``keep_cache``).
Active segments grow: ``fuse.active_timeout`` (at most 1 s), so ``stat`` and
``tail -f`` see growth, and no ``keep_cache``. When a segment is sealed,
truncated or deleted the mount invalidates what the kernel holds for it,
from a worker thread: an invalidation waits for page locks that a read in
progress may hold, and that read needs this event loop to finish.
"""

from __future__ import annotations

import collections
import errno
import functools
import grp
import logging
import math
import os
import pwd
import re
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import pyfuse3
import trio

from fs.prefetcher import Prefetcher
from fs.tree import SEGMENT_INODE_BASE, Tree
from gateway.config import FuseConfig
from gateway.container.attributes import EVENT_COUNT, is_core
from gateway.container.container import SegmentContainer
from gateway.container.segment import Segment
from gateway.errors import GatewayError, SegmentNotFound
from gateway.tier2.reader import ChunkReader

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
XATTRS = (
    b"start_offset",
    b"length",
    b"storage_length",
    b"sealed",
    b"event_count",
    b"chunk_count",
    b"writer_count",
)

P = ParamSpec("P")
R = TypeVar("R")


def _fuse_op(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Let only FUSEError leave an operation; anything unexpected is EIO, logged."""

    name = fn.__name__

    @functools.wraps(fn)
    async def op(*args: P.args, **kwargs: P.kwargs) -> R:
        args[0].ops[name] += 1  # type: ignore[attr-defined]
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except SegmentNotFound:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except Exception:
            log.exception("FUSE %s%r failed", fn.__name__, args[1:])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return op


async def _read_only(*_: Any) -> None:
    raise pyfuse3.FUSEError(errno.EROFS)


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


class SegmentFS(pyfuse3.Operations):
    """Every live segment as a read-only file; directories implied by names."""

    def __init__(
        self,
        container: SegmentContainer,
        config: FuseConfig,
        read_ahead: int,
        reader: ChunkReader | None = None,
    ) -> None:
        super().__init__()
        self.container = container
        #: Tier 2's chunk reader, for per-handle read-ahead (None: no Tier 2).
        self.reader = reader
        self.config = config
        self.read_ahead = read_ahead
        self.uid, self.gid = resolve_owner(config)
        self.tree = Tree()
        for seg in container.segments():
            self.tree.add_segment(seg.id, seg.name)
        self._mounted_ns = time.time_ns()
        self._files: dict[int, _Handle] = {}
        #: Directory handle -> its entries when opened (stable readdir offsets).
        self._dirs: dict[int, list[tuple[str, int]]] = {}
        self._next_fh = 1
        send, self._invalidations = trio.open_memory_channel[tuple[str, int, bytes, int]](math.inf)
        self._invalidate = send
        #: Set when the kernel's INIT has been answered (the mount is live).
        self.initialized = trio.Event()
        #: Requests per operation, errors per operation (metrics).
        self.ops: collections.Counter[str] = collections.Counter()
        self.reads = 0
        self.bytes_read = 0
        self.read_errors = 0

    # -- keeping the tree and the kernel's caches in step (NamespaceWatcher) -------

    def on_created(self, seg: Segment) -> None:
        """A new segment: show it (the kernel does not cache negative lookups here)."""
        self.tree.add_segment(seg.id, seg.name)

    def on_sealed(self, seg: Segment) -> None:
        """Sealed: the kernel refetches the attributes and caches them for long."""
        self._invalidate.send_nowait(("inode", self.tree.segment_inode(seg.id), b"", 1))

    def on_truncated(self, seg: Segment) -> None:
        """Bytes below the start offset are zeros now: drop cached pages too."""
        self._invalidate.send_nowait(("inode", self.tree.segment_inode(seg.id), b"", 0))

    def on_deleted(self, seg: Segment) -> None:
        """Gone: forget the name (and any directories it leaves empty), then its pages.

        Files held open must not go on answering from cached attributes and
        pages (a sealed segment's stay for ``fuse.sealed_timeout``): once
        the inode is invalidated, every ``fstat`` and read asks here and
        gets ESTALE, however warm the cache was.
        """
        inode = self.tree.segment_inode(seg.id)
        for parent, name, entry in self.tree.remove_segment(seg.id):
            self._invalidate.send_nowait(("entry", parent, name.encode(), entry))
        self._invalidate.send_nowait(("inode", inode, b"", 0))

    async def run_invalidations(self) -> None:
        """Send queued invalidations to the kernel, one at a time, from a worker thread."""
        async for kind, inode, name, arg in self._invalidations:
            # Abandoned on cancel: at unmount, an invalidation may wait for a
            # read that will never be answered; closing the session ends it.
            await trio.to_thread.run_sync(
                self._send_invalidation, kind, inode, name, arg, abandon_on_cancel=True
            )

    @staticmethod
    def _send_invalidation(kind: str, inode: int, name: bytes, arg: int) -> None:
        try:
            if kind == "inode":
                pyfuse3.invalidate_inode(inode, attr_only=bool(arg))
            else:
                pyfuse3.invalidate_entry(inode, name, deleted=arg)
        except OSError as e:
            # ENOENT: the kernel holds nothing for it, which is fine.
            if e.errno != errno.ENOENT:
                log.debug("invalidating %s %d %r: %s", kind, inode, name, e)

    # -- attributes ------------------------------------------------------------------

    def _segment(self, inode: int) -> Segment:
        if inode >= EVENTS_INODE_BASE:
            inode -= EVENTS_INODE_BASE - SEGMENT_INODE_BASE
        seg = self.container.segment_by_id(inode - SEGMENT_INODE_BASE)
        if seg is None or self.tree.segment_name(inode) is None:
            # The kernel had this inode from a lookup: it is stale, not unknown.
            raise pyfuse3.FUSEError(errno.ESTALE)
        return seg

    def _attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.st_uid = self.uid
        a.st_gid = self.gid
        a.st_blksize = BLKSIZE
        if self.tree.is_dir(inode):
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = 2
            a.st_size = 0
            a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self._mounted_ns
            a.attr_timeout = a.entry_timeout = self.config.active_timeout
            return a
        seg = self._segment(inode)
        a.st_mode = stat.S_IFREG | 0o444
        a.st_nlink = 1
        if inode >= EVENTS_INODE_BASE:
            a.st_size = len(events_file(seg))
            a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = seg.last_modified_ms * 1_000_000
            a.attr_timeout = a.entry_timeout = 0  # changes with every MiB appended
            return a
        a.st_size = seg.length
        a.st_blocks = (seg.length + 511) // 512
        modified = seg.last_modified_ms * 1_000_000
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = modified
        a.st_birthtime_ns = seg.created_at_ms * 1_000_000
        timeout = self.config.sealed_timeout if seg.sealed else self.config.active_timeout
        a.attr_timeout = a.entry_timeout = timeout
        return a

    @_fuse_op
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """The entry ``name`` in a directory."""
        if name == b".":
            return self._attributes(parent_inode)
        if name == b"..":
            parent = self.tree.parent(parent_inode)
            if parent is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attributes(parent)
        inode = self.tree.lookup(parent_inode, name.decode("utf-8", "surrogateescape"))
        if inode is None:
            events = EVENTS_NAME.match(name)
            if events is not None:
                inode = self.tree.lookup(parent_inode, events.group(1).decode("utf-8", "replace"))
                if inode is not None and not self.tree.is_dir(inode):
                    return self._attributes(inode + EVENTS_INODE_BASE - SEGMENT_INODE_BASE)
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(inode)

    @_fuse_op
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        """Attributes of a file or directory."""
        return self._attributes(inode)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """Nothing to do: inodes are derived from segment ids, not allocated per lookup."""

    # -- directories -----------------------------------------------------------------

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    @_fuse_op
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        """Open a directory: its entries as of now are what readdir lists."""
        if not self.tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR if self.tree.parent(inode) else errno.ENOENT)
        fh = self._new_fh()
        self._dirs[fh] = self.tree.entries(inode)
        return fh

    @_fuse_op
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """List entries from index ``start_id`` of the directory as opened (readdirplus)."""
        entries = self._dirs.get(fh)
        if entries is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for i in range(start_id, len(entries)):
            name, inode = entries[i]
            try:
                attrs = self._attributes(inode)
            except pyfuse3.FUSEError:
                continue  # deleted since the directory was opened
            if not pyfuse3.readdir_reply(token, name.encode(), attrs, i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        """Forget a directory handle."""
        self._dirs.pop(fh, None)

    # -- files -----------------------------------------------------------------------

    @_fuse_op
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        """Open a segment for reading; sealed ones keep their cached pages."""
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise pyfuse3.FUSEError(errno.EROFS)
        if self.tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        seg = self._segment(inode)
        fh = self._new_fh()
        if inode >= EVENTS_INODE_BASE:
            # A snapshot taken now; direct I/O, so its size as cached by the
            # kernel does not cut it short.
            self._files[fh] = _Handle(seg.id, None, events_file(seg))
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        prefetcher = Prefetcher(self.reader, self.read_ahead)
        self._files[fh] = _Handle(seg.id, prefetcher)
        return pyfuse3.FileInfo(fh=fh, keep_cache=seg.sealed)

    @_fuse_op
    async def read(self, fh: int, off: int, size: int) -> bytes:
        """Bytes of the segment: zeros below its start offset, short at its end."""
        handle = self._files.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if handle.content is not None:
            return handle.content[off : off + size]
        seg = self.container.segment_by_id(handle.segment_id)
        if seg is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        if off >= seg.length:
            return b""
        view = seg.view()
        assert handle.prefetcher is not None
        handle.prefetcher.on_read(view, off, size)
        try:
            data = await self.container.read_index.read_buffer(view, off, size, read_ahead=False)
        except GatewayError as e:
            if self.container.segment_by_id(handle.segment_id) is None:
                # Deleted while this read waited (its chunks go with it): stale, not broken.
                raise pyfuse3.FUSEError(errno.ESTALE) from None
            self.read_errors += 1
            log.error("read of %r at offset %d (%d bytes) failed: %s", seg.name, off, size, e)
            raise pyfuse3.FUSEError(errno.EIO) from None
        self.reads += 1
        self.bytes_read += len(data)
        # pyfuse3 replies from any contiguous buffer (PyObject_GetBuffer), so a
        # view into a fetched block goes to the kernel without a copy.
        return cast(bytes, data)

    async def flush(self, fh: int) -> None:
        """Nothing buffered: nothing to flush."""

    async def release(self, fh: int) -> None:
        """Forget a file handle."""
        self._files.pop(fh, None)

    # -- the filesystem and extended attributes -----------------------------------------

    @_fuse_op
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        """Size: the bytes of all segments; free: none (the mount is read-only)."""
        s = pyfuse3.StatvfsData()
        s.f_bsize = BLKSIZE
        s.f_frsize = 4096
        segments = self.container.segments()
        s.f_blocks = sum(-(-seg.length // 4096) for seg in segments)
        s.f_bfree = s.f_bavail = 0
        s.f_files = len(segments) + self.tree.directories
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    def _xattr_values(self, inode: int) -> dict[bytes, int]:
        if self.tree.is_dir(inode) or inode >= EVENTS_INODE_BASE:
            return {}
        seg = self._segment(inode)
        return {
            b"start_offset": seg.start_offset,
            b"length": seg.length,
            b"storage_length": seg.storage_length,
            b"sealed": int(seg.sealed),
            b"event_count": seg.attributes.get(EVENT_COUNT, 0),
            b"chunk_count": len(seg.chunks),
            b"writer_count": sum(1 for k in seg.attributes if not is_core(k)),
        }

    @_fuse_op
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        """``user.segment.<key>`` as a decimal number."""
        if not name.startswith(XATTR_PREFIX):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = self._xattr_values(inode).get(name[len(XATTR_PREFIX) :])
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return str(value).encode()

    @_fuse_op
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        """The ``user.segment.*`` names (none for directories)."""
        return [XATTR_PREFIX + k for k in self._xattr_values(inode)]

    # -- everything that would change something ------------------------------------------

    setattr = _read_only  # type: ignore[assignment]
    mknod = _read_only  # type: ignore[assignment]
    mkdir = _read_only  # type: ignore[assignment]
    unlink = _read_only  # type: ignore[assignment]
    rmdir = _read_only  # type: ignore[assignment]
    symlink = _read_only  # type: ignore[assignment]
    rename = _read_only  # type: ignore[assignment]
    link = _read_only  # type: ignore[assignment]
    write = _read_only  # type: ignore[assignment]
    create = _read_only  # type: ignore[assignment]
    setxattr = _read_only  # type: ignore[assignment]
    removexattr = _read_only  # type: ignore[assignment]

    def init(self) -> None:
        """The kernel's INIT arrived; the answer follows as soon as this returns."""
        self.initialized.set()

    def statistics(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        return {
            "open_files": len(self._files),
            "reads": self.reads,
            "bytes_read": self.bytes_read,
            "read_errors": self.read_errors,
            "hidden_segments": self.tree.hidden,
        }
