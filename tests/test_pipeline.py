"""Spark reads the mounted segments: built-in readers, the ``segments`` source, the job.

One real local Spark session (``local[2]``) and one mounted daemon for the
module; small data for correctness (the multi-GiB case is bench/spark_read.py).
"""

from __future__ import annotations

import collections
import datetime
import json
import pathlib
import random
import shutil
import struct
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from gateway.client.sync import SyncClient
from tests.helpers.lines import append_raw, line_rows
from tests.helpers.mount import MountedDaemon, mounted_daemon
from tests.helpers.wait import wait_for

KiB = 1024
MiB = 1024 * KiB

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedDaemon]:
    tmp = tmp_path_factory.mktemp("pipeline")
    config = (
        f'[tier2]\nurl = "file://{tmp}/tier2"\nflush_size = "256 KiB"\nmax_chunk_size = "4 MiB"\n'
    )
    with mounted_daemon(tmp, config) as daemon:
        yield daemon


def json_events(rng: random.Random, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"key": f"k{rng.randrange(5)}", "ts": 1_700_000_000 + rng.randrange(600), "n": start + i}
        for i in range(n)
    ]


def append_lines(
    c: SyncClient, name: str, events: list[dict[str, Any]], per_append: int = 7
) -> list[int]:
    """Append events as JSON lines, several per append; returns the append offsets."""
    offsets = []
    for i in range(0, len(events), per_append):
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events[i : i + per_append])
        offsets.append(c.append(name, data).offset)
    return offsets


def rows_as_events(df: Any) -> list[dict[str, Any]]:
    return sorted(
        ({"key": r.key, "ts": r.ts, "n": r.n} for r in df.collect()), key=lambda e: e["n"]
    )


def test_spark_json_reads_active_sealed_and_offloaded_segments(
    gateway: MountedDaemon, spark: Any
) -> None:
    rng = random.Random(1)
    expected: list[dict[str, Any]] = []
    with SyncClient(gateway.address) as c:
        for i, state in enumerate(("active", "sealed", "offloaded")):
            name = f"json/clicks/{i}"
            c.create(name)
            events = json_events(rng, 3000, start=len(expected))
            append_lines(c, name, events)
            expected += events
            if state != "active":
                c.seal(name)
        c.flush("json/clicks/2")
        assert c.info("json/clicks/2").storage_length == c.info("json/clicks/2").length
    path = f"file://{gateway.mnt}/json/clicks/*"
    df = spark.read.json(path)
    assert df.count() == len(expected)
    assert rows_as_events(df) == expected

    # Everything in Tier 2 only: flush, restart with the cache wiped, read again.
    with SyncClient(gateway.address) as c:
        c.flush()
    gateway.stop()
    shutil.rmtree(gateway.data_dir / "cache")
    gateway.start(timeout=60)
    assert rows_as_events(spark.read.json(path)) == expected
    # Growth after listing is not seen; a new read sees it.
    with SyncClient(gateway.address) as c:
        more = json_events(rng, 10, start=len(expected))
        append_lines(c, "json/clicks/0", more)
    assert spark.read.json(path).count() == len(expected) + 10


def test_truncated_lines_segments(gateway: MountedDaemon, spark: Any) -> None:
    """What Spark's readers make of the zeros below the start offset, and the fix."""
    from pipeline.lines import read_lines

    rng = random.Random(2)
    events = json_events(rng, 2000)
    with SyncClient(gateway.address) as c:
        c.create("trunc/at_boundary")
        offsets = append_lines(c, "trunc/at_boundary", events, per_append=10)
        c.truncate("trunc/at_boundary", offsets[50])  # an event boundary: events 500..
        c.create("trunc/mid_event")
        append_lines(c, "trunc/mid_event", events, per_append=10)
        c.truncate("trunc/mid_event", offsets[50] + 5)  # inside event 500
    at_boundary = f"file://{gateway.mnt}/trunc/at_boundary"
    mid_event = f"file://{gateway.mnt}/trunc/mid_event"

    # Spark's own JSON reader: the zeros and the first surviving line make
    # one corrupt record; with DROPMALFORMED it is dropped, and with it an
    # intact first event.
    plain = spark.read.json(at_boundary)
    assert plain.count() == 1500  # 1499 events + 1 corrupt row holding event 500
    corrupt = plain.where("_corrupt_record is not null").collect()
    assert len(corrupt) == 1 and corrupt[0]._corrupt_record.startswith("\x00")
    text = spark.read.text(at_boundary).first()
    assert text is not None and text.value.startswith("\x00")

    # The fix: read_lines strips the zeros; every surviving event is intact.
    fixed = read_lines(spark, at_boundary, "json")
    assert rows_as_events(fixed) == events[500:]
    # Cut inside an event: its tail is one malformed record, dropped on request.
    assert read_lines(spark, mid_event, "json").count() == 1500
    dropped = read_lines(spark, mid_event, "json", mode="DROPMALFORMED")
    assert rows_as_events(dropped) == events[501:]
    # CSV and text the same way.
    csv = read_lines(spark, at_boundary, "csv")
    assert csv.count() == 1500 and not csv.first()[0].startswith("\x00")
    assert read_lines(spark, at_boundary, "text").count() == 1500

    # The segments source (lines codec) starts at the truncation offset,
    # which the gateway indexed because it was an append boundary.
    rows = (
        spark.read.format("segments")
        .option("codec", "lines")
        .load(str(gateway.mnt / "trunc/at_boundary"))
        .collect()
    )
    assert [json.loads(r.event) for r in sorted(rows, key=lambda r: r.offset)] == events[500:]


def test_large_segment_is_split_into_many_tasks(gateway: MountedDaemon, spark: Any) -> None:
    """Spark's file splitting works on a mounted segment (a small split size here)."""
    line = b'{"key":"k","ts":1700000000,"pad":"' + b"x" * 200 + b'"}\n'
    with SyncClient(gateway.address) as c:
        c.create("big/s")
        for _ in range(24):
            c.append("big/s", line * (MiB // len(line)))
        c.seal("big/s")
        size = c.info("big/s").length
    lines = size // len(line)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(2 * MiB))
    try:
        df = spark.read.text(f"file://{gateway.mnt}/big/s")
        assert df.rdd.getNumPartitions() >= 12
        assert df.count() == lines
        assert spark.read.json(f"file://{gateway.mnt}/big/s").count() == lines
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def framed(event: bytes) -> bytes:
    return struct.pack(">I", len(event)) + event


@pytest.fixture(scope="module")
def framed_segments(gateway: MountedDaemon) -> dict[str, list[tuple[int, bytes]]]:
    """Framed segments with events of random sizes, one of them larger than 2 MiB."""
    rng = random.Random(3)
    out: dict[str, list[tuple[int, bytes]]] = {}
    with SyncClient(gateway.address) as c:
        for name, total in (("fr/a", 6 * MiB), ("fr/b", 3 * MiB), ("fr/c", 100 * KiB)):
            c.create(name)
            events: list[tuple[int, bytes]] = []
            offset = 0
            size = 0
            while size < total:
                batch = []
                for _ in range(rng.randrange(1, 20)):
                    n = rng.choice([0, 1, 50, 3000, 40_000, 150_000])
                    batch.append(rng.randbytes(n))
                if (
                    name == "fr/a"
                    and len(events) > 30
                    and not any(len(e) > 2 * MiB for _, e in events)
                ):
                    batch = [rng.randbytes(2 * MiB + 77)]  # larger than the split size
                data = b"".join(framed(e) for e in batch)
                assert c.append(name, data).offset == offset
                for e in batch:
                    events.append((offset, e))
                    offset += 4 + len(e)
                size += len(data)
            out[name] = events
        c.seal("fr/a")
        c.seal("fr/b")  # fr/c stays active
    return out


def test_segments_source_returns_every_event_exactly_once(
    gateway: MountedDaemon, spark: Any, framed_segments: dict[str, list[tuple[int, bytes]]]
) -> None:
    df = spark.read.format("segments").option("splitSize", "1m").load(str(gateway.mnt / "fr"))
    assert df.rdd.getNumPartitions() >= 6
    assert df.columns == ["segment", "offset", "event", "sealed"]
    got: dict[str, list[tuple[int, bytes]]] = collections.defaultdict(list)
    for r in df.collect():
        got[r.segment].append((r.offset, bytes(r.event)))
    for name, events in framed_segments.items():
        assert sorted(got[name]) == events, name
    sealed = {r.segment: r.sealed for r in df.select("segment", "sealed").distinct().collect()}
    assert sealed == {"fr/a": True, "fr/b": True, "fr/c": False}
    # Without active segments.
    only_sealed = (
        spark.read.format("segments").option("includeActive", "false").load(str(gateway.mnt / "fr"))
    )
    assert only_sealed.count() == len(framed_segments["fr/a"]) + len(framed_segments["fr/b"])


def test_segments_source_offsets_and_pushdown(
    gateway: MountedDaemon, spark: Any, framed_segments: dict[str, list[tuple[int, bytes]]]
) -> None:
    events = framed_segments["fr/a"]
    lo, hi = events[len(events) // 3][0] + 1, events[2 * len(events) // 3][0]
    want = [(o, e) for o, e in events if lo <= o < hi]
    path = str(gateway.mnt / "fr")
    ranged = (
        spark.read.format("segments")
        .option("startOffset", str(lo))
        .option("endOffset", str(hi))
        .load(str(gateway.mnt / "fr/a"))
    )
    assert sorted((r.offset, bytes(r.event)) for r in ranged.collect()) == want

    pushed = (
        spark.read.format("segments")
        .option("pushFilters", "true")
        .option("splitSize", "1m")
        .load(path)
        .where(f"segment = 'fr/a' and offset >= {lo} and offset < {hi}")
    )
    plan = pushed._jdf.queryExecution().executedPlan().toString()
    assert sorted((r.offset, bytes(r.event)) for r in pushed.collect()) == want
    # Pushed down: fewer partitions than the whole directory has.
    assert (
        pushed.rdd.getNumPartitions()
        < spark.read.format("segments").option("splitSize", "1m").load(path).rdd.getNumPartitions()
    )
    assert "fr/a" in plan or "segment" in plan
    prefixed = (
        spark.read.format("segments")
        .option("pushFilters", "true")
        .load(path)
        .where("segment like 'fr/b%'")
    )
    assert prefixed.count() == len(framed_segments["fr/b"])


def test_example_job_matches_plain_python(
    gateway: MountedDaemon, spark: Any, tmp_path: pathlib.Path
) -> None:
    from pipeline.jobs import events_per_minute

    rng = random.Random(4)
    events = json_events(rng, 5000)
    with SyncClient(gateway.address) as c:
        for i in range(3):
            c.create(f"job/stream/{i}")
            append_lines(c, f"job/stream/{i}", events[i::3])
        c.seal("job/stream/0")
    out = tmp_path / "out"
    rows = events_per_minute.run(spark, str(gateway.mnt), str(out), "job/stream")

    expected: collections.Counter[tuple[str, datetime.datetime]] = collections.Counter()
    for e in events:
        minute = datetime.datetime.fromtimestamp(e["ts"] - e["ts"] % 60, tz=datetime.UTC)
        expected[(e["key"], minute.replace(tzinfo=None))] += 1
    got = {(r.key, r.minute): r.events for r in spark.read.parquet(str(out)).collect()}
    assert rows == len(expected)
    assert got == dict(expected)


def test_example_job_streaming_counts_closed_windows_once(
    gateway: MountedDaemon, spark: Any, tmp_path: pathlib.Path
) -> None:
    """The streaming form: windows the watermark has passed, each counted once, across a restart."""
    from pipeline.jobs import events_per_minute

    rng = random.Random(5)
    events = json_events(rng, 3000)
    # In time order, as a live stream would have them (out-of-order events
    # older than the watermark are dropped, by design).
    events.sort(key=lambda e: e["ts"])
    with SyncClient(gateway.address) as c:
        c.create_stream("job/live", {"roll_size": 16 * 1024})
        append_lines(c, "job/live", events[:1500])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run_once() -> None:
        query = events_per_minute.run_streaming(
            spark, str(gateway.mnt), str(out), "job/live", str(ckpt), available_now=True
        )
        query.awaitTermination(180)
        assert query.exception() is None

    run_once()
    with SyncClient(gateway.address) as c:
        append_lines(c, "job/live", events[1500:])
    run_once()  # from the checkpoint: the first half is not counted again
    watermark = max(e["ts"] for e in events) - 60
    expected: collections.Counter[tuple[str, datetime.datetime]] = collections.Counter()
    for e in events:
        minute = e["ts"] - e["ts"] % 60
        if minute + 60 <= watermark:
            expected[(e["key"], datetime.datetime.fromtimestamp(minute, tz=datetime.UTC))] += 1
    got = [
        (r.key, r.minute.replace(tzinfo=datetime.UTC), r.events)
        for r in spark.read.parquet(str(out)).collect()
    ]
    assert len(got) == len({(k, m) for k, m, _ in got})  # every window once
    assert {(k, m): n for k, m, n in got} == dict(expected)


# -- codec=lines: lines are found by their newlines, never by the event index --


def seq_json(first: int, last: int) -> bytes:
    """``seq -f '{"n":%g}' first last``."""
    return b"".join(b'{"n":%d}\n' % n for n in range(first, last + 1))


def shaped_lines() -> bytes:
    """About 7 MiB of lines placed against 1 MiB parts.

    A newline ends exactly at 1 MiB (the part there starts at a line start),
    another sits at 2 MiB (that part starts on a newline), empty lines, a
    2.5 MiB line crossing the parts at 3, 4 and 5 MiB, and a last line
    without a newline.
    """
    out = bytearray()
    n = 0

    def fill_to(end: int) -> None:
        nonlocal n
        while end - len(out) > 200:
            out.extend(b'{"i":%d,"pad":"%s"}\n' % (n, b"y" * (n % 97)))
            n += 1
        out.extend(b"z" * (end - len(out) - 1) + b"\n")

    fill_to(MiB)
    fill_to(2 * MiB + 1)
    out.extend(b"\n\n")
    fill_to(3 * MiB - 10)
    out.extend(b"L" * (5 * MiB // 2) + b"\n")
    fill_to(7 * MiB)
    out.extend(b'{"last":"no newline"}')
    assert out[MiB - 1 : MiB + 1] != b"\n\n" and out[MiB - 1] == ord("\n")
    assert out[2 * MiB] == ord("\n") and out[2 * MiB - 1] != ord("\n")
    return bytes(out)


def wait_for_size(path: pathlib.Path, size: int, timeout: float = 10) -> None:
    """Wait until ``stat`` on the mount shows ``size`` bytes."""
    wait_for(lambda: path.stat().st_size == size, timeout, f"{path} reaching {size} bytes")


def source_rows(spark: Any, path: pathlib.Path, **options: str) -> list[tuple[int, bytes]]:
    """(offset, event) of every row of the ``segments`` source (codec=lines), by offset."""
    reader = spark.read.format("segments").option("codec", "lines")
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted((r.offset, bytes(r.event)) for r in reader.load(str(path)).collect())


def text_rows(spark: Any, path: pathlib.Path) -> list[bytes]:
    """Spark's own text reader over the same mounted file, in file order."""
    return [r.value.encode() for r in spark.read.text(f"file://{path}").collect()]


def test_lines_codec_ignores_mid_line_index_entries(gateway: MountedDaemon, spark: Any) -> None:
    """Raw appends put index entries mid-line; no part may start or end there."""
    from pipeline.source import read_event_index

    data = seq_json(1, 300_000)
    with SyncClient(gateway.address) as c:
        c.create("ln/seq")
        append_raw(c, "ln/seq", data)
        c.seal("ln/seq")
    path = gateway.mnt / "ln/seq"
    index = read_event_index(str(path))
    assert len(index) >= 3
    assert [o for o in index if o and data[o - 1] != ord("\n")], "no index entry mid-line"
    expected = line_rows(data)
    assert len(expected) == 300_000
    for split in ("1m", "100k"):
        df = spark.read.format("segments").option("codec", "lines").option("splitSize", split)
        assert df.load(str(path)).rdd.getNumPartitions() >= 3
        assert source_rows(spark, path, splitSize=split) == expected, split
    assert text_rows(spark, path) == [line for _, line in expected]


def test_lines_codec_part_edges_and_a_line_longer_than_a_part(
    gateway: MountedDaemon, spark: Any
) -> None:
    data = shaped_lines()
    with SyncClient(gateway.address) as c:
        c.create("ln/shapes")
        append_raw(c, "ln/shapes", data, piece=100_000)
        c.seal("ln/shapes")
    path = gateway.mnt / "ln/shapes"
    expected = line_rows(data)
    got = source_rows(spark, path, splitSize="1m")
    assert got == expected
    offsets = {o for o, _ in got}
    assert {MiB, 2 * MiB + 1} <= offsets and 2 * MiB not in offsets
    assert max(len(e) for _, e in got) == 5 * MiB // 2
    assert text_rows(spark, path) == [line for _, line in expected]


def test_lines_codec_last_line_without_newline(gateway: MountedDaemon, spark: Any) -> None:
    """Returned once the segment is sealed; while active it may still be growing."""
    with SyncClient(gateway.address) as c:
        c.create("ln/end/sealed")
        c.append("ln/end/sealed", b"a\nb\nc")
        c.seal("ln/end/sealed")
        c.create("ln/end/active")
        c.append("ln/end/active", b"a\nb\nc")
        c.create("ln/end/newline")
        c.append("ln/end/newline", b"a\nb\n")
        c.seal("ln/end/newline")
    sealed, active = gateway.mnt / "ln/end/sealed", gateway.mnt / "ln/end/active"
    assert source_rows(spark, sealed) == [(0, b"a"), (2, b"b"), (4, b"c")]
    assert text_rows(spark, sealed) == [b"a", b"b", b"c"]
    assert source_rows(spark, gateway.mnt / "ln/end/newline") == [(0, b"a"), (2, b"b")]
    # Spark's text reader returns the unfinished line; the source waits for it.
    assert text_rows(spark, active) == [b"a", b"b", b"c"]
    assert source_rows(spark, active, splitSize="1") == [(0, b"a"), (2, b"b")]
    with SyncClient(gateway.address) as c:
        c.append("ln/end/active", b"d\ne")
    wait_for_size(active, 8)  # the kernel caches an active file's size for a moment
    assert source_rows(spark, active) == [(0, b"a"), (2, b"b"), (4, b"cd")]
    with SyncClient(gateway.address) as c:
        c.seal("ln/end/active")
    assert source_rows(spark, active) == [(0, b"a"), (2, b"b"), (4, b"cd"), (7, b"e")]


def test_lines_codec_truncated_mid_line(gateway: MountedDaemon, spark: Any) -> None:
    """Below the start offset are zeros: the cut line's tail is skipped, nothing more."""
    from pipeline.lines import read_lines
    from pipeline.source import read_event_index

    data = seq_json(1, 200_000)
    with SyncClient(gateway.address) as c:
        c.create("ln/trunc")
        offsets = append_raw(c, "ln/trunc", data)
        cut = offsets[20] + 1000 + 3  # inside an append, inside a line
        assert data[cut - 1] != ord("\n")
        c.truncate("ln/trunc", cut)
        c.seal("ln/trunc")
    path = gateway.mnt / "ln/trunc"
    index = read_event_index(str(path))
    assert cut not in index and index[0] - cut > 100 * KiB
    first = data.index(b"\n", cut) + 1
    expected = line_rows(data, first)
    assert source_rows(spark, path, splitSize="256k") == expected
    # Spark's text reader (NULs stripped) has the tail as its first row.
    plain = [r.value.encode() for r in read_lines(spark, f"file://{path}", "text").collect()]
    assert plain == [data[cut : first - 1]] + [line for _, line in expected]


def test_lines_parts_at_every_split_size(gateway: MountedDaemon) -> None:
    """Every part size from 1 byte up, without Spark: each line exactly once."""
    from pipeline.source import SegmentsReader, read_event_index

    data = b"".join(
        [b"x" * (i % 13) + (b"\r\n" if i % 5 == 0 else b"\n") for i in range(40)]
        + [b"\n\n", b"y" * 50, b"\n", b"tail"]
    )
    with SyncClient(gateway.address) as c:
        c.create("ln/tiny/sealed")
        append_raw(c, "ln/tiny/sealed", data, piece=7)
        c.seal("ln/tiny/sealed")
        c.create("ln/tiny/active")
        append_raw(c, "ln/tiny/active", data, piece=7)
        c.create("ln/tiny/cut")
        append_raw(c, "ln/tiny/cut", data, piece=7)
        c.truncate("ln/tiny/cut", 28)  # an append boundary: indexed, so a line starts there
        c.seal("ln/tiny/cut")
        c.create("ln/tiny/midcut")
        append_raw(c, "ln/tiny/midcut", data, piece=700)
        c.truncate("ln/tiny/midcut", 31)
        c.seal("ln/tiny/midcut")

    def read(name: str, **options: str) -> list[tuple[int, bytes]]:
        reader = SegmentsReader({"path": str(gateway.mnt / name), "codec": "lines", **options})
        rows: list[tuple[int, bytes]] = []
        for part in reader.partitions():
            for batch in reader.read(part):
                offsets, events = batch.column("offset"), batch.column("event")
                rows += zip(offsets.to_pylist(), events.to_pylist(), strict=True)
        return rows

    assert read_event_index(str(gateway.mnt / "ln/tiny/cut"))[0] == 28
    assert read_event_index(str(gateway.mnt / "ln/tiny/midcut")) == []
    everything = line_rows(data)
    assert (0, b"\r") in everything  # CRLF: the \r stays in the event
    for size in range(1, len(data) + 2):
        assert read("ln/tiny/sealed", splitSize=str(size)) == everything, size
        assert read("ln/tiny/active", splitSize=str(size)) == everything[:-1], size
        assert read("ln/tiny/cut", splitSize=str(size)) == line_rows(data, 28), size
        skip = data.index(b"\n", 31) + 1
        assert read("ln/tiny/midcut", splitSize=str(size)) == line_rows(data, skip), size
    for lo, hi in ((0, 1), (1, 60), (30, 31), (31, 200), (59, 400), (200, 10_000)):
        want = [(o, e) for o, e in everything if lo <= o < hi]
        for size in (1, 3, 17, 1000):
            options = {"startOffset": str(lo), "endOffset": str(hi), "splitSize": str(size)}
            assert read("ln/tiny/sealed", **options) == want, (lo, hi, size)
