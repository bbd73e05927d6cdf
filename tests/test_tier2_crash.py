"""Crash safety of Tier 2 with a real daemon process killed at exact points."""

from __future__ import annotations

import pathlib
import random

import pytest

from gateway.client.sync import SyncClient
from gateway.protocol.metadata_pb2 import MetadataSnapshot
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from tests.helpers.daemon import Daemon
from tests.helpers.snapshots import newest_metadata
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024

CONFIG = """
[tier2]
url = "file://{root}"
flush_size = "64 KiB"
flush_interval = "1h"
max_chunk_size = "128 KiB"
snapshot_interval = "0s"
gc_interval = "300ms"
gc_grace = "0s"
"""


def latest_snapshot(storage: FileStorage) -> MetadataSnapshot:
    found = newest_metadata(storage, "node-1")
    assert found is not None
    return found[1]


def test_kill_between_upload_and_journal_loses_nothing_and_gc_removes_orphan(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "tier2"
    storage = FileStorage(root)
    config = CONFIG.format(root=root)
    crashing = Daemon(
        tmp_path / "node",
        config,
        env={"SEGMENT_GATEWAY_FAILPOINTS": "after_chunk_upload=kill"},
    )
    rng = random.Random(5)
    data = rng.randbytes(100 * KiB)
    crashing.start()
    try:
        with SyncClient(crashing.address) as client:
            client.create("s")
            client.append("s", data[: 50 * KiB])
            client.append("s", data[50 * KiB :])
        # The first flush uploads a chunk, and the daemon kills itself before
        # journaling it.
        crashing.proc.wait(timeout=30)  # type: ignore[union-attr]
        assert crashing.proc.returncode == -9  # type: ignore[union-attr]
    finally:
        crashing.kill()
    uploaded = {o.key for o in storage.list(names.chunks_prefix("node-1"))}
    assert len(uploaded) == 1  # the orphan

    daemon = Daemon(tmp_path / "node", config, port=crashing.port)
    daemon.start()
    try:
        with SyncClient(daemon.address) as client:
            assert client.info("s").length == len(data)
            client.flush("s")
            info = client.info("s")
            assert info.storage_length == len(data)
            assert client.read("s", 0, len(data)).data == data
        snapshot = latest_snapshot(storage)
        (seg,) = snapshot.container.segments
        named = [c.name for c in seg.chunks]
        flushed = b"".join(storage.read(n, 0, 1 << 30) for n in named)
        assert flushed == data  # no hole, no duplicate
        orphan = uploaded - set(named)
        assert len(orphan) == 1
        # GC (every 300 ms here, no grace) deletes the orphan and nothing else.

        def chunk_keys() -> set[str]:
            return {o.key for o in storage.list(names.chunks_prefix("node-1"))}

        wait_for(lambda: not chunk_keys() & orphan, 10, "the orphan deleted", detail=chunk_keys)
        assert chunk_keys() == set(named)
    finally:
        daemon.stop()
