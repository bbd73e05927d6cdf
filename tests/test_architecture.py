"""The shape of the tree that the layering promises (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Modules a process that only talks to a daemon must not load.
DAEMON_ONLY = (
    "rocksdict",
    "cache",
    "gateway.journal",
    "gateway.read",
    "gateway.storage",
    "gateway.tier2",
    "gateway.embedded",
    "gateway.recovery",
    "gateway.attrindex",
    "gateway.server",
)


@pytest.mark.parametrize(
    "module",
    ["gateway.client.client", "gateway.client.writer", "pipeline.source", "pipeline.stream"],
)
def test_client_side_modules_load_no_daemon_parts(module: str) -> None:
    """A writer process or a Spark executor needs neither RocksDB nor the journal."""
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {DAEMON_ONLY!r}"
        f" or m.startswith({DAEMON_ONLY!r}))\n"
        "print(' '.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == "", f"import {module} loads {out}"
