"""`fs.passthrough.Passthrough` alone: io modes per inode, the fallback, the file trigger.

A unit test of one layer: the kernel's backing-file calls are stand-ins
that record what they were asked (or refuse like a kernel without the
capability), the segment source is a dict of bytes; the segment files are
the real store in a temporary directory. The same paths on a real mount
are in test_fs_passthrough.py.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib

import pytest
import trio
import trio.testing

from cache.segment_files import SegmentFiles
from fs.passthrough import Passthrough
from fs.segment_source import file_key
from fs.vfs import Opened
from gateway.buffers import Buffer
from gateway.container.segment import Segment
from gateway.read.index import SegmentView
from tests.helpers.wait import async_wait_for

pytestmark = pytest.mark.timeout(30)

MiB = 1024 * 1024
INODE = 1_000


class Source:
    """Sealed segments as bytes (what `Passthrough` asks of a `SegmentSource`)."""

    def __init__(self) -> None:
        self.segments: dict[int, Segment] = {}
        self.data: dict[int, bytes] = {}
        self.bytes_read = 0

    def add(self, segment_id: int, data: bytes) -> Segment:
        seg = Segment(segment_id, f"s{segment_id}", created_at_ms=1_000)
        seg.length, seg.sealed = len(data), True
        self.segments[segment_id], self.data[segment_id] = seg, data
        return seg

    def segment_by_id(self, segment_id: int) -> Segment | None:
        return self.segments.get(segment_id)

    async def read(self, view: SegmentView, offset: int, size: int) -> Buffer:
        self.bytes_read += size
        return self.data[view.id][offset : offset + size]


class Kernel:
    """FUSE_DEV_IOC_BACKING_OPEN / _CLOSE: ids handed out and closed, or a refusal."""

    def __init__(self, refuse: int = 0) -> None:
        self.refuse = refuse
        self.attempts = 0
        self.opened: list[int] = []
        self.closed: list[int] = []

    def backing_open(self, fd: int) -> int:
        os.fstat(fd)  # a real descriptor of the segment file
        self.attempts += 1
        if self.refuse:
            raise OSError(self.refuse, os.strerror(self.refuse))
        self.opened.append(len(self.opened) + 7)
        return self.opened[-1]

    def backing_close(self, backing_id: int) -> None:
        self.closed.append(backing_id)


def passthrough(tmp_path: pathlib.Path, kernel: Kernel) -> tuple[Passthrough, Source]:
    files = SegmentFiles(tmp_path / "segment-files", 64 * MiB)
    files.start()
    source = Source()
    p = Passthrough(source, files, kernel.backing_open, kernel.backing_close)  # type: ignore[arg-type]
    p.active = True  # as after an INIT that granted passthrough
    return p, source


async def with_file(p: Passthrough, seg: Segment, source: Source) -> None:
    """Make ``seg``'s segment file (as the background maker would)."""
    key = file_key(seg)
    assert key is not None

    async def read(offset: int, size: int) -> Buffer:
        return await source.read(seg.view(), offset, size)

    assert await p.files.make(key, read)


def cached(fh: int) -> Opened:
    """The daemon's answer for an open of a sealed segment."""
    return Opened(fh, keep_cache=True)


async def test_a_refused_backing_file_turns_passthrough_off_once(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EPERM from the kernel: the open is served by the daemon, one warning, no retry."""
    kernel = Kernel(refuse=errno.EPERM)
    p, source = passthrough(tmp_path, kernel)
    seg = source.add(1, b"x" * 5000)
    await with_file(p, seg, source)
    with caplog.at_level(logging.WARNING, logger="fs.passthrough"):
        first = p.open(INODE, seg, cached(1))
        second = p.open(INODE, seg, cached(2))
    assert first == cached(1) and second == cached(2), "the daemon's own answers"
    assert p.active is False
    assert kernel.attempts == 1, "the second open did not try again"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "passthrough is off" in warnings[0].getMessage()
    assert "CAP_SYS_ADMIN" in warnings[0].getMessage()
    assert p.statistics()["passthrough_opens"] == 0
    for fh in (1, 2):
        p.release(fh)
    assert kernel.closed == []


async def test_eloop_names_the_stacked_file_system(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ELOOP (overlayfs under the data directory): the same fallback, the cause named."""
    p, source = passthrough(tmp_path, Kernel(refuse=errno.ELOOP))
    seg = source.add(1, b"y" * 100)
    await with_file(p, seg, source)
    with caplog.at_level(logging.WARNING, logger="fs.passthrough"):
        assert p.open(INODE, seg, cached(1)) == cached(1)
    assert not p.active
    assert "stacked file system" in caplog.records[-1].getMessage()


async def test_cached_opens_hold_an_inode_until_released(tmp_path: pathlib.Path) -> None:
    """A cached open blocks passthrough for its inode; later opens share one backing id,
    closed with the last of them; a direct-I/O open of a held inode joins it."""
    kernel = Kernel()
    p, source = passthrough(tmp_path, kernel)
    seg = source.add(1, b"z" * 3000)
    assert p.open(INODE, seg, cached(1)) == cached(1)  # no file yet
    await with_file(p, seg, source)
    assert p.open(INODE, seg, cached(2)) == cached(2), "joins the cached mode"
    assert kernel.opened == []
    p.release(1)
    assert p.open(INODE, seg, cached(3)) == cached(3), "one cached open is still held"
    p.release(2)
    p.release(3)

    a = p.open(INODE, seg, cached(4))
    b = p.open(INODE, seg, cached(5))
    direct = p.open(INODE, seg, Opened(6, direct_io=True))
    assert (a.backing_id, b.backing_id, direct.backing_id) == (7, 7, 7)
    assert kernel.opened == [7], "one backing id per inode"
    assert p.statistics()["backing_ids"] == 1
    p.release(4)
    p.release(6)
    assert kernel.closed == []
    p.release(5)
    assert kernel.closed == [7], "closed with the inode's last passthrough open"
    assert p.statistics()["backing_ids"] == 0
    assert p.statistics()["passthrough_opens"] == 3
    # The inode is free again: a new open takes a new backing id.
    assert p.open(INODE, seg, cached(8)).backing_id == 8


async def test_a_file_is_asked_for_once_the_segment_was_served_in_full(
    tmp_path: pathlib.Path,
) -> None:
    """Bytes served count across opens; zeros below the start offset do not; a
    truncation starts the count again; the file is then made from the read path."""
    kernel = Kernel()
    p, source = passthrough(tmp_path, kernel)
    data = bytes(range(256)) * (4 * MiB // 256)
    seg = source.add(1, data)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.run)
        p.open(INODE, seg, cached(1))
        p.served(1, 0, 128 * 1024)
        p.release(1)
        p.open(INODE, seg, cached(2))
        p.served(2, 2 * MiB, 2 * MiB)
        await trio.testing.wait_all_tasks_blocked()
        assert p.statistics()["segment_files_requested"] == 0, "part of it only"

        # Truncated to 1 MiB: what was served counted for other bytes.
        seg.start_offset = 1 * MiB
        p.on_truncated(seg)
        p.served(2, 1 * MiB, 3 * MiB)  # the old handle counts toward the old file only
        p.open(INODE, seg, cached(3))
        p.served(3, 0, 1 * MiB + 4096)  # zeros, and 4 KiB of data
        p.served(3, 1 * MiB + 4096, 2 * MiB)
        await trio.testing.wait_all_tasks_blocked()
        assert p.statistics()["segment_files_requested"] == 0
        p.served(3, 3 * MiB + 4096, 1 * MiB)  # past the end counts only to it
        # The file is written in worker threads: nothing to wait on but the count.
        await async_wait_for(lambda: p.statistics()["segment_files_made"], 10, "the file")
        stats = p.statistics()
        assert (stats["segment_files_requested"], stats["segment_files_made"]) == (1, 1)
        nursery.cancel_scope.cancel()
    key = file_key(seg)
    assert key is not None and key.start_offset == 1 * MiB
    made = (tmp_path / "segment-files" / key.name).read_bytes()
    assert made == bytes(MiB) + data[MiB:]
    assert source.bytes_read == 3 * MiB, "only the segment's bytes, read once"
    # The next open of the inode (the cached one released) is a passthrough one.
    p.release(2)
    p.release(3)
    assert p.open(INODE, seg, cached(4)).backing_id == 7


async def test_served_bytes_are_counted_for_a_bounded_number_of_segments(
    tmp_path: pathlib.Path,
) -> None:
    """Segments read in part take no memory for ever: past `COUNTED` segments the
    least recently read one's count is dropped (its file only comes later)."""
    from fs import passthrough as module

    p, source = passthrough(tmp_path, Kernel())
    n = module.COUNTED + 10
    for i in range(1, n + 1):
        seg = source.add(i, b"x" * 100)
        p.open(INODE + i, seg, cached(i))
        p.served(i, 0, 60)
        p.release(i)
    assert len(p._served) == module.COUNTED
    # The first ten were dropped: 60 more bytes are not the whole of segment 1.
    p.open(INODE + 1, source.segments[1], cached(n + 1))
    p.served(n + 1, 40, 60)
    assert p.statistics()["segment_files_requested"] == 0
    # The last one kept its count: its other 40 bytes make it whole.
    p.open(INODE + n, source.segments[n], cached(n + 2))
    p.served(n + 2, 60, 40)
    assert p.statistics()["segment_files_requested"] == 1


async def test_a_file_is_made_only_once_reads_pause(tmp_path: pathlib.Path) -> None:
    """The copy waits for `QUIET` seconds without a daemon read (a query reading its
    other segments keeps it back), then happens."""
    from fs import passthrough as module

    p, source = passthrough(tmp_path, Kernel())
    whole = source.add(1, b"w" * MiB)
    other = source.add(2, b"o" * MiB)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.run)
        p.open(INODE + 1, whole, cached(1))
        p.open(INODE + 2, other, cached(2))
        p.served(1, 0, MiB)
        assert p.statistics()["segment_files_requested"] == 1
        # Another segment is being read, a read every 0.2 s, for 3 x QUIET.
        reading_until = trio.current_time() + 3 * module.QUIET
        offset = 0
        while trio.current_time() < reading_until:
            p.served(2, offset, 4096)
            offset += 4096
            await trio.sleep(module.QUIET / 5)
        assert p.statistics()["segment_files_made"] == 0, "made while reads went on"
        await async_wait_for(lambda: p.statistics()["segment_files_made"], 10, "the file")
        nursery.cancel_scope.cancel()
    key = file_key(whole)
    assert key is not None
    assert (tmp_path / "segment-files" / key.name).read_bytes() == b"w" * MiB
