"""Spark Structured Streaming over growing, rolling, truncated and deleted segments.

One mounted daemon for the module. The streaming ``segments`` source
(pipeline/stream.py) runs in a local Spark session (``local[2]``) with a
memory sink, and, for exactly-once, in a separate driver process
(tests/helpers/stream_driver.py) killed with SIGKILL at random points while
writers append and the stream rolls; the batches it wrote hold every
acknowledged event exactly once.
"""

from __future__ import annotations

import collections
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
from tests.helpers.mount import MountedDaemon, mounted_daemon
from tests.helpers.wait import wait_for

# Serial (tests/conftest.py): deadlines of a minute or more on a query that
# missed them twice with another worker beside it.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(420)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedDaemon]:
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


def test_a_query_follows_appends_rolls_truncation_and_deletion(
    gateway: MountedDaemon, spark: Any
) -> None:
    d = gateway
    with SyncClient(d.address) as c:
        c.create_stream("live/clicks", {"roll_size": 2048})
        c.create("live/notes", codec="lines")
        c.append("live/notes", b'{"w": 9, "n": 0}\n{"w": 9, "n"')  # a cut line: not yet
    events = spark.readStream.format("segments").option("codec", "lines").load(str(d.mnt / "live"))
    query = (
        events.writeStream.format("memory")
        .queryName("live")
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def rows() -> list[Any]:
        return spark.sql("SELECT segment, offset, CAST(event AS STRING) AS e FROM live").collect()

    try:
        expected = [b'{"w": 9, "n": 0}']
        wait_for(lambda: len(rows()) == 1, 60, "the first line")
        # Appends to a segment the query has already read arrive: Spark's
        # file source never rereads a file it has listed.
        with SyncClient(d.address) as c:
            c.append("live/notes", b": 1}\n")
            expected.append(b'{"w": 9, "n": 1}')
            for i in range(300):  # ~6 KiB of events, rolling every 2 KiB
                c.append("live/clicks", line(1, i) + b"\n")
                expected.append(line(1, i))
        wait_for(lambda: len(rows()) >= len(expected), 60, "every event")
        got = rows()
        assert sorted(r.e.encode() for r in got) == sorted(expected)
        members = {r.segment for r in got if r.segment.startswith("live/clicks/")}
        assert len(members) >= 3  # the rolled successors were followed
        # Retention deletes the oldest members; truncation skips what it cut.
        with SyncClient(d.address) as c:
            c.set_stream("live/clicks", {"retain_size": 1})
            c.roll_stream("live/clicks")
            c.truncate("live/notes", c.info("live/notes").length)
            wait_for(lambda: len(c.stream("live/clicks").segments) <= 1, 60, "retention")
            for i in range(300, 320):
                c.append("live/clicks", line(1, i) + b"\n")
                expected.append(line(1, i))
            c.append("live/notes", b'{"w": 9, "n": 2}\n')
            expected.append(b'{"w": 9, "n": 2}')
        wait_for(lambda: len(rows()) >= len(expected), 60, "the events after retention")
        time.sleep(1)  # a few more triggers: nothing is read twice
        got = rows()
        assert sorted(r.e.encode() for r in got) == sorted(expected)
        assert query.exception() is None
    finally:
        query.stop()


def test_admission_control_limits_each_batch(gateway: MountedDaemon, spark: Any) -> None:
    d = gateway
    with SyncClient(d.address) as c:
        c.create("limited/a", codec="lines")
        c.append("limited/a", b"".join(line(2, i) + b"\n" for i in range(1000)))
        # A framed one beside it: each segment is read by its own codec.
        c.create("limited/b", codec="framed")
        c.append("limited/b", b"".join(framed(line(3, i)) for i in range(500)))
        c.seal("limited/b")
    # Events here take 17 to 23 bytes with their newline or length: 4 KiB is at most 241.
    for option, value, most in (
        ("maxEventsPerTrigger", "300", 300),
        ("maxBytesPerTrigger", "4k", 241),
    ):
        name = f"limited_{option}"
        query = (
            spark.readStream.format("segments")
            .option(option, value)
            .load(str(d.mnt / "limited"))
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


def test_a_killed_driver_restarts_from_its_checkpoint_exactly_once(
    gateway: MountedDaemon, tmp_path: Any
) -> None:
    """Writers append to a rolling stream; the driver is SIGKILLed, the query stopped twice.

    At random points: the kill after at least one batch, anywhere in the
    next two seconds; then a new driver stops and restarts its query twice
    before it runs to the end.
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
               "--seed", str(seed))  # fmt: skip
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
