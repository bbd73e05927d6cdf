"""Shared fixtures."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import re
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from gateway.config import JournalConfig, KiB, MiB
from tests.helpers import daemon as daemon_helper
from tests.helpers.disk import tmpfs

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedS3
    from gateway.storage.s3 import S3Storage
    from tests.helpers.spark_cluster import SparkCluster

ROOT = pathlib.Path(__file__).resolve().parent.parent


# -- Phases and xdist groups (`make test`) -----------------------------------------
#
# `make test` runs the suite in two phases: ``--suite-phase=parallel`` on two
# xdist workers (``-n 2 --dist loadgroup``), then ``--suite-phase=serial`` in
# one process: the tests marked ``serial`` are timing-sensitive, with a bound
# on wall time tight enough (a second or two) that a second worker's load
# could break it, or faults timed against real daemons (the tortures). Plain
# ``pytest`` (no option) runs everything in one process, as before.
#
# With ``--dist loadgroup`` the scheduler below sends each module whole to
# one worker, so its module-scoped fixtures are made once. The modules that
# use Spark form one group (one worker starts the standalone cluster and the
# local session, not both workers), and so do the tortures (at most one runs
# at a time). A worker sends its items in this order, which is the order the
# groups are handed out in: the tortures and Spark first, then the modules
# with slow tests, then the rest, so that the last groups are short and both
# workers end together.

#: The modules that run Spark: every one that uses the ``spark`` or
#: ``spark_standalone`` fixture (checked at collection: a new one must be
#: added here), and test_spark_streaming_restarts (drivers of its own).
SPARK_MODULES = frozenset(
    {
        "tests/test_cluster_spark.py",
        "tests/test_failover_spark.py",
        "tests/test_parseable_files.py",
        "tests/test_pipeline.py",
        "tests/test_replication.py",
        "tests/test_segments_jvm.py",
        "tests/test_spark_cluster_harness.py",
        "tests/test_spark_streaming.py",
        "tests/test_spark_streaming_restarts.py",
        "tests/test_streams_spark.py",
    }
)
SPARK_FIXTURES = frozenset({"spark", "spark_standalone"})


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under ``--dist loadgroup``: its module, or "spark", "torture"."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/torture/"):
        return "torture"
    if module in SPARK_MODULES:
        return "spark"
    return module


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-phase",
        choices=("all", "parallel", "serial"),
        default="all",
        help="run only the tests not marked serial (parallel), only those marked serial "
        "(serial), or all (default); see tests/conftest.py",
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: a whole module, or a group of them (`xdist_group`), per worker."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Hand the groups out in the order of the items (see above), not by size.
    config.option.loadscopereorder = False

    class ModuleGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ModuleGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this phase's items and, on an xdist worker, put the long groups first."""
    phase = config.getoption("--suite-phase")
    if phase != "all":
        keep, drop = [], []
        for item in items:
            serial = item.get_closest_marker("serial") is not None
            (keep if serial == (phase == "serial") else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())) and module not in SPARK_MODULES:
            raise pytest.UsageError(f"{module} uses Spark: add it to SPARK_MODULES in {__file__}")
        groups.setdefault(xdist_group(item.nodeid), []).append(item)
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: the order of the files
    rank = {"torture": 0, "spark": 1}

    def key(group: tuple[int, tuple[str, list[pytest.Item]]]) -> tuple[int, int]:
        n, (name, members) = group
        slow = any(i.get_closest_marker("slow") for i in members)
        return rank.get(name, 2 if slow else 3), n

    ordered = sorted(enumerate(groups.items()), key=key)
    items[:] = [item for _, (_, members) in ordered for item in members]


#: Seconds per test module (setup, call and teardown), for the summary below.
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration to its module (also for reports from xdist workers)."""
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The modules that took longest, beside pytest's slowest tests: where the suite's time goes."""
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest 15 modules (all tests: {total:.0f} s)")
    ranked = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])
    for module, seconds in ranked[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {module}")


class _ErrorRecords(logging.Handler):
    """Keeps the ERROR (and worse) records logged while a test runs."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def check_error_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test on an ERROR it did not expect (S3QL's and pyfuse3's checklogs).

    In-process records and the logs of the daemons the test started
    (tests/helpers/daemon.py) both count: a FUSE operation that logs an
    exception and answers EIO fails the test that caused it, whatever the
    test asserts. A test that provokes errors on purpose says which, by
    message: ``@pytest.mark.expect_errors("regex", ...)``.
    """
    handler = _ErrorRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    daemon_helper.STARTED.clear()
    try:
        yield
    finally:
        root.removeHandler(handler)
    marker = request.node.get_closest_marker("expect_errors")
    expected = [re.compile(p) for p in (marker.args if marker else ())]

    def unexpected(text: str) -> bool:
        return not any(p.search(text) for p in expected)

    found = [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in handler.records
        if unexpected(r.getMessage())
    ]
    for d in daemon_helper.STARTED:
        found += [
            f"daemon {d.data_dir.name}: {line}" for line in d.error_lines() if unexpected(line)
        ]
    daemon_helper.STARTED.clear()
    if found:
        pytest.fail(
            "unexpected ERROR logs (declare expected ones with @pytest.mark.expect_errors):\n"
            + "\n".join(found[:20]),
            pytrace=False,
        )


def small_journal_config(**overrides: Any) -> JournalConfig:
    """A journal configuration that rolls files and frames often, for tests."""
    base = JournalConfig(
        file_size=1 * MiB,
        preallocate_step=256 * KiB,
        max_frame_bytes=16 * KiB,
        max_group_bytes=64 * KiB,
        max_pending_bytes=4 * MiB,
        max_operation_bytes=512 * KiB,
    )
    return dataclasses.replace(base, **overrides)


@pytest.fixture
def journal_config() -> Callable[..., JournalConfig]:
    """Factory for small journal configurations (keyword overrides allowed)."""
    return small_journal_config


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """An 8 MiB tmpfs, so a journal can run out of space for real (needs root)."""
    with tmpfs(tmp_path / "small", "8m") as mnt:
        yield mnt


# -- Spark ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _local_spark_owner() -> Iterator[None]:
    """Stops the shared local Spark session at the end of the run."""
    yield
    from tests.helpers.spark_session import stop_local_spark

    stop_local_spark()


@pytest.fixture(scope="module")
def spark(_local_spark_owner: None) -> Any:
    """The suite's one ``local[2]`` session (tests/helpers/spark_session.py), shared by modules.

    Not stopped after the module: the next one reuses it. A test that
    changes its configuration sets it back.
    """
    pytest.importorskip("pyspark")
    from tests.helpers.spark_session import local_spark

    return local_spark()


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """One Spark standalone cluster of three workers for the whole run (it takes ~35 s to start).

    Worker ``i`` sees ``sources[i]`` at ``fixed_path``; a module puts its
    data there, as files or as a mount on the source (which reaches that
    worker: ``follow_sources``), and leaves the sources as it found them.
    It calls ``restart_dead_workers()`` first (an earlier module may have
    killed one), then ``session()``, and ``stop_session()`` at its end.
    """
    pytest.importorskip("pyspark")
    from tests.helpers.spark_cluster import SparkCluster, live_group_members, require_cluster

    require_cluster()
    root = tmp_path_factory.mktemp("spark-standalone")
    sources = [root / f"node-{i}" for i in range(3)]
    for source in sources:
        source.mkdir()
    fixed = root / "segments"
    fixed.mkdir()
    cluster = SparkCluster(root / "spark", fixed, sources, follow_sources=True)
    groups: set[int] = set()
    try:
        cluster.start()
        groups = cluster.process_groups
        yield cluster
    finally:
        groups |= cluster.process_groups  # workers started again included
        cluster.stop()
    # Executors included: they are in their worker's process group.
    assert live_group_members(groups) == []


# -- Tier 2 on a real S3 server ---------------------------------------------------


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    """One SeaweedFS for the whole session (~2.5 s to start), stopped at the end."""
    from gateway.embedded import EmbeddedS3

    server = EmbeddedS3(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_storage(seaweedfs: EmbeddedS3) -> Iterator[S3Storage]:
    """An `S3Storage` on a fresh bucket of the session's SeaweedFS, deleted afterwards."""
    from gateway.storage.s3 import S3Storage

    storage = S3Storage(
        f"test-{uuid.uuid4().hex[:16]}",
        endpoint_url=seaweedfs.endpoint_url,
        access_key=seaweedfs.access_key,
        secret_key=seaweedfs.secret_key,
        timeout=10.0,
        max_pool_connections=16,
    )
    storage.create_bucket_if_missing()
    yield storage
    # SeaweedFS deletes a bucket with its objects (and frees its volume).
    storage.client.delete_bucket(Bucket=storage.bucket)
    storage.close()
