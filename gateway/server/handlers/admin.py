"""Administration: flush, export-metadata, fsck, the cluster's status, the node's status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from gateway.errors import BadRequest, GatewayError, Unavailable
from gateway.protocol import wire_pb2 as wire

from ..answers import Item, Producer, ready
from ..budget import LIST_ENTRY_BYTES
from ..registry import handles, streams

if TYPE_CHECKING:
    from gateway.storage.layer import ChunkLayer

    from ..context import Peer

log = logging.getLogger(__name__)

#: The longest wait a flush request may ask for (FlushRequest.timeout_ms).
MAX_FLUSH_TIMEOUT_MS = 30 * 86400 * 1000
#: Estimated memory of an fsck answer's messages in flight.
FSCK_BYTES = 1024 * 1024


@handles("flush")
def flush(conn: Peer, req: wire.Request) -> Producer:
    """Make one segment (or all) durable in Tier 2, and wait until done."""
    container = conn.server.container
    rid = req.request_id
    name = req.flush.segment
    if name:
        container.info(name)  # fail now if missing, in order
    timeout_ms = req.flush.timeout_ms
    if timeout_ms > MAX_FLUSH_TIMEOUT_MS:
        raise BadRequest(
            f"flush timeout of {timeout_ms} ms is above {MAX_FLUSH_TIMEOUT_MS} ms (30 days)"
        )
    within = timeout_ms / 1000 if timeout_ms else None

    async def produce() -> wire.Response:
        # Retried within its time: "make it durable and wait until done"
        # outlasts a Tier 2 that is briefly down (docs/OPERATIONS.md).
        await container.flush(name, within, retry=True)
        return wire.Response(request_id=rid, done=wire.Done())

    return produce


def _snapshot_bytes(conn: Peer, req: wire.Request) -> int:
    return conn.server.container.segment_count * LIST_ENTRY_BYTES


@handles("export_metadata", answer_bytes=_snapshot_bytes)
def export_metadata(conn: Peer, req: wire.Request) -> Producer:
    """A metadata snapshot of this node's segments, as Tier 2 would hold it."""
    container = conn.server.container
    node = conn.server.node
    rid = req.request_id

    async def produce() -> wire.Response:
        # Taken when its turn to answer comes: it includes everything
        # this connection asked for before.
        from gateway.tier2.snapshots import build_snapshot

        journal = container.journal
        epoch = journal.epoch if journal is not None else 0
        snapshot = build_snapshot(container.committed_snapshot(), node, epoch)
        return wire.Response(
            request_id=rid,
            metadata=wire.ExportMetadataResponse(snapshot=snapshot.SerializeToString()),
        )

    return produce


@handles("cluster")
def cluster(conn: Peer, req: wire.Request) -> Producer:
    """Every node's status as this node sees it (none without a cluster), with who
    replicates whom."""
    view = conn.server.cluster
    server = conn.server
    rid = req.request_id
    take_over = req.cluster.take_over
    if take_over and server.containers is None:
        raise Unavailable("this node takes no containers over (it needs cluster.takeover, "
                          "replication.write_quorum > 1 and a cluster lease)")  # fmt: skip
    if view is None:
        return ready(wire.Response(request_id=rid, cluster=wire.ClusterStatus()))

    async def produce() -> wire.Response:
        if take_over:
            assert server.containers is not None
            await server.containers.take_over_now(take_over)
        if req.cluster.forget:
            from gateway.cluster.handover import forget

            name = req.cluster.forget
            if name == server.node:
                raise BadRequest("a node cannot forget itself; ask another node")
            done = await forget(
                view.layer, name, view.records.get(name), view.state_of(name), server.node
            )
            log.warning("cluster: %s", done)
        nodes = view.status()
        others = {}
        for n in nodes:
            if n.self:
                r = server.replicator
                if r is not None:
                    n.ensemble.extend(r.members)
                    n.quorum = r.has_quorum()
                if server.replicas is not None:
                    n.replicas_of.extend(sorted(server.replicas.statistics().sources))
            else:
                others[n.id] = n
        # Other nodes' ensembles from Tier 2, together and briefly (a Tier 2
        # that does not answer leaves them out rather than holding the answer).
        with trio.move_on_after(ENSEMBLE_READ_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for node_id, n in others.items():
                    nursery.start_soon(_recorded_ensemble, view.layer, node_id, n)
        return wire.Response(request_id=rid, cluster=wire.ClusterStatus(nodes=nodes))

    return produce


#: How long a cluster answer waits for the other nodes' ensemble records.
ENSEMBLE_READ_TIMEOUT = 2.0


async def _recorded_ensemble(layer: ChunkLayer, node: str, status: wire.NodeStatus) -> None:
    """A node's newest ensemble record in Tier 2 into ``status`` (nothing if none or unreadable)."""
    from gateway.replication.ensemble import read_ensembles

    try:
        found = await read_ensembles(layer, node, deadline=ENSEMBLE_READ_TIMEOUT)
    except GatewayError:
        return
    if found:
        status.ensemble.extend(found[0].members)


@handles("status")
def status(conn: Peer, req: wire.Request) -> Producer:
    """The answering node at a glance (`gateway.status`, `segment-gateway status`)."""
    summarize = conn.server.summarize
    rid = req.request_id
    if summarize is None:
        raise Unavailable("this server was started without its node summary")

    async def produce() -> wire.Response:
        return wire.Response(request_id=rid, status=await summarize())

    return produce


def _fsck_bytes(conn: Peer, req: wire.Request) -> int:
    return FSCK_BYTES


@streams("fsck", answer_bytes=_fsck_bytes)
def fsck(conn: Peer, req: wire.Request) -> Item:
    """fsck's checks on the live state (gateway/fsck/online.py), answered as they go."""
    server = conn.server
    rid = req.request_id

    async def push(send: Callable[[bytes], Awaitable[None]]) -> None:
        from gateway.fsck.online import live_target, serve_fsck

        target = server.fsck_target() if server.fsck_target else live_target(server.container)
        await serve_fsck(target, req.fsck, rid, send, server.fsck_record)

    return Item(rid, 0, None, push=push)
