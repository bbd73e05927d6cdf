"""The shape of the tree that the layering promises (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import pathlib
import re
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
    [
        "gateway.client.client",
        "gateway.client.sync",
        "gateway.client.writer",
        "pipeline.source",
        "pipeline.stream",
    ],
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


# -- the layering, as rules on the source's imports ------------------------------

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRODUCT = ("gateway", "fs", "cache", "pipeline")


def _imports(path: pathlib.Path) -> set[str]:
    """Every product module (and imported name, as ``module.name``) ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in PRODUCT}


def _modules(folder: str) -> list[pathlib.Path]:
    return sorted(
        p for p in (ROOT / folder).rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2.pyi"))
    )


def _breaks(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    """Imports of ``folder``'s modules that start with a forbidden prefix."""
    bad = []
    for path in _modules(folder):
        for m in sorted(_imports(path)):
            if m.startswith(allowed):
                continue
            if any(m == f or m.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {m}")
    return bad


#: What the daemon is made of, below the client library and the pipeline.
DAEMON = (
    "cache",
    "fs",
    "gateway.attrindex",
    "gateway.cli",
    "gateway.cluster",
    "gateway.container.container",
    "gateway.daemon",
    "gateway.embedded",
    "gateway.fsck",
    "gateway.journal",
    "gateway.metrics",
    "gateway.node",
    "gateway.read",
    "gateway.recovery",
    "gateway.server",
    "gateway.storage",
    "gateway.tier2",
)

LAYERS = {
    # The container knows its journal, the storage writer and the mount only
    # as the protocols in container/interfaces.py.
    "gateway/container": (
        "gateway.tier2",
        "gateway.storage",
        "gateway.embedded",
        "gateway.server",
        "gateway.cluster",
        "gateway.recovery",
        "gateway.attrindex.store",
        "gateway.fsck",
        "gateway.node",
        "gateway.daemon",
        "gateway.cli",
        "fs",
    ),
    # A writer process or a Spark executor loads none of the daemon.
    "gateway/client": DAEMON,
    "pipeline": DAEMON,
    # Formats shared by the two ends of every connection and of the journal.
    "gateway/protocol": (*DAEMON, "gateway.client", "gateway.container"),
    # The journal is Tier 1 and nothing more: it does not know what it stores.
    "gateway/journal": (
        "gateway.container",
        "gateway.read",
        "gateway.storage",
        "gateway.tier2",
        "gateway.server",
        "gateway.cluster",
        "cache",
    ),
    # The read side reads; it changes no metadata and knows no services.
    "gateway/read": (
        "gateway.container.container",
        "gateway.tier2",
        "gateway.server",
        "gateway.cluster",
        "gateway.journal",
    ),
    # Bindings store bytes; the services that use them sit above.
    "gateway/storage": (
        "gateway.container",
        "gateway.read",
        "gateway.tier2",
        "gateway.server",
        "gateway.cluster",
        "gateway.recovery",
        "cache",
    ),
    "cache": (*(p for p in DAEMON if p != "cache"), "gateway.container"),
}


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_a_layer_imports_nothing_above_it(folder: str) -> None:
    """The layering of docs/ARCHITECTURE.md, as rules that fail when broken."""
    assert _breaks(folder, LAYERS[folder]) == []


#: The mount reads segments only through its source (`fs/segment_source.py`).
READERS = (
    "gateway.container.container",
    "gateway.read.index.ReadIndex",
    "gateway.read.chunks.ChunkReader",
    "gateway.cluster",
    "gateway.storage",
    "gateway.tier2",
    "gateway.journal",
    "cache",
)


def test_the_mount_reads_only_through_its_source() -> None:
    bad = [
        b
        for b in _breaks("fs", READERS)
        if not b.startswith(str(pathlib.Path("fs", "segment_source.py")))
    ]
    assert bad == []


def test_no_hand_written_source_file_is_over_about_800_lines() -> None:
    """Rooms stay small enough to read (generated protobuf modules aside)."""
    big = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for folder in (*PRODUCT, "bench")
        for p in _modules(folder)
        if (n := len(p.read_text().splitlines())) > 850
    ]
    assert big == []


def test_the_architecture_page_names_every_module_and_only_modules_that_exist() -> None:
    """docs/ARCHITECTURE.md's file map is the tree: every module is named, no ghost."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:gateway|fs|cache|pipeline|bench)/[\w/]*\.py)`", text))
    ghosts = sorted(p for p in named if not (ROOT / p).exists())
    assert ghosts == []
    missing = sorted(
        str(p.relative_to(ROOT))
        for folder in PRODUCT
        for p in _modules(folder)
        if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in text
    )
    assert missing == []
