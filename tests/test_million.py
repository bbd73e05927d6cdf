"""A node with a million segments (issue 33, "At a million").

10^6 sealed, flushed segments are installed at once (`tests.helpers.bulk`:
creating them one by one takes about an hour), a tenth of them members of a
stream; the daemon starts with its mount, is stopped and started again, and
everything is still there: the live count, any segment's record and bytes,
the stream's directory of 10^5 entries. Its resident memory stays under
`MAX_RSS` (most segments are cold: only their encoded record is kept).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import time

import pytest
import trio

from gateway.client.sync import SyncClient
from gateway.config import Config
from tests.helpers import bulk
from tests.helpers.daemon import scrape
from tests.helpers.mount import MountedDaemon, require_fuse
from tests.helpers.peers import rss

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEGMENTS = 1_000_000
MEMBERS = 100_000
ACTIVE = 100
#: The issue's bound on a node of 10^6 sealed segments.
MAX_RSS = 1 << 30


def test_a_million_segments_survive_a_restart_in_bounded_memory(tmp_path: pathlib.Path) -> None:
    require_fuse()
    node = MountedDaemon(tmp_path / "node", tmp_path / "mnt")
    config = Config.load(node.config_path)
    config = dataclasses.replace(
        config, node=dataclasses.replace(config.node, data_dir=str(node.data_dir))
    )
    t = time.monotonic()
    names = trio.run(bulk.install_bulk, config, SEGMENTS, "big", MEMBERS, ACTIVE)
    installed_s = time.monotonic() - t
    try:
        took = []
        for _ in range(2):  # the first start, then a restart
            t = time.monotonic()
            node.start(timeout=300)
            took.append(time.monotonic() - t)
            assert node.proc is not None
            live = scrape(node.metrics_port)["segment_gateway_segments"]
            assert live == SEGMENTS
            memory = rss(node.proc.pid)
            assert memory < MAX_RSS, f"RSS {memory / 2**20:.0f} MiB with {SEGMENTS:,} segments"
            rng = random.Random(len(took))
            with SyncClient(node.address) as c:
                for name in [names[0], names[-1], *rng.sample(names[:-ACTIVE], 20)]:
                    info = c.info(name)
                    sealed = name not in names[-ACTIVE:]
                    assert info.sealed == sealed and info.length == (len(bulk.CHUNK) * sealed)
                one = names[MEMBERS + 5]
                assert c.read(one, 0, 1 << 20).data == bulk.CHUNK
            assert (node.mnt / one).read_bytes() == bulk.CHUNK
            t = time.monotonic()
            entries = os.listdir(node.mnt / "big")
            listed_s = time.monotonic() - t
            assert len(entries) == MEMBERS
            assert node.stop(timeout=120) == 0
        print(
            f"\n{SEGMENTS:,} segments: installed in {installed_s:.1f} s, started in "
            f"{took[0]:.1f} s, restarted in {took[1]:.1f} s; RSS {memory / 2**20:.0f} MiB; "
            f"ls of {MEMBERS:,} entries {listed_s:.2f} s"
        )
    finally:
        node.teardown()
