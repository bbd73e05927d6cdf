"""``format("segments-jvm")`` returns exactly the rows of the Python ``segments`` source.

The same segments, read by both through one mounted daemon and one local
Spark session: framed and lines, active and sealed, truncated at and
between append boundaries, a line longer than a part, a last line without
a newline, parts of every size down to one byte, offset ranges, filters
pushed down, columns pruned, and a stream whose transactions are being
committed while it is read (only whole transactions, nothing past the
listed length). The streaming source is compared in tests/test_spark_streaming.py;
its bad options are here.
"""

from __future__ import annotations

import collections
import random
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import functions as F

from gateway.client.sync import SyncClient
from tests.helpers.lines import Committer, append_raw, line_rows
from tests.helpers.mount import MountedDaemon, mounted_daemon
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KiB = 1024
MiB = 1024 * KiB
Rows = list[tuple[str, int, bytes, bool]]


@pytest.fixture(scope="module")
def jar() -> None:
    """The jar is built (``make install`` builds it; a stale one is rebuilt)."""
    from pipeline.jvm import build

    build()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, jar: None) -> Iterator[MountedDaemon]:
    tmp = tmp_path_factory.mktemp("segments-jvm")
    config = (
        f'[tier2]\nurl = "file://{tmp}/tier2"\nflush_size = "256 KiB"\nmax_chunk_size = "4 MiB"\n'
        '[streams]\ninterval = "100ms"\n'
    )
    with mounted_daemon(tmp, config) as daemon:
        yield daemon


def rows(spark: Any, fmt: str, path: Any, where: str = "", **options: str) -> Rows:
    reader = spark.read.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(str(path))
    if where:
        df = df.where(where)
    got = [(r.segment, r.offset, bytes(r.event), r.sealed) for r in df.collect()]
    return sorted(got)


def both(spark: Any, path: Any, where: str = "", **options: str) -> Rows:
    """The rows of both sources, which must be the same."""
    python = rows(spark, "segments", path, where, pushFilters="true", **options)
    jvm = rows(spark, "segments-jvm", path, where, **options)
    assert jvm == python, (path, where, options, len(jvm), len(python))
    return jvm


def framed(event: bytes) -> bytes:
    return struct.pack(">I", len(event)) + event


@pytest.fixture(scope="module")
def framed_segments(gateway: MountedDaemon) -> dict[str, list[tuple[int, bytes]]]:
    """Framed segments with events of random sizes, one larger than 2 MiB; one truncated."""
    rng = random.Random(5)
    out: dict[str, list[tuple[int, bytes]]] = {}
    with SyncClient(gateway.address) as c:
        for name, total in (("fr/a", 5 * MiB), ("fr/b", 2 * MiB), ("fr/c", 90 * KiB)):
            c.create(name)
            events: list[tuple[int, bytes]] = []
            offset = 0
            while offset < total:
                batch = [rng.randbytes(rng.choice([0, 1, 50, 3000, 40_000, 150_000]))
                         for _ in range(rng.randrange(1, 20))]  # fmt: skip
                if name == "fr/a" and len(events) > 30 and all(len(e) < MiB for _, e in events):
                    batch = [rng.randbytes(2 * MiB + 77)]  # larger than a split
                assert c.append(name, b"".join(framed(e) for e in batch)).offset == offset
                for e in batch:
                    events.append((offset, e))
                    offset += 4 + len(e)
            out[name] = events
        # Truncated between two appends' boundaries: parsing starts at the next indexed one.
        cut = out["fr/b"][len(out["fr/b"]) // 2][0] + 2
        c.truncate("fr/b", cut)
        c.seal("fr/a")
        c.seal("fr/b")  # fr/c stays active
    return out


def test_framed_rows_equal_the_python_source(
    gateway: MountedDaemon, spark: Any, framed_segments: dict[str, list[tuple[int, bytes]]]
) -> None:
    path = gateway.mnt / "fr"
    for split in ("1m", "300k", "128m"):
        got = both(spark, path, splitSize=split)
        by_segment = collections.defaultdict(list)
        for segment, offset, event, sealed in got:
            by_segment[segment].append((offset, event))
            assert sealed == (segment != "fr/c")
        assert by_segment["fr/a"] == framed_segments["fr/a"]
        assert by_segment["fr/c"] == framed_segments["fr/c"]
        b = by_segment["fr/b"]
        assert b and b == [e for e in framed_segments["fr/b"] if e[0] >= b[0][0]]
    jvm = spark.read.format("segments-jvm").option("splitSize", "1m").load(str(path))
    python = spark.read.format("segments").option("splitSize", "1m").load(str(path))
    assert jvm.rdd.getNumPartitions() == python.rdd.getNumPartitions() >= 6
    assert jvm.columns == python.columns == ["segment", "offset", "event", "sealed"]
    sealed_only = both(spark, path, includeActive="false")
    assert {s for s, *_ in sealed_only} == {"fr/a", "fr/b"}


def test_offset_ranges_filters_and_pruned_columns(
    gateway: MountedDaemon, spark: Any, framed_segments: dict[str, list[tuple[int, bytes]]]
) -> None:
    events = framed_segments["fr/a"]
    lo, hi = events[len(events) // 3][0] + 1, events[2 * len(events) // 3][0]
    want = [("fr/a", o, e, True) for o, e in events if lo <= o < hi]
    path = gateway.mnt / "fr"
    assert both(spark, path / "a", startOffset=str(lo), endOffset=str(hi)) == want
    where = f"segment = 'fr/a' and offset >= {lo} and offset < {hi}"
    assert both(spark, path, where, splitSize="1m") == want
    assert both(spark, path, f"segment in ('fr/a', 'fr/c') and offset <= {lo}")
    assert both(spark, path, "segment like 'fr/c%' and offset > 100")
    assert both(spark, path, f"offset = {events[5][0]}") == [("fr/a", *events[5], True)]
    whole = spark.read.format("segments-jvm").option("splitSize", "1m").load(str(path))
    pushed = whole.where(where)
    plan = pushed._jdf.queryExecution().executedPlan().toString()
    assert "PushedFilters" in plan and "fr/a" in plan, plan
    assert pushed.rdd.getNumPartitions() < whole.rdd.getNumPartitions()
    # Columns not asked for are not written; the rows are the same.
    total = sum(len(v) for v in framed_segments.values())
    b = framed_segments["fr/b"]
    assert (
        whole.count()
        == whole.select("offset").count()
        == total - sum(1 for o, _ in b if o < min(o2 for _, o2, _, _ in both(spark, path / "b")))
    )
    offsets = sorted(r.offset for r in whole.where("segment = 'fr/c'").select("offset").collect())
    assert offsets == [o for o, _ in framed_segments["fr/c"]]
    sizes = whole.where("segment = 'fr/a'").select(F.length("event").alias("n")).collect()
    assert sorted(r.n for r in sizes) == sorted(len(e) for _, e in events)


def test_lines_at_every_part_size(gateway: MountedDaemon, spark: Any) -> None:
    """Sealed, active, cut at an append boundary and mid-line; CRLF; parts down to a byte."""
    data = b"".join(
        [b"x" * (i % 13) + (b"\r\n" if i % 5 == 0 else b"\n") for i in range(40)]
        + [b"\n\n", b"y" * 50, b"\n", b"tail"]
    )
    with SyncClient(gateway.address) as c:
        for name, piece in (("sealed", 7), ("active", 7), ("cut", 7), ("midcut", 700)):
            c.create(f"tiny/{name}")  # read with codec=lines: the index is of appends
            append_raw(c, f"tiny/{name}", data, piece)
        c.truncate("tiny/cut", 28)  # an append boundary: indexed, so a line starts there
        c.truncate("tiny/midcut", 31)
        for name in ("sealed", "cut", "midcut"):
            c.seal(f"tiny/{name}")
    skip = data.index(b"\n", 31) + 1
    expected = {
        "tiny/sealed": line_rows(data),
        "tiny/active": line_rows(data, final=False),
        "tiny/cut": line_rows(data, 28),
        "tiny/midcut": line_rows(data, skip),
    }
    # Every size is compared with the lines found the plain way; the Python
    # source (tests/test_pipeline.py tries it at every size without Spark) is
    # compared at two, since its Python tasks make tiny parts slow.
    tiny = gateway.mnt / "tiny"
    for size in [1, 2, 3, 5, 7, 13, 28, 29, 31, 64, len(data) - 1, len(data), 10_000]:
        if size in (7, 10_000):
            got_rows = both(spark, tiny, codec="lines", splitSize=str(size))
        else:
            got_rows = rows(spark, "segments-jvm", tiny, codec="lines", splitSize=str(size))
        got = collections.defaultdict(list)
        for segment, offset, event, _ in got_rows:
            got[segment].append((offset, event))
        assert dict(got) == expected, size
    everything = expected["tiny/sealed"]
    for lo, hi in ((0, 1), (1, 60), (30, 31), (31, 200), (59, 400), (200, 10_000)):
        want = [("tiny/sealed", o, e, True) for o, e in everything if lo <= o < hi]
        for size in ("1", "17"):
            options = {"startOffset": str(lo), "endOffset": str(hi), "splitSize": size,
                       "codec": "lines"}  # fmt: skip
            got_rows = rows(spark, "segments-jvm", tiny / "sealed", **options)
            assert got_rows == want, (lo, hi, size)
    options = {"startOffset": "31", "endOffset": "200", "splitSize": "17", "codec": "lines"}
    assert both(spark, tiny / "sealed", **options)


def test_lines_long_lines_mid_line_index_and_growth(gateway: MountedDaemon, spark: Any) -> None:
    """Raw appends put index entries mid-line; a line longer than a part; an active segment
    whose unfinished last line is left out until it ends or the segment is sealed."""
    rng = random.Random(9)
    lines = [b"%d-" % i + b"z" * rng.choice([0, 5, 300, 70_000]) for i in range(3000)]
    lines[1500] = b"L" * (5 * MiB // 2)  # longer than two parts
    data = b"\n".join(lines) + b"\n"
    with SyncClient(gateway.address) as c:
        c.create("ln/long", codec="lines")
        append_raw(c, "ln/long", data, 100_003)
        c.seal("ln/long")
        c.create("ln/grow", codec="lines")
        c.append("ln/grow", b"a\nb\nc")
    got = both(spark, gateway.mnt / "ln/long", splitSize="1m")
    assert [(o, e) for _, o, e, _ in got] == line_rows(data)
    grow = gateway.mnt / "ln/grow"
    assert [(o, e) for _, o, e, _ in both(spark, grow, splitSize="1")] == [(0, b"a"), (2, b"b")]
    with SyncClient(gateway.address) as c:
        c.append("ln/grow", b"d\ne")
    # A lines segment shows its whole lines only while it is active.
    wait_for(lambda: grow.stat().st_size == 7, 10, "ln/grow at 7 bytes")
    assert [(o, e) for _, o, e, _ in both(spark, grow)] == [(0, b"a"), (2, b"b"), (4, b"cd")]
    with SyncClient(gateway.address) as c:
        c.seal("ln/grow")
    assert [(o, e) for _, o, e, _ in both(spark, grow)][-1] == (7, b"e")


def test_a_stream_read_during_commits_has_only_whole_transactions(
    gateway: MountedDaemon, spark: Any
) -> None:
    """Transactions of 50 events committed back to back while segments-jvm reads the stream."""
    per_txn = 50
    with SyncClient(gateway.address) as c:
        c.create_stream("tx", {"roll_size": 16 * KiB})
    reads: list[list[bytes]] = []
    with Committer(gateway.address, "tx", per_txn) as committer:
        deadline = time.monotonic() + 60
        while len(reads) < 6 and time.monotonic() < deadline:
            got = rows(spark, "segments-jvm", gateway.mnt / "tx", codec="lines")
            reads.append([e for _, _, e, _ in got])
    assert not committer.errors, committer.errors
    counts = [len(r) for r in reads]
    assert len(set(counts)) > 2, f"the commits did not overlap the reads: {counts}"
    for events in reads:
        # Whole transactions only, each contiguous and in order.
        assert len(events) % per_txn == 0, len(events)
        for k in range(len(events) // per_txn):
            at = events.index(b"t%05d-00" % k)
            assert events[at : at + per_txn] == [b"t%05d-%02d" % (k, j) for j in range(per_txn)]
    assert counts == sorted(counts)
    final = both(spark, gateway.mnt / "tx", codec="lines")
    assert len(final) == per_txn * len(committer.committed)


def test_bad_paths_and_options_are_clear_errors(gateway: MountedDaemon, spark: Any) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Py4JJavaError), match="codec must be framed or lines"):
        spark.read.format("segments-jvm").option("codec", "json").load(str(gateway.mnt)).count()
    with pytest.raises((PySparkException, Py4JJavaError), match="give a path"):
        spark.read.format("segments-jvm").load().count()
    assert rows(spark, "segments-jvm", gateway.mnt / "no" / "such") == []
    # The streaming source's own options, refused when the query starts.
    from pyspark.errors import StreamingQueryException

    for options, message in (
        ({"startingOffsets": "middle"}, "startingOffsets must be earliest or latest"),
        ({"maxBytesPerTrigger": "1m", "maxEventsPerTrigger": "5"}, "not both"),
        ({"maxEventsPerTrigger": "-1"}, "must be positive"),
        ({"mountTimeout": "soon"}, "cannot read 'soon' as a duration"),
    ):
        stream = spark.readStream.format("segments-jvm").options(**options)
        query = stream.load(str(gateway.mnt)).writeStream.format("noop").start()
        try:
            with pytest.raises(StreamingQueryException, match=message):
                query.awaitTermination(60)
        finally:
            query.stop()
