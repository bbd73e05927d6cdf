"""A full journal disk on a real daemon: refused with a clear error, nothing lost, then resumes."""

from __future__ import annotations

import collections
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.errors import ConditionalCheckFailed, Overloaded
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import Daemon, run_cli
from tests.helpers.disk import fill, tmpfs
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

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
        # Flushed only when asked: flushing would free the journal by itself.
        f'[tier2]\nurl = "file://{tmp_path}/tier2"\nflush_size = "5 GiB"\n'
        'max_chunk_size = "5 GiB"\nflush_interval = "24h"\n'
    )


@pytest.mark.timeout(120)
@pytest.mark.expect_errors("journal refused client operations")
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


def append_until_full(c: SyncClient, name: str, rng: random.Random, acked: bytearray) -> str:
    """Append 100 KiB pieces until the journal refuses one; return the refusal."""
    for _ in range(200):
        piece = rng.randbytes(100 * KiB)
        try:
            c.append(name, piece)
        except Overloaded as e:
            return str(e)
        acked += piece
    raise AssertionError("appends kept being accepted on a full disk")


def append_within(c: SyncClient, name: str, piece: bytes, seconds: float) -> float:
    """Append ``piece``, retrying refusals for up to ``seconds``; return how long it took."""
    started = time.monotonic()
    while True:
        try:
            c.append(name, piece)
            return time.monotonic() - started
        except Overloaded:
            if time.monotonic() - started > seconds:
                raise
            time.sleep(0.1)  # a client's backoff before it asks again


def error_lines(daemon: Daemon) -> list[str]:
    return [line for line in daemon.log_path.read_text().splitlines() if " ERROR " in line]


@pytest.mark.timeout(180)
@pytest.mark.expect_errors("journal refused client operations")
def test_flushed_full_journal_is_freed_by_a_checkpoint_and_restarts_full(
    tmp_path: pathlib.Path, small_tmpfs: pathlib.Path
) -> None:
    """A journal full of data that is then flushed frees itself at once (issue 14, items 1-2).

    No checkpoint is due by the frame count (300): without a checkpoint taken
    because space ran short, the journal stayed full and appends were
    refused until 300 tiny appends made one due. And a node restarted on
    that full disk still starts, flushes and frees its journal.
    """
    # Flushed only when asked: the journal fills with unflushed data first.
    daemon = Daemon(tmp_path / "node", small_journal(tmp_path, small_tmpfs))
    daemon.start()
    rng = random.Random(14)
    acked = bytearray()
    try:
        with SyncClient(daemon.address) as c:
            c.create("full/s")
            c.create("full/old")
            c.append("full/old", b"o" * 1000)
            message = append_until_full(c, "full/s", rng, acked)
            assert "full" in message, message
            errors_before = len(error_lines(daemon))
            # Refusals for a few seconds are logged once, not once per refusal.
            for _ in range(10):
                with pytest.raises(Overloaded):
                    c.append("full/s", rng.randbytes(100 * KiB))
            assert len(error_lines(daemon)) - errors_before <= 1, error_lines(daemon)
            # Changes that free space go through on the full disk; others do not.
            with pytest.raises(Overloaded, match="full"):
                c.create("full/new")
            c.truncate("full/old", 500)
            c.delete("full/old")
            c.flush("full/s")
            # Everything is in Tier 2 now: a checkpoint lets the journal drop
            # its files at once, and appends resume.
            piece = rng.randbytes(100 * KiB)
            took = append_within(c, "full/s", piece, 10)
            acked += piece
            assert took < 5, f"appends resumed only after {took:.1f}s"
            for _ in range(20):  # and keep going: the space came back
                piece = rng.randbytes(100 * KiB)
                append_within(c, "full/s", piece, 10)
                acked += piece
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)

            # Full again, unflushed, and a crash: the node must start on the full disk.
            append_until_full(c, "full/s", rng, acked)
        ballast = fill(small_tmpfs)
        daemon.kill()
        daemon.start()
        with SyncClient(daemon.address) as c:
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)
            # It flushes what it recovered at once, then frees the journal.
            piece = rng.randbytes(100 * KiB)
            append_within(c, "full/s", piece, 10)
            acked += piece
            assert c.read("full/s", 0, len(acked) + MiB).data == bytes(acked)
        ballast.unlink()
        assert daemon.alive()
        assert "Traceback" not in daemon.log_path.read_text()
    finally:
        daemon.stop()


@pytest.fixture
def journal_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 64 MiB tmpfs for the journal (needs root)."""
    with tmpfs(tmp_path / "journal-fs", "64m") as mnt:
        yield mnt


@pytest.mark.timeout(240)
@pytest.mark.expect_errors("journal refused client operations")
def test_full_journal_while_tier2_is_stopped_flushes_its_way_out(
    tmp_path: pathlib.Path, journal_tmpfs: pathlib.Path
) -> None:
    """The issue's reproduction: SeaweedFS stopped, three writers fill the journal, SeaweedFS
    continues. The uploads then complete on a full disk: recording them must neither kill
    the daemon nor fail, and the node flushes and truncates its way back to service."""
    s3 = EmbeddedS3(tmp_path / "s3")
    s3.start()
    try:
        bucket = "full-journal"
        storage = S3Storage(
            bucket,
            endpoint_url=s3.endpoint_url,
            access_key=s3.access_key,
            secret_key=s3.secret_key,
        )
        storage.create_bucket_if_missing()
        storage.close()
        config = (
            f'[journal]\ndir = "{journal_tmpfs}/journal"\nfile_size = "16 MiB"\n'
            'preallocate_step = "4 MiB"\n'
            '[container]\nmax_append_bytes = "2 MiB"\noverload_timeout = "1s"\n'
            '[server]\nmax_message_bytes = "3 MiB"\n'
            f'[tier2]\nurl = "s3://{bucket}/node"\nendpoint_url = "{s3.endpoint_url}"\n'
            'flush_size = "4 MiB"\nflush_interval = "1s"\nretry_deadline = "120s"\n'
            'request_timeout = "5s"\n'
        )
        env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
        daemon = Daemon(tmp_path / "node", config, env=env)
        daemon.start(timeout=60)
        try:
            names = [f"w/{k}" for k in range(3)]
            with SyncClient(daemon.address) as c:
                for name in names:
                    c.create(name)
            assert s3.pid is not None
            os.kill(s3.pid, signal.SIGSTOP)
            stop = threading.Event()
            continued = threading.Event()
            acked = {name: bytearray() for name in names}
            refused = collections.Counter[str]()
            after_continue = collections.Counter[str]()
            failures: list[BaseException] = []

            def writer(name: str, seed: int) -> None:
                rng = random.Random(seed)
                try:
                    with SyncClient(daemon.address) as wc:
                        while not stop.is_set():
                            piece = rng.randbytes(MiB)
                            try:
                                wc.append(name, piece)
                            except Overloaded:
                                refused[name] += 1
                                time.sleep(0.1)  # a client's backoff
                                continue
                            acked[name] += piece
                            if continued.is_set():
                                after_continue[name] += 1
                except BaseException as e:  # reported by the test below
                    failures.append(e)

            threads = [
                threading.Thread(target=writer, args=(name, k)) for k, name in enumerate(names)
            ]
            for t in threads:
                t.start()
            try:

                def filled() -> bool:
                    assert not failures, failures
                    return min(refused[n] for n in names) >= 3

                wait_for(filled, 60, "the journal filling", interval=0.1, detail=lambda: refused)
                os.kill(s3.pid, signal.SIGCONT)
                continued.set()

                def resumed() -> bool:
                    assert not failures, failures
                    assert daemon.alive(), daemon.log()
                    return min(after_continue[n] for n in names) >= 3

                wait_for(
                    resumed,
                    90,
                    "appends resuming",
                    interval=0.1,
                    detail=lambda: f"{after_continue}\n{daemon.log()}",
                )
            finally:
                stop.set()
                os.kill(s3.pid, signal.SIGCONT)
                for t in threads:
                    t.join(60)
            assert not failures, failures
            assert daemon.alive(), daemon.log()
            with SyncClient(daemon.address) as c:
                for name in names:
                    data = bytearray()
                    while len(data) < len(acked[name]):
                        data += c.read(name, len(data), 8 * MiB).data
                    assert data == acked[name], name
                c.flush()
            log_text = daemon.log_path.read_text()
            assert "Traceback" not in log_text, daemon.log()
            assert daemon.stop() == 0, daemon.log()
        finally:
            daemon.stop()
    finally:
        s3.stop()


@pytest.mark.timeout(120)
@pytest.mark.expect_errors("journal refused client operations")
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
            r = run_cli("append", "--connect", daemon.address, "--raw", "--timeout", "3",
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
            # An append the run sent and the daemon had not read yet (still in
            # the socket of a connection the writer left, or held behind the
            # full disk) cannot land now: the writer id is closed. (It did
            # land, and the resume then duplicated a block.)
            last = int(m.group(2))
            with pytest.raises(ConditionalCheckFailed):
                c.append("full/r", data[stored : stored + 64 * KiB],
                         writer_id=uuid.UUID(m.group(3)).bytes,
                         event_number=last + 1, previous_event_number=last)  # fmt: skip
            assert c.info("full/r").length == stored
            prefix = f"segment-gateway: resume at byte {stored} of the file: "
            assert resume.startswith(prefix), resume
            command = resume.removeprefix(prefix)
            assert command.startswith(f"tail -c +{stored + 1} "), command
            # A new writer id: the one that gave up is closed, so nothing it
            # sent can land after the count above (or in the resume's place).
            assert command.endswith(" full/r") and "--writer-id" not in command, command
            closed = run_cli("append", "--connect", daemon.address, "--raw", "--timeout", "3",
                    "--writer-id", m.group(3), "full/r", input_text="more")  # fmt: skip
            assert closed.returncode == 25, closed.stderr
            assert f"was closed after its event {m.group(2)}" in closed.stderr, closed.stderr
            command = command.replace("| segment-gateway ", f"| {sys.executable} -m gateway.cli ")
            done = subprocess.run(
                command, shell=True, capture_output=True, text=True, cwd=ROOT, timeout=60,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert c.info("full/r").length == len(data), (r.stderr, done.stderr, daemon.log())
            assert c.read("full/r", 0, len(data) + 1).data == data
    finally:
        daemon.stop()
