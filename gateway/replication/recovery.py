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
   and moves it into the empty journal directory. A container hosted on a
   survivor's host (a takeover, a drain) copies what that host's own disk
   holds of the same epoch first and reads only the rest over the protocol
   (`LocalReplicas`, `_install`).

The node then starts as if its own disk had survived: the journal replays
onto the checkpoint in it, the storage writer flushes the rest, and writers
continue. With no ensemble record (the node never replicated) the caller
falls back to the Tier-2 rebuild.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import trio

from gateway.client.client import Client
from gateway.cluster.fence import NodeFenced, current_epoch
from gateway.cluster.lease import Lease, claim_epoch
from gateway.cluster.registry import read_registry
from gateway.config import Config
from gateway.errors import GatewayError, NothingToRecover, Unavailable
from gateway.journal import open_journal
from gateway.journal.files import (
    DirectoryLock,
    JournalFileName,
    file_name,
    fsync_directory,
    list_files,
)
from gateway.journal.format import HEADER_SIZE, FrameError, decode_header
from gateway.journal.reader import frames_from
from gateway.protocol import wire_pb2 as wire
from gateway.recovery.metadata_io import STAGING, ensure_empty
from gateway.replication.ensemble import Ensemble, read_ensembles
from gateway.replication.store import READ_BYTES, epoch_dir_name
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

Connect = Callable[[str], AbstractAsyncContextManager[Client]]
#: How long a recovery keeps asking members that do not answer.
RETRY_FOR = 120.0


@dataclass(frozen=True)
class LocalReplicas:
    """The replica logs on this process's own host's disk (a container hosted there)."""

    #: The host's node id: its answer to the fence says which logs it holds.
    node: str
    #: The host's replica store (`gateway.replication.store`: ``<data_dir>/replicas``).
    directory: pathlib.Path


@dataclass(frozen=True)
class ReplicaRecovery:
    """What a recovery from replicas found and installed."""

    epoch: int
    fenced_at: int
    #: The member whose log reaches furthest (what was installed ends where it ends).
    source: str
    #: The installed journal holds the operations [start, next).
    start: int
    next: int
    bytes: int
    answered: tuple[str, ...]
    unanswered: tuple[str, ...]
    #: Bytes copied from the host's own replica log, and how long that took.
    local_bytes: int = 0
    local_seconds: float = 0.0
    #: Bytes read over the protocol from ``source``, and how long that took.
    remote_bytes: int = 0
    remote_seconds: float = 0.0


async def recover_from_replicas(
    config: Config,
    tier2: ChunkLayer,
    connect: Connect,
    patience: float,
    status: Callable[[str], object] = lambda text: None,
    expect_epoch: int | None = None,
    local_replicas: LocalReplicas | None = None,
) -> ReplicaRecovery | None:
    """Install this node's journal from its replicas; None if it never replicated.

    ``expect_epoch`` (a takeover of that epoch): `NodeFenced` unless it is
    still the node's current one -- another process started or took over
    since, and this recovery would fence it. ``local_replicas``: this
    process runs on another node's host, whose own disk may hold a copy of
    the log (read from there first); None reads everything over the protocol.
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
        local = _local_log(local_replicas, answers, node, info)
        status(f"reading the journal of epoch {ensemble.epoch} from {member}"
               + (" and this host's own copy" if local is not None else ""))  # fmt: skip
        copied = await _install(config, connect, member, addresses[member], node, info, fence,
                                local)  # fmt: skip
        result = ReplicaRecovery(
            ensemble.epoch, fence, member, copied.start, info.next,
            copied.local_bytes + copied.remote_bytes,
            tuple(sorted(answers)), tuple(sorted(set(addresses) - set(answers))),
            copied.local_bytes, copied.local_seconds, copied.remote_bytes, copied.remote_seconds,
        )  # fmt: skip
        log.warning(
            "recovered node %s from replica %s: epoch %d, operations %d..%d (%d bytes: "
            "%d from this host's disk in %.1fs, %d from %s in %.1fs); "
            "epochs below %d are fenced at %s",
            node, member, ensemble.epoch, result.start, info.next - 1, result.bytes,
            result.local_bytes, result.local_seconds, result.remote_bytes, member,
            result.remote_seconds, fence, ", ".join(sorted(answers)),
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


@dataclass(frozen=True)
class _LocalLog:
    """What the host's own disk holds of the chosen log: frames [start, next)."""

    directory: pathlib.Path
    start: int
    next: int


def _local_log(
    local: LocalReplicas | None,
    answers: dict[str, wire.ReplicaHoldings],
    node: str,
    info: wire.ReplicaLogInfo,
) -> _LocalLog | None:
    """The part of the chosen log (``info``) the host's own disk can give, if any."""
    if local is None or local.node not in answers:
        return None
    for held in answers[local.node].logs:
        if held.epoch != info.epoch or held.next <= held.start or held.start >= info.next:
            continue
        # Every log of one source epoch holds the same frames for the sequences
        # they share: one source process wrote them, and each log is contiguous
        # from its start (a write that does not follow on is refused). So this
        # log is the chosen one's frames, as far as both reach: copied up to the
        # chosen log's end at most, never beyond what it holds. Its start may be
        # later than the chosen log's (truncated further): still a journal's
        # start, since a log starts at the source's oldest journal file and a
        # replica drops a file only once the source's oldest file starts at or
        # past the next one -- the source's oldest file only moves on (after
        # what was before it is flushed and checkpointed), so the journal the
        # source itself would have recovered from is within this log.
        return _LocalLog(
            local.directory / node / epoch_dir_name(info.epoch),
            held.start,
            min(held.next, info.next),
        )
    return None


@dataclass(frozen=True)
class _Copied:
    """Where the installed frames came from."""

    start: int
    local_bytes: int = 0
    local_seconds: float = 0.0
    remote_bytes: int = 0
    remote_seconds: float = 0.0


class _LocalUnusable(Exception):
    """The host's own copy could not be read whole (a file gone, a bad frame)."""


async def _install(
    config: Config,
    connect: Connect,
    member: str,
    address: str,
    node: str,
    info: wire.ReplicaLogInfo,
    fence: int,
    local: _LocalLog | None = None,
) -> _Copied:
    """Copy one log into the empty journal directory: from the host's own copy of it
    (``local``) as far as that reaches, the rest from ``member`` at ``address``."""
    journal_dir = config.journal_dir
    journal_dir.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(journal_dir)
    try:
        ensure_empty(journal_dir)
        staging = journal_dir / STAGING
        copied = None
        if local is not None:
            try:
                copied = await _copy_with_local(connect, member, address, node, info, local,
                                                _fresh(staging))  # fmt: skip
            except _LocalUnusable as e:
                # Never a journal with a gap: the member has all of it.
                log.warning("recovery: this host's copy of node %s epoch %d cannot be read "
                            "whole (%s); reading all of it from %s", node, info.epoch, e,
                            member)  # fmt: skip
        if copied is None:
            nbytes, seconds = await _copy_remote(connect, member, address, node, info,
                                                 info.start, _fresh(staging))  # fmt: skip
            copied = _Copied(info.start, remote_bytes=nbytes, remote_seconds=seconds)
        # Checked as a journal (a bad frame refuses), and the fence's epoch
        # journaled after it: the next start runs above it.
        async with open_journal(staging, config.journal, min_epoch=fence) as journal:
            if journal.next_sequence < info.next or journal.oldest_file() != copied.start:
                raise Unavailable(
                    f"the copy of node {node}'s journal holds operations from "
                    f"{journal.oldest_file()} to {journal.next_sequence - 1}, not "
                    f"{copied.start}..{info.next - 1}"
                )
        await trio.to_thread.run_sync(_move, staging, journal_dir)
        return copied
    finally:
        lock.release()


def _fresh(staging: pathlib.Path) -> pathlib.Path:
    """``staging``, empty."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


async def _copy_with_local(
    connect: Connect,
    member: str,
    address: str,
    node: str,
    info: wire.ReplicaLogInfo,
    local: _LocalLog,
    staging: pathlib.Path,
) -> _Copied:
    """The host's own frames [local.start, local.next) into one file while the rest
    is read from the member into the next (at once: one is the disk, the other the
    member); `_LocalUnusable` if the local part cannot be had whole."""
    failed: _LocalUnusable | None = None
    remote_failed: GatewayError | OSError | None = None
    remote = (0, 0.0)
    local_bytes = linked = 0
    local_seconds = 0.0

    async def tail() -> None:
        nonlocal remote, remote_failed
        try:
            remote = await _copy_remote(connect, member, address, node, info, local.next,
                                        staging)  # fmt: skip
        except (GatewayError, OSError) as e:
            remote_failed = e

    async with trio.open_nursery() as nursery:
        if local.next < info.next:
            nursery.start_soon(tail)
        started = time.monotonic()
        try:
            local_bytes, linked = await trio.to_thread.run_sync(_copy_local, local, staging)
        except _LocalUnusable as e:
            failed = e
            nursery.cancel_scope.cancel()
        local_seconds = time.monotonic() - started
    if failed is not None:
        raise failed
    if remote_failed is not None:
        raise remote_failed
    log.info("recovery: took %d bytes (operations %d..%d; %d bytes of them hard-linked) of "
             "node %s epoch %d from this host's own replica log in %.2fs", local_bytes,
             local.start, local.next - 1, linked, node, info.epoch, local_seconds)  # fmt: skip
    return _Copied(local.start, local_bytes, local_seconds, *remote)


def _copy_local(local: _LocalLog, staging: pathlib.Path) -> tuple[int, int]:
    """Put the frames [local.start, local.next) of the host's own log into journal
    files in ``staging``, checked to run on without a gap: (bytes, of them linked).
    In a worker thread.

    Every frame is read (header and CRC). A file of the log that lies wholly
    inside the range and is not the last is hard-linked rather than copied:
    the source epoch is fenced, so nothing writes to it again, and a link
    costs no writing and no fsync (the copy was most of a drain's pause:
    1.0-2.4 s for 268 MB here). The first file (if the range starts inside
    it) and the last are copied frame by frame -- the journal appends to its
    last file, which must never be the host's replica file.
    """
    try:
        files = list_files(local.directory)
        at = local.start
        total = linked = 0
        for k, jf in enumerate(files):
            if at >= local.next:
                break
            following = files[k + 1].first_sequence if k + 1 < len(files) else None
            if following is not None and following <= at:
                continue  # wholly before the part copied
            if jf.first_sequence == at and following is not None and following < local.next:
                nbytes = _checked_frames(jf, at, following, None)
                if _link(jf.path, staging / file_name(at)):
                    total += nbytes
                    linked += nbytes
                    at = following
                    continue
            # Copied: up to the next file's start, or the end of the range.
            stop = local.next if following is None else min(following, local.next)
            fd = os.open(staging / file_name(at),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)  # fmt: skip
            try:
                nbytes = _checked_frames(jf, at, stop, fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            total += nbytes
            at = stop
        if at != local.next:
            # A file gone: the frames stop early.
            raise _LocalUnusable(f"it stops at operation {at}, not {local.next}")
        return total, linked
    except OSError as e:
        raise _LocalUnusable(str(e)) from e


def _checked_frames(jf: JournalFileName, at: int, stop: int, fd: int | None) -> int:
    """Read the frames [at, stop) of ``jf``, checked to run on from ``at`` without a
    gap, and write them to ``fd`` (None: only check); their bytes."""
    pending: list[bytes] = []
    size = total = 0
    taking = False
    for header, head, payload, _ in frames_from(jf.path, 0):
        if header.end_sequence <= at and not taking:
            continue  # before the part wanted (the range starts inside this file)
        if header.first_sequence >= stop:
            break
        if header.first_sequence != at:
            raise _LocalUnusable(
                f"{jf.path.name} holds operation {header.first_sequence} where {at} should be"
            )
        taking = True
        at = header.end_sequence
        if fd is None:
            total += len(head) + len(payload)
            continue
        pending += (head, payload)
        size += len(head) + len(payload)
        if size >= _WRITE_BYTES:
            _write_all(fd, pending)
            total += size
            pending, size = [], 0
    if fd is not None:
        _write_all(fd, pending)
        total += size
    if at != stop:
        # A bad frame, or a file cut short: the frames stop early.
        raise _LocalUnusable(f"{jf.path.name} stops at operation {at}, not {stop}")
    return total


def _link(source: pathlib.Path, target: pathlib.Path) -> bool:
    """Hard-link ``source`` as ``target``; False where the file system cannot (copy it)."""
    try:
        os.link(source, target)
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            return False
        raise
    return True


#: Bytes of frames a local copy gathers before it writes them: few enough to
#: stay in the CPU's cache (8 MiB was slower on this machine: 200 MB of 60 KB
#: frames in 0.29-0.58 s, against 0.21-0.24 s).
_WRITE_BYTES = 256 * 1024


def _write_all(fd: int, buffers: list[bytes]) -> None:
    """Write ``buffers`` whole at the file position."""
    iov_max = os.sysconf("SC_IOV_MAX")
    for k in range(0, len(buffers), iov_max):
        chunk = buffers[k : k + iov_max]
        written = os.writev(fd, chunk)
        if written < sum(map(len, chunk)):
            rest = memoryview(b"".join(chunk))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


async def _copy_remote(
    connect: Connect,
    member: str,
    address: str,
    node: str,
    info: wire.ReplicaLogInfo,
    at: int,
    staging: pathlib.Path,
) -> tuple[int, float]:
    """Read the frames [at, info.next) of ``member``'s log into a journal file in
    ``staging``: (bytes, seconds)."""
    started = time.monotonic()
    async with connect(address) as client:
        written, requests = await _read_remote(client, node, info.epoch, at, info.next, staging)
    seconds = time.monotonic() - started
    log.info("recovery: read %d bytes (operations %d..%d) of node %s epoch %d from %s in "
             "%.2fs (%d requests)", written, at, info.next - 1, node, info.epoch, member,
             seconds, requests)  # fmt: skip
    return written, seconds


class _Answer(Protocol):
    async def wait(self) -> wire.Response: ...


class _Requests(Protocol):
    """What the read needs of a `Client`: a request sent, its answer awaited."""

    async def start(self, build: Callable[[int], Sequence[bytes]]) -> _Answer: ...


async def _read_remote(
    client: _Requests,
    node: str,
    epoch: int,
    at: int,
    until: int,
    directory: pathlib.Path,
    max_bytes: int = READ_BYTES,
) -> tuple[int, int]:
    """Read a member's frames [at, until) into one journal file in ``directory``, one
    answer after the other: (bytes written, requests).

    One at a time: a read answers whole write groups from an operation, so
    where the next begins is known only from the answer before. Reading
    ranges at once was measured no faster on this 2-core machine (268 MB:
    2.1-3.3 s one at a time, 2.2-2.5 s with four ranges; docs/PERFORMANCE.md).
    """
    path = directory / file_name(at)
    written = requests = 0
    with path.open("wb") as f:
        while at < until:
            read = wire.ReplicaReadRequest(
                source=node, epoch=epoch, from_sequence=at, max_bytes=max_bytes
            )
            requests += 1
            answer = await client.start(_read_request(read))
            frames = (await answer.wait()).replica_frames
            if frames.next_sequence <= at:
                break  # the log ends here
            data = frames.frames
            try:
                first = decode_header(data[:HEADER_SIZE]).first_sequence
            except FrameError as e:
                raise Unavailable(f"replica read of node {node} from {at}: {e}") from e
            if first != at:
                raise Unavailable(f"replica read of node {node} from {at}: operations "
                                  f"{at}..{first - 1} missing")  # fmt: skip
            f.write(data)
            written += len(data)
            at = frames.next_sequence
        f.flush()
        os.fsync(f.fileno())
    if at < until:
        raise Unavailable(f"replica read of node {node} stopped at {at}, not {until}")
    return written, requests


def _read_request(read: wire.ReplicaReadRequest) -> Callable[[int], Sequence[bytes]]:
    def build(rid: int) -> Sequence[bytes]:
        return (wire.Request(request_id=rid, replica_read=read).SerializeToString(),)

    return build


def _move(staging: pathlib.Path, journal_dir: pathlib.Path) -> None:
    for f in list_files(staging):
        os.rename(f.path, journal_dir / f.path.name)
    fsync_directory(journal_dir)
    shutil.rmtree(staging, ignore_errors=True)
