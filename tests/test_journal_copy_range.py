"""`copy_range`: a byte range of a journal file appended to another file."""

from __future__ import annotations

import errno
import os
import pathlib
import random

import pytest

from gateway.journal import files
from gateway.journal.files import copy_range

pytestmark = pytest.mark.timeout(30)


def _no_copy_file_range(*args: object) -> int:
    raise OSError(errno.EXDEV, "Invalid cross-device link")


@pytest.fixture(params=["copy_file_range", "read-write"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of copying: in the kernel, and read and written (the fallback)."""
    if request.param == "read-write":
        monkeypatch.setattr(files.os, "copy_file_range", _no_copy_file_range)
    monkeypatch.setattr(files, "_COPY_BLOCK", 4096)  # several calls per range
    return str(request.param)


def copied(
    tmp_path: pathlib.Path, data: bytes, ranges: list[tuple[int, int]]
) -> tuple[list[int], bytes]:
    """`copy_range` of each of ``ranges`` of a file holding ``data`` into one new file:
    (what each call returned, the new file's bytes)."""
    source = tmp_path / "source"
    source.write_bytes(data)
    dest = tmp_path / "dest"
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        counts = [copy_range(source, fd, begin, end) for begin, end in ranges]
    finally:
        os.close(fd)
    return counts, dest.read_bytes()


def test_ranges_append_at_the_file_position(tmp_path: pathlib.Path, kernel: str) -> None:
    data = random.Random(7).randbytes(50_000)
    ranges = [(100, 20_000), (30_000, 30_000), (30_000, 50_000)]
    counts, out = copied(tmp_path, data, ranges)
    assert counts == [19_900, 0, 20_000]
    assert out == data[100:20_000] + data[30_000:50_000]


def test_a_short_source_copies_what_it_holds(tmp_path: pathlib.Path, kernel: str) -> None:
    data = random.Random(8).randbytes(10_000)
    assert copied(tmp_path, data, [(2_000, 15_000)]) == ([8_000], data[2_000:])


def test_a_missing_source_raises(tmp_path: pathlib.Path) -> None:
    fd = os.open(tmp_path / "dest", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with pytest.raises(FileNotFoundError):
            copy_range(tmp_path / "gone", fd, 0, 10)
    finally:
        os.close(fd)
