"""A full journal disk on a node of thousands of segments (rolling checkpoints).

With more than ``container.checkpoint_min_segments`` segments a normal
checkpoint holds a share of them, but the checkpoint written to free a full
disk (into a new file, so every older file may go) holds all of them. The
journal's reserve must hold that one, or a node on a full disk stays stuck:
client appends refused, and the checkpoint that would free the disk refused too.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random

import pytest
import trio

from gateway.client.sync import SyncClient
from gateway.config import Config
from tests.helpers import bulk
from tests.helpers.daemon import Daemon, scrape
from tests.helpers.disk import fill
from tests.test_disk_full import append_until_full, append_within, small_journal

pytestmark = pytest.mark.slow

KiB = 1024
MiB = 1024 * KiB
#: Cold records of ~150 bytes: a whole checkpoint of ~900 KB, more than three
#: times the reserve configured below, and more than one checkpoint piece.
SEGMENTS = 6000


@pytest.mark.timeout(240)
@pytest.mark.expect_errors("journal refused client operations")
def test_full_journal_disk_of_many_segments_frees_itself(
    tmp_path: pathlib.Path, small_tmpfs: pathlib.Path
) -> None:
    text = small_journal(tmp_path, small_tmpfs).replace(
        "[journal]\n", '[journal]\nreserve = "256 KiB"\n'
    )
    daemon = Daemon(tmp_path / "node", text)
    config = Config.load(daemon.config_path)
    config = dataclasses.replace(
        config, node=dataclasses.replace(config.node, data_dir=str(daemon.data_dir))
    )
    names = trio.run(bulk.install_bulk, config, SEGMENTS)
    daemon.start(timeout=60)
    rng = random.Random(34)
    acked = bytearray()
    try:
        with SyncClient(daemon.address) as c:
            c.create("full/s")
            message = append_until_full(c, "full/s", rng, acked)
            assert "full" in message, message
            ballast = fill(small_tmpfs)  # every free byte: only the journal's files can go
            # Tier 2 takes the data: a checkpoint of every segment, written
            # into a new file, lets the journal drop its files.
            c.flush("full/s")
            piece = rng.randbytes(100 * KiB)
            append_within(c, "full/s", piece, 30)
            acked += piece
            for _ in range(20):  # and keep going: the space came back
                piece = rng.randbytes(100 * KiB)
                append_within(c, "full/s", piece, 30)
                acked += piece
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)
            for name in [names[0], names[-1], *rng.sample(names, 5)]:
                assert c.read(name, 0, MiB).data == bulk.CHUNK, name
            metrics = scrape(daemon.metrics_port)
            assert metrics["segment_gateway_journal_short_of_space"] == 0
            # The reserve holds a checkpoint of every segment (~150 bytes each).
            assert metrics["segment_gateway_journal_reserve_bytes"] > SEGMENTS * 150
        ballast.unlink()
        daemon.kill()
        daemon.start(timeout=60)
        with SyncClient(daemon.address) as c:
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)
            assert c.read(names[1], 0, MiB).data == bulk.CHUNK
            assert len(c.list("d00/")) == len([n for n in names if n.startswith("d00/")])
        assert "Traceback" not in daemon.log_path.read_text()
    finally:
        daemon.stop()
