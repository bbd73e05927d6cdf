"""Event codecs: where a segment's events end, and the views of the mount that use it.

The container (on a journal and a cache in memory) keeps a ``lines``
segment's last complete line and refuses raw appends to a ``framed`` one
that are not whole frames; the mount's core (fs/vfs.py, no FUSE) shows an
active lines segment ending at its last newline, and the ``.trimmed`` view
starting at the first event at or after the start offset. The same through
a real mount, read by pandas, pyarrow, DuckDB and Spark, is in
tests/test_parseable_files.py.
"""

from __future__ import annotations

import struct

import pytest

from fs.tree import ROOT_INODE, SEGMENT_INODE_BASE
from fs.vfs import TRIMMED_BASE, TRIMMED_ROOT, XATTR_PREFIX, FsError, SegmentVFS
from gateway.config import FuseConfig
from gateway.errors import BadRequest, InvalidName
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.codec import Codec, lines_end, whole_frames
from tests.helpers.container import DirectContainer
from tests.test_container_unit import make, restart
from tests.test_fs_vfs import MemorySource

CONFIG = FuseConfig(active_timeout=1.0, sealed_timeout=300.0)


def frame(event: bytes) -> bytes:
    return struct.pack(">I", len(event)) + event


class ContainerSource(MemorySource):
    """The mount's source over a real container (committed views, its read index)."""

    def __init__(self, c: DirectContainer) -> None:
        super().__init__()
        self.c = c

    def segments(self):  # type: ignore[no-untyped-def]
        return self.c.segments()

    def totals(self) -> tuple[int, int]:
        return self.c.total_blocks, self.c.segment_count

    def segment_by_id(self, segment_id: int):  # type: ignore[no-untyped-def]
        return self.c.segment_by_id(segment_id)

    async def read(self, seg, offset, size):  # type: ignore[no-untyped-def]
        return await self.c.read_index.read_buffer(seg, offset, size, read_ahead=False)


def test_codec_helpers() -> None:
    assert lines_end(10, b"ab\ncd", 3) == 13
    assert lines_end(10, b"ab\n", 3) == 13
    assert lines_end(10, b"abc", 3) == 3
    assert lines_end(0, b"", 7) == 7
    assert whole_frames(frame(b"x") * 3 + frame(b"")) == ""
    assert "1 more byte" in whole_frames(frame(b"xy")[:-1])
    assert "not a whole 4-byte length" in whole_frames(frame(b"") + b"\0\0")
    assert Codec.from_number(Codec.LINES.number) is Codec.LINES
    assert Codec.from_number(99) is Codec.RAW


async def test_a_lines_segment_ends_at_its_last_newline_while_active() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("log", codec=Codec.LINES)
    await c.append("log", b'{"a":1}\n{"a":2')  # a raw append that cut a line
    seg = c._committed("log")
    assert seg.codec is Codec.LINES and seg.length == 14 and seg.event_end == 8
    await c.append("log", b'}\n{"a":3}\n{"a"')
    assert seg.event_end == 24
    # The event index holds only offsets where a line starts.
    assert seg.event_index == [0]
    # The same after a restart (the end is journaled with the append).
    again = restart(journal)
    assert again._committed("log").event_end == 24
    await c.seal("log")
    assert seg.event_end == seg.length == 28  # sealed: the last line is whole
    # A raw segment ends at its length, whatever its bytes.
    await c.create("raw")
    await c.append("raw", b"no newline")
    assert c._committed("raw").event_end == 10


async def test_a_framed_segment_refuses_raw_appends_that_are_not_whole_frames() -> None:
    c = make()
    await c.create("f", codec=Codec.FRAMED)
    await c.append("f", frame(b"one") + frame(b"two"))
    with pytest.raises(BadRequest, match="not whole events"):
        await c.append("f", frame(b"three")[:-2])
    assert c._committed("f").length == 14  # nothing of the refused append landed
    # An exactly-once writer's appends are its own whole frames: not walked.
    await c.append("f", frame(b"w"), writer_id=b"\x05" * 16, event_number=1)
    assert c._committed("f").length == 19


async def test_trimmed_is_not_a_name_for_segments() -> None:
    c = make()
    with pytest.raises(InvalidName, match="trimmed view"):
        await c.create(".trimmed/x")
    with pytest.raises(InvalidName, match="trimmed view"):
        await c.create_stream(".trimmed")


async def test_the_trimmed_view_starts_at_the_first_line_after_the_start_offset() -> None:
    c = make()
    await c.create("d/log", codec=Codec.LINES)
    await c.append("d/log", b"first line\nsecond line\nthird")
    vfs = SegmentVFS(ContainerSource(c), CONFIG, read_ahead=0, owner=(0, 0))
    plain = SEGMENT_INODE_BASE + c._committed("d/log").id
    # The plain view: the whole length but the cut line.
    assert vfs.attributes(plain).size == len(b"first line\nsecond line\n")
    # The trimmed view: the same while nothing is truncated.
    d = vfs.lookup(TRIMMED_ROOT, b"d")
    assert d.inode >= TRIMMED_BASE
    t = vfs.lookup(d.inode, b"log")
    assert t.inode == plain + TRIMMED_BASE and t.size == 23
    # Truncated mid-line: the trimmed file starts at the next whole line.
    await c.truncate("d/log", 3)
    await vfs.find_trim_start(t.inode)
    t = vfs.attributes(t.inode)
    assert t.size == len(b"second line\n")
    opened = vfs.open(t.inode, 0)
    assert bytes(await vfs.read(opened.fh, 0, 100)) == b"second line\n"
    assert vfs.getxattr(t.inode, XATTR_PREFIX + b"view_offset") == b"11"
    # The plain view keeps offsets: zeros below the start offset.
    p = vfs.open(plain, 0)
    assert bytes(await vfs.read(p.fh, 0, 12)) == b"\0\0\0st line\ns"
    assert vfs.getxattr(plain, XATTR_PREFIX + b"view_offset") == b"0"
    # The rest of the cut line arrives: both views grow to it.
    await c.append("d/log", b" line\n")
    assert vfs.attributes(t.inode).size == len(b"second line\nthird line\n")
    # Listing the trimmed root lists the tree; `.events` files are the plain view's only.
    fh = vfs.opendir(TRIMMED_ROOT)
    assert [n for n, _, _ in vfs.readdir(fh, 0)] == [b"d"]
    with pytest.raises(FsError):
        vfs.lookup(d.inode, b".log.events")
    assert vfs.lookup(d.inode, b"..").inode == TRIMMED_ROOT
    assert vfs.lookup(TRIMMED_ROOT, b"..").inode == ROOT_INODE
    # The root does not list it.
    fh = vfs.opendir(ROOT_INODE)
    assert [n for n, _, _ in vfs.readdir(fh, 0)] == [b"d"]


async def test_a_truncation_at_an_indexed_boundary_keeps_that_event() -> None:
    c = make()
    await c.create("f", codec=Codec.FRAMED)
    await c.append("f", frame(b"a" * 10))
    await c.append("f", frame(b"b" * 10))
    await c.truncate("f", 14)  # an append boundary: the index says so
    vfs = SegmentVFS(ContainerSource(c), CONFIG, read_ahead=0, owner=(0, 0))
    t = vfs.lookup(TRIMMED_ROOT, b"f")
    opened = vfs.open(t.inode, 0)
    assert bytes(await vfs.read(opened.fh, 0, 100)) == frame(b"b" * 10)


async def test_a_truncation_inside_an_event_indexes_the_next_one() -> None:
    c = make()
    await c.create("f", codec=Codec.FRAMED)
    for i in range(5):
        await c.append("f", frame(b"%d" % i * 10))
    await c.truncate("f", 14 * 2 + 3)
    assert c._committed("f").event_index == [14 * 3]
    await c.create("l", codec=Codec.LINES)
    await c.append("l", b"aaaa\nbb")
    await c.append("l", b"bb\ncccc\n")
    await c.truncate("l", 6)  # inside "bbbb": the next line starts at 10
    assert c._committed("l").event_index == [10]


async def test_an_o_direct_open_is_served_as_direct_io() -> None:
    """What the streaming source's executors use: reads not cut at the kernel's cached size."""
    import os

    c = make()
    await c.create("s")
    await c.append("s", b"abc")
    await c.seal("s")
    vfs = SegmentVFS(ContainerSource(c), CONFIG, read_ahead=0, owner=(0, 0))
    inode = SEGMENT_INODE_BASE + c._committed("s").id
    plain = vfs.open(inode, 0)
    assert plain.keep_cache and not plain.direct_io
    direct = vfs.open(inode, os.O_DIRECT)
    assert direct.direct_io and not direct.keep_cache
    assert vfs.open(inode + TRIMMED_BASE, os.O_DIRECT).direct_io
