"""A full journal disk on a real daemon: refused with a clear error, nothing lost, then resumes."""

from __future__ import annotations

import os
import pathlib
import random
import re
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


def small_journal(tmp_path: pathlib.Path, small_tmpfs: pathlib.Path) -> str:
    """A daemon's configuration with its journal on the small tmpfs."""
    return (
        f'[journal]\ndir = "{small_tmpfs}/journal"\nfile_size = "1 MiB"\n'
        'preallocate_step = "256 KiB"\nmax_pending_bytes = "1 MiB"\nmax_group_bytes = "512 KiB"\n'
        'max_frame_bytes = "256 KiB"\nmax_operation_bytes = "512 KiB"\n'
        '[container]\nmax_append_bytes = "256 KiB"\noverload_timeout = "1s"\n'
        '[server]\nmax_message_bytes = "1 MiB"\n'
        # Tier 2 off for this test: flushing would free the journal by itself.
        f'[tier2]\nurl = "file://{tmp_path}/tier2"\nflush_size = "5 GiB"\n'
        'max_chunk_size = "5 GiB"\nflush_interval = "24h"\n'
    )


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True, cwd=ROOT, timeout=timeout, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_full_journal_disk_refuses_then_resumes(
    tmp_path: pathlib.Path, small_tmpfs: pathlib.Path
) -> None:
    daemon = Daemon(tmp_path / "node", small_journal(tmp_path, small_tmpfs))
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
            assert b"Traceback" not in r.stderr and r.stderr.count(b"\n") == 2, r.stderr
            failed, stored = r.stderr.decode().splitlines()
            assert "gave up after 3s" in failed and "full" in failed, failed
            # What of the input is stored (from stdin: no file to resume from).
            assert stored.startswith(
                "segment-gateway: stored: the first 0 bytes of the 1000 bytes read, "
                "no event of this run of writer "
            ), stored
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


@pytest.mark.timeout(120)
def test_append_file_that_gives_up_says_where_to_resume(
    tmp_path: pathlib.Path, small_tmpfs: pathlib.Path
) -> None:
    """`append --raw --file` on a disk that fills midway: exit 25, what is stored, how to go on."""
    daemon = Daemon(tmp_path / "node", small_journal(tmp_path, small_tmpfs))
    daemon.start()
    data = random.Random(5).randbytes(6 * MiB)
    path = tmp_path / "big input.bin"  # a name the resume command must quote
    path.write_bytes(data)
    try:
        with SyncClient(daemon.address) as c:
            c.create("full/r")
            # Leave room for about half of the file.
            st = os.statvfs(small_tmpfs)
            ballast = small_tmpfs / "ballast"
            with ballast.open("wb") as f:
                f.write(bytes(st.f_bavail * st.f_frsize - 3 * MiB))
            r = cli("append", "--connect", daemon.address, "--raw", "--timeout", "3",
                    "--file", str(path), "full/r")  # fmt: skip
            assert r.returncode == 25, r.stderr
            assert "Traceback" not in r.stderr, r.stderr
            failed, stored_line, resume = r.stderr.splitlines()
            assert "gave up after 3s" in failed and "full" in failed, failed
            m = re.fullmatch(
                rf"segment-gateway: stored: the first (\d+) bytes of {re.escape(str(path))} "
                rf"\({len(data)} bytes\), events 1-(\d+) of writer ([0-9a-f-]+); "
                r"full/r is (\d+) bytes long",
                stored_line,
            )
            assert m is not None, stored_line
            stored, length = int(m.group(1)), int(m.group(4))
            # What it says is stored is what the segment holds: a prefix of the file.
            assert 0 < stored < len(data) and length == stored, stored_line
            assert c.read("full/r", 0, len(data)).data == data[:stored]

            # Room again: the printed command appends the rest, exactly.
            ballast.unlink()
            prefix = f"segment-gateway: resume at byte {stored} of the file: "
            assert resume.startswith(prefix), resume
            command = resume.removeprefix(prefix)
            assert command.startswith(f"tail -c +{stored + 1} "), command
            assert f"--writer-id {m.group(3)} full/r" in command, command
            command = command.replace("| segment-gateway ", f"| {sys.executable} -m gateway.cli ")
            done = subprocess.run(
                command, shell=True, capture_output=True, text=True, cwd=ROOT, timeout=60,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert c.info("full/r").length == len(data)
            assert c.read("full/r", 0, len(data) + 1).data == data
    finally:
        daemon.stop()
