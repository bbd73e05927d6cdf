"""Containers that fail over: a down node's container runs on a surviving node.

A node's segments belong to its container, and the container is the node id:
its journal, its epoch, its registry record, its prefix in Tier 2. When a
node has been down for ``cluster.down_after`` (and the cluster replicates
its journals, so its acknowledged tail is on other nodes), one surviving
node takes the container over and runs it *as a process of its own*: the
same ``serve`` code path as on its own host, started with the dead node's
id, a data directory under ``<data_dir>/hosted/<node>/``, a port of its
own, no mount, and ``hosted_by`` in its registry record. The steps, in
order (docs/ARCHITECTURE.md, "Failover", says why each is safe):

1. **Decide.** Every surviving node sees the node down by its own clock.
   The survivors are ranked per dead node (rendezvous hashing over the
   nodes up on their own hosts); the first tries at once, the next
   ``down_after / 2`` later, and so on, so a survivor that is itself cut
   off only delays the takeover.
2. **Claim.** A conditional write (``If-None-Match: *``) of
   ``_cluster/takeover/<node>/<epoch>``, the epoch being the one that
   died: exactly one survivor wins it; the others stand down for that
   epoch.
3. **Fence and recover.** The winner starts the hosted process with the
   epoch it won. That process registers the next epoch only if the dead
   one is still current (`gateway.replication.recovery`), waits out the
   dead process's lease, fences the old epoch at the replicas and installs
   the longest acknowledged journal from an ack quorum of them.
4. **Serve.** It replays, uploads a snapshot, heartbeats with its own
   address, and from then on clients that ask any node are redirected to
   it (the registry's address for the node id) and every node's mount
   follows it. Its duties go on there: flushes, rolls, retention,
   transaction timeouts, GC.

The hosted process dies with its host (``PR_SET_PDEATHSIG``): a host that
dies takes its hosted containers with it, and they fail over again, from
their own replicas. A hosted process that crashes is started again from its
own journal; one that exits fenced (another process holds the node id)
leaves, and its directory is removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import trio

from gateway.cluster.fence import current_epoch
from gateway.cluster.registry import UP, NodeRecord, now_ms, read_record
from gateway.config import CLUSTER_PREFIX, METRICS_ADDRESS_FILE, Config, parse_host_port
from gateway.errors import BadRequest, ChunkNotFound, GatewayError, Unavailable
from gateway.storage.layer import ChunkLayer
from gateway.tier2.untrusted import BadRecord, want_int, want_str

log = logging.getLogger(__name__)

TAKEOVER_PREFIX = f"{CLUSTER_PREFIX}/takeover/"
#: A takeover claim is a few hundred bytes; anything far larger is not one.
MAX_CLAIM_BYTES = 16 * 1024
#: The hosted process's description of itself, in its directory.
SPEC_FILE = "hosted.json"
READY_FILE = "ready"
#: Exit codes of a hosted process that mean "another process holds the node
#: id" (taken over, copied, running elsewhere; fenced at its replicas).
FENCED_EXITS = frozenset({31, 44, 46, 48})
#: How long a hosted process may take to recover and serve before it is
#: stopped and the takeover tried again (a recovery waits for replicas up
#: to two minutes).
READY_WITHIN = 300.0
#: Restarts of a crashed hosted process back off up to this.
MAX_RESTART_DELAY = 30.0


async def _wait_exit(process: subprocess.Popen[bytes]) -> None:
    """Until ``process`` has exited (polled: a waiting thread per child would outlive a
    cancelled wait)."""
    while process.poll() is None:  # noqa: ASYNC110
        await trio.sleep(0.1)


def takeover_key(node: str, epoch: int) -> str:
    """Tier-2 key of the claim to take over ``epoch`` of ``node``."""
    return f"{TAKEOVER_PREFIX}{node}/{epoch:020d}"


@dataclass(frozen=True)
class TakeoverClaim:
    """Who won the takeover of one epoch of a node (the body of its key)."""

    node: str
    #: The epoch that died (the one registered when the claim was made).
    epoch: int
    #: The surviving node that runs the container.
    host: str
    at_ms: int
    #: Random per claim: tells a retried write of our own from another's.
    nonce: str
    #: A drain's claim: the process running the epoch stops only once the
    #: claimant's process waits for it (`announced_key`), so that the
    #: writers' pause does not include a process start.
    announce: bool = False

    def encode(self) -> bytes:
        """The stored JSON body."""
        return json.dumps({"format": 1, **dataclasses.asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> TakeoverClaim:
        """Parse a stored claim, field by field (`BadRecord` if unusable)."""
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise BadRecord(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BadRecord("not a JSON object")
        if want_int(doc, "format", high=1 << 31) != 1:
            raise BadRecord("an unknown format")
        return cls(
            node=want_str(doc, "node", max_len=255),
            epoch=want_int(doc, "epoch"),
            host=want_str(doc, "host", max_len=255),
            at_ms=want_int(doc, "at_ms"),
            nonce=want_str(doc, "nonce", max_len=64),
            # Absent in claims written before drains announced themselves.
            announce=doc.get("announce", False) is True,
        )


def announced_key(node: str, epoch: int) -> str:
    """Tier-2 key the process taking ``epoch`` of ``node`` over writes once it is
    started and waits for the old one to stop (`TakeoverClaim.announce`)."""
    return takeover_key(node, epoch) + ".waiting"


async def claim_takeover(
    layer: ChunkLayer, node: str, epoch: int, host: str, announce: bool = False
) -> TakeoverClaim:
    """Claim the takeover of ``epoch`` of ``node`` for ``host``; the claim that won.

    The winner is whoever stored the key first; a claim that cannot be read
    back is nobody's (the caller stands down: another survivor wrote it).
    """
    mine = TakeoverClaim(node, epoch, host, now_ms(), uuid.uuid4().hex, announce)
    key = takeover_key(node, epoch)
    if await layer.write_if_absent(key, mine.encode(), {"node": node, "host": host}):
        return mine
    try:
        theirs = TakeoverClaim.decode(await layer.read(key, 0, MAX_CLAIM_BYTES))
    except (ChunkNotFound, BadRecord) as e:
        return dataclasses.replace(mine, host=f"(unreadable claim: {e})")
    return theirs


async def read_claim(layer: ChunkLayer, node: str, epoch: int) -> TakeoverClaim | None:
    """The takeover claim on ``epoch`` of ``node``, if one is readable."""
    try:
        data = await layer.read(takeover_key(node, epoch), 0, MAX_CLAIM_BYTES, deadline=10.0)
    except ChunkNotFound:
        return None
    try:
        return TakeoverClaim.decode(data)
    except BadRecord:
        return None


def rank(node: str, candidates: list[str]) -> list[str]:
    """The order in which ``candidates`` try to take ``node`` over (rendezvous hashing).

    Each dead node has its own order, so the containers of several dead
    nodes spread over the survivors, and every survivor computes the same
    order from the same registry.
    """

    def weight(candidate: str) -> bytes:
        return hashlib.sha256(f"{node}\0{candidate}".encode()).digest()

    return sorted(candidates, key=weight)


def hosted_config(config: Config, node: str, directory: pathlib.Path) -> Config:
    """The configuration ``node``'s container runs with on this host."""
    host, _ = parse_host_port(config.server.listen)
    listen = f"[{host}]:0" if ":" in host else f"{host}:0"
    from gateway.node import cache_budget

    return dataclasses.replace(
        config,
        node=dataclasses.replace(config.node, id=node, data_dir=str(directory), advertise=""),
        server=dataclasses.replace(config.server, listen=listen),
        fuse=dataclasses.replace(config.fuse, mountpoint=""),
        # Loopback, any free port (never the host's): it writes the bound address
        # to its directory (`gateway.config.METRICS_ADDRESS_FILE`), and the host's
        # /metrics includes what it serves there (none if the host has none).
        metrics=dataclasses.replace(
            config.metrics, listen="127.0.0.1:0" if config.metrics.listen else ""
        ),
        journal=dataclasses.replace(config.journal, dir=""),
        # Its own RocksDB beside the host's: half the host's budget at most.
        cache=dataclasses.replace(
            config.cache, dir="", budget=max(64 * 1024 * 1024, cache_budget(config) // 2)
        ),
    )


def advertise_host(config: Config) -> str:
    """The host part other nodes reach this node at (its hosted processes share it)."""
    if config.node.advertise:
        return parse_host_port(config.node.advertise)[0]
    return ""


@dataclass
class Hosted:
    """One container this node runs for another node id."""

    node: str
    directory: pathlib.Path
    #: The epoch that was taken over (None: restarted from its own journal).
    took_over: int | None
    process: subprocess.Popen[bytes] | None = None
    #: "recovering", "serving", "stopped" (its host is stopping).
    state: str = "recovering"
    #: Seconds from the decision to take over until it served.
    takeover_seconds: float | None = None
    address: str = ""
    restarts: int = 0
    #: HOST:PORT of its /metrics ("": not known yet).
    metrics_address: str = ""


class ContainerHost:
    """Runs other nodes' containers on this node: takes them over, supervises, stops.

    ``records`` gives the registry as this node last read it (node id ->
    record), ``state_of`` and ``age_of`` a node's state and heartbeat age,
    ``watched_of`` how long this node has itself seen the record unchanged.
    """

    def __init__(
        self,
        config: Config,
        layer: ChunkLayer,
        records: Callable[[], dict[str, NodeRecord]],
        state_of: Callable[[str], str],
        age_of: Callable[[NodeRecord], float],
        watched_of: Callable[[NodeRecord], float],
        python: tuple[str, ...] = (sys.executable,),
    ) -> None:
        self.config = config
        self.layer = layer
        self.records = records
        self.state_of = state_of
        self.age_of = age_of
        self.watched_of = watched_of
        self.python = python
        self.node_id = config.node.id
        self.root = pathlib.Path(config.node.data_dir) / "hosted"
        self.hosted: dict[str, Hosted] = {}
        #: (node, epoch) takeovers another node won.
        self.lost: set[tuple[str, int]] = set()
        self.takeovers = 0
        self.takeover_failures = 0
        self.handbacks = 0
        self._stopping = False
        self._nursery: trio.Nursery | None = None

    # -- running ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the containers hosted before a restart, then watch for down nodes."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for directory in sorted(self.root.glob("*")) if self.root.is_dir() else []:
                if (directory / SPEC_FILE).exists():
                    node = directory.name
                    log.info("failover: starting node %s's container again (hosted here)", node)
                    h = Hosted(node, directory, None)
                    self.hosted[node] = h
                    nursery.start_soon(self._supervise, h)
            task_status.started()
            interval = self.config.cluster.heartbeat_interval
            while not self._stopping:
                try:
                    await self._consider()
                except GatewayError as e:
                    log.warning("failover: cannot decide on takeovers now: %s", e)
                await trio.sleep(interval)

    async def _consider(self) -> None:
        """Take over the down nodes this node is first in line for."""
        records = self.records()
        cl = self.config.cluster
        candidates = [
            n
            for n, r in records.items()
            if not r.hosted_by and (n == self.node_id or self.state_of(n) == UP)
        ]
        if self.node_id not in candidates:
            candidates.append(self.node_id)
        for node, record in sorted(records.items()):
            if node == self.node_id or node in self.hosted or record.hosted_by == self.node_id:
                continue
            if self.state_of(node) == UP or (node, record.epoch) in self.lost:
                continue
            if record.write_quorum < 2:
                # Its journal is on its own disk only: a takeover would lose
                # its unflushed tail (and set its journal aside on return).
                continue
            position = rank(node, candidates).index(self.node_id)
            if self.age_of(record) < cl.down_after * (1 + position / 2):
                continue
            # Watched by this node's own clock for as long (a first sight
            # says nothing), and still the same record in Tier 2 right now.
            if self.watched_of(record) < cl.down_after * (1 + position / 2):
                continue
            if await self._fresher(record):
                continue
            await self._take_over(node, record)

    async def _fresher(self, record: NodeRecord) -> bool:
        """Whether Tier 2 holds a newer heartbeat of ``record``'s node than ``record``
        -- or may: when Tier 2 requests failed and were retried meanwhile (a
        failing Tier 2 stops that node's heartbeats too), the answer proves
        nothing, and counts as fresher."""
        retries = self.layer.retries
        now = await read_record(self.layer, record.id, deadline=10.0)
        if self.layer.retries > retries:
            return True
        return now is not None and (
            now.heartbeat_at_ms != record.heartbeat_at_ms or now.epoch != record.epoch
        )

    async def _take_over(self, node: str, record: NodeRecord) -> None:
        epoch = await current_epoch(self.layer, node)
        if epoch > record.epoch and not await self._dead_takeover(node, epoch):
            return
        if (node, epoch) in self.lost or epoch < record.epoch:
            return
        claim = await claim_takeover(self.layer, node, epoch, self.node_id)
        if claim.host != self.node_id:
            self.lost.add((node, epoch))
            log.info("failover: node %s (epoch %d) is taken over by %s", node, epoch, claim.host)
            return
        log.warning(
            "failover: node %s is %s (no heartbeat for %.1fs, epoch %d); taking its container "
            "over here",
            node, self.state_of(node), self.age_of(record), epoch,
        )  # fmt: skip
        self._host(node, epoch)

    async def take_over_now(self, node: str) -> None:
        """A drain: run ``node``'s container here now, although its process is alive.

        Claims its current epoch; the process running it sees the claim, stops
        cleanly and exits, and the one started here recovers once it has.
        """
        if node == self.node_id:
            raise BadRequest("a node cannot take its own container over; drain it to another")
        if node in self.hosted:
            return
        record = self.records().get(node)
        if record is None:
            raise BadRequest(f"node {node} is not in the registry")
        if record.write_quorum < 2:
            raise BadRequest(
                f"node {node} does not replicate its journal (replication.write_quorum = 1): "
                "its container cannot move"
            )
        epoch = await current_epoch(self.layer, node)
        if epoch != record.epoch:
            raise Unavailable(f"node {node} is being started or taken over (epoch {epoch} "
                              f"registered, {record.epoch} running); try again")  # fmt: skip
        claim = await claim_takeover(self.layer, node, epoch, self.node_id, announce=True)
        if claim.host != self.node_id:
            raise Unavailable(f"node {claim.host} is already taking node {node} over")
        log.warning("failover: draining node %s (epoch %d) to this node", node, epoch)
        self._host(node, epoch)

    def _host(self, node: str, epoch: int) -> None:
        """Start running ``node``'s container here, taking over ``epoch`` (claimed)."""
        directory = self.root / node
        if directory.exists():
            shutil.rmtree(directory)  # an earlier hosting's leftovers: superseded
        directory.mkdir(parents=True)
        self._write_spec(directory, node, epoch)
        h = Hosted(node, directory, epoch)
        self.hosted[node] = h
        assert self._nursery is not None
        self._nursery.start_soon(self._supervise, h)

    async def _dead_takeover(self, node: str, epoch: int) -> bool:
        """Whether ``epoch`` of ``node``, registered but never heartbeating, died with its host.

        A newer epoch than the record's is a takeover (or a restart) under
        way: it is waited for while the node that claimed it is up. One
        registered by hand (no claim) is waited for as well.
        """
        claim = await read_claim(self.layer, node, epoch - 1)
        if claim is None:
            return False
        return claim.host != self.node_id and self.state_of(claim.host) != UP

    def _write_spec(self, directory: pathlib.Path, node: str, epoch: int | None) -> None:
        config = hosted_config(self.config, node, directory)
        spec = {
            "config": {
                f.name: dataclasses.asdict(getattr(config, f.name))
                for f in dataclasses.fields(config)
            },
            "hosted_by": self.node_id,
            "advertise_host": advertise_host(self.config),
            "takeover_of": epoch,
            # This host's own replica store (the daemon's): the hosted process's
            # recovery copies what it holds of the node's journal from the disk.
            "replicas": str(pathlib.Path(self.config.node.data_dir) / "replicas"),
        }
        tmp = directory / (SPEC_FILE + ".tmp")
        tmp.write_text(json.dumps(spec, indent=1))
        os.replace(tmp, directory / SPEC_FILE)

    async def _supervise(self, h: Hosted) -> None:
        """Run ``h``'s process until it leaves for good (fenced, stopped, handed back)."""
        delay = 1.0
        while True:
            takeover = h.took_over is not None
            code = await self._run_once(h)
            if self._stopping:
                h.state = "stopped"
                return
            if code == 0 and h.state == "serving":
                # It stopped cleanly by itself: its container was handed over
                # (its own node took it back, or a drain moved it on).
                self.handbacks += 1
                log.warning("failover: node %s's container was handed over and stopped "
                            "here", h.node)  # fmt: skip
                self._forget(h)
                return
            if code in FENCED_EXITS:
                log.warning("failover: node %s's container left this host (exit %d: another "
                            "process holds the node id)", h.node, code)  # fmt: skip
                self._forget(h)
                return
            if takeover and h.takeover_seconds is None:
                self.takeover_failures += 1
            h.restarts += 1
            log.error("failover: node %s's container exited with %s; starting it again in "
                      "%.0fs", h.node, code, delay)  # fmt: skip
            await trio.sleep(delay)
            delay = min(MAX_RESTART_DELAY, delay * 2)
            if h.took_over is not None and h.takeover_seconds is None:
                # The recovery did not finish: begin again from the replicas.
                for child in h.directory.iterdir():
                    if child.name != SPEC_FILE:
                        shutil.rmtree(child) if child.is_dir() else child.unlink()

    async def _run_once(self, h: Hosted) -> int | None:
        started = time.monotonic()
        ready = h.directory / READY_FILE
        ready.unlink(missing_ok=True)
        metrics = h.directory / METRICS_ADDRESS_FILE
        metrics.unlink(missing_ok=True)
        h.metrics_address = ""
        h.state = "recovering"
        h.process = self._spawn(h)
        try:
            while True:
                code = h.process.poll()
                if code is not None:
                    return code
                if not h.metrics_address and metrics.exists():
                    # Written (atomically) as its metrics endpoint listens.
                    h.metrics_address = metrics.read_text().strip()
                if h.state == "recovering" and ready.exists():
                    h.address = ready.read_text().strip()
                    h.state = "serving"
                    if h.took_over is not None and h.takeover_seconds is None:
                        h.takeover_seconds = time.monotonic() - started
                        self.takeovers += 1
                        log.warning("failover: node %s's container serves here at %s (took "
                                    "over in %.1fs)", h.node, h.address,
                                    h.takeover_seconds)  # fmt: skip
                        # A restart from here on is a restart, not a takeover.
                        self._write_spec(h.directory, h.node, None)
                    else:
                        log.info("failover: node %s's container serves here at %s",
                                 h.node, h.address)  # fmt: skip
                elif h.state == "recovering" and time.monotonic() - started > READY_WITHIN:
                    log.error("failover: node %s's container did not serve within %.0fs; "
                              "stopping it", h.node, READY_WITHIN)  # fmt: skip
                    h.process.kill()
                await trio.sleep(0.1)
        finally:
            if h.process.poll() is None:
                with trio.CancelScope(shield=True):
                    await self._terminate(h.process)

    def _spawn(self, h: Hosted) -> subprocess.Popen[bytes]:
        from gateway.embedded.libc import set_parent_death_signal

        # Started from the trio thread, which lives as long as this process:
        # the death signal fires when the starting *thread* ends.
        return subprocess.Popen(
            [*self.python, "-m", "gateway.cli.hosted", str(h.directory)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=set_parent_death_signal,
        )

    async def _terminate(self, process: subprocess.Popen[bytes]) -> None:
        """SIGTERM (a clean stop: flush, snapshot, "stopped"), then SIGKILL if it takes too long."""
        c = self.config
        patience = c.server.drain_timeout + c.tier2.stop_flush_timeout + 10
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(patience):
            await _wait_exit(process)
        if process.poll() is None:
            process.kill()
            await trio.to_thread.run_sync(process.wait)

    def _forget(self, h: Hosted) -> None:
        self.hosted.pop(h.node, None)
        shutil.rmtree(h.directory, ignore_errors=True)

    async def stop(self) -> None:
        """Stop every hosted container cleanly (each flushes and says "stopped")."""
        self._stopping = True
        processes = [h.process for h in self.hosted.values() if h.process is not None]
        async with trio.open_nursery() as nursery:
            for p in processes:
                if p.poll() is None:
                    nursery.start_soon(self._terminate, p)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def statistics(self) -> HostStatistics:
        """What runs here for whom, for metrics and ``cluster``."""
        return HostStatistics(
            hosted={
                n: HostedStatistics(
                    h.state, h.address, h.takeover_seconds, h.restarts, h.metrics_address
                )
                for n, h in self.hosted.items()
            },
            takeovers=self.takeovers,
            takeover_failures=self.takeover_failures,
            handbacks=self.handbacks,
        )


@dataclass(frozen=True)
class HostedStatistics:
    """One container hosted here."""

    state: str
    address: str
    takeover_seconds: float | None
    restarts: int
    #: HOST:PORT of its /metrics on loopback ("": not known yet).
    metrics_address: str = ""


@dataclass(frozen=True)
class HostStatistics:
    """`ContainerHost.statistics`."""

    hosted: dict[str, HostedStatistics]
    takeovers: int
    takeover_failures: int
    handbacks: int


__all__ = [
    "ContainerHost",
    "TakeoverClaim",
    "announced_key",
    "claim_takeover",
    "hosted_config",
    "rank",
    "takeover_key",
]
