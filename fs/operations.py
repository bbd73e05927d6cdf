"""The FUSE `Operations`: a thin pyfuse3 adapter over `fs.vfs.SegmentVFS`.

Everything the mount computes (inodes, attributes, lookups, listings, reads,
xattrs, invalidations) is `fs.vfs`, tested without mounting; this module
converts arguments and answers to pyfuse3's types, and errors to
`pyfuse3.FUSEError`, the only exception that may leave an operation (S3QL's
``fs.py``): `fs.vfs.FsError` keeps its errno, a segment that does not exist
is ENOENT, and anything unexpected is EIO with the traceback logged. Writes
of any kind get EROFS (the mount is also read-only in the kernel, which
refuses most of them first).

Kernel cache invalidations are sent from a worker thread, one at a time: an
invalidation waits for page locks that a read in progress may hold, and that
read needs this event loop to finish (the reason DESIGN.md forbids
``notify_store`` on the loop).
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import pyfuse3
import trio

from fs.passthrough import Passthrough
from fs.segment_source import SegmentSource
from fs.tree import SEGMENT_INODE_BASE
from fs.vfs import EVENTS_INODE_BASE, TRIMMED_BASE, Attributes, FsError, Invalidation, SegmentVFS
from gateway.config import FuseConfig
from gateway.errors import SegmentNotFound

log = logging.getLogger(__name__)

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
        except FsError as e:
            raise pyfuse3.FUSEError(e.errno) from None
        except SegmentNotFound:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except Exception:
            log.exception("FUSE %s%r failed", fn.__name__, args[1:])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return op


async def _read_only(*_: Any) -> None:
    raise pyfuse3.FUSEError(errno.EROFS)


def entry_attributes(a: Attributes) -> pyfuse3.EntryAttributes:
    """The core's attributes as pyfuse3's."""
    e = pyfuse3.EntryAttributes()
    e.st_ino = a.inode
    e.st_mode = a.mode
    e.st_nlink = a.nlink
    e.st_size = a.size
    e.st_blocks = a.blocks
    e.st_uid = a.uid
    e.st_gid = a.gid
    e.st_blksize = a.blksize
    e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = a.mtime_ns
    if a.birthtime_ns:
        e.st_birthtime_ns = a.birthtime_ns
    e.attr_timeout = e.entry_timeout = a.timeout
    return e


class SegmentFS(pyfuse3.Operations):
    """The mount's pyfuse3 `Operations` over a `SegmentVFS` (``self.vfs``)."""

    def __init__(
        self,
        source: SegmentSource,
        config: FuseConfig,
        read_ahead: int,
        passthrough: Passthrough | None = None,
    ) -> None:
        super().__init__()
        send, self._invalidations = trio.open_memory_channel[Invalidation](math.inf)
        self.vfs = SegmentVFS(source, config, read_ahead, send.send_nowait)
        #: Sealed segments from local files (`fs.passthrough`), once INIT granted it.
        self.passthrough = passthrough
        # Read by pyfuse3 (patched, scripts/build_pyfuse3.sh) at INIT: ask the kernel.
        self.enable_passthrough = passthrough is not None
        #: Set when the kernel's INIT has been answered (the mount is live).
        self.initialized = trio.Event()
        #: Requests per operation (metrics).
        self.ops: collections.Counter[str] = collections.Counter()

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

    @_fuse_op
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        """The entry ``name`` in a directory."""
        attrs = self.vfs.lookup(parent_inode, name)
        if attrs.inode >= TRIMMED_BASE:  # a truncated lines segment may need a read
            await self.vfs.find_trim_start(attrs.inode)
            attrs = self.vfs.attributes(attrs.inode)
        return entry_attributes(attrs)

    @_fuse_op
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        """Attributes of a file or directory."""
        await self.vfs.find_trim_start(inode)
        return entry_attributes(self.vfs.attributes(inode))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """Nothing to do: inodes are derived from segment ids, not allocated per lookup."""

    @_fuse_op
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        """Open a directory."""
        return self.vfs.opendir(inode)

    @_fuse_op
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """List entries from index ``start_id`` (readdirplus)."""
        await self.vfs.find_trim_starts(fh, start_id)  # the kernel caches these sizes
        for name, attrs, next_id in self.vfs.readdir(fh, start_id):
            if not pyfuse3.readdir_reply(token, name, entry_attributes(attrs), next_id):
                break

    async def releasedir(self, fh: int) -> None:
        """Forget a directory handle."""
        self.vfs.releasedir(fh)

    @_fuse_op
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        """Open a segment (or its ``.events`` file) for reading."""
        await self.vfs.find_trim_start(inode)
        opened = self.vfs.open(inode, flags)
        if self.passthrough is not None:
            # Only the plain view: its offsets are the segment's (and the file's).
            plain = SEGMENT_INODE_BASE <= inode < EVENTS_INODE_BASE
            seg = self.vfs.segment(inode) if plain else None
            opened = self.passthrough.open(inode, seg, opened)
            if opened.backing_id:
                return pyfuse3.FileInfo(fh=opened.fh, backing_id=opened.backing_id)
        return pyfuse3.FileInfo(
            fh=opened.fh, keep_cache=opened.keep_cache, direct_io=opened.direct_io
        )

    @_fuse_op
    async def read(self, fh: int, off: int, size: int) -> bytes:
        """Bytes of the segment: zeros below its start offset, short at its end."""
        # pyfuse3 replies from any contiguous buffer (PyObject_GetBuffer), so a
        # view into a fetched block goes to the kernel without a copy.
        data = await self.vfs.read(fh, off, size)
        if self.passthrough is not None:
            # A sealed segment served in full gets its segment file.
            self.passthrough.served(fh, off, len(data))
        return cast(bytes, data)

    async def flush(self, fh: int) -> None:
        """Nothing buffered: nothing to flush."""

    async def release(self, fh: int) -> None:
        """Forget a file handle (and a backing id with an inode's last passthrough open)."""
        self.vfs.release(fh)
        if self.passthrough is not None:
            self.passthrough.release(fh)

    @_fuse_op
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        """Size: the bytes of all segments; free: none (the mount is read-only)."""
        st = self.vfs.statfs()
        s = pyfuse3.StatvfsData()
        s.f_bsize = st.bsize
        s.f_frsize = st.frsize
        s.f_blocks = st.blocks
        s.f_bfree = s.f_bavail = 0
        s.f_files = st.files
        s.f_ffree = s.f_favail = 0
        s.f_namemax = st.namemax
        return s

    @_fuse_op
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        """``user.segment.<key>`` as a decimal number."""
        await self.vfs.find_trim_start(inode)  # view_offset of a truncated lines segment
        return self.vfs.getxattr(inode, name)

    @_fuse_op
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        """The ``user.segment.*`` names (none for directories)."""
        return self.vfs.listxattr(inode)

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
        """The kernel's INIT arrived; the answer follows as soon as this returns.

        Passthrough is used only if INIT granted it (before any open can come).
        """
        if self.passthrough is not None:
            self.passthrough.active = pyfuse3.passthrough_enabled()
            if not self.passthrough.active:
                log.info("FUSE passthrough: the kernel did not offer it; the daemon serves reads")
        self.initialized.set()

    def statistics(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        more = self.passthrough.statistics() if self.passthrough is not None else {}
        return self.vfs.statistics() | more
