"""Rebuilding a lost node from its replicas: fence, read the longest log, install.

``serve --recover-from-tier2`` on a node whose journal is gone (a dead disk,
a new host) with ``replication.write_quorum > 1``:

1. registers a new epoch F for the node id in Tier 2 and waits out the old
   process's lease (`gateway.cluster.lease.claim_epoch`, a takeover): from
   here on no replica starts a log for an older epoch;
2. fences every node of the registry at epoch F (BookKeeper's recovery
   fencing): each refuses the old epochs' writes from now on, and answers
   which logs of the node it holds;
3. takes the newest ensemble record whose members answered in enough number
   (`Ensemble.needed_answers`) and hold a caught-up log of that epoch: every
   acknowledged write group is in one of those logs, and the one reaching
   furthest holds them all (each is a contiguous journal from the node's
   oldest journal file);
4. copies that log, frame for frame, into a staging directory, checks it as
   a journal (torn tail, corruption) with the epoch F journaled after it,
   and moves it into the empty journal directory.

The node then starts as if its own disk had survived: the journal replays
onto the checkpoint in it, the storage writer flushes the rest, and writers
continue. With no ensemble record (the node never replicated) the caller
falls back to the Tier-2 rebuild.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import trio

from gateway.client.client import Client
from gateway.cluster.fence import NodeFenced, current_epoch
from gateway.cluster.lease import Lease, claim_epoch
from gateway.cluster.registry import read_registry
from gateway.config import Config
from gateway.errors import GatewayError, NothingToRecover, Unavailable
from gateway.journal import open_journal
from gateway.journal.files import DirectoryLock, file_name, fsync_directory, list_files
from gateway.protocol import wire_pb2 as wire
from gateway.recovery.metadata_io import STAGING, ensure_empty
from gateway.replication.ensemble import Ensemble, read_ensembles
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

Connect = Callable[[str], AbstractAsyncContextManager[Client]]
#: How long a recovery keeps asking members that do not answer.
RETRY_FOR = 120.0


@dataclass(frozen=True)
class ReplicaRecovery:
    """What a recovery from replicas found and installed."""

    epoch: int
    fenced_at: int
    source: str
    start: int
    next: int
    bytes: int
    answered: tuple[str, ...]
    unanswered: tuple[str, ...]


async def recover_from_replicas(
    config: Config,
    tier2: ChunkLayer,
    connect: Connect,
    patience: float,
    status: Callable[[str], object] = lambda text: None,
    expect_epoch: int | None = None,
) -> ReplicaRecovery | None:
    """Install this node's journal from its replicas; None if it never replicated.

    ``expect_epoch`` (a takeover of that epoch): `NodeFenced` unless it is
    still the node's current one -- another process started or took over
    since, and this recovery would fence it.
    """
    ensure_empty(config.journal_dir)
    node = config.node.id
    ensembles = await read_ensembles(tier2, node)
    if not ensembles:
        return None
    fence = await current_epoch(tier2, node) + 1
    if expect_epoch is not None and fence - 1 != expect_epoch:
        raise NodeFenced(node, expect_epoch, fence - 1)
    cl = config.cluster
    # The old process's lease is waited out *while* the replicas are fenced and
    # read (each step is safe with it still running: fenced replicas refuse it,
    # and nothing here writes to Tier 2); only the answer waits for it.
    held = await claim_epoch(
        tier2, node, fence, str(config.journal_dir), lease=cl.lease, down_after=cl.down_after,
        heartbeat_interval=cl.heartbeat_interval, takeover=True, status=status, wait=False,
    )  # fmt: skip
    status(f"fencing epoch {fence - 1} of node {node} at its replicas")
    addresses = {r.id: r.advertise for r in await read_registry(tier2) if r.id != node}
    answers = await _fence_all(connect, addresses, node, fence, patience)
    # Members that do not answer may be restarting: ask again for a while
    # before giving up (a recovery without them could miss an acknowledged write).
    give_up = trio.current_time() + RETRY_FOR
    while True:
        try:
            found = _first_usable(ensembles, answers)
            break
        except Unavailable as e:
            if trio.current_time() >= give_up:
                raise
            status(f"{e}; asking again")
            log.warning("recovery: %s; asking again", e)
            await trio.sleep(1.0)
            addresses.update(
                {r.id: r.advertise for r in await read_registry(tier2) if r.id != node}
            )
            missing = {n: a for n, a in addresses.items() if n not in answers}
            answers.update(await _fence_all(connect, missing, node, fence, patience))
    if found is not None:
        ensemble, member, info = found
        status(f"reading the journal of epoch {ensemble.epoch} from {member}")
        nbytes = await _install(config, connect, addresses[member], node, info, fence)
        result = ReplicaRecovery(
            ensemble.epoch, fence, member, info.start, info.next, nbytes,
            tuple(sorted(answers)), tuple(sorted(set(addresses) - set(answers))),
        )  # fmt: skip
        log.warning(
            "recovered node %s from replica %s: epoch %d, operations %d..%d (%d bytes); "
            "epochs below %d are fenced at %s",
            node, member, ensemble.epoch, info.start, info.next - 1, nbytes, fence,
            ", ".join(sorted(answers)),
        )  # fmt: skip
        await _wait_out(held, tier2, status)
        return result
    await _wait_out(held, tier2, status)
    raise NothingToRecover(
        f"the replicas of node {node} hold no usable journal (ensembles "
        + "; ".join(f"epoch {e.epoch}: {', '.join(e.members) or 'none'}" for e in ensembles)
        + f"; answered: {', '.join(sorted(answers)) or 'none'})"
    )


async def _wait_out(held: Lease, tier2: ChunkLayer, status: Callable[[str], object]) -> None:
    """Until the previous process's lease has run out; NodeFenced if taken over since."""
    left = held.serve_after - held.clock()
    if left > 0:
        status(f"waiting {left:.1f}s for the previous process's lease")
        await trio.sleep(left)
    await held.renew(tier2, deadline=max(1.0, held.duration))
    if held.fenced is not None:
        raise held.fenced


async def _fence_all(
    connect: Connect, addresses: dict[str, str], node: str, fence: int, patience: float
) -> dict[str, wire.ReplicaHoldings]:
    """Fence ``node`` below ``fence`` at every reachable node; their holdings."""
    answers: dict[str, wire.ReplicaHoldings] = {}

    async def one(peer: str, address: str) -> None:
        try:
            with trio.fail_after(patience):
                async with connect(address) as client:
                    r = await client._call(
                        replica_fence=wire.ReplicaFenceRequest(source=node, epoch=fence)
                    )
            answers[peer] = r.replica_holdings
        except (GatewayError, OSError, trio.TooSlowError) as e:
            log.warning("recovery: node %s at %s did not answer the fence: %s", peer, address, e)

    async with trio.open_nursery() as nursery:
        for peer, address in sorted(addresses.items()):
            nursery.start_soon(one, peer, address)
    return answers


def _choose(
    ensemble: Ensemble, answers: dict[str, wire.ReplicaHoldings]
) -> tuple[str, wire.ReplicaLogInfo] | None:
    """The furthest caught-up log of this epoch among enough answering members."""
    if not ensemble.members:
        return None
    answered = [m for m in ensemble.members if m in answers]
    need = ensemble.needed_answers()
    if len(answered) < need:
        missing = [m for m in ensemble.members if m not in answers]
        raise Unavailable(
            f"cannot recover epoch {ensemble.epoch} safely: {len(answered)} of its replicas "
            f"answered, {need} are needed so that nothing acknowledged is missed "
            f"(not answering: {', '.join(missing)}); bring one back and retry"
        )
    logs = [
        (m, info)
        for m in answered
        for info in answers[m].logs
        if info.epoch == ensemble.epoch and info.caught_up and info.next > info.start
    ]
    if not logs:
        return None  # this epoch acknowledged nothing: an older one has it all
    return max(logs, key=lambda x: x[1].next)


def _first_usable(
    ensembles: list[Ensemble], answers: dict[str, wire.ReplicaHoldings]
) -> tuple[Ensemble, str, wire.ReplicaLogInfo] | None:
    """The newest epoch with a usable log, and that log (Unavailable: too few answers)."""
    for ensemble in ensembles:
        chosen = _choose(ensemble, answers)
        if chosen is not None:
            return ensemble, chosen[0], chosen[1]
    return None


async def _install(
    config: Config,
    connect: Connect,
    address: str,
    node: str,
    info: wire.ReplicaLogInfo,
    fence: int,
) -> int:
    """Copy one log into the empty journal directory; the bytes copied."""
    journal_dir = config.journal_dir
    journal_dir.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(journal_dir)
    try:
        ensure_empty(journal_dir)
        staging = journal_dir / STAGING
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        path = staging / file_name(info.start)
        total = 0
        with path.open("wb") as f:
            async with connect(address) as client:
                at = info.start
                while at < info.next:
                    r = await client._call(
                        replica_read=wire.ReplicaReadRequest(
                            source=node, epoch=info.epoch, from_sequence=at
                        )
                    )
                    frames = r.replica_frames
                    if frames.next_sequence <= at:
                        break
                    f.write(frames.frames)
                    total += len(frames.frames)
                    at = frames.next_sequence
            f.flush()
            os.fsync(f.fileno())
        if at < info.next:
            raise Unavailable(f"replica read of node {node} stopped at {at}, not {info.next}")
        # Checked as a journal (a bad frame refuses), and the fence's epoch
        # journaled after it: the next start runs above it.
        async with open_journal(staging, config.journal, min_epoch=fence):
            pass
        await trio.to_thread.run_sync(_move, staging, journal_dir)
        return total
    finally:
        lock.release()


def _move(staging: pathlib.Path, journal_dir: pathlib.Path) -> None:
    for f in list_files(staging):
        os.rename(f.path, journal_dir / f.path.name)
    fsync_directory(journal_dir)
    shutil.rmtree(staging, ignore_errors=True)
