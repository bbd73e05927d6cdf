"""The source's side of replication: write groups to the ensemble, acks by quorum.

With ``replication.write_quorum = W > 1`` a node's journal is held by its
own disk and by W-1 peers (the *ensemble*), and a write group is durable --
its appends acknowledged -- once it is synced locally and on
``ack_quorum - 1`` members (BookKeeper's write and ack quorums, the node's
own disk counting as one copy). `Replicator` is the journal's
`ReplicationSink`: the journal hands it each group's frames as written and
waits in `wait_replicated` before settling the group.

Each peer has a sender task holding one protocol connection, which brings
the peer's log for this epoch up to the journal's end and then streams
groups as they are written, pipelined: from memory while the peer keeps up
(at most ``replication.lag_bytes`` kept), else read back from the journal
files. A log always starts at the journal's oldest file (``start``), so it
is a journal on its own: recovery can install it as it is.

The ensemble (`gateway.replication.ensemble`) is recorded in Tier 2 before
it counts: a peer joins once caught up; a member that leaves a write
unanswered for ``replication.peer_timeout`` (or cannot be reached) stops
holding anything up -- with ack_quorum < write_quorum the others carry the
acks -- and is replaced by a spare node if there is one (BookKeeper's
ensemble change), or dropped from the record once the remaining members
hold everything acknowledged, so a recovery needs only them; it rejoins
once caught up. Tier 2 unreachable only delays ensemble changes.

A replica that refuses a write because a recovery fenced this epoch
(`ReplicaFenced`) means this process was taken over: it is told to the
node (``on_fenced``), which stops accepting changes.
"""

from __future__ import annotations

import logging
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.aio import service_nursery
from gateway.client.client import Client
from gateway.config import ReplicationConfig
from gateway.errors import (
    GatewayError,
    JournalClosed,
    JournalFenced,
    NoQuorum,
    ReplicaFenced,
    ReplicaGap,
    Unavailable,
)
from gateway.journal import Journal
from gateway.journal.reader import group_ending_at, read_groups
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import encode_replica_write_request
from gateway.replication.ensemble import Ensemble, delete_ensembles_before, write_ensemble
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

#: Frames per catch-up message read back from the journal files.
CATCH_UP_BYTES = 4 * 1024 * 1024
#: Unanswered bytes per peer connection (the pipeline's depth).
WINDOW_BYTES = 16 * 1024 * 1024
#: How often an idle sender tells its peer about truncation, and the
#: membership is reconsidered.
IDLE_INTERVAL = 0.5
#: Reconnecting to a replica: the first wait, and the longest.
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0
#: An idle connection to a replica carries an empty write this often.
KEEPALIVE_INTERVAL = 1.0

Connect = Callable[[str], AbstractAsyncContextManager[Client]]
#: Other nodes that are up now: (node id, address).
Candidates = Callable[[], list[tuple[str, str]]]


@dataclass
class Peer:
    """One peer's replica of this epoch's log, as this node knows it."""

    node: str
    address: str
    #: The peer's log holds every frame below this durably.
    acked: int = 0
    #: Frames below this were sent on the current connection.
    sent: int = 0
    #: The peer's log took a catch-up to the journal's end once.
    caught_up: bool = False
    #: Connected and answering within peer_timeout.
    live: bool = False
    #: trio time since when it has not been live (None: live).
    down_since: float | None = None
    errors: int = 0
    last_error: str = ""
    #: Wait before the next reconnect (doubles while failing, reset by an answer).
    backoff: float = 0.1
    scope: trio.CancelScope | None = None
    #: Writes sent and not yet answered, oldest first: (bytes, end, when sent).
    #: Changed only by `note_sent`, `note_answered` and `forget_unanswered`.
    unanswered: deque[tuple[int, int, float]] = field(default_factory=deque)
    #: The bytes of ``unanswered``, summed.
    unanswered_bytes: int = 0
    #: A seeded start is unanswered; the peer refused one (start it whole from now on).
    seeding: bool = False
    seed_refused: bool = False

    def note_sent(self, nbytes: int, end: int, when: float) -> None:
        """A write of ``nbytes`` of frames, up to ``end``, was sent at ``when``."""
        self.unanswered.append((nbytes, end, when))
        self.unanswered_bytes += nbytes

    def note_answered(self) -> None:
        """The oldest unanswered write was answered."""
        if self.unanswered:
            self.unanswered_bytes -= self.unanswered.popleft()[0]

    def forget_unanswered(self) -> None:
        """The connection is gone, and what it left unanswered with it."""
        self.unanswered.clear()
        self.unanswered_bytes = 0


@dataclass(frozen=True)
class PeerStatistics:
    """One peer as ``segment-gateway cluster`` and the metrics show it."""

    node: str
    member: bool
    live: bool
    caught_up: bool
    #: Operations written here and not yet durable there.
    lag: int
    errors: int
    last_error: str


@dataclass(frozen=True)
class ReplicationStatistics:
    """The replicator's state (``Replicator.statistics()``)."""

    epoch: int
    write_quorum: int
    ack_quorum: int
    members: tuple[str, ...]
    peers: tuple[PeerStatistics, ...]
    written: int
    acked: int
    ensemble_changes: int
    #: Changes answered NoQuorum after replication.ack_timeout.
    quorum_failures: int
    #: Whether an ack quorum of live members exists now.
    has_quorum: bool
    fenced: str | None


class Replicator:
    """Replicates one journal epoch to its ensemble (module docstring)."""

    def __init__(
        self,
        node_id: str,
        journal: Journal,
        config: ReplicationConfig,
        tier2: ChunkLayer,
        connect: Connect,
        candidates: Candidates = list,
        on_fenced: Callable[[GatewayError], None] = lambda e: None,
        record_deadline: float = 10.0,
    ) -> None:
        self.node_id = node_id
        self.journal = journal
        self.epoch = journal.epoch
        self.config = config
        self.acks_needed = config.acks - 1
        self._tier2 = tier2
        self._connect = connect
        self._candidates = candidates
        self._on_fenced = on_fenced
        self._record_deadline = record_deadline
        #: Every operation below this is written locally.
        self.written_end = journal.next_sequence
        #: Every operation below this is durable on an ack quorum (and locally).
        self.acked_end = 0
        #: Groups still in memory for peers: (first, end, frames), contiguous.
        self._live: deque[tuple[int, int, bytes]] = deque()
        self._live_bytes = 0
        self._written = trio.Event()
        self._progress = trio.Event()
        # Set when a peer has caught up and may join now (`_membership_step`).
        self._join_ready = trio.Event()
        self.peers: dict[str, Peer] = {}
        #: Nodes not tried as spares again until then (trio time): they hung.
        self._cooldown: dict[str, float] = {}
        #: The recorded ensemble: peers whose logs count for acknowledgements.
        self.members: tuple[str, ...] = ()
        self._recorded = False
        self._dropped_before = 0
        self.fenced: GatewayError | None = None
        self._closed = False
        self._attached = False
        self._nursery: trio.Nursery | None = None
        self.ensemble_changes = 0
        self.quorum_failures = 0
        self._said_no_quorum = False
        #: Other nodes up in the registry, at the last look.
        self._others_up = 0

    # -- the journal's side (ReplicationSink) -------------------------------------

    def written(self, first_sequence: int, end_sequence: int, frames: bytes | None) -> None:
        """A group was written locally: keep its frames for the peers, wake the senders."""
        if frames is not None and (not self._live or self._live[-1][1] == first_sequence):
            self._live.append((first_sequence, end_sequence, frames))
            self._live_bytes += len(frames)
        else:
            self._live.clear()
            self._live_bytes = 0
        self.written_end = end_sequence
        while self._live_bytes > self.config.lag_bytes and len(self._live) > 1:
            self._live_bytes -= len(self._live.popleft()[2])
        self._written.set()
        self._written = trio.Event()

    async def wait_replicated(self, end_sequence: int) -> None:
        """Return once operations below ``end_sequence`` are on ack_quorum - 1 members."""
        while not self._replicated(end_sequence):
            if self.fenced is not None:
                # Taken over: never acknowledged, and nobody will keep it.
                raise JournalFenced(str(self.fenced))
            if self._closed:
                raise JournalClosed()
            await self._progress.wait()
        if end_sequence > self.acked_end:
            self.acked_end = end_sequence

    def _replicated(self, end: int) -> bool:
        if self.acks_needed <= 0:
            return True
        # Only caught-up logs count: a recovery installs only such a log.
        have = sum(
            1 for m in self.members if (p := self.peers.get(m)) and p.caught_up and p.acked >= end
        )
        return have >= self.acks_needed

    def _wake(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    # -- the container's side (a LeaseGate) --------------------------------------

    @property
    def ack_timeout(self) -> float:
        """How long an acknowledgement may wait for the quorum."""
        return self.config.ack_timeout

    def held(self) -> bool:
        """Whether changes may be admitted: replicating, and not taken over."""
        return self._attached and self.fenced is None and not self._closed

    def check(self) -> None:
        """Raise Unavailable saying why changes are not admitted now."""
        if self.fenced is not None:
            raise Unavailable(str(self.fenced))
        if self._closed:
            raise Unavailable("the daemon is shutting down")
        if not self._attached:
            raise Unavailable("replication is starting: no replica has this node's journal yet")

    def not_acknowledged(self) -> GatewayError:
        """The error for a change that found no ack quorum within ack_timeout."""
        self.quorum_failures += 1
        return NoQuorum(self.describe_quorum())

    def has_quorum(self) -> bool:
        """Whether ack_quorum - 1 members are live now."""
        live = sum(1 for m in self.members if (p := self.peers.get(m)) and p.live)
        return live >= self.acks_needed

    def describe_quorum(self) -> str:
        """Why there is no quorum, in words."""
        live = [m for m in self.members if (p := self.peers.get(m)) and p.live]
        down = [
            f"{p.node} ({p.last_error or 'not answering'})"
            for p in self.peers.values()
            if not p.live
        ]
        short = ""
        if self._others_up < self.acks_needed:
            short = (
                f"; replication.ack_quorum = {self.config.acks} needs {self.acks_needed} other "
                f"node(s) up, the registry has {self._others_up}"
            )
        return (
            f"{len(live)} of the {self.acks_needed} replica(s) needed answer "
            f"(ensemble: {', '.join(self.members) or 'none yet'}"
            + (f"; down: {', '.join(down)}" if down else "")
            + short
            + ")"
        )

    # -- running -------------------------------------------------------------------

    def attach_candidates(self, candidates: Candidates) -> None:
        """Where the ensemble's candidates come from (the cluster's registry)."""
        self._candidates = candidates

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Attach to the journal and replicate until cancelled."""
        self.written_end = self.journal.next_sequence
        self.journal.replication = self
        self._attached = True
        log.info("replication: epoch %d, write quorum %d, ack quorum %d",
                 self.epoch, self.config.write_quorum, self.config.acks)  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._run_membership()
        finally:
            self._closed = True
            self.journal.replication = None
            self._wake()

    async def _run_membership(self) -> None:
        """Start senders, record joins, replace or drop failed members."""
        while True:
            try:
                await self._membership_step()
            except GatewayError as e:
                log.warning("replication: ensemble change postponed: %s", e)
            except Exception:
                log.exception("replication: unexpected error in the membership loop")
            self._report_quorum()
            # A caught-up peer joins at once: a new epoch (a restart, a
            # takeover, a drain) acknowledges nothing until its ensemble has
            # a quorum, and the interval was half of a drain's member join.
            with trio.move_on_after(IDLE_INTERVAL):
                await self._join_ready.wait()
            self._join_ready = trio.Event()

    async def _membership_step(self) -> None:
        if self.fenced is not None:
            return  # taken over: nothing more is written anywhere
        now = trio.current_time()
        timeout = self.config.peer_timeout
        candidates = self._candidates()
        self._others_up = len(candidates)
        up = {n: a for n, a in candidates if self._cooldown.get(n, 0.0) <= now}
        # A joining peer that has not answered for peer_timeout (a hung or
        # stopped node) makes room for another spare for a while -- if there
        # is one: else it keeps trying, and rejoins as soon as it answers.
        waiting = [n for n in up if n not in self.members and n not in self.peers]
        for joiner in list(self.peers.values()):
            if (
                waiting
                and joiner.node not in self.members
                and not joiner.live
                and joiner.down_since is not None
                and now - joiner.down_since >= timeout
                and joiner.scope is not None
            ):
                joiner.scope.cancel()
                self._cooldown[joiner.node] = now + max(5.0, 10 * timeout)
                up.pop(joiner.node, None)
        failed = {
            m
            for m in self.members
            if (p := self.peers.get(m)) is None
            or (p.down_since is not None and now - p.down_since >= timeout)
        }
        want = self.config.write_quorum - 1
        # Senders: every member, and candidates for open or failed places.
        for m in self.members:
            if m not in self.peers and m in up:
                self._start_peer(m, up[m])
        spares = [n for n in sorted(up, key=self._rank) if n not in self.members]
        open_places = want - (len(self.members) - len(failed))
        for n in spares:
            joining = [
                p
                for p in self.peers.values()
                if p.node not in self.members and not (p.scope and p.scope.cancel_called)
            ]
            if len(joining) >= open_places:
                break
            if n not in self.peers:
                self._start_peer(n, up[n])
        # Joins: caught-up peers fill open places.
        new = list(self.members)
        for p in self.peers.values():
            if p.node in new or not p.caught_up or not p.live:
                continue
            if len([m for m in new if m not in failed]) < want:
                new.append(p.node)
        # Leaves: failed members, once the others hold everything acknowledged.
        for m in sorted(failed):
            rest = [n for n in new if n != m]
            full = [n for n in rest if (q := self.peers.get(n)) and q.acked >= self.acked_end]
            if len(full) >= max(1, self.acks_needed):
                new = rest
        if (tuple(new) != self.members or not self._recorded) and (new or self._recorded):
            await self._record(tuple(new))
        # Stop senders to nodes that are neither members nor wanted.
        for p in list(self.peers.values()):
            if p.node not in self.members and p.node not in up and p.scope is not None:
                p.scope.cancel()
        await self._maybe_drop_older()

    def _rank(self, node: str) -> int:
        """Spread ensembles over the nodes: each source prefers different peers."""
        return zlib.crc32(f"{self.node_id}/{node}".encode())

    async def _record(self, members: tuple[str, ...]) -> None:
        ensemble = Ensemble(
            self.node_id, self.epoch, members, self.config.write_quorum, self.config.acks
        )
        await write_ensemble(self._tier2, ensemble, self._record_deadline)
        old = self.members
        self.members = members
        self._recorded = True
        self.ensemble_changes += 1
        log.info("replication: ensemble of epoch %d: %s (was %s)", self.epoch,
                 ", ".join(members) or "none", ", ".join(old) or "none")  # fmt: skip
        self._wake()

    async def _maybe_drop_older(self) -> None:
        """Once this epoch's logs are caught up on a quorum, older epochs' logs may go."""
        if self._dropped_before >= self.epoch or not self._recorded:
            return
        caught = [m for m in self.members if (p := self.peers.get(m)) and p.caught_up]
        if len(caught) < max(1, self.acks_needed):
            return
        self._dropped_before = self.epoch  # the senders tell the replicas
        self._written.set()
        self._written = trio.Event()
        try:
            await delete_ensembles_before(self._tier2, self.node_id, self.epoch)
        except GatewayError as e:
            log.info("replication: older ensemble records stay for now: %s", e)

    def _report_quorum(self) -> None:
        ok = self.has_quorum()
        if not ok and not self._said_no_quorum and self._recorded:
            log.error("replication: no ack quorum: %s; changes are not acknowledged",
                      self.describe_quorum())  # fmt: skip
        elif ok and self._said_no_quorum:
            log.warning("replication: ack quorum again (%s)", ", ".join(self.members))
        self._said_no_quorum = not ok and self._recorded

    def _start_peer(self, node: str, address: str) -> None:
        assert self._nursery is not None
        peer = Peer(node, address, down_since=trio.current_time())
        self.peers[node] = peer
        log.info("replication: sending this node's journal to %s at %s", node, address)
        self._nursery.start_soon(self._run_peer, peer)

    # -- one peer ---------------------------------------------------------------------

    async def _run_peer(self, peer: Peer) -> None:
        with trio.CancelScope() as scope:
            peer.scope = scope
            while True:
                try:
                    async with self._connect(peer.address) as client:
                        await self._stream(peer, client)
                except ReplicaFenced as e:
                    self._fence(e)
                    return
                except (GatewayError, OSError, trio.TooSlowError) as e:
                    self._peer_down(peer, str(e) or type(e).__name__)
                except Exception as e:  # a bug must not stop the other peers
                    log.exception("replication: peer %s", peer.node)
                    self._peer_down(peer, f"unexpected {type(e).__name__}")
                await trio.sleep(peer.backoff)
                peer.backoff = min(BACKOFF_MAX, peer.backoff * 2)
        self._peer_down(peer, "stopped")
        if self.peers.get(peer.node) is peer and peer.node not in self.members:
            del self.peers[peer.node]

    def _peer_down(self, peer: Peer, why: str) -> None:
        if peer.live or peer.down_since is None:
            if peer.live:
                log.warning("replication: peer %s down: %s", peer.node, why)
            peer.down_since = trio.current_time()
        peer.live = False
        peer.errors += 1
        peer.last_error = why
        peer.forget_unanswered()
        self._wake()

    def _fence(self, e: GatewayError) -> None:
        if self.fenced is None:
            self.fenced = e
            log.error("replication: %s", e)
            self._on_fenced(e)
        self._wake()

    async def _stream(self, peer: Peer, client: Client) -> None:
        """Bring the peer's log to the journal's end, then stream groups as written."""
        with trio.fail_after(2 * self.config.peer_timeout):
            holdings = await client._call(
                replica_fence=wire.ReplicaFenceRequest(source=self.node_id, epoch=0)
            )
        if holdings.replica_holdings.fenced_below > self.epoch:
            raise ReplicaFenced(peer.node, self.epoch, self.node_id,
                                holdings.replica_holdings.fenced_below)  # fmt: skip
        oldest = self.journal.oldest_file()
        start = True
        for info in holdings.replica_holdings.logs:
            if info.epoch == self.epoch and oldest <= info.next <= self.written_end:
                start = False
                peer.acked = peer.sent = info.next
                peer.caught_up = info.caught_up
        seed: tuple[int, int, bytes] | None = None
        peer.seeding = False
        if start:
            peer.acked = 0
            peer.sent = oldest
            peer.caught_up = False
            if not peer.seed_refused:
                seed = await self._seed(holdings.replica_holdings.logs, oldest)
            if seed is not None:
                peer.sent = seed[1]
                log.info("replication: %s seeds epoch %d's log from its epoch %d up to %d "
                         "(%d operations not sent again)", peer.node, self.epoch, seed[0],
                         seed[1], seed[1] - oldest)  # fmt: skip
        peer.live = True
        peer.down_since = None
        self._wake()
        async with service_nursery() as nursery:
            answers: trio.MemorySendChannel[Any]
            answers, receive = trio.open_memory_channel[Any](1000)
            nursery.start_soon(self._take_answers, peer, receive)
            nursery.start_soon(self._watch_answers, peer)
            told_truncate = 0
            told_drop = 0
            last_sent = trio.current_time()
            while True:
                oldest = self.journal.oldest_file()
                if peer.sent < self.written_end:
                    frames, end = await self._next_frames(peer)
                    if end == peer.sent:
                        if peer.sent < self.journal.oldest_file():
                            raise GatewayError("journal truncated under a catch-up: restarting it")
                        await trio.sleep(0.01)
                        continue
                    caught = not peer.caught_up and end >= self.written_end
                    req = wire.ReplicaWriteRequest(
                        source=self.node_id, epoch=self.epoch, first_sequence=peer.sent,
                        truncate_before=oldest, start=start, caught_up=caught,
                        drop_epochs_before=self._dropped_before,
                    )  # fmt: skip
                    if start and seed is not None:
                        req.seed_epoch, req.seed_header = seed[0], seed[2]
                        peer.seeding = True
                    told_truncate, told_drop = oldest, self._dropped_before
                    await self._wait_window(peer)
                    fut = await client.start(_request(req, frames))
                    last_sent = trio.current_time()
                    peer.note_sent(len(frames), end, trio.current_time())
                    peer.sent = end
                    await answers.send((fut, end, caught))
                    if start:
                        # The replica checks a new log's epoch in Tier 2 before
                        # taking it: nothing more until it has.
                        start = False
                        while peer.unanswered:
                            await self._progress.wait()
                        peer.seeding = False
                    continue
                idle = trio.current_time() - last_sent >= KEEPALIVE_INTERVAL
                if oldest != told_truncate or self._dropped_before != told_drop or idle:
                    # Also a keepalive: an idle replica that restarted (and may
                    # have lost its log) is noticed, not trusted for ever.
                    last_sent = trio.current_time()
                    req = wire.ReplicaWriteRequest(
                        source=self.node_id, epoch=self.epoch, truncate_before=oldest,
                        drop_epochs_before=self._dropped_before,
                    )  # fmt: skip
                    told_truncate, told_drop = oldest, self._dropped_before
                    fut = await client.start(_request(req, b""))
                    peer.note_sent(0, peer.sent, trio.current_time())
                    await answers.send((fut, peer.sent, False))
                    continue
                with trio.move_on_after(IDLE_INTERVAL):
                    await self._written.wait()

    async def _seed(
        self, logs: Sequence[wire.ReplicaLogInfo], oldest: int
    ) -> tuple[int, int, bytes] | None:
        """(epoch, sequence, header) to seed a peer's new log from its older one, if any.

        The older log must start by this journal's oldest file; the seed ends
        where it and the journal as opened (earlier epochs' frames only) both
        reach, at the end of a write group whose last header the peer checks
        against its own (`gateway.replication.store.ReplicaStore._seed` says
        why that proves the frames below are these).
        """
        best: tuple[int, int] | None = None
        for info in logs:
            if info.epoch >= self.epoch or info.start > oldest:
                continue
            upto = min(info.next, self.journal.opened_end)
            if upto > oldest and upto < self.written_end and (best is None or upto > best[1]):
                best = (info.epoch, upto)
        if best is None:
            return None
        end = await trio.to_thread.run_sync(group_ending_at, self.journal.files(), best[1])
        return None if end is None else (best[0], best[1], end.header)

    async def _next_frames(self, peer: Peer) -> tuple[bytes, int]:
        """The next frames for ``peer``: whole groups from memory, else from the files."""
        live = self._live
        if live and live[0][0] <= peer.sent < live[-1][1]:
            out = []
            size = 0
            end = peer.sent
            for first, last, frames in live:
                if last <= peer.sent:
                    continue
                if first != end or (size and size + len(frames) > CATCH_UP_BYTES):
                    break
                out.append(frames)
                size += len(frames)
                end = last
            if out:
                self._trim_live()
                return b"".join(out) if len(out) > 1 else out[0], end
        frames, end, _ = await trio.to_thread.run_sync(
            read_groups, self.journal.files(), peer.sent, self.written_end, CATCH_UP_BYTES
        )
        return frames, end

    def _trim_live(self) -> None:
        """Drop groups every live peer has been sent."""
        sent = [p.sent for p in self.peers.values() if p.live]
        if not sent:
            return
        low = min(sent)
        while self._live and self._live[0][1] <= low:
            self._live_bytes -= len(self._live.popleft()[2])

    async def _wait_window(self, peer: Peer) -> None:
        while peer.unanswered_bytes > WINDOW_BYTES:
            await self._progress.wait()

    async def _take_answers(self, peer: Peer, receive: trio.MemoryReceiveChannel[Any]) -> None:
        async for fut, end, caught in receive:
            try:
                response = await fut.wait()
            except ReplicaGap as e:
                if peer.seeding:
                    peer.seed_refused = True
                    raise GatewayError(f"replica {peer.node} refused the seed ({e}): "
                                       "sending it the whole journal") from e  # fmt: skip
                raise GatewayError(f"replica {peer.node} lost its place ({e}): catching up") from e
            peer.note_answered()
            held = response.replica_write.next_sequence
            if held < end:
                # It no longer holds what it acknowledged (a wiped disk): start over.
                peer.caught_up = False
                peer.acked = 0
                raise GatewayError(f"replica {peer.node} holds less than it acknowledged "
                                   f"({held} < {end}): catching up from the start")  # fmt: skip
            peer.acked = max(peer.acked, held, end)
            peer.backoff = BACKOFF_FIRST  # it answers: the next reconnect is quick again
            could_join = peer.caught_up and peer.live
            if caught:
                peer.caught_up = True
            peer.live = True
            peer.down_since = None
            if not could_join and peer.caught_up and peer.node not in self.members:
                self._join_ready.set()  # it may join now, not at the next interval
            self._wake()

    async def _watch_answers(self, peer: Peer) -> None:
        """A peer that leaves a write unanswered for peer_timeout is down (reconnect)."""
        timeout = self.config.peer_timeout
        while True:
            await trio.sleep(min(0.1, timeout / 4))
            if peer.unanswered and trio.current_time() - peer.unanswered[0][2] > timeout:
                raise GatewayError(f"no answer within {timeout:g}s (replication.peer_timeout)")

    # -- observing --------------------------------------------------------------------

    def statistics(self) -> ReplicationStatistics:
        """The replicator's state for metrics and ``segment-gateway cluster``."""
        peers = tuple(
            PeerStatistics(
                p.node,
                p.node in self.members,
                p.live,
                p.caught_up,
                max(0, self.written_end - p.acked),
                p.errors,
                p.last_error,
            )
            for p in sorted(self.peers.values(), key=lambda p: p.node)
        )
        return ReplicationStatistics(
            self.epoch, self.config.write_quorum, self.config.acks, self.members, peers,
            self.written_end, self.acked_end, self.ensemble_changes, self.quorum_failures,
            self.has_quorum(), str(self.fenced) if self.fenced else None,
        )  # fmt: skip


def _request(req: wire.ReplicaWriteRequest, frames: bytes) -> Callable[[int], list[bytes]]:
    """The request's buffers for a request id: the frames go as they are, not copied
    into a message and serialized again (a profile of 1 MiB appends found a third of
    the event loop there)."""

    def build(rid: int) -> list[bytes]:
        return encode_replica_write_request(rid, req, frames)

    return build
