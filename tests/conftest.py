"""Shared fixtures."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
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
