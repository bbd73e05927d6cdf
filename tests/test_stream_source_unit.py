"""The streaming ``segments`` source's offsets, decided without Spark or a mount.

`SegmentsStreamReader.latestOffset` and `partitions` over listings given by
the test (the mount's part is its xattrs, tested through a real mount in
tests/test_spark_streaming.py), and the cut helpers over local files; what a
mount that cannot be read, or shows less than before, does to the offsets
(tests/test_spark_streaming_restarts.py kills a real gateway under a query).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import pathlib
import time
from collections.abc import Mapping
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from pipeline import stream
from pipeline.parts import LinesPart, MountUnavailable, SegmentPart, check_mount
from pipeline.stream import (
    Listed,
    SegmentsStreamReader,
    _bytes_cut,
    _count_cut,
    _last_newline_end,
)


class Listing(SegmentsStreamReader):
    """The reader over a listing the test sets, with first events at the start offset.

    ``now`` is what the mount shows; an exception in it is raised instead
    (a mount that cannot be read), once per listing, in order.
    """

    def __init__(self, path: pathlib.Path, **options: str) -> None:
        super().__init__({"path": str(path), **options})
        self._root = str(path)
        self.now: list[Listed] = []
        self.failures: list[OSError] = []
        self.listings = 0

    def list(self, done: Mapping[str, tuple[int, str]] | None = None) -> list[Listed]:
        self.listings += 1
        if self.failures:
            raise self.failures.pop(0)
        return [dataclasses.replace(s) for s in self.now]

    def _first(self, seg: Listed) -> int:
        return seg.start_offset


def seg(
    name: str, end: int, created: int = 1, sealed: bool = False, start: int = 0, node: str = "n1"
) -> Listed:
    return Listed(name, f"/nowhere/{name}", created, sealed, start, end, "lines", node)


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
    assert o1["segments"]["s/1"] == {"c": 1, "from": 0, "at": 100, "k": "lines", "n": "n1"}
    # Nothing new: the same offset, so Spark runs no batch.
    assert r.latestOffset(o1, all_) is o1
    # Growth, and a successor; the first one sealed at 150.
    r.now = [seg("s/1", 150, sealed=True), seg("s/2", 40, created=2)]
    o2 = r.latestOffset(o1, all_)
    assert o2["segments"]["s/1"] == {
        "c": 1, "from": 100, "at": 150, "k": "lines", "n": "n1", "sealed": True
    }  # fmt: skip
    assert o2["segments"]["s/2"]["from"] == 0 and o2["done"] == {"s/1": [1, "n1"]}
    parts = r.partitions(o1, o2)
    assert {(p.segment, p.start) for p in parts} == {("s/1", 100), ("s/2", 0)}
    assert all(isinstance(p, LinesPart) for p in parts)
    assert all(p.direct == (not p.sealed) for p in parts)  # type: ignore[attr-defined]
    # Finished: not read again, dropped from the working set.
    r.now = [seg("s/1", 150, sealed=True), seg("s/2", 60, created=2)]
    o3 = r.latestOffset(o2, all_)
    assert "s/1" not in o3["segments"] and o3["done"] == {"s/1": [1, "n1"]}
    assert [(p.segment, p.start, p.end) for p in r.partitions(o2, o3)] == [("s/2", 40, 60)]
    # Truncated past the position: goes on from the new start.
    r.now = [seg("s/1", 150, sealed=True), seg("s/2", 90, created=2, start=80)]
    o4 = r.latestOffset(o3, all_)
    assert o4["segments"]["s/2"]["from"] == 80 and o4["segments"]["s/2"]["at"] == 90
    # Deleted (retention: a newer segment of its node is still there): dropped from both.
    r.now = [seg("s/2", 95, created=2, start=80)]
    o5 = r.latestOffset(o4, all_)
    assert o5["done"] == {} and list(o5["segments"]) == ["s/2"]
    # Deleted and created again under the same name: another segment, from its start.
    r.now = [seg("s/2", 10, created=3)]
    o6 = r.latestOffset(o5, all_)
    assert o6["segments"]["s/2"] == {"c": 3, "from": 0, "at": 10, "k": "lines", "n": "n1"}


def test_latest_starts_at_the_end_of_what_is_there(tmp_path: pathlib.Path) -> None:
    r = Listing(tmp_path, startingOffsets="latest")
    r.now = [seg("a", 100), seg("b", 50, created=2, sealed=True)]
    start = r.initialOffset()
    assert start["done"] == {"b": [2, "n1"]} and start["segments"]["a"]["at"] == 100
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


def read_all(r: Listing, *segments: Listed) -> dict[str, Any]:
    """The offset after a batch that read ``segments`` to their ends."""
    r.now = list(segments)
    return r.latestOffset(r.initialOffset(), ReadAllAvailable())


def test_a_mount_that_is_down_or_back_empty_forgets_no_segment(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway restarting: ENOTCONN, then an empty directory, then the whole view again."""
    r = Listing(tmp_path, mountTimeout="3s")
    all_ = ReadAllAvailable()
    members = [seg("s/1", 100, 1, True), seg("s/2", 100, 2, True), seg("s/3", 250, 3)]
    o1 = read_all(r, *members)
    members[2] = seg("s/3", 300, 3)
    r.now = members
    o2 = r.latestOffset(o1, all_)  # s/1 and s/2 finished: only their names are kept
    assert o2["done"] == {"s/1": [1, "n1"], "s/2": [2, "n1"]} and list(o2["segments"]) == ["s/3"]
    # Down (the dead mount answers ENOTCONN, then EIO), back within the wait, grown:
    # the batch waits for it and goes on where it was.
    r.failures = [MountUnavailable(errno.ENOTCONN, "no"), OSError(errno.EIO, "Input/output")]
    r.now = [*members[:2], seg("s/3", 350, 3)]
    r.listings = 0
    o3 = r.latestOffset(o2, all_)
    assert r.listings == 3
    assert o3["segments"]["s/3"]["from"] == 300 and o3["segments"]["s/3"]["at"] == 350
    assert o3["done"] == o2["done"]
    # Back, but empty (a plain directory before the new mount, or not yet
    # listed): nothing is taken for deleted, and no batch runs.
    r.now = []
    assert r.latestOffset(o3, all_) is o3
    assert "not shown by the mount" in caplog.text and "was deleted;" not in caplog.text
    # The whole view again: read on from where it was, nothing read twice.
    r.now = [*members[:2], seg("s/3", 400, 3)]
    o4 = r.latestOffset(o3, all_)
    assert o4["segments"] == {"s/3": {"c": 3, "from": 350, "at": 400, "k": "lines", "n": "n1"}}
    assert o4["done"] == o2["done"]
    # Down for longer than mountTimeout: the batch fails, saying so; the
    # offset it started from still has everything.
    r.failures = [MountUnavailable(errno.ENOTCONN, "no segment-gateway mount")] * 100
    began = time.monotonic()
    with pytest.raises(MountUnavailable, match="nothing was taken for deleted"):
        r.latestOffset(o4, all_)
    assert 3 <= time.monotonic() - began < 30
    # An error no wait cures is raised at once.
    r.failures = [PermissionError(errno.EACCES, "Permission denied")]
    began = time.monotonic()
    with pytest.raises(MountUnavailable, match="Permission denied"):
        r.latestOffset(o4, all_)
    assert time.monotonic() - began < 1


def test_a_segment_leaves_the_offset_only_when_its_deletion_is_proven(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = Listing(tmp_path)
    all_ = ReadAllAvailable()
    a = seg("d/a", 50, 1, True)
    b = seg("d/b", 70, 5, node="n2")  # another node's segment in the same directory
    o = r.latestOffset(read_all(r, a, b), all_)
    assert o["done"] == {"d/a": [1, "n1"]}
    # Only n2's segments shown (this node's view of n1 not there yet):
    # a newer segment of another node proves nothing.
    r.now = [seg("d/b", 80, 5, node="n2")]
    o = r.latestOffset(o, all_)
    assert o["done"] == {"d/a": [1, "n1"]} and o["segments"]["d/b"]["at"] == 80
    # A newer segment of n1 and no d/a: retention, or a delete. Dropped.
    r.now = [seg("d/b", 80, 5, node="n2"), seg("d/c", 10, 6)]
    o = r.latestOffset(o, all_)
    assert o["done"] == {} and o["segments"]["d/c"] == {
        "c": 6, "from": 0, "at": 10, "k": "lines", "n": "n1"
    }  # fmt: skip
    # The newest segment of its node gone, nothing newer: kept, unread.
    r.now = [seg("d/b", 80, 5, node="n2")]
    caplog.clear()
    assert r.latestOffset(o, all_) is o
    assert "d/c is not shown by the mount" in caplog.text
    kept = r.latestOffset(o, all_)
    assert kept["segments"]["d/c"]["at"] == 10
    # Its name created again (another creation time): the old one is gone,
    # the new one is read from its start.
    r.now = [seg("d/b", 80, 5, node="n2"), seg("d/c", 4, 9)]
    o = r.latestOffset(o, all_)
    assert o["segments"]["d/c"] == {"c": 9, "from": 0, "at": 4, "k": "lines", "n": "n1"}
    # Offsets written before nodes were recorded (done: name -> creation time).
    legacy = {"segments": {}, "done": {"d/a": 1}}
    r.now = [seg("d/a", 50, 1, True)]
    assert r.latestOffset(legacy, all_) is legacy
    r.now = []
    assert r.latestOffset(legacy, all_) is legacy
    r.now = [seg("d/z", 1, 2)]
    assert r.latestOffset(legacy, all_)["done"] == {}


def test_a_task_never_ends_early_on_a_file_the_mount_does_not_show(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No segment-gateway mount shows it deleted: the task fails (after a short wait)."""
    monkeypatch.setattr(stream, "MOUNT_CATCH_UP", 1.0)
    part = LinesPart(str(tmp_path / "s" / "1"), "s/1", 0, 10, 10, True, False, True)
    part.created, part.node = 1, "n1"
    began = time.monotonic()
    with pytest.raises(OSError, match=r"s/1 \[0, 10\).*does not show it deleted") as e:
        list(stream._read_part(part))
    assert e.value.errno == errno.ENOENT
    assert time.monotonic() - began >= 1.0
    with pytest.raises(MountUnavailable, match="no segment-gateway mount"):
        check_mount(str(tmp_path))


def test_a_task_ends_early_only_for_a_segment_proven_deleted(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local files with the mount's xattrs stand in for a live mount (checked elsewhere)."""
    monkeypatch.setattr(stream, "check_mount", lambda root: "1")
    monkeypatch.setattr(stream, "MOUNT_CATCH_UP", 1.0)
    (tmp_path / "s").mkdir()

    def segment(name: str, created: int, node: str) -> None:
        file = tmp_path / name
        file.write_bytes(b"x\n")
        try:
            os.setxattr(file, "user.segment.created_ms", b"%d" % created)
        except OSError as e:
            pytest.skip(f"no user xattrs here: {e}")
        os.setxattr(file, "user.segment.node", node.encode())

    def part(name: str, created: int, node: str) -> LinesPart:
        p = LinesPart(str(tmp_path / name), name, 0, 10, 10, True, False, True)
        p.created, p.node = created, node
        return p

    segment("s/3", 3, "n2")
    # Only another node's newer segment beside it: no proof, the task fails.
    with pytest.raises(OSError, match="does not show it deleted"):
        list(stream._read_part(part("s/1", 1, "n1")))
    # A newer segment of its own node: deleted (retention), nothing more to read.
    segment("s/2", 2, "n1")
    assert list(stream._read_part(part("s/1", 1, "n1"))) == []
    # Its name holds another segment: that one's bytes are not read as its.
    segment("s/1", 7, "n1")
    assert list(stream._read_part(part("s/1", 1, "n1"))) == []
