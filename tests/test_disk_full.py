"""A full journal disk on a real daemon: refused with a clear error, nothing lost, then resumes."""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys

import pytest

from gateway.client import SyncClient
from gateway.errors import Overloaded
from tests.helpers.daemon import Daemon
from tests.helpers.disk import fill

KiB = 1024
MiB = 1024 * KiB
ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_full_journal_disk_refuses_then_resumes(
    tmp_path: pathlib.Path, small_tmpfs: pathlib.Path
) -> None:
    config = (
        f'[journal]\ndir = "{small_tmpfs}/journal"\nfile_size = "1 MiB"\n'
        'preallocate_step = "256 KiB"\nmax_pending_bytes = "1 MiB"\nmax_group_bytes = "512 KiB"\n'
        'max_frame_bytes = "256 KiB"\nmax_operation_bytes = "512 KiB"\n'
        '[container]\nmax_append_bytes = "256 KiB"\noverload_timeout = "1s"\n'
        '[server]\nmax_message_bytes = "1 MiB"\n'
        # Tier 2 off for this test: flushing would free the journal by itself.
        f'[tier2]\nurl = "file://{tmp_path}/tier2"\nflush_size = "5 GiB"\n'
        'max_chunk_size = "5 GiB"\nflush_interval = "24h"\n'
    )
    daemon = Daemon(tmp_path / "node", config)
    daemon.start()
    rng = random.Random(3)
    acked = bytearray()
    try:
        with SyncClient(daemon.address) as c:
            c.create("full/s")
            for _ in range(8):
                piece = rng.randbytes(100 * KiB)
                c.append("full/s", piece)
                acked += piece
            ballast = fill(small_tmpfs)
            refused = 0
            for _ in range(40):
                piece = rng.randbytes(100 * KiB)
                try:
                    c.append("full/s", piece)
                    acked += piece  # it fit in preallocated space
                except Overloaded as e:
                    refused += 1
                    message = str(e)
                    break
            assert refused, "appends kept being accepted on a full disk"
            assert "full" in message or "journal" in message, message
            # The CLI says the same in one line, with its exit code.
            r = subprocess.run(
                [sys.executable, "-m", "gateway.cli", "append", "--connect", daemon.address,
                 "--raw", "--timeout", "3", "full/s"],
                input=b"x" * 1000, capture_output=True, cwd=ROOT, timeout=60,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert r.returncode == 25, r.stderr
            assert b"Traceback" not in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
            assert b"gave up after 3s" in r.stderr and b"full" in r.stderr, r.stderr
            # Nothing acknowledged was lost, reads still work.
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)
            ballast.unlink()
            # Service resumes once there is room.
            piece = rng.randbytes(100 * KiB)
            c.append("full/s", piece)
            acked += piece
        assert daemon.alive()
        daemon.kill()
        daemon.start()
        with SyncClient(daemon.address) as c:
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)
    finally:
        daemon.stop()
