"""ruff and mypy are part of the suite, so CI keeps the tree clean."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(ROOT / ".venv" / "bin")) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make install)")
    return path


def test_ruff_check() -> None:
    r = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = subprocess.run(
        [_tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(300)
def test_mypy() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    assert r.returncode == 0, r.stdout + r.stderr
