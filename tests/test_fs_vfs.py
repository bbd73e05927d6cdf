"""The mount's filesystem core (fs/vfs.py), called directly: no mount, no pyfuse3.

The segments come from an in-memory source; what the tests check is what a
user of the mount would see through stat, ls, cat, getfattr and the kernel's
caches. tests/test_fs_mount.py checks the same through a real mount.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Sequence

import pytest

from fs.tree import ROOT_INODE, SEGMENT_INODE_BASE
from fs.vfs import (
    EVENTS_INODE_BASE,
    TRIMMED_BASE,
    TRIMMED_ROOT,
    XATTR_PREFIX,
    FsError,
    Invalidation,
    SegmentVFS,
)
from gateway.buffers import Buffer
from gateway.config import FuseConfig
from gateway.container import EVENT_COUNT
from gateway.container.attributes import CODEC
from gateway.container.interfaces import NamespaceWatcher
from gateway.container.segment import Segment
from gateway.errors import Tier2Error
from gateway.protocol.codec import Codec
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.chunks import in_random_access
from gateway.read.index import SegmentView

MiB = 1024 * 1024
CONFIG = FuseConfig(active_timeout=1.0, sealed_timeout=300.0)


class MemorySource:
    """Segments and their bytes in memory; records prefetches; fails reads on demand."""

    def __init__(self) -> None:
        self.by_id: dict[int, Segment] = {}
        self.data: dict[int, bytes] = {}
        self.prefetched: list[tuple[int, int]] = []
        #: (offset, whether the read was made within `random_access`), per read.
        self.reads: list[tuple[int, bool]] = []
        self.fail_reads = False
        self.watchers: list[NamespaceWatcher] = []
        #: Names of live streams (directories that show while empty).
        self.stream_names: list[str] = []

    def add(self, segment_id: int, name: str, data: bytes = b"", **fields: object) -> Segment:
        seg = Segment(segment_id, name, created_at_ms=1_000)
        seg.durable = True
        seg.length = len(data)
        seg.last_modified_ms = 2_000
        for k, v in fields.items():
            setattr(seg, k, v)
        self.by_id[segment_id] = seg
        self.data[segment_id] = data
        for w in self.watchers:
            w.on_created(seg)
        return seg

    def add_stream(self, name: str) -> None:
        self.stream_names.append(name)
        for w in self.watchers:
            w.on_stream_created(name)

    def remove_stream(self, name: str) -> None:
        self.stream_names.remove(name)
        for w in self.watchers:
            w.on_stream_deleted(name)

    def segments(self) -> Sequence[Segment]:
        return list(self.by_id.values())

    def totals(self) -> tuple[int, int]:
        return sum(-(-s.length // 4096) for s in self.by_id.values()), len(self.by_id)

    def streams(self) -> Sequence[str]:
        return list(self.stream_names)

    def segment_by_id(self, segment_id: int) -> Segment | None:
        return self.by_id.get(segment_id)

    async def read(self, seg: SegmentView, offset: int, size: int) -> Buffer:
        self.reads.append((offset, in_random_access()))
        if self.fail_reads:
            raise Tier2Error("GET failed: the server is down")
        data = self.data[seg.id]
        out = data[offset : min(offset + size, seg.length)]
        if offset < seg.start_offset:
            zeros = min(seg.start_offset, offset + size) - offset
            out = bytes(zeros) + out[zeros:]
        return out

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        self.prefetched.append((start, stop))
        return 1

    def watch(self, watcher: NamespaceWatcher) -> None:
        self.watchers.append(watcher)

    def unwatch(self, watcher: NamespaceWatcher) -> None:
        self.watchers.remove(watcher)

    def owner(self, segment_id: int) -> tuple[str, bool]:
        # Odd ids stand for another node's segments whose owner is down.
        return ("node-x", False) if segment_id % 2 else ("node-1", True)


def make(source: MemorySource) -> tuple[SegmentVFS, list[Invalidation]]:
    sent: list[Invalidation] = []
    vfs = SegmentVFS(source, CONFIG, 32 * MiB, sent.append, owner=(1234, 5678))
    source.watch(vfs)
    return vfs, sent


def errno_of(fn: object, *args: object) -> int:
    with pytest.raises(FsError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value.errno


def test_inodes_come_from_segment_ids_and_directories_are_implied() -> None:
    src = MemorySource()
    src.add(7, "logs/2026/a", b"x" * 10)
    src.add(9, "logs/b")
    vfs, _ = make(src)
    logs = vfs.lookup(ROOT_INODE, b"logs")
    assert stat.S_ISDIR(logs.mode) and logs.mode & 0o777 == 0o555 and logs.nlink == 2
    year = vfs.lookup(logs.inode, b"2026")
    a = vfs.lookup(year.inode, b"a")
    assert a.inode == SEGMENT_INODE_BASE + 7
    assert vfs.lookup(logs.inode, b"b").inode == SEGMENT_INODE_BASE + 9
    assert vfs.lookup(year.inode, b"..").inode == logs.inode
    assert vfs.lookup(logs.inode, b".").inode == logs.inode
    assert errno_of(vfs.lookup, logs.inode, b"nothing") == errno.ENOENT
    assert vfs.lookup(ROOT_INODE, b"..").inode == ROOT_INODE


def test_file_attributes_active_and_sealed() -> None:
    src = MemorySource()
    src.add(1, "active", b"a" * 1000)
    src.add(2, "sealed", b"s" * 513, sealed=True)
    vfs, _ = make(src)
    active = vfs.lookup(ROOT_INODE, b"active")
    assert active.mode == stat.S_IFREG | 0o444 and active.nlink == 1
    assert (active.size, active.blocks) == (1000, 2)
    assert (active.uid, active.gid) == (1234, 5678)
    assert active.mtime_ns == 2_000 * 1_000_000 and active.birthtime_ns == 1_000 * 1_000_000
    assert active.timeout == 1.0
    sealed = vfs.attributes(SEGMENT_INODE_BASE + 2)
    assert sealed.size == 513 and sealed.blocks == 2 and sealed.timeout == 300.0


def test_listing_skips_nothing_and_is_stable_across_deletes() -> None:
    src = MemorySource()
    for i in range(1, 1201):
        src.add(i, f"d/s{i:05d}", b"x")
    vfs, _ = make(src)
    d = vfs.lookup(ROOT_INODE, b"d").inode
    fh = vfs.opendir(d)
    first = list(vfs.readdir(fh, 0))[:500]
    # A segment deleted between two readdir calls is skipped, not an error,
    # and the offsets of the rest do not move.
    gone = src.by_id.pop(600)
    vfs.on_deleted(gone)
    rest = list(vfs.readdir(fh, first[-1][2]))
    names = [n for n, _, _ in first + rest]
    assert len(names) == 1199 and b"s00600" not in names
    assert names == sorted(names) and len(set(names)) == 1199
    vfs.releasedir(fh)
    assert errno_of(lambda: list(vfs.readdir(fh, 0))) == errno.EBADF
    assert errno_of(vfs.opendir, SEGMENT_INODE_BASE + 1) == errno.ENOTDIR


async def test_reads_zeros_below_start_short_at_end_and_read_ahead() -> None:
    src = MemorySource()
    chunk = ChunkRecord(name="c", start_offset=0, length=8 * MiB)
    src.add(1, "s", bytes(range(256)) * (32 * 1024), start_offset=100,
            storage_length=8 * MiB, chunks=[chunk])  # fmt: skip
    vfs, _ = make(src)
    opened = vfs.open(SEGMENT_INODE_BASE + 1, os.O_RDONLY)
    # Active: direct I/O, no page cache (the kernel may keep a zero-filled
    # last page after growth), in the trimmed view too.
    assert opened.direct_io and not opened.keep_cache
    trimmed = vfs.open(SEGMENT_INODE_BASE + 1 + TRIMMED_BASE, os.O_RDONLY)
    assert trimmed.direct_io and not trimmed.keep_cache
    vfs.release(trimmed.fh)
    head = await vfs.read(opened.fh, 0, 200)
    assert head[:100] == bytes(100) and head[100:] == bytes(range(100, 200))
    # The first read at 0 starts a sequential scan: read-ahead from there on.
    assert src.prefetched and src.prefetched[0][0] == 200
    assert await vfs.read(opened.fh, 8 * MiB - 10, 100) == bytes(range(246, 256))
    assert await vfs.read(opened.fh, 8 * MiB, 100) == b""
    # Sequential reads fetch whole blocks; a seek (no read-ahead window) only its pages.
    assert src.reads == [(0, False), (8 * MiB - 10, True)]
    vfs.release(opened.fh)
    assert vfs.statistics()["open_files"] == 0
    assert errno_of(vfs.open, SEGMENT_INODE_BASE + 1, os.O_WRONLY) == errno.EROFS
    assert errno_of(vfs.open, ROOT_INODE, os.O_RDONLY) == errno.EISDIR


@pytest.mark.expect_errors(r"read of 'broken' at offset 40")
async def test_a_tier2_failure_is_eio_with_a_log_line_naming_segment_and_offset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = MemorySource()
    src.add(1, "broken", b"x" * 100)
    vfs, _ = make(src)
    fh = vfs.open(SEGMENT_INODE_BASE + 1, os.O_RDONLY).fh
    src.fail_reads = True
    with caplog.at_level(logging.ERROR, logger="fs.vfs"), pytest.raises(FsError) as e:
        await vfs.read(fh, 40, 10)
    assert e.value.errno == errno.EIO
    assert "'broken' at offset 40" in caplog.text and "server is down" in caplog.text
    assert vfs.statistics()["read_errors"] == 1


async def test_a_deleted_segment_is_stale_for_open_handles_and_gone_by_name() -> None:
    src = MemorySource()
    seg = src.add(1, "d/x", b"abc", sealed=True)
    vfs, sent = make(src)
    d = vfs.lookup(ROOT_INODE, b"d").inode
    opened = vfs.open(SEGMENT_INODE_BASE + 1, os.O_RDONLY)
    assert opened.keep_cache
    del src.by_id[1]
    vfs.on_deleted(seg)
    with pytest.raises(FsError) as e:
        await vfs.read(opened.fh, 0, 3)
    assert e.value.errno == errno.ESTALE
    assert errno_of(vfs.attributes, SEGMENT_INODE_BASE + 1) == errno.ESTALE
    assert errno_of(vfs.lookup, ROOT_INODE, b"d") == errno.ENOENT  # emptied directory goes
    # The kernel is told to drop the name, the emptied directory, and the pages.
    assert ("entry", d, b"x", SEGMENT_INODE_BASE + 1) in sent
    assert ("entry", ROOT_INODE, b"d", d) in sent
    assert sent[-2] == ("inode", SEGMENT_INODE_BASE + 1, b"", 0)


def test_create_seal_and_truncate_reach_the_tree_and_the_kernel() -> None:
    src = MemorySource()
    vfs, sent = make(src)
    seg = src.add(3, "new", b"12345")
    assert vfs.lookup(ROOT_INODE, b"new").size == 5
    seg.sealed = True
    vfs.on_sealed(seg)
    assert sent[-2] == ("inode", SEGMENT_INODE_BASE + 3, b"", 1)  # attributes only
    seg.start_offset = 2
    vfs.on_truncated(seg)
    assert sent[-2] == ("inode", SEGMENT_INODE_BASE + 3, b"", 0)  # pages too


async def test_events_file_is_hidden_found_by_name_and_a_snapshot() -> None:
    src = MemorySource()
    src.add(5, "d/s", b"x" * 10, event_index=[0, 4])
    vfs, _ = make(src)
    d = vfs.lookup(ROOT_INODE, b"d").inode
    ev = vfs.lookup(d, b".s.events")
    assert ev.inode == EVENTS_INODE_BASE + 5 and ev.size == len(b"0\n4\n") and ev.timeout == 0
    assert b".s.events" not in [n for n, _, _ in vfs.readdir(vfs.opendir(d), 0)]
    assert errno_of(vfs.lookup, d, b".nothing.events") == errno.ENOENT
    opened = vfs.open(ev.inode, os.O_RDONLY)
    assert opened.direct_io
    src.by_id[5].event_index.append(8)  # later growth does not change an open snapshot
    assert await vfs.read(opened.fh, 0, 100) == b"0\n4\n"
    assert vfs.listxattr(ev.inode) == []


def test_xattrs_statfs() -> None:
    src = MemorySource()
    writer = b"\x09" * 16
    src.add(1, "s", b"x" * 5000, storage_length=4096, sealed=True,
            attributes={EVENT_COUNT: 7, writer: 3},
            chunks=[ChunkRecord(name="c", start_offset=0, length=4096)])  # fmt: skip
    src.add(2, "dir/t", b"")
    vfs, _ = make(src)
    inode = SEGMENT_INODE_BASE + 1
    values = {n: vfs.getxattr(inode, n) for n in vfs.listxattr(inode)}
    assert values == {
        XATTR_PREFIX + b"node": b"node-x",
        XATTR_PREFIX + b"tail_available": b"0",
        XATTR_PREFIX + b"start_offset": b"0",
        XATTR_PREFIX + b"length": b"5000",
        XATTR_PREFIX + b"storage_length": b"4096",
        XATTR_PREFIX + b"sealed": b"1",
        XATTR_PREFIX + b"event_count": b"7",
        XATTR_PREFIX + b"chunk_count": b"1",
        XATTR_PREFIX + b"writer_count": b"1",
        XATTR_PREFIX + b"view_offset": b"0",
        XATTR_PREFIX + b"codec": b"raw",
        XATTR_PREFIX + b"event_end": b"5000",
        XATTR_PREFIX + b"created_ms": b"1000",
    }
    assert vfs.getxattr(SEGMENT_INODE_BASE + 2, XATTR_PREFIX + b"node") == b"node-1"
    assert vfs.getxattr(SEGMENT_INODE_BASE + 2, XATTR_PREFIX + b"tail_available") == b"1"
    assert errno_of(vfs.getxattr, inode, b"user.other") == errno.ENODATA
    assert errno_of(vfs.getxattr, inode, XATTR_PREFIX + b"nope") == errno.ENODATA
    assert vfs.listxattr(ROOT_INODE) == []
    st = vfs.statfs()
    assert st.blocks == 2 and st.files == 2 + 2 and st.namemax == 255  # root and dir/


# -- the trimmed view's first byte (docs/FORMATS.md, "The trimmed view") ---------------

LINES = b"".join(b'{"id": %d}\n' % i for i in range(100))
#: Inside line 10 (each line of ids 10-99 is 12 bytes, of 0-9 11).
CUT = 10 * 11 + 5
#: Where line 11 starts.
NEXT_LINE = 10 * 11 + 12


def trimmed_file(vfs: SegmentVFS, name: bytes) -> int:
    return vfs.lookup(TRIMMED_ROOT, name).inode


async def read_all(vfs: SegmentVFS, inode: int) -> bytes:
    fh = vfs.open(inode, os.O_RDONLY).fh
    try:
        return bytes(await vfs.read(fh, 0, 1 << 20))
    finally:
        vfs.release(fh)


@pytest.mark.parametrize("index", [[], [900]], ids=["nothing indexed", "a later boundary"])
async def test_a_raw_segment_trimmed_starts_at_its_start_offset(index: list[int]) -> None:
    """Raw bytes: no boundary is known inside an append, so nothing past the start goes.

    One append of 100 lines, truncated inside line 10: the index knows no
    boundary at or after the start offset (or only one far on). The trimmed
    file is every byte the plain file still has, from the start offset on.
    """
    src = MemorySource()
    src.add(1, "raw", LINES, start_offset=CUT, event_index=list(index), sealed=True)
    vfs, _ = make(src)
    inode = trimmed_file(vfs, b"raw")
    await vfs.find_trim_start(inode)
    assert vfs.attributes(inode).size == len(LINES) - CUT
    assert vfs.getxattr(inode, XATTR_PREFIX + b"view_offset") == str(CUT).encode()
    assert await read_all(vfs, inode) == LINES[CUT:]
    # The plain file: the same bytes at their offsets, zeros below.
    assert await read_all(vfs, SEGMENT_INODE_BASE + 1) == bytes(CUT) + LINES[CUT:]


async def test_a_raw_segment_truncated_at_an_indexed_boundary_starts_there() -> None:
    src = MemorySource()
    src.add(1, "raw", LINES, start_offset=NEXT_LINE, event_index=[NEXT_LINE])
    vfs, _ = make(src)
    inode = trimmed_file(vfs, b"raw")
    assert await read_all(vfs, inode) == LINES[NEXT_LINE:]


@pytest.mark.parametrize("index", [[], [900]], ids=["nothing indexed", "a later boundary"])
async def test_a_lines_segment_trimmed_starts_after_the_next_newline(index: list[int]) -> None:
    """Lines: the bytes are searched for the first newline at or after the start offset."""
    src = MemorySource()
    src.add(1, "d/lines", LINES, start_offset=CUT, event_index=list(index), sealed=True,
            attributes={CODEC: Codec.LINES.number})  # fmt: skip
    vfs, _ = make(src)
    inode = trimmed_file(vfs, b"d")
    inode = vfs.lookup(inode, b"lines").inode
    await vfs.find_trim_start(inode)
    assert vfs.getxattr(inode, XATTR_PREFIX + b"view_offset") == str(NEXT_LINE).encode()
    assert vfs.attributes(inode).size == len(LINES) - NEXT_LINE
    assert await read_all(vfs, inode) == LINES[NEXT_LINE:]


async def test_a_trimmed_listing_shows_the_sizes_a_lookup_does() -> None:
    """Listings (readdirplus) give the kernel attributes it caches: found like a lookup's."""
    src = MemorySource()
    src.add(1, "d/lines", LINES, start_offset=CUT, sealed=True,
            attributes={CODEC: Codec.LINES.number})  # fmt: skip
    src.add(2, "d/raw", LINES, start_offset=CUT, sealed=True)
    vfs, _ = make(src)
    d = vfs.lookup(TRIMMED_ROOT, b"d").inode
    fh = vfs.opendir(d)
    await vfs.find_trim_starts(fh)
    sizes = {name: attrs.size for name, attrs, _ in vfs.readdir(fh, 0)}
    assert sizes == {b"lines": len(LINES) - NEXT_LINE, b"raw": len(LINES) - CUT}


@pytest.mark.expect_errors(r"where the first line of 'lines' after offset 115 starts")
async def test_a_failed_search_for_the_first_line_is_eio_not_an_empty_file() -> None:
    src = MemorySource()
    src.add(1, "lines", LINES, start_offset=CUT, sealed=True,
            attributes={CODEC: Codec.LINES.number})  # fmt: skip
    vfs, _ = make(src)
    inode = trimmed_file(vfs, b"lines")
    src.fail_reads = True
    with pytest.raises(FsError) as e:
        await vfs.find_trim_start(inode)
    assert e.value.errno == errno.EIO
    src.fail_reads = False
    await vfs.find_trim_start(inode)
    assert await read_all(vfs, inode) == LINES[NEXT_LINE:]


# -- streams: a directory from their creation to their deletion ----------------------------


def test_a_stream_shows_as_a_directory_while_it_has_no_segment() -> None:
    src = MemorySource()
    src.add_stream("old/stream")  # before the mount: listed when it starts
    vfs, sent = make(src)
    old = vfs.lookup(ROOT_INODE, b"old").inode
    stream = vfs.lookup(old, b"stream")
    assert stat.S_ISDIR(stream.mode)
    assert list(vfs.readdir(vfs.opendir(stream.inode), 0)) == []
    assert stat.S_ISDIR(vfs.lookup(vfs.lookup(TRIMMED_ROOT, b"old").inode, b"stream").mode)
    src.add_stream("new")
    new = vfs.lookup(ROOT_INODE, b"new")
    assert stat.S_ISDIR(new.mode)
    # Its segments come and go; the directory stays while the stream does.
    seg = src.add(1, "new/000000000001", b"x")
    assert [n for n, _, _ in vfs.readdir(vfs.opendir(new.inode), 0)] == [b"000000000001"]
    del src.by_id[1]
    vfs.on_deleted(seg)
    assert vfs.lookup(ROOT_INODE, b"new").inode == new.inode
    assert list(vfs.readdir(vfs.opendir(new.inode), 0)) == []
    # Deleted: gone, with the directories it leaves empty, and the kernel told.
    src.remove_stream("new")
    assert errno_of(vfs.lookup, ROOT_INODE, b"new") == errno.ENOENT
    assert ("entry", ROOT_INODE, b"new", new.inode) in sent
    assert ("entry", TRIMMED_ROOT, b"new", new.inode + TRIMMED_BASE) in sent
    src.remove_stream("old/stream")
    assert errno_of(vfs.lookup, ROOT_INODE, b"old") == errno.ENOENT
    assert ("entry", ROOT_INODE, b"old", old) in sent
