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
from gateway.storage import object_keys as names
from gateway.storage.interface import ObjectInfo
from gateway.storage.layer import ChunkLayer

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
    #: The objects behind the counts, for fsck's report: garbage old enough
    #: to delete (deleted unless a dry run), garbage kept for its youth,
    #: deletes that failed, and the unknown keys.
    garbage: list[ObjectInfo] = field(default_factory=list)
    young: list[ObjectInfo] = field(default_factory=list)
    failed_keys: list[str] = field(default_factory=list)
    unknown_keys: list[str] = field(default_factory=list)


async def collect(
    layer: ChunkLayer,
    node: str,
    referenced: Callable[[], set[str]],
    grace: float,
    now: float | None = None,
    dry_run: bool = False,
) -> GcResult:
    """One pass over ``node``'s chunk objects; ``referenced()`` is asked again before deleting.

    With ``dry_run`` nothing is deleted: ``garbage`` lists what would be (fsck).
    """
    result = GcResult()
    now = time.time() if now is None else now
    objects = await layer.list(names.node_prefix(node))
    chunk_prefixes = (names.chunks_prefix(node), names.attributes_prefix(node))
    meta_prefix = names.meta_prefix(node)
    named = referenced()
    candidates = []
    for obj in objects:
        if obj.key.startswith(meta_prefix):
            continue
        if not obj.key.startswith(chunk_prefixes) or names.chunk_epoch(obj.key) is None:
            result.unknown += 1
            result.unknown_keys.append(obj.key)
            continue
        result.listed += 1
        if obj.key in named:
            result.referenced += 1
        elif now - obj.mtime < grace:
            result.kept_young += 1
            result.young.append(obj)
        else:
            candidates.append(obj)
    if candidates:
        # Again, now: a chunk may have been added since the listing began.
        named = referenced()
        for obj in candidates:
            key = obj.key
            if key in named:
                result.referenced += 1
                continue
            result.garbage.append(obj)
            if dry_run:
                continue
            try:
                await layer.delete(key)
            except Tier2Error as e:
                result.failed += 1
                result.failed_keys.append(key)
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
