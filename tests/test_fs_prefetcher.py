"""The per-handle prefetcher (fs/prefetcher.py) over a recording reader."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from fs.prefetcher import INITIAL_WINDOW, Prefetcher
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.chunks import ChunkReader
from gateway.read.index import SegmentView

MiB = 1024 * 1024
REQUEST = 128 * 1024


class Recorder:
    """Stands in for ChunkReader.prefetch: notes the ranges asked for."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def prefetch(self, chunks: Sequence[ChunkRecord], start: int, stop: int) -> int:
        self.ranges.append((start, stop))
        return 1


def setup(max_window: int = 32 * MiB) -> tuple[Prefetcher, Recorder]:
    rec = Recorder()
    return Prefetcher(cast(ChunkReader, cast(Any, rec)), max_window), rec


def view(stored: int) -> SegmentView:
    chunk = ChunkRecord(name="c", start_offset=0, length=stored)
    return SegmentView(1, "s", 0, stored, True, stored, [chunk])


def test_sequential_reader_window_doubles_up_to_the_maximum() -> None:
    p, rec = setup()
    seg = view(1 << 40)
    for i in range(2000):
        p.on_read(seg, i * REQUEST, REQUEST)
    # Contiguous, never overlapping, starting right after the first read.
    assert rec.ranges[0] == (REQUEST, REQUEST + INITIAL_WINDOW)
    for (_, stop), (start, _) in zip(rec.ranges, rec.ranges[1:], strict=False):
        assert start == stop
    # The window doubled from 1.125 MiB and stopped at the maximum.
    assert p.window == 32 * MiB
    sizes = [stop - start for start, stop in rec.ranges]
    assert sizes[0] < sizes[1] < sizes[2] and max(sizes) <= 32 * MiB
    # The reader is never more than a window behind what is scheduled.
    assert p.ahead_until - 2000 * REQUEST <= 32 * MiB


def test_random_reader_prefetches_nothing() -> None:
    p, rec = setup()
    seg = view(1 << 30)
    for offset in (5 * MiB, 100 * MiB, 7, 900 * MiB, 3 * MiB):
        assert p.on_read(seg, offset, 4096) == 0
    assert rec.ranges == []


def test_a_seek_resets_the_window() -> None:
    p, rec = setup()
    seg = view(1 << 30)
    for i in range(100):
        p.on_read(seg, i * REQUEST, REQUEST)
    assert p.window > INITIAL_WINDOW
    p.on_read(seg, 500 * MiB, REQUEST)  # a seek
    assert p.window == 0
    rec.ranges.clear()
    p.on_read(seg, 500 * MiB + REQUEST, REQUEST)  # sequential again: starts small
    assert rec.ranges == [(500 * MiB + 2 * REQUEST, 500 * MiB + 2 * REQUEST + INITIAL_WINDOW)]


def test_only_bytes_in_tier2_are_prefetched() -> None:
    p, rec = setup()
    seg = view(3 * MiB)
    for i in range(64):
        p.on_read(seg, i * REQUEST, REQUEST)
    assert rec.ranges and all(stop <= 3 * MiB for _, stop in rec.ranges)
    rec.ranges.clear()
    p2, rec2 = setup()
    nothing_stored = SegmentView(1, "s", 0, 10 * MiB, False, 0, [])
    for i in range(10):
        p2.on_read(nothing_stored, i * REQUEST, REQUEST)
    assert rec2.ranges == []


def test_no_read_ahead_configured() -> None:
    p, rec = setup(max_window=0)
    seg = view(1 << 30)
    for i in range(10):
        p.on_read(seg, i * REQUEST, REQUEST)
    assert rec.ranges == []
