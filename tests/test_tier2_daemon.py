"""The daemon with its default Tier 2: an embedded SeaweedFS it starts and stops itself."""

from __future__ import annotations

import pathlib
import random
import shutil
import subprocess

import pytest

from gateway.client.sync import SyncClient
from tests.helpers.daemon import Daemon
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024
MiB = 1024 * KiB


def weed_processes(data_dir: pathlib.Path) -> list[str]:
    """Command lines of weed processes serving ``data_dir``."""
    r = subprocess.run(["pgrep", "-af", "weed server"], capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if str(data_dir) in line]


@pytest.mark.timeout(180)
def test_embedded_tier2_survives_kill_and_leaves_no_child(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "node"
    config = '[tier2]\nurl = "embedded"\nflush_size = "256 KiB"\nmax_chunk_size = "1 MiB"\n'
    daemon = Daemon(data_dir, config)
    rng = random.Random(9)
    data = rng.randbytes(3 * MiB)
    daemon.start(timeout=60)
    try:
        assert len(weed_processes(data_dir)) == 1
        with SyncClient(daemon.address) as c:
            c.create("e/s")
            for i in range(0, len(data), 100 * KiB):
                c.append("e/s", data[i : i + 100 * KiB])
            c.flush("e/s")
            info = c.info("e/s")
            assert info.storage_length == len(data) and info.chunk_count >= 3
        # A crash of the daemon takes its S3 server with it.
        daemon.kill()
        wait_for(lambda: not weed_processes(data_dir), 10, "weed gone with the daemon")
        # Restart with the cache gone: the bytes come back from the chunks.
        shutil.rmtree(data_dir / "cache")
        daemon.start(timeout=60)
        with SyncClient(daemon.address) as c:
            assert c.read("e/s", 0, len(data)).data == data
        assert daemon.stop() == 0, daemon.log()
        wait_for(lambda: not weed_processes(data_dir), 10, "weed gone with the daemon")
    finally:
        daemon.kill()
