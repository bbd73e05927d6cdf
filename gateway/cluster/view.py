"""This node's view of the cluster: its own registry record, and every other node.

`ClusterView.run` writes this node's heartbeat, reads the registry every
``cluster.heartbeat_interval``, and follows each other node in a task of its
own (`RemoteNode`): connected to it over the protocol while it answers,
polling its segments every ``cluster.refresh_interval``; from its Tier-2
snapshot while it does not. The mount's `fs.source.ClusterSegments` and the
``cluster`` request read from here.
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
from gateway.client import Client
from gateway.cluster.fence import NodeFenced, current_epoch
from gateway.cluster.registry import (
    DOWN,
    UP,
    NodeRecord,
    now_ms,
    read_registry,
    run_heartbeat,
    write_stopped,
)
from gateway.cluster.remote import REMOTE_ID_BASE, MountIds, RemoteNode
from gateway.config import Config
from gateway.container.interfaces import NamespaceWatcher
from gateway.container.segment import Segment
from gateway.errors import GatewayError
from gateway.protocol import wire_pb2 as wire
from gateway.tier2.layer import ChunkLayer
from gateway.tier2.reader import ChunkReader

log = logging.getLogger(__name__)

#: Opens a protocol connection to another node's advertised address.
Connector = Callable[[str], AbstractAsyncContextManager[Client]]


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
        #: Highest epoch seen per node id: lower ones are a fenced zombie's.
        self._epochs: dict[str, int] = {}
        self.node_id = config.node.id
        self.ids = MountIds()
        #: Registry records by node id (this node's included), as last read.
        self.records: dict[str, NodeRecord] = {}
        #: Every other node seen in the registry.
        self.nodes: dict[str, RemoteNode] = {}
        self.own: NodeRecord | None = None
        self.watchers: list[NamespaceWatcher] = []
        self._nursery: trio.Nursery | None = None
        self._registry_read = trio.Event()

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
        now = now_ms()
        down_after = self.config.cluster.down_after
        out = []
        for record in sorted(self.records.values(), key=lambda r: r.id):
            if record.id == self.node_id and self.own is not None:
                record = self.own  # fresher than the copy read back
            out.append(
                wire.NodeStatus(
                    id=record.id,
                    advertise=record.advertise,
                    state=UP if record.id == self.node_id else record.state_at(now, down_after),
                    epoch=record.epoch,
                    version=record.version,
                    segments=record.segments,
                    unflushed_bytes=record.unflushed_bytes,
                    heartbeat_age_ms=0
                    if record.id == self.node_id
                    else int(record.heartbeat_age(now) * 1000),
                    started_at_ms=record.started_at_ms,
                    self=record.id == self.node_id,
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
        )
        interval = self.config.cluster.heartbeat_interval
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
                nursery.start_soon(self._watch_fence)
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

    async def _watch_fence(self) -> None:
        """Once a higher epoch of this node id is registered, stop: this process is a zombie."""
        assert self.own is not None
        interval = self.config.cluster.heartbeat_interval
        while True:
            await trio.sleep(interval)
            try:
                current = await current_epoch(self.layer, self.node_id, deadline=interval)
            except GatewayError:
                continue  # Tier 2 unreachable: nothing this node uploads lands either
            if current > self.own.epoch:
                self.fenced = NodeFenced(self.node_id, self.own.epoch, current)
                self.on_fenced(self.fenced)
                return

    def _beat(self) -> tuple[int, int]:
        segments, unflushed = self.progress()
        if self.own is not None:
            self.own = replace(
                self.own, heartbeat_at_ms=now_ms(), segments=segments, unflushed_bytes=unflushed
            )
        return segments, unflushed

    async def _follow_registry(self) -> None:
        interval = self.config.cluster.heartbeat_interval
        failing = False
        while True:
            try:
                records = await read_registry(self.layer, deadline=max(interval, 5.0))
                failing = False
            except GatewayError as e:
                if not failing:
                    log.warning("cluster: cannot read the node registry: %s", e)
                failing = True
                records = list(self.records.values())
            fresh = {}
            for r in records:
                # A record below an epoch already seen is a fenced zombie's.
                if r.epoch < self._epochs.get(r.id, 0) and r.id in self.records:
                    fresh[r.id] = self.records[r.id]
                    continue
                self._epochs[r.id] = r.epoch
                fresh[r.id] = r
            self.records = fresh
            records = list(fresh.values())
            for record in records:
                if record.id != self.node_id and record.id not in self.nodes:
                    node = RemoteNode(record.id, self.layer, self.reader, self.ids)
                    node.watchers.extend(self.watchers)
                    self.nodes[record.id] = node
                    assert self._nursery is not None
                    self._nursery.start_soon(self._follow_node, node)
                    log.info("cluster: following node %s at %s", record.id, record.advertise)
            self._registry_read.set()
            await trio.sleep(interval)

    async def _follow_node(self, node: RemoteNode) -> None:
        """Follow ``node`` for good: a bug here shows in the log, not as a dead daemon."""
        while True:
            try:
                await self._follow_node_once(node)
            except Exception:
                log.exception("cluster: following node %s failed; starting again", node.node_id)
                node.client = None
                await trio.sleep(self.config.cluster.heartbeat_interval)

    async def _follow_node_once(self, node: RemoteNode) -> None:
        """Keep ``node``'s view fresh: live from the owner, else what Tier 2 proves."""
        refresh = self.config.cluster.refresh_interval
        down_after = self.config.cluster.down_after
        reported = ""
        while True:
            record = self.records.get(node.node_id)
            if record is not None and record.state_at(now_ms(), down_after) == UP:
                try:
                    async with self.connect(record.advertise) as client:
                        await node.refresh_live(client)
                        node.client = client
                        node.first_refresh.set()
                        if reported:
                            log.info("cluster: node %s answers again", node.node_id)
                        reported = ""
                        while self._same_process(record, node.node_id):
                            await trio.sleep(refresh)
                            await node.refresh_live(client)
                except (GatewayError, OSError) as e:
                    if reported != str(e):
                        log.warning(
                            "cluster: node %s at %s does not answer (%s); showing what "
                            "Tier 2 holds of it",
                            node.node_id,
                            record.advertise,
                            e,
                        )
                        reported = str(e)
                finally:
                    node.client = None
            try:
                await node.refresh_proven()
            except GatewayError as e:
                log.warning("cluster: cannot read node %s's metadata from Tier 2: %s",
                            node.node_id, e)  # fmt: skip
            node.first_refresh.set()
            record = self.records.get(node.node_id)
            state = record.state_at(now_ms(), down_after) if record else DOWN
            # A node that is up but did not answer is tried again soon; a
            # down one only when the registry says it is back.
            await trio.sleep(
                refresh if state == UP else min(self.config.cluster.heartbeat_interval, 2.0)
            )

    def _same_process(self, old: NodeRecord, node_id: str) -> bool:
        """Whether the registry still describes the process we are connected to."""
        new = self.records.get(node_id)
        return (
            new is not None
            and new.epoch == old.epoch
            and new.advertise == old.advertise
            and new.state == UP
        )
