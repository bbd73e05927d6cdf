"""Shared fixtures."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.config import JournalConfig, KiB, MiB

ROOT = pathlib.Path(__file__).resolve().parent.parent


def small_journal_config(**overrides: Any) -> JournalConfig:
    """A journal configuration that rolls files and frames often, for tests."""
    base = JournalConfig(
        file_size=1 * MiB,
        preallocate_step=256 * KiB,
        max_frame_bytes=16 * KiB,
        max_group_bytes=64 * KiB,
        max_pending_bytes=4 * MiB,
        max_operation_bytes=512 * KiB,
    )
    return dataclasses.replace(base, **overrides)


@pytest.fixture
def journal_config() -> Callable[..., JournalConfig]:
    """Factory for small journal configurations (keyword overrides allowed)."""
    return small_journal_config


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """An 8 MiB tmpfs, so a journal can run out of space for real (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=False)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
