"""Other nodes' journals: replica writes, fencing, and reads for a recovery.

Only another node of this cluster may send these: its Hello names it
(``segment-gateway-node/ID``) and carried the cluster's token (and, with
TLS, a certificate the cluster's CA signed); a write must come from the
node it is the journal of. A log starts only while Tier 2 says the
source's epoch is its current one, so a process taken over cannot begin a
log on a node the recovery did not fence (docs/ARCHITECTURE.md,
"Replication").
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from gateway.errors import BadRequest, ReplicaFenced, Unauthorized, Unavailable
from gateway.protocol import wire_pb2 as wire
from gateway.replication.store import READ_BYTES, ReplicaStore

from ..answers import Producer
from ..registry import handles

if TYPE_CHECKING:
    from ..context import Peer

NODE_CLIENT = "segment-gateway-node/"


def _store(conn: Peer, source: str | None = None) -> ReplicaStore:
    """The replica store, if the caller is another node of the cluster (that source)."""
    store = conn.server.replicas
    if store is None:
        raise Unavailable("this node keeps no replicas (it runs without a cluster)")
    name = conn.client_name
    if not name.startswith(NODE_CLIENT):
        raise Unauthorized("replica requests are for the cluster's nodes only")
    caller = name[len(NODE_CLIENT) :]
    if source is not None and caller != source:
        raise Unauthorized(f"node {caller!r} may not write node {source!r}'s journal")
    if source == conn.server.node:
        raise BadRequest("a node does not hold its own journal's replicas")
    return store


def _read_bytes(conn: Peer, req: wire.Request) -> int:
    return int(min(req.replica_read.max_bytes or READ_BYTES, READ_BYTES)) + 64 * 1024


@handles("replica_write")
def replica_write(conn: Peer, req: wire.Request) -> Producer:
    """Store write groups of another node's journal durably (in arrival order)."""
    r = req.replica_write
    store = _store(conn, r.source)
    rid = req.request_id
    check = conn.server.epoch_current if r.start else None

    submit = functools.partial(store.submit, r.source, r.epoch, r.first_sequence, r.frames,
                               start=r.start, caught_up=r.caught_up,
                               truncate_before=r.truncate_before,
                               drop_before=r.drop_epochs_before, seed_epoch=r.seed_epoch,
                               seed_header=r.seed_header)  # fmt: skip

    # Queued now, in arrival order; a log's start only once Tier 2 is asked.
    queued = submit() if check is None else None

    async def produce() -> wire.Response:
        w = queued
        if w is None:
            # A log starts only for the source's current epoch: a process
            # taken over learns it here (a recovery registered a higher one).
            assert check is not None
            if not await check(r.source, r.epoch):
                fence = await store.fence(r.source, r.epoch + 1)
                raise ReplicaFenced(conn.server.node, r.epoch, r.source, fence)
            w = submit()
        nxt = await store.wait(w)
        return wire.Response(
            request_id=rid, replica_write=wire.ReplicaWriteResponse(next_sequence=nxt)
        )

    return produce


@handles("replica_fence")
def replica_fence(conn: Peer, req: wire.Request) -> Producer:
    """Refuse a source's epochs below one from now on; answer what is held of it."""
    r = req.replica_fence
    store = _store(conn)
    rid = req.request_id

    async def produce() -> wire.Response:
        fenced = await store.fence(r.source, r.epoch) if r.epoch else store.fenced_below(r.source)
        logs = [
            wire.ReplicaLogInfo(
                epoch=rl.epoch, start=rl.start, next=rl.next, caught_up=rl.caught_up
            )
            for rl in store.holdings(r.source)
        ]
        return wire.Response(
            request_id=rid,
            replica_holdings=wire.ReplicaHoldings(
                node=conn.server.node, fenced_below=fenced, logs=logs
            ),
        )

    return produce


@handles("replica_read", answer_bytes=_read_bytes)
def replica_read(conn: Peer, req: wire.Request) -> Producer:
    """Frames of one of a source's logs (a recovery reads them)."""
    r = req.replica_read
    store = _store(conn)
    rid = req.request_id
    max_bytes = min(r.max_bytes or READ_BYTES, READ_BYTES)

    async def produce() -> wire.Response:
        frames, nxt, end = await store.read(r.source, r.epoch, r.from_sequence, max_bytes)
        return wire.Response(
            request_id=rid,
            replica_frames=wire.ReplicaFrames(frames=frames, next_sequence=nxt, end=end),
        )

    return produce
