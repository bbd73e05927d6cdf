"""Garbage collection of Tier-2 objects nobody names.

An object under ``<node>/chunks/`` is garbage when no live segment's chunk
list names it and no upload is in progress for it: a crash between an
upload and its ``ChunkAdded``, a chunk truncated away or deleted whose
delete failed, or an upload that lost a race with a truncation. Objects
younger than the grace period are kept: their upload may be about to be
journaled by this daemon (or by one whose clock runs differently).

Only chunk keys are collected. Metadata snapshots are pruned by the storage
writer (it keeps the newest ``tier2.snapshots_kept``); other keys under the
node prefix are counted and left alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import Tier2Error
from gateway.tier2 import names
from gateway.tier2.layer import ChunkLayer

log = logging.getLogger(__name__)


@dataclass
class GcResult:
    """What one pass found and did."""

    #: Chunk objects listed.
    listed: int = 0
    #: Named by metadata or being uploaded.
    referenced: int = 0
    #: Garbage, but younger than the grace period.
    kept_young: int = 0
    deleted: int = 0
    failed: int = 0
    #: Keys under the node prefix that are neither chunks nor snapshots.
    unknown: int = 0
    deleted_keys: list[str] = field(default_factory=list)


async def collect(
    layer: ChunkLayer,
    node: str,
    referenced: Callable[[], set[str]],
    grace: float,
    now: float | None = None,
) -> GcResult:
    """One pass over ``node``'s chunk objects; ``referenced()`` is asked again before deleting."""
    result = GcResult()
    now = time.time() if now is None else now
    objects = await layer.list(names.node_prefix(node))
    chunks_prefix = names.chunks_prefix(node)
    meta_prefix = names.meta_prefix(node)
    named = referenced()
    candidates = []
    for obj in objects:
        if obj.key.startswith(meta_prefix):
            continue
        if not obj.key.startswith(chunks_prefix) or names.chunk_epoch(obj.key) is None:
            result.unknown += 1
            continue
        result.listed += 1
        if obj.key in named:
            result.referenced += 1
        elif now - obj.mtime < grace:
            result.kept_young += 1
        else:
            candidates.append(obj.key)
    if candidates:
        # Again, now: a chunk may have been added since the listing began.
        named = referenced()
        for key in candidates:
            if key in named:
                result.referenced += 1
                continue
            try:
                await layer.delete(key)
            except Tier2Error as e:
                result.failed += 1
                log.warning("GC: cannot delete %s: %s", key, e)
                continue
            result.deleted += 1
            result.deleted_keys.append(key)
    if result.deleted or result.failed:
        log.info(
            "GC: %d chunk object(s), %d deleted, %d failed, %d young garbage kept",
            result.listed,
            result.deleted,
            result.failed,
            result.kept_young,
        )
    return result
