"""`read_groups` resuming where an earlier read of a file stopped, or not."""

from __future__ import annotations

import pathlib

import pytest

from gateway.journal import reader
from gateway.journal.format import HEADER_SIZE, encode_header
from gateway.journal.reader import read_groups

pytestmark = pytest.mark.timeout(30)

OPS = 10


def journal_file(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[bytes]]:
    """A file of OPS one-operation groups from sequence 1: (path, the frames)."""
    frames = []
    for seq in range(1, OPS + 1):
        payload = bytes([seq]) * (100 * seq)
        frames.append(encode_header([payload], len(payload), 1, seq, seq, 1) + payload)
    path = tmp_path / "00000000000000000001.wal"
    path.write_bytes(b"".join(frames))
    return path, frames


def offset_of(frames: list[bytes], seq: int) -> int:
    return sum(map(len, frames[: seq - 1]))


def test_a_read_in_pieces_resumes_where_the_last_stopped(tmp_path: pathlib.Path) -> None:
    path, frames = journal_file(tmp_path)
    files = [(1, path)]
    reader._RESUME.clear()
    got, nxt, reached = read_groups(files, 1, OPS + 1, len(frames[0]) + len(frames[1]))
    assert (got, nxt, reached) == (frames[0] + frames[1], 3, False)
    remembered = dict(reader._RESUME)
    assert remembered == {(path, 3): offset_of(frames, 3)}
    got, nxt, reached = read_groups(files, 3, OPS + 1, 1 << 20)
    assert (got, nxt, reached) == (b"".join(frames[2:]), OPS + 1, True)


@pytest.mark.parametrize(
    "where",
    ["another frame", "inside a frame", "past the end"],
)
def test_a_remembered_place_that_is_wrong_reads_from_the_start(
    tmp_path: pathlib.Path, where: str
) -> None:
    path, frames = journal_file(tmp_path)
    files = [(1, path)]
    offset = {
        "another frame": offset_of(frames, 6),
        "inside a frame": offset_of(frames, 5) + HEADER_SIZE + 7,
        "past the end": path.stat().st_size + 100,
    }[where]
    reader._RESUME.clear()
    reader._RESUME[(path, 5)] = offset
    got, nxt, reached = read_groups(files, 5, 8, 1 << 20)
    assert (got, nxt, reached) == (b"".join(frames[4:7]), 8, True)
    assert (path, 5) not in reader._RESUME
