"""The Spark standalone harness: each worker's executors see their own source at one path.

Plain directories stand in for the gateway nodes' FUSE mounts here; what is
checked is the harness itself (tests/helpers/spark_cluster.py).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.helpers.spark_cluster import (
    SparkCluster,
    executor_view,
    live_group_members,
    require_cluster,
)

# A standalone cluster of JVMs: `make test-fast` leaves this out.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N = 3


# First: it would share the two cores with the module's session after it.
def test_stop_leaves_no_process(tmp_path: pathlib.Path) -> None:
    """A cluster stopped before any session leaves no process behind."""
    require_cluster()
    source = tmp_path / "src"
    source.mkdir()
    fixed = tmp_path / "segments"
    fixed.mkdir()
    spark_cluster = SparkCluster(tmp_path / "spark", fixed, [source])
    try:
        spark_cluster.start()
        groups = spark_cluster.process_groups
        assert len(groups) == 2
        assert len(live_group_members(groups)) >= 2
    finally:
        spark_cluster.stop()
    assert live_group_members(groups) == []
    assert spark_cluster.process_groups == set()


@pytest.fixture(scope="module")
def cluster(spark_standalone: SparkCluster) -> Iterator[tuple[SparkCluster, Any]]:
    """The suite's three workers, each with its own ``node-<i>`` file at ``segments/node.txt``.

    That the cluster's stop leaves no process is checked where it stops
    (tests/conftest.py, ``spark_standalone``).
    """
    assert spark_standalone.n == N
    spark_standalone.restart_dead_workers()
    for i, source in enumerate(spark_standalone.sources):
        (source / "node.txt").write_text(f"node-{i}")
    try:
        yield spark_standalone, spark_standalone.session("spark-cluster-harness")
    finally:
        spark_standalone.stop_session()
        for source in spark_standalone.sources:
            (source / "node.txt").unlink(missing_ok=True)


def test_each_executor_sees_its_own_worker_source(cluster: tuple[SparkCluster, Any]) -> None:
    """Tasks read ``segments/node.txt``: every node's content turns up, one per executor."""
    spark_cluster, spark = cluster
    fixed = spark_cluster.fixed_path / "node.txt"
    sc = spark.sparkContext
    seen: set[str] = set()
    # The scheduler may leave an executor idle in one job; a few jobs do not.
    for _ in range(5):
        seen |= set(
            sc.parallelize(range(60), 60).map(lambda _: fixed.read_text()).distinct().collect()
        )
        if len(seen) == N:
            break
    assert seen == {f"node-{i}" for i in range(N)}

    view = executor_view(spark, spark_cluster.fixed_path, "node.txt", N)
    assert len(view) == N, view
    # One source per executor, and a different one for each.
    assert all(len(contents) == 1 for contents in view.values()), view
    assert set.union(*view.values()) == {f"node-{i}" for i in range(N)}


def test_binds_stay_private_to_the_workers(cluster: tuple[SparkCluster, Any]) -> None:
    """The binds live in the workers' namespaces: the host's ``segments`` stays empty."""
    spark_cluster, _ = cluster
    fixed = spark_cluster.fixed_path
    assert fixed.is_dir()
    assert list(fixed.iterdir()) == []
    assert not os.path.ismount(fixed)
    with open("/proc/self/mountinfo") as f:
        assert all(line.split()[4] != str(fixed) for line in f)
