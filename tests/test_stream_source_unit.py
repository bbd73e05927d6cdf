"""The streaming ``segments`` source's offsets, decided without Spark or a mount.

`SegmentsStreamReader.latestOffset` and `partitions` over listings given by
the test (the mount's part is its xattrs, tested through a real mount in
tests/test_spark_streaming.py), and the cut helpers over local files.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from pipeline.parts import LinesPart, SegmentPart
from pipeline.stream import (
    Listed,
    SegmentsStreamReader,
    _bytes_cut,
    _count_cut,
    _last_newline_end,
)


class Listing(SegmentsStreamReader):
    """The reader over a listing the test sets, with first events at the start offset."""

    def __init__(self, path: pathlib.Path, **options: str) -> None:
        super().__init__({"path": str(path), **options})
        self.now: list[Listed] = []

    def list(self, done: dict[str, int] | None = None) -> list[Listed]:
        return [Listed(s.name, s.file, s.created, s.sealed, s.start_offset, s.end, s.codec)
                for s in self.now]  # fmt: skip

    def _first(self, seg: Listed) -> int:
        return seg.start_offset


def seg(name: str, end: int, created: int = 1, sealed: bool = False, start: int = 0) -> Listed:
    return Listed(name, f"/nowhere/{name}", created, sealed, start, end, "lines")


def test_bad_options_are_refused_clearly(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="give a path"):
        SegmentsStreamReader({})
    with pytest.raises(ValueError, match="codec must be framed or lines"):
        SegmentsStreamReader({"path": str(tmp_path), "codec": "csv"})
    with pytest.raises(ValueError, match="startingOffsets"):
        SegmentsStreamReader({"path": str(tmp_path), "startingOffsets": "middle"})
    with pytest.raises(ValueError, match="not both"):
        SegmentsStreamReader(
            {"path": str(tmp_path), "maxBytesPerTrigger": "1m", "maxEventsPerTrigger": "5"}
        )
    r = SegmentsStreamReader({"path": str(tmp_path), "maxBytesPerTrigger": "1m"})
    assert r.getDefaultReadLimit() == ReadMaxBytes(1 << 20)


def test_offsets_follow_growth_new_sealed_truncated_and_deleted_segments(
    tmp_path: pathlib.Path,
) -> None:
    r = Listing(tmp_path)
    all_ = ReadAllAvailable()
    start = r.initialOffset()
    assert start == {"segments": {}, "done": {}}
    r.now = [seg("s/1", 100)]
    o1 = r.latestOffset(start, all_)
    assert o1["segments"]["s/1"] == {"c": 1, "from": 0, "at": 100, "k": "lines"}
    # Nothing new: the same offset, so Spark runs no batch.
    assert r.latestOffset(o1, all_) is o1
    # Growth, and a successor; the first one sealed at 150.
    r.now = [seg("s/1", 150, sealed=True), seg("s/2", 40, created=2)]
    o2 = r.latestOffset(o1, all_)
    assert o2["segments"]["s/1"] == {"c": 1, "from": 100, "at": 150, "k": "lines", "sealed": True}
    assert o2["segments"]["s/2"]["from"] == 0 and o2["done"] == {"s/1": 1}
    parts = r.partitions(o1, o2)
    assert {(p.segment, p.start) for p in parts} == {("s/1", 100), ("s/2", 0)}
    assert all(isinstance(p, LinesPart) for p in parts)
    assert all(p.direct == (not p.sealed) for p in parts)  # type: ignore[attr-defined]
    # Finished: not read again, dropped from the working set.
    r.now = [seg("s/1", 150, sealed=True), seg("s/2", 60, created=2)]
    o3 = r.latestOffset(o2, all_)
    assert "s/1" not in o3["segments"] and o3["done"] == {"s/1": 1}
    assert [(p.segment, p.start, p.end) for p in r.partitions(o2, o3)] == [("s/2", 40, 60)]
    # Truncated past the position: goes on from the new start.
    r.now = [seg("s/1", 150, sealed=True), seg("s/2", 90, created=2, start=80)]
    o4 = r.latestOffset(o3, all_)
    assert o4["segments"]["s/2"]["from"] == 80 and o4["segments"]["s/2"]["at"] == 90
    # Deleted (retention): dropped from both.
    r.now = [seg("s/2", 95, created=2, start=80)]
    o5 = r.latestOffset(o4, all_)
    assert o5["done"] == {} and list(o5["segments"]) == ["s/2"]
    # Deleted and created again under the same name: another segment, from its start.
    r.now = [seg("s/2", 10, created=3)]
    o6 = r.latestOffset(o5, all_)
    assert o6["segments"]["s/2"] == {"c": 3, "from": 0, "at": 10, "k": "lines"}


def test_latest_starts_at_the_end_of_what_is_there(tmp_path: pathlib.Path) -> None:
    r = Listing(tmp_path, startingOffsets="latest")
    r.now = [seg("a", 100), seg("b", 50, created=2, sealed=True)]
    start = r.initialOffset()
    assert start["done"] == {"b": 2} and start["segments"]["a"]["at"] == 100
    r.now = [seg("a", 130), seg("b", 50, created=2, sealed=True)]
    end = r.latestOffset(start, ReadAllAvailable())
    assert [(p.segment, p.start, p.end) for p in r.partitions(start, end)] == [("a", 100, 130)]


def test_limits_cut_at_event_boundaries_oldest_first(tmp_path: pathlib.Path) -> None:
    lines = b"".join(b"event %03d\n" % i for i in range(100))  # 10 bytes each
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(lines)
    r = Listing(tmp_path)
    r.now = [
        Listed("a", str(tmp_path / "a"), 1, False, 0, 1000, "lines"),
        Listed("b", str(tmp_path / "b"), 2, False, 0, 1000, "lines"),
    ]
    o = r.latestOffset(r.initialOffset(), ReadMaxRows(25))
    assert o["segments"]["a"]["at"] == 250 and o["segments"]["b"]["at"] == 0
    o = r.latestOffset(o, ReadMaxBytes(995))
    assert o["segments"]["a"]["at"] == 1000 and o["segments"]["b"]["at"] == 240
    assert _last_newline_end(str(tmp_path / "a"), 0, 995) == 990
    assert _count_cut(str(tmp_path / "a"), "lines", 10, 1000, 3) == (40, 3)
    assert _bytes_cut(str(tmp_path / "a"), "lines", 0, 1000, 5) == 10  # one event at least


def test_framed_ranges_cut_at_indexed_boundaries(tmp_path: pathlib.Path) -> None:
    frame = (4).to_bytes(4, "big") + b"abcd"
    (tmp_path / "f").write_bytes(frame * 10)
    assert _count_cut(str(tmp_path / "f"), "framed", 0, 80, 3) == (24, 3)
    # No index entries between: the frames are walked up to the budget.
    assert _bytes_cut(str(tmp_path / "f"), "framed", 8, 80, 20) == 24
    assert _bytes_cut(str(tmp_path / "f"), "framed", 8, 80, 3) == 16  # one event at least
    r: Any = Listing(tmp_path, splitSize="16", minPartitions="1")
    end = {"segments": {"f": {"c": 1, "from": 0, "at": 80, "k": "framed"}}, "done": {}}
    parts = r.partitions({}, end)
    assert [(p.start, p.end) for p in parts] == [(0, 80)]  # no index: one part
    assert isinstance(parts[0], SegmentPart)
