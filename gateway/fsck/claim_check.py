"""fsck check 7, ``name-claims``: this node's name claims in Tier 2 that no segment
or stream of it has (`gateway.cluster.claims`).

A node that stopped between a deletion and its release, or between claiming
a name and creating the segment, leaves such a claim: no other node can
create that name until it is released. A claim is this node's if its body
names this node; one of a name that is a live segment or stream here is
fine. A create claims before its segment exists, so a claim younger than
``tier2.gc_grace`` (by its object's LastModified) is never released: online
it is a note (perhaps a create in flight), offline a problem kept for a
later run. Online, a claim whose create the daemon has in flight is a note
whatever its age (an old claim reused by a create of the same name).
"""

from __future__ import annotations

import time

from gateway.cluster.claims import NAMES_PREFIX, Claim, claim_key, read_claim, release_orphan
from gateway.container.streams import is_hidden
from gateway.errors import GatewayError, Tier2Error
from gateway.storage.interface import ObjectInfo

from .orphan_check import SNAPSHOT_UPLOAD_MARGIN
from .target import HANDS_OFF, CheckRun, Target, for_each, per_basis, show_age, without_tier2

#: Claim objects read at once (one GET each).
READ_CONCURRENCY = 16


def live_names(target: Target) -> set[str]:
    """Names of the target's segments (transactions' aside: never claimed) and streams."""
    snapshot = target.snapshot()
    names = {r.name for r in snapshot.segments if not is_hidden(r.name)}
    names.update(s.name for s in snapshot.streams)
    return names


async def check_name_claims(target: Target, run: CheckRun) -> None:
    """Check 7: claims of this node whose name is no segment or stream of it.

    One listing of ``_cluster/names/`` (every node's claims), and one GET
    for each claim that is not of a name live here (to read whose it is).
    With ``--repair``, an orphan claim older than ``tier2.gc_grace`` is
    released (`release_orphan`: read again, then deleted if unchanged).
    """
    if target.tier2.url == "embedded":
        await run.done("Tier 2 is embedded: names are this node's alone and are not claimed")
        return
    layer = target.layer
    if layer is None:
        await without_tier2(target, run, first=False)
        return
    names = live_names(target)
    alive = target.alive or names.__contains__
    ours = {claim_key(n) for n in names}
    deadline = target.tier2.retry_deadline
    try:
        listed = await layer.list(NAMES_PREFIX, deadline=deadline)
    except Tier2Error as e:
        await run.problem(f"cannot list the name claims in Tier 2: {e}")
        await run.done()
        return
    found: list[Claim] = []
    others = 0

    async def read(obj: ObjectInfo) -> None:
        nonlocal others
        try:
            claim = await read_claim(layer, obj.key, obj.mtime, deadline)
        except ValueError as e:
            await run.note(f"unreadable name claim {obj.key} ({e}); left alone", key=obj.key)
            return
        except GatewayError as e:
            await run.problem(f"cannot read the name claim {obj.key}: {e}", key=obj.key)
            return
        if claim is None:
            return  # released since the listing
        if claim.node != target.node:
            others += 1
        else:
            found.append(claim)

    await for_each([o for o in listed if o.key not in ours], read, READ_CONCURRENCY)
    grace = target.tier2.gc_grace
    guard = target.name_claims
    now = time.time()
    for claim in sorted(found, key=lambda c: c.name):
        if alive(claim.name):
            continue  # created since the names were taken
        age = now - claim.mtime
        what = f"name claim {claim.key} of {claim.name!r} ({show_age(age)} old)"
        if guard is not None and guard.in_flight(claim.name):
            await run.note(f"{what}: a create of it is in flight", segment=claim.name)
            continue
        if age <= grace:
            if target.online:
                await run.note(
                    f"{what}: no segment or stream has this name yet; younger than "
                    "tier2.gc_grace, so perhaps a create in flight (released once older)",
                    segment=claim.name,
                    key=claim.key,
                )
            else:
                await run.problem(
                    f"{what}: no segment or stream of this node has this name",
                    action=f"kept: younger than tier2.gc_grace ({show_age(grace)}), so perhaps "
                    "a create in flight when the node stopped; run fsck --repair again once "
                    "it is older"
                    if run.options.repair
                    else "",
                    segment=claim.name,
                    key=claim.key,
                )
            continue
        if target.basis:
            if claim.mtime >= target.basis_time - SNAPSHOT_UPLOAD_MARGIN:
                await run.note(
                    f"{what}: claimed after the snapshot, which does not name it; the journal may",
                    segment=claim.name,
                    key=claim.key,
                )
            else:
                await run.problem(
                    f"{what}: no segment or stream of this node has this name",
                    action=f"not released: {HANDS_OFF}" if run.options.repair else "",
                    segment=claim.name,
                    key=claim.key,
                )
            continue
        action, repaired = "", False
        if run.options.repair:
            try:
                why = await release_orphan(layer, claim, alive, guard, deadline)
            except GatewayError as e:
                why = f"the delete failed: {e}"
            action, repaired = ("released", True) if not why else (f"not released: {why}", False)
        await run.problem(
            f"{what}: no segment or stream of this node has this name (the node stopped "
            "between a deletion and its release, or between a claim and its create); "
            "no node can create it while claimed",
            action=action,
            repaired=repaired,
            segment=claim.name,
            key=claim.key,
        )
    here = sum(1 for o in listed if o.key in ours)
    run.detail = (
        f"{len(listed)} name claim(s) listed: {here} of names here, "
        f"{len(found)} other(s) of this node, {others} of other nodes"
    ) + per_basis(target)
    await run.done()
