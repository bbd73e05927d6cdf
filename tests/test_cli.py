"""The segment-gateway command: version and journal-dump."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from gateway import __version__
from gateway.journal.files import list_files
from gateway.journal.format import HEADER_SIZE
from tests.helpers.daemon import run_cli

from .conftest import small_journal_config
from .test_journal import corrupt, frames_of, make_journal


def test_version() -> None:
    r = run_cli("version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"segment-gateway {__version__}"


def test_the_command_starts_without_trio_or_the_client() -> None:
    """Building the parser loads neither trio nor the client library: the commands
    that need them import them when they run, so `version` and ``--help`` start fast."""
    code = (
        "import sys, gateway.cli\n"
        "gateway.cli.build_parser()\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'trio'"
        " or m.startswith('gateway.client'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == "", f"the command loads {out} before it runs"


async def test_journal_dump_clean_and_torn(tmp_path: pathlib.Path) -> None:
    cfg = small_journal_config()
    await make_journal(tmp_path, cfg, 20)
    await make_journal(tmp_path, cfg, 5)
    r = run_cli("journal-dump", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "epoch_startedx1" in r.stdout
    assert "appendx" in r.stdout
    assert "crc=ok" in r.stdout
    assert "ok: " in r.stdout and "last epoch 2" in r.stdout

    path = list_files(tmp_path)[-1].path
    last = frames_of(path)[-1]
    corrupt(path, last.offset + HEADER_SIZE + 2, b"\x00\xff")
    r = run_cli("journal-dump", str(tmp_path))
    assert r.returncode == 0
    assert "BAD FRAME: CRC32C mismatch" in r.stdout
    assert "torn tail" in r.stdout and "will be cut on next open" in r.stdout

    r = run_cli("journal-dump", "--json", str(tmp_path))
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[-1]["exit_code"] == 0
    assert any(row.get("bad") == "CRC32C mismatch" for row in rows)
    assert all("first_seq" in row for row in rows[:3])


async def test_journal_dump_corrupt(tmp_path: pathlib.Path) -> None:
    cfg = small_journal_config()
    await make_journal(tmp_path, cfg, 30)
    path = list_files(tmp_path)[-1].path
    victim = frames_of(path)[3]
    corrupt(path, victim.offset + HEADER_SIZE + 1, b"\x13\x37")
    r = run_cli("journal-dump", str(tmp_path))
    assert r.returncode == 3
    assert f"CORRUPT: journal is corrupt: {path} at offset {victim.offset}" in r.stdout
    assert "(after the bad frame)" in r.stdout


def test_journal_dump_missing_directory(tmp_path: pathlib.Path) -> None:
    r = run_cli("journal-dump", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert "not a directory" in r.stderr
