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
