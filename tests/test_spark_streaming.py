"""Spark Structured Streaming over growing, rolling, truncated and deleted segments.

One mounted daemon for the module. The streaming ``segments`` source
(pipeline/stream.py) and its JVM port ``segments-jvm`` (SegmentsStream in
pipeline/jvm) run in a local Spark session (``local[2]``) with a memory sink
(the same tests over both), side by side on the same segments while
transactions are committed (the same rows, whole transactions per batch, each
query stopped and continued from its checkpoint by the other format), and,
for exactly-once, in a separate driver process
(tests/helpers/stream_driver.py) killed with SIGKILL at random points while
writers append and the stream rolls, continued by a driver reading with
``segments-jvm``; the batches hold every acknowledged event exactly once.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from gateway.client.sync import SyncClient
from tests.helpers.lines import Committer
from tests.helpers.mount import MountedDaemon, mounted_daemon
from tests.helpers.wait import wait_for

# Serial (tests/conftest.py): deadlines of a minute or more on a query that
# missed them twice with another worker beside it.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(420)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The streaming sources: the Python one and its JVM port.
FORMATS = ("segments", "segments-jvm")


@pytest.fixture(scope="module")
def jar() -> None:
    """The segments-jvm jar is built (``make install`` builds it; a stale one is rebuilt)."""
    from pipeline.jvm import build

    build()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, jar: None) -> Iterator[MountedDaemon]:
    tmp = tmp_path_factory.mktemp("spark-streaming")
    config = (
        f'[tier2]\nurl = "file://{tmp}/tier2"\nflush_size = "16 KiB"\nflush_interval = "300ms"\n'
        '[streams]\ninterval = "100ms"\n'
    )
    with mounted_daemon(tmp, config) as daemon:
        yield daemon


def line(k: int, i: int) -> bytes:
    return b'{"w": %d, "n": %d}' % (k, i)


def framed(event: bytes) -> bytes:
    return len(event).to_bytes(4, "big") + event


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_query_follows_appends_rolls_truncation_and_deletion(
    gateway: MountedDaemon, spark: Any, fmt: str
) -> None:
    d = gateway
    live = "live" if fmt == "segments" else "livejvm"
    with SyncClient(d.address) as c:
        c.create_stream(f"{live}/clicks", {"roll_size": 2048})
        c.create(f"{live}/notes", codec="lines")
        c.append(f"{live}/notes", b'{"w": 9, "n": 0}\n{"w": 9, "n"')  # a cut line: not yet
    events = spark.readStream.format(fmt).option("codec", "lines").load(str(d.mnt / live))
    query = (
        events.writeStream.format("memory")
        .queryName(live)
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def rows() -> list[Any]:
        return spark.sql(
            f"SELECT segment, offset, CAST(event AS STRING) AS e FROM {live}"
        ).collect()

    try:
        expected = [b'{"w": 9, "n": 0}']
        wait_for(lambda: len(rows()) == 1, 60, "the first line")
        # Appends to a segment the query has already read arrive: Spark's
        # file source never rereads a file it has listed.
        with SyncClient(d.address) as c:
            c.append(f"{live}/notes", b": 1}\n")
            expected.append(b'{"w": 9, "n": 1}')
            for i in range(300):  # ~6 KiB of events, rolling every 2 KiB
                c.append(f"{live}/clicks", line(1, i) + b"\n")
                expected.append(line(1, i))
        wait_for(lambda: len(rows()) >= len(expected), 60, "every event")
        got = rows()
        assert sorted(r.e.encode() for r in got) == sorted(expected)
        members = {r.segment for r in got if r.segment.startswith(f"{live}/clicks/")}
        assert len(members) >= 3  # the rolled successors were followed
        # Retention deletes the oldest members; truncation skips what it cut.
        with SyncClient(d.address) as c:
            c.set_stream(f"{live}/clicks", {"retain_size": 1})
            c.roll_stream(f"{live}/clicks")
            c.truncate(f"{live}/notes", c.info(f"{live}/notes").length)
            wait_for(lambda: len(c.stream(f"{live}/clicks").segments) <= 1, 60, "retention")
            for i in range(300, 320):
                c.append(f"{live}/clicks", line(1, i) + b"\n")
                expected.append(line(1, i))
            c.append(f"{live}/notes", b'{"w": 9, "n": 2}\n')
            expected.append(b'{"w": 9, "n": 2}')
        wait_for(lambda: len(rows()) >= len(expected), 60, "the events after retention")
        time.sleep(1)  # a few more triggers: nothing is read twice
        got = rows()
        assert sorted(r.e.encode() for r in got) == sorted(expected)
        assert query.exception() is None
    finally:
        query.stop()


@pytest.mark.parametrize("fmt", FORMATS)
def test_admission_control_limits_each_batch(gateway: MountedDaemon, spark: Any, fmt: str) -> None:
    d = gateway
    limited = "limited" if fmt == "segments" else "limitedjvm"
    with SyncClient(d.address) as c:
        c.create(f"{limited}/a", codec="lines")
        c.append(f"{limited}/a", b"".join(line(2, i) + b"\n" for i in range(1000)))
        # A framed one beside it: each segment is read by its own codec.
        c.create(f"{limited}/b", codec="framed")
        c.append(f"{limited}/b", b"".join(framed(line(3, i)) for i in range(500)))
        c.seal(f"{limited}/b")
    # Events here take 17 to 23 bytes with their newline or length: 4 KiB is at most 241.
    for option, value, most in (
        ("maxEventsPerTrigger", "300", 300),
        ("maxBytesPerTrigger", "4k", 241),
    ):
        name = f"{limited}_{option}"
        query = (
            spark.readStream.format(fmt)
            .option(option, value)
            .load(str(d.mnt / limited))
            .writeStream.format("memory")
            .queryName(name)
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            wait_for(
                lambda n=name: spark.table(n).count() >= 1500,  # type: ignore[misc]
                60,
                f"{option}: every event",
            )
            table = spark.table(name)
            assert table.count() == 1500
            assert table.select("segment", "offset").distinct().count() == 1500
            events = {bytes(r.event) for r in table.collect()}
            assert events == {line(2, i) for i in range(1000)} | {line(3, i) for i in range(500)}
            sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
            assert len(sizes) >= 1500 // most and max(sizes) <= most, sizes
        finally:
            query.stop()


# A query stopped in its foreachBatch: the callback's collect is interrupted (py4j logs it).
@pytest.mark.expect_errors("exception while executing the Python Proxy")
def test_both_formats_read_the_same_events_exactly_once_while_transactions_commit(
    gateway: MountedDaemon, spark: Any, tmp_path: Any
) -> None:
    """Two queries, one per format, over a rolling stream with transactions being committed
    and a growing framed segment; midway each is stopped and continued from its checkpoint
    by the other format (the offsets are the same JSON). Each holds every event exactly
    once, the same rows, and every batch only whole transactions."""
    d = gateway
    per_txn = 50
    with SyncClient(d.address) as c:
        c.create_stream("same/tx", {"roll_size": 64 * 1024}, codec="lines")
        c.create("same/f", codec="framed")
    framed_events: list[bytes] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def append_framed() -> None:
        try:
            with SyncClient(d.address) as c:
                while not stop.is_set():
                    batch = [b"f%06d" % (len(framed_events) + j) for j in range(7)]
                    c.append("same/f", b"".join(framed(e) for e in batch))
                    framed_events.extend(batch)
                    time.sleep(0.01)
        except BaseException as e:
            errors.append(e)

    #: checkpoint -> batch id -> rows; a batch run again replaces its rows (exactly once).
    sinks: dict[str, dict[int, list[tuple[str, int, bytes]]]] = {"a": {}, "b": {}}

    def start(fmt: str, checkpoint: str) -> Any:
        def sink(df: Any, batch_id: int) -> None:
            rows = df.select("segment", "offset", "event").collect()
            sinks[checkpoint][batch_id] = [(r.segment, r.offset, bytes(r.event)) for r in rows]

        return (
            spark.readStream.format(fmt)
            .load(str(d.mnt / "same"))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(processingTime="300 milliseconds")
            .start()
        )

    def with_rows(checkpoint: str) -> int:
        return sum(1 for rows in list(sinks[checkpoint].values()) if rows)

    committer = Committer(d.address, "same/tx", per_txn)
    framer = threading.Thread(target=append_framed)
    committer.start()
    framer.start()
    queries = [start("segments", "a"), start("segments-jvm", "b")]
    try:
        wait_for(lambda: with_rows("a") >= 3 and with_rows("b") >= 3, 120, "three batches each")
        for q in queries:
            q.stop()  # wherever its batch is: the other format replays it or goes on
        queries = [start("segments-jvm", "a"), start("segments", "b")]
        n = {cp: with_rows(cp) for cp in sinks}
        wait_for(lambda: all(with_rows(cp) >= n[cp] + 2 for cp in sinks), 120, "batches after")
    finally:
        stop.set()
        committer.stop()
        framer.join(timeout=60)
    try:
        assert not errors and not committer.errors, (errors, committer.errors)
        expected = {b"t%05d-%02d" % (k, j) for k in range(len(committer.committed))
                    for j in range(per_txn)} | set(framed_events)  # fmt: skip

        def events(cp: str) -> list[bytes]:
            return [e for rows in list(sinks[cp].values()) for _, _, e in rows]

        wait_for(lambda: all(len(events(cp)) >= len(expected) for cp in sinks), 120, "all")
        time.sleep(1)  # a few more triggers: nothing is read twice
        for q in queries:
            assert q.exception() is None, q.exception()
    finally:
        for q in queries:
            q.stop()
    got = {cp: [r for rows in sinks[cp].values() for r in rows] for cp in sinks}
    for cp, rows in got.items():
        assert len(rows) == len({(s, o) for s, o, _ in rows}), f"{cp}: an event twice"
        assert {e for _, _, e in rows} == expected, cp
        assert len(rows) == len(expected)
    assert sorted(got["a"]) == sorted(got["b"])  # the same segments, offsets and events
    for cp in sinks:
        for batch in sinks[cp].values():
            ordered = [e for _, _, e in sorted(batch) if e.startswith(b"t")]
            # Whole transactions only, each in order.
            starts = [i for i, e in enumerate(ordered) if e.endswith(b"-00")]
            assert len(ordered) == per_txn * len(starts), (cp, len(ordered))
            for i in starts:
                k = ordered[i][1:6]
                assert ordered[i : i + per_txn] == [b"t%s-%02d" % (k, j) for j in range(per_txn)]
    # The offsets both formats logged are Python's json.dumps text.
    for cp in sinks:
        for f in (tmp_path / cp / "offsets").iterdir():
            if f.name.isdigit():
                logged = f.read_text().splitlines()[-1]
                assert logged == json.dumps(json.loads(logged)), logged


def test_segments_jvm_tasks_end_early_only_for_a_segment_proven_deleted(
    gateway: MountedDaemon, spark: Any
) -> None:
    """Deleted or truncated between planning and reading (inside ``foreachBatch``).

    Retention's case (a newer segment of its node beside it): the task returns what is
    left; a truncation: it starts at the first line left; a lone segment deleted: nothing
    proves it deleted, so the task tries again for a while and fails.
    """
    d = gateway
    system = spark._jvm.java.lang.System
    system.setProperty("segmentgateway.mountCatchUpMs", "3000")
    with SyncClient(d.address) as c:
        for name in ("gone/a", "gone/b", "lone/x"):
            c.create(name, codec="lines")
            c.append(name, b"%s-0\n" % name.encode())
    offsets = {}  # line -> offset in gone/b
    first: list[int] = []  # where gone/b's trimmed view starts after the truncation
    seen: list[list[tuple[str, bytes]]] = []
    failed: list[tuple[float, str]] = []

    def sink(df: Any, batch_id: int) -> None:
        with SyncClient(d.address) as c:
            if not seen:  # retention deletes the oldest segment
                c.delete("gone/a")
                wait_for(lambda: not (d.mnt / "gone/a").exists(), 30, "gone/a gone")
                for i in range(1, 6):
                    offsets[i] = c.append("gone/b", b"gone/b-%d\n" % i).offset
            else:
                c.truncate("gone/b", offsets[3])
                trimmed = d.mnt / ".trimmed" / "gone" / "b"
                first.append(int(os.getxattr(trimmed, "user.segment.view_offset")))
        seen.append(sorted((r.segment, bytes(r.event)) for r in df.collect()))

    def lone(df: Any, batch_id: int) -> None:
        with SyncClient(d.address) as c:
            c.delete("lone/x")
        wait_for(lambda: not (d.mnt / "lone/x").exists(), 30, "lone/x gone")
        began = time.monotonic()
        try:
            df.collect()
        except Exception as e:  # the task's failure, as the sink sees it
            failed.append((time.monotonic() - began, str(e)))

    queries = [
        spark.readStream.format("segments-jvm").load(str(d.mnt / name)).writeStream
        .foreachBatch(f).trigger(processingTime="200 milliseconds").start()
        for name, f in (("gone", sink), ("lone", lone))
    ]  # fmt: skip
    try:
        wait_for(lambda: len(seen) >= 2 and failed, 90, "two batches and a failed read")
        assert all(q.exception() is None for q in queries)
    finally:
        for q in queries:
            q.stop()
        system.clearProperty("segmentgateway.mountCatchUpMs")
    assert seen[0] == [("gone/b", b"gone/b-0")]  # gone/a proven deleted: nothing of it
    # Truncated past where the batch starts: its first line left on (zeros below).
    assert offsets[3] <= first[0] <= offsets[5]
    assert seen[1] == [("gone/b", b"gone/b-%d" % i) for i in (3, 4, 5) if offsets[i] >= first[0]]
    waited, message = failed[0]
    assert "lone/x" in message and "does not show it deleted" in message, message
    assert waited >= 3


def test_a_killed_driver_restarts_from_its_checkpoint_exactly_once(
    gateway: MountedDaemon, tmp_path: Any
) -> None:
    """Writers append to a rolling stream; the driver is SIGKILLed, the query stopped twice.

    At random points: the kill after at least one batch, anywhere in the
    next two seconds; then a new driver, reading with ``segments-jvm`` from
    the killed one's checkpoint, stops and restarts its query twice before
    it runs to the end.
    """
    import pyarrow.parquet as pq

    d = gateway
    seed = int(os.environ.get("SEGMENT_GATEWAY_TEST_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    print(f"seed {seed}")
    with SyncClient(d.address) as c:
        c.create_stream("once/clicks", {"roll_size": 8192})
    acked: list[bytes] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write(k: int) -> None:
        import trio

        from gateway.client.writer import open_segment_writer

        async def main() -> None:
            async with open_segment_writer(
                d.address, "once/clicks", codec="lines", max_batch_bytes=1024
            ) as w:
                i = 0
                while not stop.is_set():
                    batch = [line(k, i + j) for j in range(20)]
                    for e in batch:
                        await w.write(e)
                    await w.flush()
                    acked.extend(batch)
                    i += 20
                    await trio.sleep(0.05)

        try:
            trio.run(main)
        except BaseException as e:
            errors.append(e)

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    env = {**os.environ, "PYTHONPATH": ROOT}
    command = [sys.executable, "-m", "tests.helpers.stream_driver", str(d.mnt / "once")]
    command += [str(checkpoint), str(out)]

    def driver(*extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*command, *extra], cwd=ROOT, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    writers = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for t in writers:
        t.start()
    try:
        p = driver()
        # Mid-stream: after at least one batch is written.
        # A new driver process starts Spark first: 20-45 s here, more when busy.
        wait_for(lambda: out.exists() and len(os.listdir(out)) > 0, 150, "a batch")
        time.sleep(rnd.uniform(0.0, 2.0))  # a random kill point: the subject
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
    finally:
        stop.set()
        for t in writers:
            t.join(timeout=60)
    assert not errors, errors
    with SyncClient(d.address) as c:
        c.roll_stream("once/clicks")
    # In batches of an eighth of what was acknowledged: the query stops land mid-way.
    limit = str(max(500, len(acked) // 8))
    p = driver("--until", str(len(acked)), "--max-events", limit, "--restarts", "2",
               "--seed", str(seed), "--format", "segments-jvm")  # fmt: skip
    try:
        _, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, stderr.decode()[-3000:]
    tables = [
        pq.read_table(out / b) for b in sorted(os.listdir(out)) if (out / b / "_SUCCESS").exists()
    ]
    got = [bytes(e) for t in tables for e in t.column("event").to_pylist()]
    counts = collections.Counter(got)
    assert [e for e, n in counts.items() if n > 1] == [], f"duplicates (seed {seed})"
    assert set(got) == set(acked), f"missing {len(set(acked) - set(got))} (seed {seed})"
    assert len(acked) > 1000
