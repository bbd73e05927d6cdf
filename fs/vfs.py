"""The filesystem the mount shows, computed without FUSE (borg's ``vfs.py``).

Everything the mount decides lives here and is tested by calling it
(tests/test_fs_vfs.py), with no mount and no pyfuse3: inode numbers,
attributes and cache timeouts, lookups (the hidden ``.NAME.events`` files
included), directory listings, opening and reading files, extended
attributes, ``statfs``, and which kernel caches to invalidate when the
namespace changes. `fs.operations.SegmentFS` is the thin pyfuse3 adapter over
it; the segments come from a `fs.segment_source.SegmentSource`.

Errors are `FsError(errno)`; the adapter raises them as FUSEError:

- a name that does not exist: ENOENT;
- an inode that no longer exists -- a file held open, or a cached entry,
  whose segment was deleted: ESTALE (like NFS; the bytes are gone, and
  pretending the file ended would be a lie). The kernel asks by inode only
  for inodes a lookup gave it, and retries path-based calls that get ESTALE
  with a fresh lookup, which answers ENOENT;
- a Tier-2 or cache failure: EIO, with a log line naming segment and offset;
- anything that would change the tree, a file or an attribute: EROFS.

Two views of every segment:

- the file at the segment's name keeps segment offsets: byte N of the file
  is byte N of the segment, and a truncated segment reads as zeros below its
  start offset (like a punched hole). The `segments` Spark source, ``cat
  --offset`` and anything that compares offsets with the protocol's use it;
- the same name under the hidden directory ``.trimmed`` (found by name,
  never listed) starts where the segment's bytes do, so pandas, pyarrow,
  DuckDB and Spark's JSON reader see no zeros: at the start offset when it
  is a known event boundary; otherwise, for ``lines``, just past the first
  newline at or after it (found by reading), so no partial first line; for
  ``framed``, at the next indexed boundary (frames cannot be found by
  reading from an arbitrary offset); for ``raw``, at the start offset itself
  (`SegmentVFS.trim_start` says why). Its xattr ``user.segment.view_offset``
  is the segment offset of the file's first byte.

In both, an active ``lines`` segment ends at its last newline
(`Segment.event_end`): a raw append that cut a line is not shown until the
line is whole.

Sealed segments never change again (short of a truncation), so their
attributes and names are cached for ``fuse.sealed_timeout``. Active segments
grow: ``fuse.active_timeout`` (at most 1 s), so ``stat`` and ``tail -f`` see
growth. A sealed segment's pages survive a reopen (``keep_cache``). An active
segment is served as direct I/O, without the page cache: the page holding a
growing file's end is cached zero-filled past it, and with several readers
of one growing file the kernel did not always drop it when the file grew
(readers saw zeros where appended bytes were; docs/PERFORMANCE.md). What can
change is pushed to the kernel: a truncation (zeros below the new start)
and a deletion drop the inode's pages (`on_truncated`, `on_deleted`).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
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
from fs.segment_source import SegmentSource
from fs.tree import ROOT_INODE, SEGMENT_INODE_BASE, Tree
from gateway.buffers import Buffer
from gateway.config import FuseConfig
from gateway.container.attributes import EVENT_COUNT, is_core
from gateway.container.segment import Segment
from gateway.container.segment_names import TRIMMED_DIR
from gateway.errors import GatewayError
from gateway.protocol.codec import Codec
from gateway.read.chunks import random_access

log = logging.getLogger(__name__)

#: Preferred I/O size reported in st_blksize: ``cat`` and Python's buffered
#: files size their reads by it, and fewer, larger reads cost less here.
BLKSIZE = 1024 * 1024
#: A segment's event-boundary index shows as the hidden file ``.NAME.events``
#: beside it: found by name, never listed (so ``ls``, ``find`` and Spark's
#: listings do not see it), inode ``EVENTS_INODE_BASE + segment id``.
EVENTS_INODE_BASE = 2 * SEGMENT_INODE_BASE
EVENTS_NAME = re.compile(rb"^\.(.+)\.events$")
#: The trimmed view: ``.trimmed`` at the root mirrors the whole tree; its
#: inodes are the plain view's plus ``TRIMMED_BASE`` (directories included).
TRIMMED_NAME = TRIMMED_DIR.encode()
TRIMMED_BASE = 1 << 43
TRIMMED_ROOT = TRIMMED_BASE + ROOT_INODE
#: How far the trimmed view looks for a truncated lines segment's first
#: newline at a time.
_SCAN = 64 * 1024
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
    #: The kernel reads the open file from this backing file (FUSE
    #: passthrough, `fs.passthrough`); 0: from the daemon.
    backing_id: int = 0


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


def _trimmed(inode: int) -> tuple[int, bool]:
    """(the plain view's inode, whether ``inode`` is in the trimmed view)."""
    return (inode - TRIMMED_BASE, True) if inode >= TRIMMED_BASE else (inode, False)


class _Handle:
    """One open file (a segment, or a snapshot of its ``.events`` file).

    ``base``: the segment offset of the file's first byte (the trimmed view's
    start when opened; 0 in the plain view).
    """

    __slots__ = ("base", "content", "prefetcher", "segment_id")

    def __init__(
        self,
        segment_id: int,
        prefetcher: Prefetcher | None,
        content: bytes | None = None,
        base: int = 0,
    ) -> None:
        self.segment_id = segment_id
        self.prefetcher = prefetcher
        self.content = content
        self.base = base


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
        for name in source.streams():
            self.tree.keep_directory(name)
        self._mounted_ns = time.time_ns()
        self._files: dict[int, _Handle] = {}
        #: Directory handle -> its entries when opened (stable readdir offsets).
        self._dirs: dict[int, list[tuple[str, int]]] = {}
        self._next_fh = 1
        #: (segment id, start offset) -> first event boundary at or after it,
        #: found by reading (truncated lines segments; `find_trim_start`).
        self._trim_starts: dict[tuple[int, int], int] = {}
        self.reads = 0
        self.bytes_read = 0
        self.read_errors = 0

    # -- keeping the tree and the kernel's caches in step (NamespaceWatcher) -------

    def on_created(self, seg: Segment) -> None:
        """A new segment: show it (the kernel does not cache negative lookups here)."""
        self.tree.add_segment(seg.id, seg.name)

    def on_sealed(self, seg: Segment) -> None:
        """Sealed: the kernel refetches the attributes and caches them for long."""
        inode = self.tree.segment_inode(seg.id)
        self.invalidate(("inode", inode, b"", 1))
        # The trimmed file's size changes too (a lines segment's last line).
        self.invalidate(("inode", inode + TRIMMED_BASE, b"", 1))

    def on_truncated(self, seg: Segment) -> None:
        """Bytes below the start offset are zeros now: drop cached pages too.

        The trimmed file starts later now: every byte of it moved.
        """
        inode = self.tree.segment_inode(seg.id)
        self.invalidate(("inode", inode, b"", 0))
        self.invalidate(("inode", inode + TRIMMED_BASE, b"", 0))

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
            self.invalidate(("entry", parent + TRIMMED_BASE, name.encode(), entry + TRIMMED_BASE))
        self.invalidate(("inode", inode, b"", 0))
        self.invalidate(("inode", inode + TRIMMED_BASE, b"", 0))
        for key in [k for k in self._trim_starts if k[0] == seg.id]:
            del self._trim_starts[key]

    def on_stream_created(self, name: str) -> None:
        """A new stream: its directory shows now, before its first segment."""
        self.tree.keep_directory(name)

    def on_stream_deleted(self, name: str) -> None:
        """The stream is gone (its segments went first): its directory goes, if empty."""
        for parent, base, entry in self.tree.release_directory(name):
            self.invalidate(("entry", parent, base.encode(), entry))
            self.invalidate(("entry", parent + TRIMMED_BASE, base.encode(), entry + TRIMMED_BASE))

    # -- attributes ------------------------------------------------------------------

    def segment(self, inode: int) -> Segment:
        """The segment behind a file inode (its ``.events`` file's too); ESTALE if gone."""
        inode = _trimmed(inode)[0]
        if inode >= EVENTS_INODE_BASE:
            inode -= EVENTS_INODE_BASE - SEGMENT_INODE_BASE
        seg = self.source.segment_by_id(inode - SEGMENT_INODE_BASE)
        if seg is None or self.tree.segment_name(inode) is None:
            # The kernel had this inode from a lookup: it is stale, not unknown.
            raise FsError(errno.ESTALE)
        return seg

    def trim_start(self, seg: Segment) -> int:
        """The trimmed view's first byte (docs/FORMATS.md, "The trimmed view").

        The start offset when it is offset 0 or an indexed boundary (the
        index holds it when a truncation was at a known boundary, as
        retention's are). Otherwise, by codec:

        - raw: the start offset itself. Every append is whole events, but
          which offsets are appends' starts is known only while they are
          cached (and, sparsely, from the index): one append of a whole file
          has no known boundary after the start at all. Rather than drop
          bytes that the plain file still has (it did: an empty file), the
          trimmed file starts where they start; a cut event shows as its
          tail, which a parser reports;
        - lines: just past the first newline at or after the start offset,
          found by reading (`find_trim_start`); until it has been, the next
          indexed boundary, else the end of the last complete line;
        - framed: the next indexed boundary (frames cannot be found by
          reading from an arbitrary offset), else the end of the last
          complete event.
        """
        start = seg.start_offset
        index = seg.event_index
        i = bisect.bisect_left(index, start)
        if start == 0 or (i < len(index) and index[i] == start) or seg.codec is Codec.RAW:
            return start
        found = self._trim_starts.get((seg.id, start))
        if found is not None:
            return found
        end = seg.event_end
        return min(index[i], end) if i < len(index) else end

    async def find_trim_start(self, inode: int) -> None:
        """For a trimmed file of a truncated ``lines`` segment: find its first line by reading.

        The line that starts after the first newline at or after the start
        offset (a line starting exactly at an unindexed start offset cannot
        be told from the tail of a cut one, so it is skipped too). Nothing
        to do for other files. A read that fails is EIO (logged): the
        file's start is unknown, and guessing would drop lines or show a
        partial one.
        """
        plain, trimmed = _trimmed(inode)
        if not trimmed or self.tree.is_dir(plain) or plain >= EVENTS_INODE_BASE:
            return
        seg = self.source.segment_by_id(plain - SEGMENT_INODE_BASE)
        if seg is None or seg.codec is not Codec.LINES:
            return
        start = seg.start_offset
        limit = self.trim_start(seg)  # the next indexed boundary, or the end
        if limit == start or (seg.id, start) in self._trim_starts:
            return
        pos = start
        while pos < limit:
            try:
                block = bytes(await self.source.read(seg.view(), pos, min(_SCAN, limit - pos)))
            except GatewayError as e:
                if self.source.segment_by_id(seg.id) is None:
                    return  # deleted meanwhile: stale, not broken (the caller finds it gone)
                self.read_errors += 1
                log.error(
                    "read of %r at offset %d, to find where the first line of %r after "
                    "offset %d starts, failed: %s", seg.name, pos, seg.name, start, e,
                )  # fmt: skip
                raise FsError(errno.EIO) from None
            if not block:
                return
            nl = block.find(b"\n")
            if nl >= 0:
                limit = pos + nl + 1
                break
            pos += len(block)
        if len(self._trim_starts) >= 100_000:
            self._trim_starts.clear()
        self._trim_starts[(seg.id, start)] = limit

    async def find_trim_starts(self, fh: int, start_id: int = 0) -> None:
        """`find_trim_start` for the files of a trimmed directory listing, from ``start_id``.

        A listing (readdirplus) hands the kernel each entry's attributes,
        which it caches like a lookup's: the sizes must be the files' own.
        """
        for _, inode in self._dirs.get(fh, [])[start_id:]:
            if inode >= TRIMMED_BASE:
                await self.find_trim_start(inode)

    def attributes(self, inode: int) -> Attributes:
        """What ``stat`` shows."""
        plain, trimmed = _trimmed(inode)
        if trimmed:
            if plain >= EVENTS_INODE_BASE:
                raise FsError(errno.ENOENT)
            a = self.attributes(plain)
            if self.tree.is_dir(plain):
                return dataclasses.replace(a, inode=inode)
            seg = self.segment(plain)
            size = seg.event_end - self.trim_start(seg)
            return dataclasses.replace(a, inode=inode, size=size, blocks=(size + 511) // 512)
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
        size = seg.event_end
        return Attributes(
            inode, mode, 1, size, (size + 511) // 512, self.uid, self.gid,
            BLKSIZE, modified, seg.created_at_ms * 1_000_000, timeout,
        )  # fmt: skip

    def lookup(self, parent_inode: int, name: bytes) -> Attributes:
        """The entry ``name`` in a directory."""
        if name == b".":
            return self.attributes(parent_inode)
        plain, trimmed = _trimmed(parent_inode)
        if trimmed:
            if name == b".." and plain == ROOT_INODE:
                return self.attributes(ROOT_INODE)
            if not self.tree.is_dir(plain):
                raise FsError(errno.ENOENT)
            if EVENTS_NAME.match(name) is not None:
                raise FsError(errno.ENOENT)  # the index's offsets are the plain view's
            found = self.lookup(plain, name)
            return self.attributes(found.inode + TRIMMED_BASE)
        if parent_inode == ROOT_INODE and name == TRIMMED_NAME:
            return self.attributes(TRIMMED_ROOT)
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
        plain, trimmed = _trimmed(inode)
        if not self.tree.is_dir(plain):
            raise FsError(errno.ENOTDIR if self.tree.parent(plain) else errno.ENOENT)
        fh = self._new_fh()
        entries = self.tree.entries(plain)
        if trimmed:
            entries = [(name, entry + TRIMMED_BASE) for name, entry in entries]
        self._dirs[fh] = entries
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
        """Open a segment for reading; its pages survive (the trimmed view's once sealed)."""
        if flags & WRITE_FLAGS:
            raise FsError(errno.EROFS)
        plain, trimmed = _trimmed(inode)
        if self.tree.is_dir(plain):
            raise FsError(errno.EISDIR)
        seg = self.segment(inode)
        fh = self._new_fh()
        # O_DIRECT: served as direct I/O, so reads go up to the segment's
        # current end even while the kernel's copy of the size is older.
        # Active segments always: the page holding a growing file's end is
        # cached zero-filled past it, and the kernel does not always drop it
        # when the file grows (measured: with several readers of one growing
        # file, a held descriptor read a run of zeros where appended bytes
        # were, within a minute; with direct I/O, none in 10 minutes).
        direct = bool(flags & os.O_DIRECT) or not seg.sealed
        if trimmed:
            base = self.trim_start(seg)
            self._files[fh] = _Handle(seg.id, Prefetcher(self.source, self.read_ahead), None, base)
            return Opened(fh, keep_cache=seg.sealed and not direct, direct_io=direct)
        if inode >= EVENTS_INODE_BASE:
            # A snapshot taken now; direct I/O, so its size as cached by the
            # kernel does not cut it short.
            self._files[fh] = _Handle(seg.id, None, events_file(seg))
            return Opened(fh, direct_io=True)
        self._files[fh] = _Handle(seg.id, Prefetcher(self.source, self.read_ahead))
        # Sealed segments never change: their pages survive a reopen.
        return Opened(fh, keep_cache=not direct, direct_io=direct)

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
        off += handle.base
        end = seg.event_end
        if off >= end:
            return b""
        size = min(size, end - off)
        view = seg.view()
        assert handle.prefetcher is not None
        handle.prefetcher.on_read(view, off, size)
        # A reader with no read-ahead window is not sequential: a Tier-2 miss
        # fetches the pages it reads, not their whole block.
        random = handle.prefetcher.window == 0
        try:
            with random_access() if random else contextlib.nullcontext():
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
        size, count = self.source.totals()
        return FsStats(
            bsize=BLKSIZE,
            frsize=4096,
            blocks=size,
            files=count + self.tree.directories,
            namemax=255,
        )

    def xattr_values(self, inode: int) -> dict[bytes, int | str]:
        """The ``user.segment.*`` values by key (none for directories and ``.events``).

        ``view_offset`` is the segment offset of the file's first byte (0 but
        in the trimmed view); ``event_end`` the file's end as a segment offset.

        ``node`` names the owner; ``tail_available`` is 0 when the owner does
        not answer, so the file ends at its flushed length (``length`` then
        says so too) and ``storage_length`` is all there is.
        """
        plain, trimmed = _trimmed(inode)
        if self.tree.is_dir(plain) or plain >= EVENTS_INODE_BASE:
            return {}
        seg = self.segment(plain)
        owner, tail = self.source.owner(seg.id)
        view: dict[bytes, int | str] = {b"view_offset": self.trim_start(seg) if trimmed else 0}
        values: dict[bytes, int | str] = view | {
            b"node": owner,
            b"tail_available": int(tail),
            b"start_offset": seg.start_offset,
            b"length": seg.length,
            b"storage_length": seg.storage_length,
            b"sealed": int(seg.sealed),
            b"event_count": seg.core(EVENT_COUNT),
            b"chunk_count": len(seg.chunks),
            b"writer_count": sum(
                1 for k, v in seg.attributes.items() if v is not None and not is_core(k)
            ),
            b"codec": seg.codec.value,
            b"event_end": seg.event_end,
            b"created_ms": seg.created_at_ms,
        }
        if seg.events_unknown:
            # Cut to what the owner flushed (it is down): no count is known
            # for that, and the whole segment's would be wrong.
            del values[b"event_count"]
        return values

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
