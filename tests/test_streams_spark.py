"""Streams and transactions read by Spark through the mount, with the daemon killed.

One mounted daemon and one local Spark session (``local[2]``) for the module.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import functions as F

from gateway.client.sync import SyncClient
from tests.helpers.lines import Committer
from tests.helpers.mount import MountedDaemon, mounted_daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

KiB = 1024


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedDaemon]:
    tmp = tmp_path_factory.mktemp("streams-spark")
    config = (
        f'[tier2]\nurl = "file://{tmp}/tier2"\nflush_size = "16 KiB"\nflush_interval = "300ms"\n'
        '[streams]\ninterval = "100ms"\n'
    )
    with mounted_daemon(tmp, config) as daemon:
        yield daemon


def events_df(spark: Any, path: pathlib.Path) -> Any:
    """Every event of the segments under ``path``, through the ``segments`` source."""
    return spark.read.format("segments").option("codec", "lines").load(str(path))


def test_writers_on_a_rolling_stream_under_sigkills_land_every_event_once_in_order(
    gateway: MountedDaemon, spark: Any
) -> None:
    """Two exactly-once writers on a stream rolling every 4 KiB; the daemon killed mid-stream.

    Every acknowledged event is in the stream exactly once and in order,
    as the protocol, the mount and Spark each read it.
    """
    d = gateway
    n_events = 3000
    with SyncClient(d.address) as c:
        c.create_stream("ev", {"roll_size": 4 * KiB})
    errors: list[BaseException] = []

    def write(k: int) -> None:
        import trio

        from gateway.client.writer import open_segment_writer

        async def main() -> None:
            async with open_segment_writer(
                d.address, "ev", codec="lines", writer_id=bytes([k + 1]) * 16, max_batch_bytes=512
            ) as w:
                for i in range(n_events):
                    await w.write(b"w%d-%06d" % (k, i))
                    if i % 10 == 0:
                        await trio.sleep(0.02)  # about 6 s: the kills land mid-stream

        try:
            trio.run(main)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    kills = 0
    while kills < 4 and any(t.is_alive() for t in threads):
        time.sleep(0.6)  # the writers go on between kills: kill points are the subject
        d.kill()
        d.start()
        kills += 1
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    # The writers sleep 6 s in all: at least two kills land while they write.
    assert kills >= 2, f"the writers finished after {kills} kill(s)"
    with SyncClient(d.address) as c:
        c.roll_stream("ev")
        segs = c.stream("ev").segments
        assert len(segs) > 10
        assert all(s.sealed for s in segs)
        protocol = b"".join(c.read(s.name, 0, 1 << 20).data for s in segs)
    mounted = b"".join((d.mnt / s.name).read_bytes() for s in segs)
    assert mounted == protocol
    lines = protocol.split(b"\n")[:-1]
    expected = {k: [b"w%d-%06d" % (k, i) for i in range(n_events)] for k in range(2)}
    for k in range(2):
        assert [x for x in lines if x.startswith(b"w%d-" % k)] == expected[k]
    rows = events_df(spark, d.mnt / "ev").select("segment", "offset", "event").collect()
    ordered = [bytes(r.event) for r in sorted(rows, key=lambda r: (r.segment, r.offset))]
    assert ordered == lines


def test_a_spark_count_during_commits_sees_only_whole_transactions(
    gateway: MountedDaemon, spark: Any
) -> None:
    """Transactions of 50 events committed back to back while Spark counts the stream."""
    d = gateway
    per_txn = 50
    with SyncClient(d.address) as c:
        c.create_stream("tx", {"roll_size": 16 * KiB})
    stop = threading.Event()
    errors: list[BaseException] = []
    committer = Committer(d.address, "tx", per_txn)
    direct: list[int] = []

    def append_loop() -> None:
        # Plain appends to the same stream, between and during the commits.
        try:
            with SyncClient(d.address) as c:
                while not stop.is_set():
                    c.append("tx", b"direct-%06d\n" % len(direct))
                    direct.append(1)
                    time.sleep(0.002)
        except BaseException as e:
            errors.append(e)

    threads = [committer, threading.Thread(target=append_loop)]
    for t in threads:
        t.start()
    counts = []
    try:
        while len(counts) < 8:
            events = events_df(spark, d.mnt / "tx")
            counts.append(events.where(F.expr("substring(event, 1, 1) = X'74'")).count())
    finally:
        stop.set()
        committer.stop()
        for t in threads:
            t.join(timeout=60)
    assert not errors and not committer.errors, (errors, committer.errors)
    committed = committer.committed
    assert len(set(counts)) > 2, f"the commits did not overlap the counts: {counts}"
    assert all(n % per_txn == 0 for n in counts), counts
    assert counts == sorted(counts)
    rows = events_df(spark, d.mnt / "tx").collect()
    events = [bytes(r.event) for r in sorted(rows, key=lambda r: (r.segment, r.offset))]
    assert len(events) == per_txn * len(committed) + len(direct)
    # Each transaction's events are contiguous and whole, wherever it landed.
    txn_events = [e for e in events if e.startswith(b"t")]
    for k in range(len(committed)):
        at = txn_events.index(b"t%05d-00" % k)
        assert txn_events[at : at + per_txn] == [b"t%05d-%02d" % (k, j) for j in range(per_txn)]
        i = events.index(b"t%05d-00" % k)
        assert events[i : i + per_txn] == txn_events[at : at + per_txn]
