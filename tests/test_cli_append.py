"""`segment-gateway append` in blocks: what lands, its event count, where to resume."""

from __future__ import annotations

import os
import pathlib
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.cli import _read_blocks, _StoredInput
from gateway.client import SyncClient
from tests.helpers.daemon import Daemon, run_cli

from .test_disk_full import small_journal

KiB = 1024
MiB = 1024 * KiB
ROOT = pathlib.Path(__file__).resolve().parent.parent


def blocks_of(path: pathlib.Path, lines: bool, size: int) -> list[tuple[bytes, int]]:
    with open(path, "rb") as f:
        return list(_read_blocks(f, lines, size))


def test_line_blocks_are_whole_lines_and_take_the_whole_input(tmp_path: pathlib.Path) -> None:
    rng = random.Random(7)
    lines = [b"x" * rng.choice([0, 1, 5, 17, 40]) for _ in range(500)]
    lines[100] = b"L" * 100  # longer than a block
    body = b"\n".join(lines)  # the last line has no newline
    path = tmp_path / "in.txt"
    path.write_bytes(body)
    got = blocks_of(path, True, 64)
    assert all(block.endswith(b"\n") for block, _ in got)
    # The long line is a block of its own; no other block is longer than asked.
    assert [block for block, _ in got if b"L" in block] == [b"L" * 100 + b"\n"]
    assert all(len(block) <= 64 for block, _ in got if b"L" not in block)
    # Exactly what one event per line encodes to; the last line gets its newline.
    assert b"".join(block for block, _ in got) == body + b"\n"
    assert sum(block.count(b"\n") for block, _ in got) == len(lines)
    assert [consumed for _, consumed in got] == [len(b) for b, _ in got[:-1]] + [
        len(got[-1][0]) - 1
    ]
    assert sum(consumed for _, consumed in got) == len(body)

    path.write_bytes(b"")
    assert blocks_of(path, True, 64) == []
    path.write_bytes(b"only")
    assert blocks_of(path, True, 64) == [(b"only\n", 4)]


def test_raw_blocks_take_the_input_as_it_is(tmp_path: pathlib.Path) -> None:
    data = random.Random(3).randbytes(1000)
    path = tmp_path / "in.bin"
    path.write_bytes(data)
    got = blocks_of(path, False, 256)
    assert [len(b) for b, _ in got] == [256, 256, 256, 232]
    assert b"".join(b for b, _ in got) == data
    assert all(consumed == len(b) for b, consumed in got)


def test_line_blocks_from_a_pipe_come_as_the_lines_do() -> None:
    """A slow producer's lines are handed on when they arrive, not when a block fills."""
    r, w = os.pipe()
    arrived = threading.Event()
    with open(r, "rb") as stream:
        it = _read_blocks(stream, True, 1 * MiB)

        def produce() -> None:
            os.write(w, b"first\nsec")
            arrived.wait(10)
            os.write(w, b"ond\nthird")
            os.close(w)

        t = threading.Thread(target=produce)
        t.start()
        try:
            assert next(it) == (b"first\n", 6)  # without waiting for more input
            arrived.set()
            assert list(it) == [(b"second\n", 7), (b"third\n", 5)]
        finally:
            arrived.set()
            t.join()


def test_stored_input_is_exact_at_every_batch_end() -> None:
    track = _StoredInput(first_event=11)  # a writer that had 10 events stored
    track.add(7)  # event 11
    track.add(300, events=40)  # events 12-51, one block
    track.add(5, events=2)  # 52-53
    assert track.advance(10) == 0
    assert track.advance(11) == 7
    assert track.advance(51) == 307
    assert track.advance(53) == 312
    assert track.offset == 312


# -- against a real daemon --------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("cli-append") / "node")
    d.start()
    yield d
    assert d.stop() == 0, d.log()


def sg(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_a_file_of_lines_lands_byte_for_byte_with_one_event_per_line(
    daemon: Daemon, tmp_path: pathlib.Path
) -> None:
    rng = random.Random(11)
    lines = [b"%d %s" % (i, b"y" * rng.randrange(0, 300)) for i in range(60_000)]
    lines[5000] = b""
    lines[30_000] = b"z" * (5 * MiB)  # longer than a block (4 MiB), within an append
    body = b"\n".join(lines)  # no newline at the end: the last line is an event too
    src = tmp_path / "in.txt"
    src.write_bytes(body)
    r = sg("append", "--connect", daemon.address, "--create", "--file", str(src), "cli/lines")
    assert r.returncode == 0, r.stderr
    payload = len(body) - (len(lines) - 1)
    assert f"appended {len(lines)} event(s), {payload} bytes".encode() in r.stderr, r.stderr
    with SyncClient(daemon.address) as c:
        info = c.info("cli/lines")
        assert (info.length, info.event_count) == (len(body) + 1, len(lines))
        assert c.read("cli/lines", 0, info.length).data == body + b"\n"


@pytest.mark.slow
def test_a_line_longer_than_an_append_is_refused_in_one_line(
    daemon: Daemon, tmp_path: pathlib.Path
) -> None:
    src = tmp_path / "long.txt"
    src.write_bytes(b"short\n" + b"x" * (9 * MiB) + b"\nafter\n")
    r = sg("append", "--connect", daemon.address, "--create", "--file", str(src), "cli/long")
    assert r.returncode == 17, r.stderr
    assert r.stderr.decode().splitlines() == [
        "segment-gateway: the line at byte 6 of the input, with its newline, "
        f"of {9 * MiB + 1} bytes exceeds the limit of {8 * MiB} bytes"
    ]


@pytest.mark.slow
def test_lines_from_a_slow_pipe_are_appended_as_they_come(daemon: Daemon) -> None:
    with SyncClient(daemon.address) as c:
        c.create("cli/pipe", codec="lines")
        with subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "append", "--connect", daemon.address,
             "cli/pipe"],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        ) as proc:  # fmt: skip
            assert proc.stdin is not None and proc.stderr is not None
            try:
                proc.stdin.write(b"one\ntw")
                proc.stdin.flush()
                deadline = time.monotonic() + 30
                while c.info("cli/pipe").length < 4:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.02)
                proc.stdin.write(b"o\nthree")
                proc.stdin.close()
                assert proc.wait(60) == 0
            finally:
                proc.kill()
            assert b"appended 3 event(s), 11 bytes" in proc.stderr.read()
        assert c.read("cli/pipe", 0, 100).data == b"one\ntwo\nthree\n"
        assert c.info("cli/pipe").event_count == 3


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.expect_errors("journal refused client operations")
def test_lines_that_give_up_midway_say_the_byte_and_line_to_resume_at(
    tmp_path: pathlib.Path, small_tmpfs: pathlib.Path
) -> None:
    """Blocks of lines on a disk that fills: the stored prefix ends a line, resume is exact."""
    daemon = Daemon(tmp_path / "node", small_journal(tmp_path, small_tmpfs))
    daemon.start()
    rng = random.Random(9)
    lines = [b"%07d %s" % (i, rng.randbytes(rng.randrange(0, 90)).hex().encode()) for i in
             range(60_000)]  # fmt: skip
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "input lines.txt"
    path.write_bytes(data)
    try:
        with SyncClient(daemon.address) as c:
            c.create("full/lines", codec="lines")
            st = os.statvfs(small_tmpfs)
            with (small_tmpfs / "ballast").open("wb") as f:
                f.write(bytes(st.f_bavail * st.f_frsize - 3 * MiB))
            r = run_cli("append", "--connect", daemon.address, "--timeout", "3",
                        "--file", str(path), "full/lines")  # fmt: skip
            assert r.returncode == 25, r.stderr
            failed, stored_line, resume = r.stderr.splitlines()
            assert "gave up after 3s" in failed and "full" in failed, failed
            m = re.fullmatch(
                rf"segment-gateway: stored: the first (\d+) bytes of {re.escape(str(path))} "
                rf"\({len(data)} bytes\), events 1-(\d+) of writer ([0-9a-f-]+); "
                r"full/lines is (\d+) bytes long",
                stored_line,
            )
            assert m is not None, stored_line
            stored, last, length = int(m.group(1)), int(m.group(2)), int(m.group(4))
            assert 0 < stored < len(data) and length == stored, stored_line
            # A whole number of lines, and as many events as lines.
            assert data[stored - 1 : stored] == b"\n" and data[:stored].count(b"\n") == last
            assert c.read("full/lines", 0, len(data)).data == data[:stored]

            (small_tmpfs / "ballast").unlink()
            prefix = f"segment-gateway: resume at byte {stored} of the file: "
            assert resume.startswith(prefix), resume
            command = resume.removeprefix(prefix)
            command = command.replace("| segment-gateway ", f"| {sys.executable} -m gateway.cli ")
            done = subprocess.run(
                command, shell=True, capture_output=True, text=True, cwd=ROOT, timeout=60,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            info = c.info("full/lines")
            assert (info.length, info.event_count) == (len(data), len(lines))
            assert c.read("full/lines", 0, len(data) + 1).data == data
            writer = bytes.fromhex(m.group(3).replace("-", ""))
            assert c.get_attributes("full/lines", [writer])[writer] == len(lines)
    finally:
        daemon.stop()
