"""This node's view of the cluster: its own registry record, and every other node.

`ClusterView.run` writes this node's heartbeat, renews its lease
(`gateway.cluster.lease`), reads the registry every
``cluster.heartbeat_interval``, and follows each other node in a task of
its own (`RemoteNode`): connected to it over the protocol while it is up
and answers, polling its segments every ``cluster.refresh_interval``; from
its Tier-2 snapshot while it does not. The mount's
`fs.segment_source.ClusterSegments` and the ``cluster`` request read from here.

Every wait on another node has a deadline (connecting, Hello, each
refresh), and a node whose heartbeat has not changed for
``cluster.down_after`` (`Liveness`) is down for readers: its segments end
at their flushed length and reads never wait for it. Records in Tier 2
that do not parse are skipped and reported once (`Rejections`), and a
registry record of an epoch below the node id's fence is a fenced
process's: it is shown down, never followed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import trio

import gateway
from gateway.client.client import Client
from gateway.cluster.fence import NodeFenced, all_current_epochs
from gateway.cluster.lease import Lease, renew_interval
from gateway.cluster.registry import (
    DOWN,
    STOPPED,
    UP,
    Liveness,
    NodeRecord,
    now_ms,
    read_registry,
    record_key,
    run_heartbeat,
    write_stopped,
)
from gateway.cluster.remote import REMOTE_ID_BASE, MountIds, RemoteNode, ReplicaTails
from gateway.config import Config
from gateway.container.interfaces import NamespaceWatcher
from gateway.container.segment import Segment
from gateway.errors import ConnectionLost, GatewayError
from gateway.protocol import wire_pb2 as wire
from gateway.read.chunks import ChunkReader
from gateway.storage.layer import ChunkLayer
from gateway.tier2.untrusted import Rejections

log = logging.getLogger(__name__)

#: Opens a protocol connection to another node's advertised address.
Connector = Callable[[str], AbstractAsyncContextManager[Client]]
#: The longest a read waits to reach an owner that is up but not connected
#: (`ClusterView.reach`): a registry read and a connection take far less.
REACH_WAIT = 1.0


class ClusterView:
    """The nodes sharing this node's Tier 2, and their segments."""

    def __init__(
        self,
        config: Config,
        layer: ChunkLayer,
        reader: ChunkReader | None,
        connect: Connector,
        progress: Callable[[], tuple[int, int]] = lambda: (0, 0),
        on_fenced: Callable[[GatewayError], None] = lambda e: None,
        lease: Lease | None = None,
    ) -> None:
        self.config = config
        self.layer = layer
        self.reader = reader
        self.connect = connect
        #: (segment count, unflushed bytes) of this node, for its heartbeat.
        self.progress = progress
        #: Called once if another process takes this node id over.
        self.on_fenced = on_fenced
        #: Set once this node is fenced (`gateway.cluster.fence`).
        self.fenced: GatewayError | None = None
        self.node_id = config.node.id
        #: This process's lease on its node id (no lease: only fencing is watched).
        self.lease = lease or Lease(self.node_id, 0, 0.0)
        #: Highest epoch registered per node id: records below it are a fenced
        #: process's (a zombie's).
        self._fences: dict[str, int] = {}
        self.ids = MountIds()
        #: Registry records by node id (this node's included), as last read.
        self.records: dict[str, NodeRecord] = {}
        self.liveness = Liveness(config.cluster.down_after)
        #: Tier-2 records skipped as unusable (node records, fences, snapshots).
        self.rejections = Rejections()
        #: This node's replicas of other nodes' journals: a down owner's
        #: unflushed bytes are read from them (None: none held here).
        self.replicas: ReplicaTails | None = None
        #: The node whose host runs this container ("": its own host).
        self.hosted_by = ""
        #: Every other node seen in the registry.
        self.nodes: dict[str, RemoteNode] = {}
        self.own: NodeRecord | None = None
        self.watchers: list[NamespaceWatcher] = []
        self._nursery: trio.Nursery | None = None
        self._registry_read = trio.Event()
        #: Set to read the registry now rather than at the next interval.
        self._registry_wanted = trio.Event()
        # Set (and replaced) after every registry read (`await_moved`).
        self._registry_done = trio.Event()
        #: Unexpected failures of the following loops (logged once per kind).
        self._loop_errors: set[str] = set()

    # -- what the mount and the server ask ------------------------------------------

    def segments(self) -> Iterator[Segment]:
        """Every segment of every other node."""
        for node in self.nodes.values():
            yield from node.segments.values()

    def streams(self) -> Iterator[str]:
        """The names of every other node's streams."""
        for node in self.nodes.values():
            yield from node.streams

    def node_of(self, mount_id: int) -> RemoteNode | None:
        """The node holding the remote segment with this local id."""
        if mount_id < REMOTE_ID_BASE:
            return None
        for node in self.nodes.values():
            if mount_id in node.segments:
                return node
        return None

    def segment_by_id(self, mount_id: int) -> Segment | None:
        """The remote segment with this local id."""
        node = self.node_of(mount_id)
        return None if node is None else node.segments.get(mount_id)

    def address_of(self, node_id: str) -> str:
        """Where ``node_id`` listens, as its registry record says ("" if unknown)."""
        record = self.records.get(node_id)
        return record.advertise if record is not None else ""

    def state_of(self, node_id: str) -> str:
        """up, down or stopped, as this node sees ``node_id`` now (down if unknown)."""
        if node_id == self.node_id:
            return UP
        record = self.records.get(node_id)
        if record is None:
            return DOWN
        if record.epoch < self._fences.get(node_id, 0):
            return DOWN  # a fenced process's record: nobody speaks for the id yet
        return self.liveness.state(record)

    def describe(self, node_id: str) -> str:
        """The node's state in words, for errors: "down (no heartbeat for 41s) at 10.0.0.3:9410"."""
        record = self.records.get(node_id)
        if record is None:
            return "not in the registry"
        state = self.state_of(node_id)
        if state == UP:
            return f"up at {record.advertise}"
        if state == STOPPED:
            return f"stopped (last at {record.advertise})"
        return (
            f"down (no heartbeat for {self.liveness.age(record):.0f}s; last at {record.advertise})"
        )

    def find(self, name: str) -> tuple[RemoteNode, Segment] | None:
        """The other node that has a segment called ``name``, and the segment."""
        for node in self.nodes.values():
            seg = node.by_name(name)
            if seg is not None:
                return node, seg
        return None

    def owner_of(self, name: str) -> tuple[str, str] | None:
        """(node id, address) of the other node that has ``name``, if one does."""
        found = self.find(name)
        return None if found is None else (found[0].node_id, self.address_of(found[0].node_id))

    def watch(self, watcher: NamespaceWatcher) -> None:
        """Tell ``watcher`` about other nodes' creates, seals, truncations and deletes."""
        self.watchers.append(watcher)
        for node in self.nodes.values():
            node.watchers.append(watcher)

    def unwatch(self, watcher: NamespaceWatcher) -> None:
        """Stop telling ``watcher``."""
        self.watchers.remove(watcher)
        for node in self.nodes.values():
            node.watchers.remove(watcher)

    def status(self) -> list[wire.NodeStatus]:
        """Every node in the registry, for ``segment-gateway cluster``."""
        out = []
        for record in sorted(self.records.values(), key=lambda r: r.id):
            me = record.id == self.node_id
            if me and self.own is not None:
                record = self.own  # fresher than the copy read back
            out.append(
                wire.NodeStatus(
                    id=record.id,
                    advertise=record.advertise,
                    state=self.state_of(record.id),
                    epoch=record.epoch,
                    version=record.version,
                    segments=record.segments,
                    unflushed_bytes=record.unflushed_bytes,
                    heartbeat_age_ms=0 if me else int(self.liveness.age(record) * 1000),
                    started_at_ms=record.started_at_ms,
                    self=me,
                    hosted_by=record.hosted_by,
                )
            )
        return out

    # -- running ------------------------------------------------------------------------

    async def run(self, advertise: str, epoch: int, *, task_status: trio.TaskStatus[None]) -> None:
        """Join: heartbeat, follow the others; started once they have been read once."""
        started = now_ms()
        self.own = NodeRecord(
            id=self.node_id,
            advertise=advertise,
            epoch=epoch,
            version=gateway.__version__,
            started_at_ms=started,
            heartbeat_at_ms=started,
            state=UP,
            host=socket.gethostname(),
            pid=os.getpid(),
            hosted_by=self.hosted_by,
            write_quorum=self.config.replication.write_quorum,
        )
        cl = self.config.cluster
        interval = cl.heartbeat_interval
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(
                    run_heartbeat,
                    self.layer,
                    self.own,
                    interval,
                    self._beat,
                    lambda: self.fenced is None,
                )
                nursery.start_soon(self._follow_registry)
                nursery.start_soon(
                    self.lease.run, self.layer, renew_interval(cl.lease, interval), self._fence
                )
                # Ready once every node that was up has been listed (bounded:
                # a node that does not answer shows its proven part later).
                with trio.move_on_after(max(5.0, 2 * interval)):
                    await self._registry_read.wait()
                    for node in list(self.nodes.values()):
                        await node.first_refresh.wait()
                task_status.started()
        finally:
            if self.own is not None and self.fenced is None:
                segments, unflushed = self.progress()
                with trio.CancelScope(shield=True):
                    await write_stopped(self.layer, self.own, segments, unflushed)

    def _fence(self, error: NodeFenced) -> None:
        """A higher epoch of this node id is registered: this process is a zombie."""
        self.fenced = error
        self.on_fenced(error)

    def _beat(self) -> tuple[int, int]:
        segments, unflushed = self.progress()
        if self.own is not None:
            self.own = replace(
                self.own, heartbeat_at_ms=now_ms(), segments=segments, unflushed_bytes=unflushed
            )
        return segments, unflushed

    def _loop_failed(self, where: str, e: Exception) -> None:
        """A bug in a following loop: logged once per kind, never fatal to the node."""
        kind = f"{where}: {type(e).__name__}"
        if kind not in self._loop_errors:
            self._loop_errors.add(kind)
            log.error("cluster: %s failed (logged once; it goes on): %r", where, e, exc_info=e)

    async def _follow_registry(self) -> None:
        interval = self.config.cluster.heartbeat_interval
        failing = False
        # A read that takes longer was retried: Tier 2 failed meanwhile, and a
        # record that did not change may not have been written for the same
        # reason (`Liveness.read_done`).
        self.liveness.slow_read = max(2 * interval, 1.0)
        self.liveness.retries = lambda: self.layer.retries
        # Reads asked for early (`reach`) come at most this often.
        least = min(interval, self.config.cluster.refresh_interval)
        while True:
            started = trio.current_time()
            self.liveness.read_started()
            ok = False
            try:
                await self._read_registry_once(max(interval, 5.0))
                ok = True
                if failing:
                    log.info("cluster: the node registry is readable again")
                failing = False
            except GatewayError as e:
                if not failing:
                    log.warning("cluster: cannot read the node registry: %s", e)
                failing = True
            except Exception as e:
                self._loop_failed("reading the node registry", e)
            finally:
                self.liveness.read_done(ok)
            self._registry_read.set()
            self._registry_done.set()
            self._registry_done = trio.Event()
            with trio.move_on_after(interval):
                await self._registry_wanted.wait()
            self._registry_wanted = trio.Event()
            await trio.sleep_until(started + least)

    async def _read_registry_once(self, deadline: float) -> None:
        fences = await all_current_epochs(self.layer, deadline, self.rejections)
        records = await read_registry(self.layer, deadline=deadline, rejections=self.rejections)
        self._fences = fences
        fresh: dict[str, NodeRecord] = {}
        for r in records:
            old = self.records.get(r.id)
            # A record below an epoch already seen is a fenced zombie's: keep
            # the newer process's (or, if none was seen, show it fenced).
            if old is not None and r.epoch < old.epoch:
                fresh[r.id] = old
                continue
            self.liveness.observe(r)
            fresh[r.id] = r
        for gone in set(self.records) - set(fresh):
            if ("node record", record_key(gone)) in self.rejections.current:
                # Its record is there but unusable now (a hand edit, a newer
                # format, garbage): what was known of the node stands, and
                # goes stale like any record that stops changing.
                fresh[gone] = self.records[gone]
                continue
            self.liveness.forget(gone)
        self.records = fresh
        for record in fresh.values():
            if record.id != self.node_id and record.id not in self.nodes:
                node = RemoteNode(
                    record.id, self.layer, self.reader, self.ids, self.rejections, self.replicas
                )
                node.watchers.extend(self.watchers)
                self.nodes[record.id] = node
                assert self._nursery is not None
                self._nursery.start_soon(self._follow_node, node)
                log.info("cluster: following node %s at %s", record.id, record.advertise)

    async def _follow_node(self, node: RemoteNode) -> None:
        """Follow ``node`` for good: a bug here shows in the log, not as a dead daemon."""
        while node.node_id in self.nodes:
            try:
                await self._follow_node_once(node)
            except Exception as e:
                self._loop_failed(f"following node {node.node_id}", e)
                node.client = None
                await trio.sleep(self.config.cluster.heartbeat_interval)

    def _request_deadline(self) -> float:
        """How long one request to another node may take before it counts as not answering."""
        return max(2.0, min(10.0, self.config.cluster.down_after / 2))

    async def reach(self, node: RemoteNode) -> bool:
        """Whether ``node``'s owner can answer a read now, waiting a moment if it is up.

        An owner that is up by the registry but not connected is usually a
        container that just moved (the registry's next read names its new
        process): a read waits for that connection -- `REACH_WAIT` at most,
        so that a dead owner not yet timed out costs each read only that --
        rather than answering from an older view. A writer whose append the
        new process acknowledged then reads it back through any node.
        """
        if node.client is not None:
            return True
        if self.state_of(node.node_id) != UP:
            return False
        self._registry_wanted.set()
        return await node.wait_attached(REACH_WAIT)

    def moving(self, node_id: str) -> bool:
        """Whether ``node_id``'s container is between processes: its record says
        stopped (a drain, a handback, a restart), or a newer epoch of it is
        registered than its record's (a takeover or drain recovering)."""
        record = self.records.get(node_id)
        if record is None or node_id == self.node_id:
            return False
        return record.state == STOPPED or record.epoch < self._fences.get(node_id, 0)

    async def await_moved(self, node_id: str, seconds: float) -> bool:
        """Whether ``node_id`` is up, waiting up to ``seconds`` if its container is `moving`.

        The registry is read early meanwhile, so a request about a segment of
        a container that is moving learns the new process's address as soon
        as it registers, instead of OWNER_DOWN and the client's backoff.
        """
        with trio.move_on_after(seconds):
            while self.state_of(node_id) != UP and self.moving(node_id):
                self._registry_wanted.set()
                await self._registry_done.wait()
        return self.state_of(node_id) == UP

    async def _follow_node_once(self, node: RemoteNode) -> None:
        """Keep ``node``'s view fresh: live from the owner, else what Tier 2 proves."""
        refresh = self.config.cluster.refresh_interval
        deadline = self._request_deadline()
        reported = ""
        while True:
            record = self.records.get(node.node_id)
            if record is None and not node.segments and self._registry_read.is_set():
                # Removed from the registry (``cluster forget``) with nothing
                # to show: not followed any more.
                log.info("cluster: node %s left the registry; no longer following it",
                         node.node_id)  # fmt: skip
                self.nodes.pop(node.node_id, None)
                return
            if record is not None and self.state_of(node.node_id) == UP:
                try:
                    await self._follow_live(node, record, refresh, deadline)
                except (GatewayError, OSError) as e:
                    # Up by its record, yet not answering: the record may be
                    # a moved container's last process (a takeover, a
                    # drain), so read the registry now, not in an interval.
                    self._registry_wanted.set()
                    if reported != str(e):
                        log.warning(
                            "cluster: node %s at %s does not answer (%s); showing what "
                            "Tier 2 holds of it",
                            node.node_id,
                            record.advertise,
                            e,
                        )
                        reported = str(e)
                else:
                    reported = ""
            try:
                fences = self._fences.get(node.node_id, 0)
                await node.refresh_proven(fences, deadline=max(deadline, 5.0))
            except GatewayError as e:
                if reported != f"tier2: {e}":
                    log.warning("cluster: cannot read node %s's metadata from Tier 2: %s",
                                node.node_id, e)  # fmt: skip
                    reported = f"tier2: {e}"
            node.first_refresh.set()
            # A node that is up but did not answer is tried again soon; a
            # down one only when the registry says it is back.
            up = self.state_of(node.node_id) == UP
            await trio.sleep(refresh if up else min(self.config.cluster.heartbeat_interval, 2.0))

    async def _follow_live(
        self, node: RemoteNode, record: NodeRecord, refresh: float, deadline: float
    ) -> None:
        """Follow ``node`` over the protocol while the same process is up and answers.

        Returns when its record changes (a new process) or it goes down;
        raises when it does not answer within ``deadline`` (the connector
        bounds connecting and Hello), or when a read of its tail timed out
        meanwhile (`RemoteNode.lost`).
        """
        async with self.connect(record.advertise) as client:
            with trio.CancelScope() as scope:
                node.attach(client, scope)
                try:
                    while self._same_process(record, node.node_id):
                        try:
                            # Each request within the deadline, not the whole
                            # refresh (a first walk of 10^6 segments takes ~20 s).
                            await node.refresh_live(client, deadline)
                        except trio.TooSlowError:
                            raise ConnectionLost(
                                record.advertise, f"no answer within {deadline:g}s"
                            ) from None
                        node.first_refresh.set()
                        await node.pause(refresh)
                finally:
                    node.detach()
            if scope.cancelled_caught:
                raise ConnectionLost(record.advertise, node.lost_reason or "lost")

    def _same_process(self, old: NodeRecord, node_id: str) -> bool:
        """Whether the registry still describes the process we are connected to, up."""
        new = self.records.get(node_id)
        return (
            new is not None
            and new.epoch == old.epoch
            and new.advertise == old.advertise
            and self.state_of(node_id) == UP
        )
