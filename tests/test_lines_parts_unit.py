"""`pipeline.parts.line_events` over local files, without Spark or a mount.

The executors' half of the ``segments`` source for ``codec=lines``: every
line exactly once, byte for byte, at its offset, whatever the part and block
sizes (lines across block and part boundaries, lines longer than a block or
a part, empty lines, no final newline, a part not known to start at a line).
The same rules through a real mount and Spark are in tests/test_pipeline.py.
"""

from __future__ import annotations

import pathlib
import random

import pytest

pytest.importorskip("pyarrow")

from pipeline import parts
from pipeline.parts import LinesPart, line_events
from tests.helpers.lines import line_rows


def rows_of(part: LinesPart) -> list[tuple[int, bytes]]:
    """The part's rows, checking the batches' shape."""
    rows: list[tuple[int, bytes]] = []
    for batch in line_events(part):
        assert batch.schema.names == ["segment", "offset", "event", "sealed"]
        assert str(batch.schema.field("event").type) == "binary"
        assert batch.column("segment").to_pylist() == ["s"] * batch.num_rows
        offsets, events = batch.column("offset"), batch.column("event")
        rows += zip(offsets.to_pylist(), events.to_pylist(), strict=True)
    return rows


def read(
    path: pathlib.Path, data: bytes, split: int, first: int = 0, complete: bool = True
) -> list[tuple[int, bytes]]:
    """All parts of ``split`` bytes from ``first``, as the batch source plans them."""
    rows: list[tuple[int, bytes]] = []
    for a in range(first, len(data), split):
        b = min(a + split, len(data))
        rows += rows_of(LinesPart(str(path), "s", a, b, len(data), a == first, True, complete))
    return rows


def shapes(seed: int) -> bytes:
    """Lines of every kind: empty, short, CRLF, longer than a block, no final newline."""
    rnd = random.Random(seed)
    lines = []
    for i in range(150):
        kind = rnd.random()
        if kind < 0.15:
            lines.append(b"")
        elif kind < 0.95:
            lines.append(bytes(rnd.randrange(1, 255) for _ in range(rnd.randrange(1, 90))))
        else:
            lines.append(bytes([65 + i % 26]) * rnd.randrange(300, 3000))
    body = b"\n".join(line.replace(b"\n", b"\r") for line in lines)
    return body + (b"\n" if seed % 2 else b"")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_every_line_once_across_blocks_and_parts(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    data = shapes(seed)
    path = tmp_path / "seg"
    path.write_bytes(data)
    for block in (1, 2, 7, 64, 256, 4096):
        monkeypatch.setattr(parts, "LINES_BLOCK", block)
        monkeypatch.setattr(parts, "SCAN_BYTES", max(1, block // 4))
        for split in (1, 5, 100, 1000, 5000, len(data) + 1):
            assert read(path, data, split) == line_rows(data, 0, True), (block, split)
        # Active: a last line without a newline may still be growing.
        assert read(path, data, 333, complete=False) == line_rows(data, 0, False), block


def test_a_line_longer_than_the_block_and_the_part(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parts, "LINES_BLOCK", 1024)
    data = b"a\n" + b"x" * 10_000 + b"\n\nb\n" + b"y" * 5000
    path = tmp_path / "seg"
    path.write_bytes(data)
    for split in (1, 100, 3000, 20_000):
        rows = read(path, data, split)
        assert rows == [(0, b"a"), (2, b"x" * 10_000), (10_003, b""), (10_004, b"b"),
                        (10_006, b"y" * 5000)], split  # fmt: skip
        assert read(path, data, split, complete=False) == rows[:-1]


def test_a_part_not_known_to_start_at_a_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated segment whose start offset is not indexed: the cut line's tail is skipped."""
    monkeypatch.setattr(parts, "LINES_BLOCK", 16)
    data = b"\0" * 10 + b"ail of a cut line\nfirst\n\nsecond line here\nlast"
    path = tmp_path / "seg"
    path.write_bytes(data)
    start = 10
    first = data.index(b"\n", start) + 1
    for split in (1, 3, 17, 100):
        rows: list[tuple[int, bytes]] = []
        for a in range(start, len(data), split):
            b = min(a + split, len(data))
            rows += rows_of(LinesPart(str(path), "s", a, b, len(data), False, True, True))
        assert rows == line_rows(data, first, True), split
    # A newline just before the part's start: a line starts exactly there.
    part = LinesPart(str(path), "s", first, len(data), len(data), False, True, True)
    got = rows_of(part)
    assert got == line_rows(data, first, True)


def test_empty_lines_only_and_a_file_of_one_newline(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "seg"
    for data in (b"\n", b"\n\n\n", b"x", b"\nx"):
        path.write_bytes(data)
        for split in (1, 2, 10):
            assert read(path, data, split) == line_rows(data, 0, True), (data, split)
