"""`segment-gateway append` in blocks: what lands, its event count, where to resume."""

from __future__ import annotations

import os
import pathlib
import random
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cli.append import _frames, _read_blocks, _RollRoom, _StoredInput
from gateway.client.sync import SyncClient
from tests.helpers.daemon import Daemon, run_cli
from tests.helpers.wait import wait_for

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


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=60),
    final_newline=st.booleans(),
    limits=st.lists(st.integers(min_value=1, max_value=120), min_size=1, max_size=20),
)
def test_line_blocks_follow_a_limit_that_changes_between_blocks(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[bytes],
    final_newline: bool,
    limits: list[int],
) -> None:
    """The room left in a stream's segment changes after each block: each block is
    within the limit asked last (or one line), and together they are the input."""
    body = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    path = tmp_path_factory.mktemp("blocks") / "in.txt"
    path.write_bytes(body)
    appends = 0  # the limit changes after each append, as a stream's room does

    def limit() -> int:
        return limits[appends % len(limits)]

    got = []
    with open(path, "rb") as f:
        for block, consumed in _read_blocks(f, True, limit):
            assert block.endswith(b"\n")
            assert len(block) <= limit() or block.count(b"\n") == 1, (block, limit())
            got.append((block, consumed))
            appends += 1
    expected = body if body.endswith(b"\n") or not body else body + b"\n"
    assert b"".join(b for b, _ in got) == expected
    assert sum(c for _, c in got) == len(body)
    # And framed, the same lines cut to the same kind of limit.
    events = expected.split(b"\n")[:-1]
    frames = []
    for block, consumed in got:
        for frame_block, n, took in _frames(block, consumed, limit):
            assert len(frame_block) <= limit() or n == 1, (frame_block, limit())
            frames.append((frame_block, n, took))
            appends += 1
    assert b"".join(f for f, _, _ in frames) == b"".join(
        len(line).to_bytes(4, "big") + line for line in events
    )
    assert sum(n for _, n, _ in frames) == len(events)
    assert sum(c for _, _, c in frames) == len(body)


def test_roll_room_starts_a_new_segment_once_one_is_full() -> None:
    room = _RollRoom(100, 30)
    assert room.room() == 70
    room.add(70)  # exactly full: the daemon rolls before the next append
    assert room.room() == 100
    room.add(90)
    assert room.room() == 10
    room.add(25)  # one event past it: the next append rolls
    assert room.room() == 100 and room.filled == 115


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
    # The bytes stored: each line with its newline (the last one's added).
    assert f"appended {len(lines)} event(s), {len(body) + 1} bytes".encode() in r.stderr, r.stderr
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

                def appended(proc: subprocess.Popen[bytes] = proc) -> bool:
                    assert proc.poll() is None
                    return c.info("cli/pipe").length >= 4

                wait_for(appended, 30, "the first line appended")
                proc.stdin.write(b"o\nthree")
                proc.stdin.close()
                assert proc.wait(60) == 0
            finally:
                proc.kill()
            assert b"appended 3 event(s), 14 bytes" in proc.stderr.read()
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
            # The run that gave up closed its writer id after its last stored
            # event; the resume stored the rest, once, under an id of its own.
            assert f"appended {len(lines) - last} event(s), {len(data) - stored} bytes" in (
                done.stderr
            ), done.stderr
            writer = bytes.fromhex(m.group(3).replace("-", ""))
            assert c.get_attributes("full/lines", [writer])[writer] == -(last + 1)
    finally:
        daemon.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "stored"),
    [
        ("lines", b"1\n2\n3\n"),
        ("framed", b"\0\0\0\x011\0\0\0\x012\0\0\0\x013"),
        ("raw", b"1\n2\n3\n"),
    ],
)
def test_append_says_the_bytes_it_stored(daemon: Daemon, mode: str, stored: bytes) -> None:
    """What the segment grew by: 292 for ``seq 1 100`` (192 digits and 100 newlines)."""
    seq = b"".join(b"%d\n" % i for i in range(1, 101))
    assert len(seq) == 292
    name = f"cli/seq-{mode}"
    flag = [] if mode == "lines" else [f"--{mode}"]
    r = sg("append", "--connect", daemon.address, "--create", *flag, name, stdin=seq)
    assert r.returncode == 0, r.stderr
    with SyncClient(daemon.address) as c:
        info = c.info(name)
        assert c.read(name, 0, len(stored)).data == stored
    events = 1 if mode == "raw" else 100
    expected = {"lines": 292, "framed": 100 * 4 + 192, "raw": 292}[mode]
    assert info.length == expected, info
    assert f"appended {events} event(s), {expected} bytes, to {name} ".encode() in r.stderr, (
        r.stderr
    )
    assert f"it is {expected} bytes long now".encode() in r.stderr, r.stderr


def stream_segments(c: SyncClient, stream: str) -> list[bytes]:
    """Every segment of a stream, oldest first, read whole."""
    return [c.read(s.name, 0, s.length + 1).data for s in c.stream(stream).segments]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_appends_to_a_stream_keep_its_segments_at_its_roll_size(
    daemon: Daemon, tmp_path: pathlib.Path
) -> None:
    """A 1 MiB roll size: ~10 MiB of lines make ~10 segments of 1 MiB give or take a line."""
    rng = random.Random(14)
    lines = [b"%07d %s" % (i, b"x" * rng.choice([0, 10, 90, 300, 2000])) for i in range(20_000)]
    for i in range(500, 20_000, 4000):
        lines[i] = b"%07d %s" % (i, b"L" * (rng.randrange(100, 300) * KiB))  # some long ones
    body = b"\n".join(lines) + b"\n"
    assert 8 * MiB < len(body) < 16 * MiB
    src = tmp_path / "in.txt"
    src.write_bytes(body)
    roll = 1 * MiB
    with SyncClient(daemon.address) as c:
        c.create_stream("rolled", {"roll_size": roll})
        # One segment begun by another append first: the command starts from its length.
        c.append("rolled", b"%07d first\n" % 0)
        head = b"%07d first\n" % 0
        r = sg("append", "--connect", daemon.address, "--file", str(src), "rolled")
        assert r.returncode == 0, r.stderr
        segments = stream_segments(c, "rolled")
        infos = c.stream("rolled").segments
    # Every line exactly once, in order.
    assert b"".join(segments) == head + body
    longest = max(len(line) for line in lines) + 1
    assert len(segments) >= len(body) // (roll + longest)
    for info, data in zip(infos[:-1], segments[:-1], strict=True):
        assert info.sealed, info
        # It rolled at its roll size: no more than one line past it, and it
        # ends at a line's end.
        assert roll <= len(data), (info.name, len(data))
        last_line = len(data) - data.rfind(b"\n", 0, len(data) - 1) - 1
        assert len(data) - roll < last_line, (info.name, len(data), last_line)
        assert data.endswith(b"\n")
    assert f"appended {len(lines)} event(s), {len(body)} bytes".encode() in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_raw_and_framed_appends_to_a_stream_fill_segments_to_the_roll_size(
    daemon: Daemon, tmp_path: pathlib.Path
) -> None:
    roll = 256 * KiB
    data = random.Random(5).randbytes(2 * MiB + 1234)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    lines = [b"%06d %s" % (i, b"f" * (i % 700)) for i in range(6000)]
    framed_src = tmp_path / "framed.txt"
    framed_src.write_bytes(b"\n".join(lines))  # the last line without a newline
    with SyncClient(daemon.address) as c:
        c.create_stream("rolled-raw", {"roll_size": roll})
        r = sg("append", "--connect", daemon.address, "--raw", "--file", str(src), "rolled-raw")
        assert r.returncode == 0, r.stderr
        segments = stream_segments(c, "rolled-raw")
        # Raw input is cut anywhere: every segment but the last holds exactly the roll size.
        assert b"".join(segments) == data
        assert [len(s) for s in segments[:-1]] == [roll] * (len(data) // roll)

        c.create_stream("rolled-framed", {"roll_size": roll})
        r = sg("append", "--connect", daemon.address, "--framed", "--file", str(framed_src),
               "rolled-framed")  # fmt: skip
        assert r.returncode == 0, r.stderr
        segments = stream_segments(c, "rolled-framed")
        frames = b"".join(len(line).to_bytes(4, "big") + line for line in lines)
        assert b"".join(segments) == frames
        assert f"appended {len(lines)} event(s), {len(frames)} bytes".encode() in r.stderr
        for data_ in segments[:-1]:
            # Whole frames, and past the roll size by less than its last frame.
            pos, last = 0, 0
            while pos < len(data_):
                last = 4 + int.from_bytes(data_[pos : pos + 4], "big")
                pos += last
            assert pos == len(data_) and roll <= len(data_) < roll + last, len(data_)
