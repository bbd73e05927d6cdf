"""Planned moves of a live container: handback to its returning node, and drain.

Both use the takeover claim of `gateway.cluster.failover` on the container's
*current* epoch, written while the process running it is alive:

- the process that runs a container watches the claim of its own epoch
  (`watch_handover`, every ``cluster.heartbeat_interval``). Once another
  node holds it, it stops as at SIGTERM -- stops accepting, answers what is
  in flight, says ``stopped`` in the registry -- and exits 0, without the
  stop's flush to Tier 2 (the claimant recovers the journal from the
  replicas anyway; a flush would only make the writers wait);
- the claimant waits for that (`wait_stopped`: the record says ``stopped``,
  or has gone stale because the process died meanwhile, or `HANDOVER_WAIT`
  passed), then recovers exactly as a takeover does: a new epoch, the old
  one fenced at the replicas, the journal from them. A previous process
  that stopped cleanly leaves no lease to wait out.

**Handback** (``cluster.handback = true``): a node that starts while its
registry record says another node hosts its container (`take_back`) claims
the hosted epoch for itself, waits for the host to stop it, moves its own
stale journal aside (``<journal>.replaced``: never replayed over the newer
data, kept for inspection until the next handback replaces it), empties its
cache and recovers. With ``handback = false`` it refuses to start
(`HostedElsewhere`).

**Drain** (``segment-gateway cluster drain NODE``): the target node claims
NODE's current epoch for itself (an ``announce`` claim) and starts the
hosted process at once; NODE keeps serving until that process says it is
started and waits (`announce_waiting`; `ANNOUNCE_WAIT` at most), then
stops, so the writers' pause is the recovery, not a process start.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import time
from collections.abc import Callable

import trio

from gateway.cluster import registry
from gateway.cluster.failover import announced_key, claim_takeover, read_claim
from gateway.cluster.fence import current_epoch
from gateway.cluster.registry import STOPPED, UP, Liveness, NodeRecord, record_key
from gateway.config import CLUSTER_PREFIX, Config
from gateway.errors import BadRequest, ChunkNotFound, GatewayError, Unavailable
from gateway.journal.files import DirectoryLock, fsync_directory, list_files
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

#: The longest a claimant waits for the running process to stop cleanly
#: (beyond its drain and flush timeouts) before it fences it instead.
HANDOVER_WAIT = 30.0
#: The longest the process running a drained container keeps serving while
#: the claimant's process starts (`TakeoverClaim.announce`).
ANNOUNCE_WAIT = 10.0
#: Where a returning node's stale journal goes (beside the journal directory).
REPLACED_SUFFIX = ".replaced"
RETIRED_PREFIX = f"{CLUSTER_PREFIX}/retired/"


class NodeRetired(GatewayError):
    """node {} was retired with `cluster forget` ({}; its container runs on: {}): it \
does not start again under this id"""

    exit_code = 31


class HostedElsewhere(GatewayError):
    """node {}'s container runs on node {} since this node was down or drained, and \
cluster.handback = false: this node does not take it back. Set cluster.handback \
= true to get it back"""

    exit_code = 31


async def read_record(layer: ChunkLayer, node: str) -> NodeRecord | None:
    """``node``'s registry record, if there is a usable one (bounded)."""
    return await registry.read_record(layer, node, deadline=10.0)


def stop_patience(config: Config) -> float:
    """How long a clean stop of a container may take, for whoever waits for it."""
    return HANDOVER_WAIT + config.server.drain_timeout + config.tier2.stop_flush_timeout


async def wait_stopped(
    config: Config,
    layer: ChunkLayer,
    node: str,
    epoch: int,
    status: Callable[[str], object] = lambda text: None,
    poll: float = 0.1,
) -> bool:
    """Until the process running ``epoch`` of ``node`` has stopped; whether cleanly.

    Stopped cleanly: its record says ``stopped``. Otherwise it is taken for
    gone once its record has not changed for ``cluster.down_after``, or
    after `stop_patience` (what follows fences it either way).
    """
    liveness = Liveness(config.cluster.down_after)
    status(f"waiting for node {node} (epoch {epoch}) to stop")
    with trio.move_on_after(stop_patience(config)):
        while True:
            record = await read_record(layer, node)
            if record is None or record.epoch > epoch:
                return False
            if record.state == STOPPED:
                return True
            liveness.observe(record)
            if liveness.state(record) != UP:
                return False
            await trio.sleep(poll)
    log.warning("handover: node %s (epoch %d) did not stop within %.0fs; fencing it",
                node, epoch, stop_patience(config))  # fmt: skip
    return False


async def take_back(
    config: Config, layer: ChunkLayer, status: Callable[[str], object] = lambda text: None
) -> int | None:
    """Get this node's container back if another node hosts it.

    Returns the hosted epoch to recover over (its stale journal moved aside),
    or None when nobody hosts it (an ordinary start).
    """
    node = config.node.id
    give_up = trio.current_time() + stop_patience(config) + 120
    while True:
        record = await read_record(layer, node)
        if record is None:
            return None
        epoch = await current_epoch(layer, node)
        taken = await read_claim(layer, node, record.epoch) if record.epoch < epoch else None
        if taken is not None and taken.host == node:
            return None  # this node's own handback went through before it stopped
        if taken is None and not record.hosted_by:
            return None  # runs on its own host: an ordinary start
        host = taken.host if taken is not None else record.hosted_by
        if not config.cluster.handback:
            raise HostedElsewhere(node, host)
        if epoch == record.epoch:
            claim = await claim_takeover(layer, node, epoch, node)
            if claim.host == node:
                break
            why = f"node {claim.host} is taking it over (epoch {epoch})"
        else:
            # A takeover (or the hosted process's restart) has registered an
            # epoch and not written its record yet.
            why = f"epoch {epoch} is registered and not serving yet"
        if trio.current_time() > give_up:
            raise Unavailable(f"cannot take node {node}'s container back from {host}: {why}")
        status(f"waiting to take the container back: {why}")
        await trio.sleep(config.cluster.heartbeat_interval)
    log.warning("handback: node %s's container runs on node %s (epoch %d); taking it back",
                node, host, epoch)  # fmt: skip
    status(f"waiting for node {host} to hand this node's container back")
    cleanly = await wait_stopped(config, layer, node, epoch, status)
    log.info("handback: node %s %s node %s's container", host,
             "stopped" if cleanly else "no longer runs", node)  # fmt: skip
    await trio.to_thread.run_sync(set_aside, config)
    return epoch


def set_aside(config: Config) -> None:
    """Move a stale journal aside and empty the cache (blocking)."""
    journal_dir = config.journal_dir
    if journal_dir.is_dir() and list_files(journal_dir):
        lock = DirectoryLock(journal_dir)  # no daemon may be using it meanwhile
        target = journal_dir.with_name(journal_dir.name + REPLACED_SUFFIX)
        try:
            if target.exists():
                shutil.rmtree(target)
            os.rename(journal_dir, target)
            fsync_directory(journal_dir.parent)
        finally:
            lock.release()
        log.warning("handback: the stale journal is kept at %s (never replayed; delete it "
                    "when no longer wanted)", target)  # fmt: skip
    cache_dir = pathlib.Path(config.cache_dir)
    if cache_dir.exists():
        # Only a cache, but it holds the stale journal's unflushed bytes.
        shutil.rmtree(cache_dir)


async def announce_waiting(layer: ChunkLayer, node: str, epoch: int) -> None:
    """Say that the process taking ``epoch`` of ``node`` over is started and waits
    for the old one to stop (best effort: the old one stops after
    `ANNOUNCE_WAIT` anyway)."""
    try:
        await layer.write(announced_key(node, epoch), b"", {"node": node}, deadline=5.0)
    except GatewayError as e:
        log.warning("handover: cannot say that this process waits for the old one: %s", e)


async def _announced(layer: ChunkLayer, node: str, epoch: int, poll: float = 0.1) -> None:
    """Until the claimant's process has said it waits (`ANNOUNCE_WAIT` at most)."""
    with trio.move_on_after(ANNOUNCE_WAIT):
        while True:
            try:
                await layer.read(announced_key(node, epoch), 0, 1, deadline=5.0)
                return
            except ChunkNotFound:
                pass
            except GatewayError as e:
                log.info("handover: cannot read whether the claimant waits: %s", e)
            await trio.sleep(poll)
    log.warning("handover: the claimant's process did not say it waits within %.0fs; "
                "stopping anyway", ANNOUNCE_WAIT)  # fmt: skip


async def watch_handover(
    layer: ChunkLayer,
    node: str,
    epoch: int,
    host: str,
    interval: float,
    on_claimed: Callable[[str, bool], None],
) -> None:
    """Call ``on_claimed(claimant, takeover)`` once a node other than ``host`` (the node
    whose host runs this process) claims ``epoch`` of ``node``.

    ``takeover``: the claim is a failover's (neither a drain's announce nor the
    node itself taking its container back): this process was taken over while
    it ran, cut off, and should leave as taken over, to be started again.
    """
    failing = False
    while True:
        await trio.sleep(interval)
        try:
            claim = await read_claim(layer, node, epoch)
            failing = False
        except GatewayError as e:
            if not failing:
                log.warning("handover: cannot read this container's takeover claim: %s", e)
            failing = True
            continue
        if claim is not None and claim.host != host:
            if claim.announce:
                # A drain: keep serving while the claimant's process starts.
                await _announced(layer, node, epoch)
            on_claimed(claim.host, not claim.announce and claim.host != node)
            return


def retired_key(node: str) -> str:
    """Tier-2 key saying ``node`` was retired (``cluster forget``)."""
    return f"{RETIRED_PREFIX}{node}.json"


async def check_not_retired(layer: ChunkLayer, node: str) -> None:
    """`NodeRetired` if ``node`` was retired with ``cluster forget``."""
    try:
        data = await layer.read(retired_key(node), 0, 16 * 1024, deadline=10.0)
    except ChunkNotFound:
        return
    try:
        doc = json.loads(data)
        when, host = str(doc.get("at", "?")), str(doc.get("hosted_by") or "none")
    except (ValueError, AttributeError):
        when, host = "unreadable record", "?"
    raise NodeRetired(node, when, host)


async def forget(
    layer: ChunkLayer, node: str, record: NodeRecord | None, state: str, by: str
) -> str:
    """Retire ``node`` for good (``cluster forget``); what was done, in words.

    - its container runs on another node (``hosted_by``): it stays there, and
      the node may not start again under this id (no handback);
    - it is down or stopped, holds no segment and nobody runs it: its registry
      record goes too, and nobody follows it any more;
    - refused while it runs on its own host (drain it first) or while it is
      down with segments that nobody runs (they would be unreachable).
    """
    if record is None:
        raise BadRequest(f"node {node} is not in the registry")
    hosted = bool(record.hosted_by)
    if not hosted and state == UP:
        raise BadRequest(f"node {node} is up: drain it first (segment-gateway cluster drain "
                         f"{node}), then forget it")  # fmt: skip
    if not hosted and record.segments:
        raise BadRequest(
            f"node {node} is {state} and holds {record.segments} segment(s) that no other node "
            "runs: they would be unreachable. Let a survivor take it over (replication and "
            "cluster.takeover), or rebuild it (serve --recover-from-tier2), then forget it"
        )
    body = {"format": 1, "node": node, "by": by, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
            time.gmtime()), "hosted_by": record.hosted_by}  # fmt: skip
    await layer.write(retired_key(node), json.dumps(body).encode(), {"node": node})
    if hosted:
        return f"node {node} retired; its container stays on node {record.hosted_by}"
    await layer.delete(record_key(node))
    return f"node {node} retired and removed from the registry"


__all__ = [
    "HANDOVER_WAIT",
    "HostedElsewhere",
    "NodeRetired",
    "announce_waiting",
    "check_not_retired",
    "forget",
    "set_aside",
    "stop_patience",
    "take_back",
    "wait_stopped",
    "watch_handover",
]
