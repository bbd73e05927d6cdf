"""Spark over containers that fail over: a dead node's segment and stream, read by a cluster.

Three replicating daemons with mounts on one SeaweedFS bucket (``write_quorum
= 3, ack_quorum = 2``, ``cluster.takeover = true``, ``down_after = 3s``) and
the suite's Spark standalone cluster (tests/conftest.py, ``spark_standalone``:
a master and three workers from the pyspark package, worker ``i`` in its own
mount namespace where the fixed path shows node ``i``'s mount, standing in for
an executor on that storage node). The driver (this process) lists through
node-a's mount.

node-c owns what is written and is killed with SIGKILL while an exactly-once
writer appends through node-a. Its storage node's host dies with it: its
mount is aborted (force-unmounted, as tests/test_failover.py does) and its
Spark worker is SIGKILLed with its executor, so from then on Spark runs on
the workers of node-a and node-b only (the next module using the cluster
starts the worker again: ``restart_dead_workers``). A survivor takes node-c's
container over and the writer finishes through it.
"""

from __future__ import annotations

import collections
import pathlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

pytest.importorskip("pyspark")

from gateway.client.client import open_client
from gateway.client.writer import open_segment_writer
from gateway.embedded import EmbeddedS3
from tests.helpers.mount import MountedDaemon, force_unmount, require_fuse
from tests.helpers.replicated import ReplicatedCluster
from tests.helpers.spark_cluster import SparkCluster
from tests.helpers.wait import async_wait_for, wait_for
from tests.torture import check_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

NODES = ("node-a", "node-b", "node-c")
DEAD = "node-c"
#: Streams roll by size and are looked after every 100 ms.
STREAMS = '[streams]\ninterval = "100ms"\n'

EXPECTED_ERRORS = (
    "cluster: .*", "replication: .*", "connection .*", "failover: .*", "recovery: .*",
    "handover: .*", "handback: .*",
)  # fmt: skip


@dataclass
class Setup:
    """The gateways, the Spark cluster, its session and the path its executors read."""

    gateways: ReplicatedCluster
    spark_cluster: SparkCluster
    spark: Any
    fixed: pathlib.Path
    #: When node-c was killed; when the writer's flushes were acknowledged.
    killed_at: float = 0.0
    acked_at: list[float] = field(default_factory=list)

    def say_pause(self) -> None:
        """How long after kill -9 the first append was acknowledged again.

        For a reader of the run only: tests/test_failover.py holds the
        bound; under Spark on this machine it is looser.
        """
        after = [t - self.killed_at for t in self.acked_at if t > self.killed_at]
        _say(f"first acknowledged append {min(after):.1f}s after kill -9")


@pytest.fixture(scope="module")
def spark_session(spark_standalone: SparkCluster) -> Iterator[Any]:
    """One session on the standalone cluster for the module (it takes long to start)."""
    spark_standalone.restart_dead_workers()  # an earlier module may have killed one
    _say("Spark workers up")
    try:
        spark = spark_standalone.session("failover-spark")
        from pipeline.source import SegmentsDataSource

        spark.dataSource.register(SegmentsDataSource)
        _say("Spark session up")
        yield spark
    finally:
        spark_standalone.stop_session()


@pytest.fixture
def setup(
    tmp_path: pathlib.Path,
    seaweedfs: EmbeddedS3,
    spark_standalone: SparkCluster,
    spark_session: Any,
) -> Iterator[Setup]:
    """Three taking-over gateways with mounts; Spark worker ``i`` reads node ``i``'s mount."""
    require_fuse()
    spark_cluster, spark = spark_standalone, spark_session
    fixed = spark_cluster.fixed_path
    gateways = ReplicatedCluster(tmp_path, seaweedfs, mounts=True, takeover=True, extra=STREAMS)
    bound: list[pathlib.Path] = []
    try:
        # An earlier test killed node-c's worker: started again, the
        # master gives the session an executor on it again.
        spark_cluster.restart_dead_workers()
        wait_for(lambda: spark_cluster.executor_count() == 3, 120, "an executor per worker")
        gateways.start()
        _say("gateways up")
        for node, source in zip(NODES, spark_cluster.sources, strict=True):
            mnt = _mnt(gateways, node)
            subprocess.run(["mount", "--bind", str(mnt), str(source)], check=True, timeout=10)
            bound.append(source)
        # The driver lists files (in this process's namespace): node-a's mount.
        mnt = _mnt(gateways, "node-a")
        subprocess.run(["mount", "--bind", str(mnt), str(fixed)], check=True, timeout=10)
        bound.append(fixed)
        assert executor_mounts(spark, fixed) == 3  # one executor per node, each its own mount
        _say("each executor reads its own node's mount")
        yield Setup(gateways, spark_cluster, spark, fixed)
    finally:
        for path in reversed(bound):
            subprocess.run(["umount", "-l", str(path)], timeout=10)
        gateways.teardown()


def _mnt(c: ReplicatedCluster, node: str) -> pathlib.Path:
    d = c.daemons[node]
    assert isinstance(d, MountedDaemon)
    return d.mnt


def executor_mounts(spark: Any, fixed: pathlib.Path) -> int:
    """How many distinct mounts the executors read ``fixed`` through (one per live node)."""
    path = str(fixed)

    def mount_of(_: int) -> str:
        # The FUSE connection behind the path, from this executor's namespace.
        with open("/proc/self/mountinfo") as f:
            found = ""
            for line in f:
                fields = line.split()
                if fields[4] == path:
                    found = fields[2]
            return found

    return len(spark.sparkContext.parallelize(range(30), 30).map(mount_of).distinct().collect())


_T0 = time.monotonic()


def _say(what: str) -> None:
    """Progress, for a reader of a slow run (``-s``)."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {what}", flush=True)


def _event(i: int) -> bytes:
    return b"event-%08d" % i


def _host_dies(s: Setup) -> None:
    """kill -9 of node-c's gateway; its mount and its Spark worker (with its executor) go too."""
    s.gateways.daemons[DEAD].kill()
    s.killed_at = time.monotonic()
    force_unmount(_mnt(s.gateways, DEAD))
    _say("node-c killed")
    s.spark_cluster.kill_worker(NODES.index(DEAD))
    _say("node-c's executor gone")


async def _hosted_by(c: ReplicatedCluster, via: str, node: str) -> str:
    async with open_client(c.daemons[via].address) as cl:
        status = {n.id: n for n in await cl.cluster()}
    return status[node].hosted_by


async def _wait_taken_over(c: ReplicatedCluster) -> str:
    """The survivor that runs node-c's container (it says so in its log)."""
    hosts: list[str] = []

    async def hosted() -> Any:
        hosts.append(await _hosted_by(c, "node-a", DEAD))
        return bool(hosts[-1])

    await async_wait_for(hosted, 60, "node-c's container hosted")
    host = hosts[-1]
    assert host in ("node-a", "node-b")
    log = c.daemons[host].log_path
    # The registry names the host as soon as its process starts; it
    # serves once the lease ran out and the journal tail is recovered.
    await async_wait_for(lambda: "took over in" in log.read_text(), 30, f"{host} serving node-c")
    _say(f"node-c's container serves on {host}")
    return host


@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_spark_cluster_reads_every_event_of_a_taken_over_segment_once(
    setup: Setup,
) -> None:
    """A Spark job on the standalone cluster reads a dead node's segment after the takeover.

    An exactly-once writer appends 3,000 events through node-a to a segment
    of node-c; a third of the way node-c's host dies (gateway SIGKILLed,
    mount aborted, its Spark worker and executor SIGKILLed: from then on
    only the workers of node-a and node-b run tasks, each reading through
    its own node's mount); the writer finishes through the survivor that
    took the container over. Then a job over the two remaining executors
    reads the segment through their mounts (the ``segments`` source, cut in
    several parts so both executors read, and Spark's ``text`` reader):
    every acknowledged event once, in order.
    """
    s = setup
    c = s.gateways
    a = c.daemons["node-a"]
    async with open_client(c.daemons[DEAD].address) as cl:
        await cl.create("dead/events", codec="lines")
    events = 3000
    async with trio.open_nursery() as nursery, open_segment_writer(
        a.address, "dead/events", codec="lines", writer_id=uuid.uuid4().bytes,
        max_batch_bytes=2048, reconnect_timeout=120,
    ) as w:  # fmt: skip
        for i in range(events):
            await w.write(_event(i))
            if i % 25 == 0:
                await w.flush()
                s.acked_at.append(time.monotonic())
                await trio.sleep(0.005)
            if i == events // 3:
                await w.flush()  # acknowledged by node-c and a replica
                nursery.start_soon(trio.to_thread.run_sync, _host_dies, s)
                nursery.start_soon(_wait_taken_over, c)
        await w.flush()
        assert w.acked_event == events
    _say("writer done")
    s.say_pause()
    assert await _hosted_by(c, "node-a", DEAD) in ("node-a", "node-b")

    want = [_event(i) for i in range(events)]
    # The survivors' mounts show it whole (a tail read through the host).
    for node in ("node-a", "node-b"):
        mnt = _mnt(c, node)

        def through_mount(mnt: pathlib.Path = mnt, node: str = node) -> bool:
            data = (mnt / "dead" / "events").read_bytes()
            where = f"through {node}'s mount"
            return check_lines(data, _event, 0, where, "dead/events") == events

        await trio.to_thread.run_sync(wait_for, through_mount, 30, f"all in {node}'s mount")

    def in_spark() -> None:
        spark, fixed = s.spark, s.fixed
        # Only the survivors' executors are left: node-c's mount is nowhere.
        assert s.spark_cluster.executor_count() == 2
        assert executor_mounts(spark, fixed) == 2
        rows = (
            spark.read.format("segments")
            .option("codec", "lines")
            .option("splitSize", "12k")  # several parts, read by both executors
            .load(f"{fixed}/dead")
            .collect()
        )
        by_offset = sorted((r.offset, bytes(r.event)) for r in rows)
        got = [e for _, e in by_offset]
        assert len(got) == len(set(got)), "an event read twice"
        assert got == want
        assert by_offset[-1][0] == (events - 1) * (len(want[0]) + 1)
        text = [r.value.encode() for r in spark.read.text(f"file://{fixed}/dead/events").collect()]
        assert text == want

    _say("mounts show every event")
    began = time.monotonic()
    await trio.to_thread.run_sync(in_spark)
    print(f"Spark read {events} events after the takeover in {time.monotonic() - began:.1f}s")


@pytest.mark.expect_errors(*EXPECTED_ERRORS)
async def test_a_streaming_query_over_a_dead_nodes_stream_keeps_running(setup: Setup) -> None:
    """A Structured Streaming query over node-c's stream rides through its takeover.

    The query (the streaming ``segments`` source through the driver's
    node-a mount, each executor reading through its own node's mount, a
    memory sink, 1 s trigger) runs while an exactly-once writer appends
    3,000 events through node-a to a stream of node-c that rolls every
    8 KiB. Once the sink holds rows, node-c's host dies (gateway, mount,
    Spark worker and executor); the writer finishes through the survivor
    that took the container over. The query is still running, never
    failed after its first rows, and its sink holds every acknowledged
    event exactly once, in the stream's order (segments by name, events
    by offset). (A query that fails at its start, before anything fails
    over, is started again: see ``started``.)
    """
    s = setup
    c = s.gateways
    a = c.daemons["node-a"]
    async with open_client(c.daemons[DEAD].address) as cl:
        await cl.create_stream("live", {"roll_size": 8 * 1024}, codec="lines")
    events = 3000

    def start() -> Any:
        return (
            s.spark.readStream.format("segments")
            .option("minPartitions", "2")
            .option("mountTimeout", "60s")
            .load(f"{s.fixed}/live")
            .writeStream.format("memory")
            .queryName("failover_live")
            .trigger(processingTime="1 second")
            .start()
        )

    queries = [await trio.to_thread.run_sync(start)]

    def rows() -> list[Any]:
        return list(s.spark.table("failover_live").collect())

    def running() -> None:
        if not queries[-1].isActive:
            raise AssertionError(f"the streaming query stopped: {queries[-1].exception()}")

    def started() -> bool:
        """The query has put rows in its sink (before node-c dies).

        A query that fails before its first rows is started again (twice
        at most): on this loaded machine the Python process of the
        streaming source sometimes does not connect back to the driver in
        time (``Python worker failed to connect back``, at query start).
        Nothing has failed over yet, so that is not what is tested.
        """
        if not queries[-1].isActive and len(queries) < 3 and not rows():
            _say(f"the query failed before its first rows, again: {queries[-1].exception()}")
            queries.append(start())
            return False
        running()
        return bool(rows())

    try:
        async with trio.open_nursery() as nursery, open_segment_writer(
            a.address, "live", codec="lines", writer_id=uuid.uuid4().bytes,
            max_batch_bytes=2048, reconnect_timeout=120,
        ) as w:  # fmt: skip
            for i in range(events):
                await w.write(_event(i))
                if i % 25 == 0:
                    await w.flush()
                    s.acked_at.append(time.monotonic())
                    await trio.sleep(0.01)
                if i == events // 3:
                    await w.flush()
                    # Mid-stream: the query has put rows of node-c's stream in its sink.
                    await trio.to_thread.run_sync(lambda: wait_for(started, 90, "first rows"))
                    nursery.start_soon(trio.to_thread.run_sync, _host_dies, s)
                    nursery.start_soon(_wait_taken_over, c)
            await w.flush()
            assert w.acked_event == events
        _say("writer done")
        s.say_pause()
        assert await _hosted_by(c, "node-a", DEAD) in ("node-a", "node-b")

        def all_in() -> bool:
            running()
            return len(rows()) >= events

        began = time.monotonic()
        await trio.to_thread.run_sync(lambda: wait_for(all_in, 90, "every event in the sink"))
        print(f"the sink held every event {time.monotonic() - began:.1f}s after the last ack")
        await trio.sleep(3)  # a late duplicate would show
        running()
        got = await trio.to_thread.run_sync(rows)
    finally:
        await trio.to_thread.run_sync(queries[-1].stop)
    assert queries[-1].exception() is None
    counts = collections.Counter(bytes(r.event) for r in got)
    twice = sorted(e for e, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} event(s) more than once in the sink: {twice[:5]}"
    in_order = [bytes(r.event) for r in sorted(got, key=lambda r: (r.segment, r.offset))]
    assert in_order == [_event(i) for i in range(events)]
    segments = {r.segment for r in got}
    assert len(segments) > 3, f"the stream did not roll: {segments}"
