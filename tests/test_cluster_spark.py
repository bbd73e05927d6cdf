"""Spark as a real cluster over three storage nodes: one executor per node.

Three gateway daemons share one SeaweedFS bucket; a Spark standalone master
and three workers run from the pyspark package, each worker in its own mount
namespace where the same path shows its own node's mount
(tests/helpers/spark_cluster.py). Segments are written on all three nodes
(sealed and flushed, flushed and active, only in the owner's journal), and
``spark.read.json``, ``spark.read.text`` and the ``segments`` source count
exactly what was appended. Then one node is killed: every flushed event is
still counted, and the unflushed tail is left out as documented (the file
ends at the flushed length), never half-read.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from gateway.embedded import EmbeddedS3
from tests.helpers.cluster import NODES, Cluster
from tests.helpers.mount import require_fuse
from tests.helpers.spark_cluster import SparkCluster
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def lines(node: str, kind: str, first: int, count: int) -> bytes:
    return b"".join(
        json.dumps({"node": node, "kind": kind, "n": i}).encode() + b"\n"
        for i in range(first, first + count)
    )


@pytest.fixture(scope="module")
def setup(
    seaweedfs: EmbeddedS3, spark_standalone: SparkCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, SparkCluster, Any, pathlib.Path, dict[str, int]]]:
    """Three gateways, and the suite's Spark workers each reading its own node's mount."""
    require_fuse()
    root = tmp_path_factory.mktemp("spark-cluster")
    gateways = Cluster(root / "nodes", seaweedfs)
    spark_cluster = spark_standalone
    fixed = spark_cluster.fixed_path
    bound: list[pathlib.Path] = []
    try:
        gateways.start()
        counts = write_segments(gateways)
        spark_cluster.restart_dead_workers()
        # Worker i's source is where node i's mount goes: it shows at
        # ``fixed`` in that worker's namespace only.
        for node, source in zip(NODES, spark_cluster.sources, strict=True):
            mnt = gateways.daemons[node].mnt
            subprocess.run(["mount", "--bind", str(mnt), str(source)], check=True, timeout=10)
            bound.append(source)
        # The driver lists files (in this process's namespace): node-a's mount.
        subprocess.run(["mount", "--bind", str(gateways.daemons["node-a"].mnt), str(fixed)],
                       check=True, timeout=10)  # fmt: skip
        bound.append(fixed)
        spark = spark_cluster.session("cluster-spark")
        from pipeline.source import SegmentsDataSource

        spark.dataSource.register(SegmentsDataSource)
        yield gateways, spark_cluster, spark, fixed, counts
    finally:
        try:
            spark_cluster.stop_session()
        finally:
            for path in reversed(bound):
                subprocess.run(["umount", "-l", str(path)], timeout=10)
            gateways.teardown()


def write_segments(gateways: Cluster) -> dict[str, int]:
    """On every node: a sealed flushed, an active flushed-then-grown, a journal-only segment."""
    counts: dict[str, int] = {}
    for i, node in enumerate(NODES):
        with gateways.client(node) as c:
            sealed = f"events/{node}/sealed"
            c.create(sealed)
            c.append(sealed, lines(node, "sealed", 0, 3000 + i))
            c.seal(sealed)
            c.flush(sealed)
            active = f"events/{node}/active"
            c.create(active)
            c.append(active, lines(node, "active", 0, 2000))
            c.flush(active)
            c.append(active, lines(node, "active", 2000, 150 + i))  # journal only
            journal = f"events/{node}/journal"
            c.create(journal)
            c.append(journal, lines(node, "journal", 0, 500 + i))
            counts[f"{node}/flushed"] = 3000 + i + 2000
            counts[f"{node}/unflushed"] = 150 + i + 500 + i
    total = sum(counts.values())
    for node in NODES:
        mnt = gateways.daemons[node].mnt

        seen: dict[str, int] = {}

        def complete(mnt: pathlib.Path = mnt, seen: dict[str, int] = seen) -> bool:
            seen.clear()
            for d in (mnt / "events").iterdir():
                for f in d.iterdir():
                    seen[str(f.relative_to(mnt))] = f.read_bytes().count(b"\n")
            return sum(seen.values()) == total

        try:
            wait_for(complete, 10, f"every event in {node}'s mount")
        except AssertionError as e:
            raise AssertionError(f"{e}; lines seen: {seen}, expected {counts}") from None
    return counts


def executors_per_node(spark: Any, fixed: pathlib.Path) -> int:
    """How many distinct mounts the executors read ``fixed`` through (one per node)."""
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


def test_spark_cluster_counts_every_event_of_every_node(setup: Any) -> None:
    _, _, spark, fixed, counts = setup
    total = sum(counts.values())
    assert executors_per_node(spark, fixed) == 3
    uri = f"file://{fixed}/events/*/*"
    df = spark.read.json(uri)
    assert df.count() == total
    per_node = {r["node"]: r["count"] for r in df.groupBy("node").count().collect()}
    assert per_node == {n: counts[f"{n}/flushed"] + counts[f"{n}/unflushed"] for n in NODES}
    assert spark.read.text(uri).count() == total
    source = spark.read.format("segments").option("codec", "lines").load(f"{fixed}/events")
    assert source.count() == total


def test_a_streaming_query_follows_appends_on_every_node(setup: Any) -> None:
    """The streaming source on the cluster: each executor reads through its own node's mount."""
    gateways, _, spark, fixed, _ = setup
    for node in NODES:
        with gateways.client(node) as c:
            c.create(f"live/{node}", codec="lines")
            c.append(f"live/{node}", lines(node, "live", 0, 100))
    query = (
        spark.readStream.format("segments")
        .option("minPartitions", "3")
        .load(f"{fixed}/live")
        .writeStream.format("memory")
        .queryName("cluster_live")
        .trigger(processingTime="500 milliseconds")
        .start()
    )

    def count() -> int:
        return int(spark.table("cluster_live").count())

    try:
        wait_for(lambda: count() == 300, 60, "the first events of every node")
        # Appends to segments the query has read, on every node, some
        # read by executors of other nodes before their views refresh.
        for node in NODES:
            with gateways.client(node) as c:
                c.append(f"live/{node}", lines(node, "live", 100, 400))
        wait_for(lambda: count() >= 1500, 60, "the later events of every node")
        rows = spark.table("cluster_live").collect()
        assert len(rows) == 1500
        got = {(json.loads(bytes(r.event))["node"], json.loads(bytes(r.event))["n"]) for r in rows}
        assert got == {(node, n) for node in NODES for n in range(500)}
        assert query.exception() is None
    finally:
        query.stop()


def test_a_dead_node_leaves_its_flushed_events_counted(setup: Any) -> None:
    """Runs last: node-c stays down."""
    gateways, spark_cluster, spark, fixed, counts = setup
    # What this test is about: node-c still holds tails only in its journal.
    seen = gateways.daemons["node-a"].mnt / "events/node-c"
    for name in ("active", "journal"):
        stored = int(os.getxattr(seen / name, "user.segment.storage_length"))
        assert stored < (seen / name).stat().st_size, f"{name} was flushed meanwhile"
    # The storage node's host dies: its gateway and its Spark worker with it.
    gateways.daemons["node-c"].kill()
    spark_cluster.kill_worker(NODES.index("node-c"))
    mnt = gateways.daemons["node-a"].mnt
    active = mnt / "events/node-c/active"
    wait_for(lambda: os.getxattr(active, "user.segment.tail_available") == b"0", 15,
             "node-c's tail marked unavailable")  # fmt: skip
    expected = total_without_tail = sum(counts.values()) - counts["node-c/unflushed"]
    uri = f"file://{fixed}/events/*/*"
    df = spark.read.json(uri)
    got = df.count()
    if got != expected:
        views = {
            node: {
                name: (
                    (gateways.daemons[node].mnt / "events/node-c" / name).stat().st_size,
                    (gateways.daemons[node].mnt / "events/node-c" / name).read_bytes().count(b"\n"),
                )
                for name in ("active", "journal", "sealed")
            }
            for node in ("node-a", "node-b")
        }
        by_node = {r["node"]: r["count"] for r in df.groupBy("node").count().collect()}
        raise AssertionError(f"{got} != {expected}: {by_node}, mounts now: {views}, {counts}")
    # Whole lines only: the file ends at an append boundary, nothing half-read.
    assert "_corrupt_record" not in df.columns
    per_node = {r["node"]: r["count"] for r in df.groupBy("node").count().collect()}
    assert per_node["node-c"] == counts["node-c/flushed"]
    assert spark.read.text(uri).count() == total_without_tail
