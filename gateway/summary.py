"""A node's summary in words: the rows the status page shows at its top and
``segment-gateway status`` prints, from one `NodeSummary` (wire.proto).

A leaf: the command line imports it without any daemon part. Each row says
whether it needs attention (the page marks it, the command prints ``!`` and
exits 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.protocol import wire_pb2 as wire


@dataclass(frozen=True)
class Row:
    """One line of the summary."""

    label: str
    text: str
    #: Something an operator should look at.
    attention: bool = False


def size(n: float) -> str:
    """Bytes for a person: ``512 B``, ``1.5 KiB`` ... ``2.0 PiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} PiB"


def duration(seconds: float) -> str:
    """Seconds for a person: ``4.2s``, ``3m 05s``, ``2h 03m``, ``5d 01h``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def hit_ratio(s: wire.NodeSummary) -> float | None:
    """Cache hits over look-ups of Tier-2 blocks (None before the first)."""
    total = s.cache_hits + s.cache_misses
    return s.cache_hits / total if total else None


def rows(s: wire.NodeSummary) -> list[Row]:
    """The summary, one row per part of the node."""
    node = f"{s.node}: segment-gateway {s.version}, epoch {s.epoch}, up {duration(s.uptime_s)}"
    segments = f"{s.segments:,} ({s.sealed_segments:,} sealed, {s.cold_segments:,} cold)"
    out = [Row("node", node), Row("segments", segments)]
    journal = f"{size(s.journal_bytes)} in {s.journal_files} file(s)"
    if s.journal_disk_bytes:
        free, disk = size(s.journal_disk_free_bytes), size(s.journal_disk_bytes)
        journal += f"; its disk {free} free of {disk}"
    if s.journal_refusals:
        journal += f"; {s.journal_refusals:,} write group(s) refused"
    if s.journal_failed:
        journal += f"; FAILED: {s.journal_failed}"
    elif s.journal_short_of_space:
        journal += "; SHORT OF SPACE: changes wait"
    out.append(Row("journal", journal, bool(s.journal_failed or s.journal_short_of_space)))
    ratio = hit_ratio(s)
    cache = (
        f"{size(s.cache_pinned_bytes)} pinned (unflushed), "
        f"{size(s.cache_journal_bytes)} read from the journal, "
        f"{size(s.cache_block_bytes)} of Tier-2 blocks; budget {size(s.cache_budget_bytes)}; "
        + (f"hit ratio {ratio:.1%}" if ratio is not None else "no Tier-2 reads yet")
    )
    out.append(Row("cache", cache))
    if s.tier2:
        tier2 = (
            f"{s.tier2}: {size(s.tier2_unflushed_bytes)} unflushed in "
            f"{s.tier2_unflushed_segments:,} segment(s)"
        )
        if s.tier2_unflushed_bytes:
            tier2 += f", the oldest {duration(s.tier2_oldest_unflushed_s)} old"
        tier2 += f"; {s.tier2_errors:,} error(s), {s.tier2_flush_failures:,} failed flush(es)"
        if s.tier2_failing_segments:
            tier2 += f"; FAILING for {s.tier2_failing_segments:,} segment(s)"
        out.append(Row("tier 2", tier2, bool(s.tier2_failing_segments)))
    else:
        out.append(Row("tier 2", "none"))
    if s.mountpoint:
        state = "mounted" if s.mounted else "NOT MOUNTED"
        mount = f"{s.mountpoint}: {state}; {s.fuse_open_files:,} file(s) open"
        if s.fuse_read_errors:
            mount += f"; {s.fuse_read_errors:,} read(s) failed (EIO)"
        out.append(Row("mount", mount, not s.mounted or bool(s.fuse_read_errors)))
    else:
        out.append(Row("mount", "none (fuse.mountpoint is empty)"))
    if s.embedded_s3:
        text = (
            f"{s.embedded_s3}; {s.embedded_s3_exits:,} exit(s), "
            f"{s.embedded_s3_restarts:,} restart(s)"
        )
        out.append(Row("embedded S3", text, s.embedded_s3 != "up"))
    if s.cluster:
        if s.fenced:
            text, bad = "FENCED: another process took this node id over", True
        else:
            text, bad = ("lease held", False) if s.lease_held else ("LEASE NOT HELD", True)
        out.append(Row("cluster", text, bad))
    return out


def as_dict(s: wire.NodeSummary) -> dict[str, Any]:
    """Every field by its name, numbers as numbers (``status --json``)."""
    return {f.name: getattr(s, f.name) for f in s.DESCRIPTOR.fields}
