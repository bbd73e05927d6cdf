"""fsck check 5, ``orphans``: chunk objects no segment names, found with GC's own
pass (`gateway.tier2.gc.collect`)."""

from __future__ import annotations

import math
import time

import trio

from gateway.config import Tier2Config
from gateway.errors import Tier2Error
from gateway.tier2 import gc

from .target import HANDS_OFF, CheckRun, Target, per_basis, show_age, show_size, without_tier2

#: Checked against a snapshot: a chunk object written this long before the
#: snapshot may be an upload whose ChunkAdded was not committed yet when it
#: was taken (so the journal, not the snapshot, names it).
SNAPSHOT_UPLOAD_MARGIN = 60.0


def _gc_overdue(tier2: Tier2Config) -> float:
    """Age past which a running daemon's GC should have deleted an orphan (seconds).

    GC passes run every ``gc_interval`` and delete what is older than
    ``gc_grace``; allow two passes, each retrying Tier 2 for its deadline.
    """
    return tier2.gc_grace + 2 * (tier2.gc_interval + tier2.retry_deadline)


async def check_orphans(target: Target, run: CheckRun) -> None:
    """Check 5: chunk objects that no segment names, with GC's own rules.

    With ``--repair`` exactly what GC would delete is deleted: garbage older
    than ``tier2.gc_grace``. Younger garbage is reported and kept (offline
    it is a problem left; on a running daemon it may be an upload or a
    delete in progress, so a note). On a running daemon, garbage that its
    GC deletes at one of its next passes is expected: only garbage that GC
    should have deleted by now is a problem (`_gc_overdue`).
    """
    layer = target.layer
    if layer is None:
        await without_tier2(target, run, first=False)
        return
    repair = run.options.repair
    grace = target.tier2.gc_grace
    if target.basis:
        await _orphans_per_snapshot(target, run)
        return
    try:
        result = await gc.collect(
            layer, target.node, target.referenced, grace=grace, dry_run=not repair
        )
    except Tier2Error as e:
        await run.problem(f"cannot list the node's objects in Tier 2: {e}")
        await run.done()
        return
    now = time.time()
    deleted, failed = set(result.deleted_keys), set(result.failed_keys)
    for obj in result.garbage:
        if target.online and not repair and now - obj.mtime <= _gc_overdue(target.tier2):
            await run.note(
                f"orphan object {obj.key} ({show_size(obj.size)}, "
                f"{show_age(now - obj.mtime)} old): "
                "no segment names it; the daemon's GC deletes it at its next pass",
                key=obj.key,
            )
            continue
        action = ""
        if obj.key in deleted:
            action = "deleted"
            if target.store is not None:
                await trio.to_thread.run_sync(target.store.drop_chunk, obj.key)
            target.forget_chunk(obj.key)
        elif obj.key in failed:
            action = "not deleted: the delete failed (see the log)"
        await run.problem(
            f"orphan object {obj.key} ({show_size(obj.size)}, {show_age(now - obj.mtime)} old): "
            "no segment names it",
            action=action,
            repaired=obj.key in deleted,
            key=obj.key,
        )
    named = target.referenced() if result.young else set()
    for obj in result.young:
        if obj.key in named:
            continue
        what = f"orphan object {obj.key} ({show_size(obj.size)}, {show_age(now - obj.mtime)} old)"
        if target.online:
            await run.note(
                f"{what}: younger than tier2.gc_grace, so perhaps an upload or a delete in "
                "progress; GC decides once it is older",
                key=obj.key,
            )
        else:
            await run.problem(
                f"{what}: no segment names it",
                action=f"kept: younger than tier2.gc_grace ({show_age(grace)}); run fsck --repair "
                "again once it is older"
                if repair
                else "",
                key=obj.key,
            )
    for key in result.unknown_keys:
        await run.note(f"unknown object {key} under the node's prefix (not a chunk; left alone)")
    run.detail = f"{result.listed} chunk object(s) listed, {result.referenced} named"
    await run.done()


async def _orphans_per_snapshot(target: Target, run: CheckRun) -> None:
    """Check 5 against a snapshot: report what it does not name, delete nothing.

    Objects written after the snapshot (or just before it, see
    `SNAPSHOT_UPLOAD_MARGIN`) may be chunks the journal names: notes. Older
    ones no snapshot names are garbage as far as fsck can tell: problems,
    left for GC once the node runs again.
    """
    assert target.layer is not None
    try:
        # grace=inf: every unnamed object comes back in ``young``, none deleted.
        result = await gc.collect(
            target.layer, target.node, target.referenced, grace=math.inf, dry_run=True
        )
    except Tier2Error as e:
        await run.problem(f"cannot list the node's objects in Tier 2: {e}")
        await run.done()
        return
    now = time.time()
    action = f"not deleted: {HANDS_OFF}" if run.options.repair else ""
    for obj in result.young:
        what = f"orphan object {obj.key} ({show_size(obj.size)}, {show_age(now - obj.mtime)} old)"
        if obj.mtime >= target.basis_time - SNAPSHOT_UPLOAD_MARGIN:
            await run.note(
                f"{what}: written after the snapshot, which does not name it; the journal may",
                key=obj.key,
            )
        else:
            await run.problem(f"{what}: no segment names it", action=action, key=obj.key)
    for key in result.unknown_keys:
        await run.note(f"unknown object {key} under the node's prefix (not a chunk; left alone)")
    run.detail = f"{result.listed} chunk object(s) listed, {result.referenced} named"
    run.detail += per_basis(target)
    await run.done()
