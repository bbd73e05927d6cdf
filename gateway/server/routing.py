"""Requests in a cluster: who owns a name, claims for creates, other nodes' segments.

A request about a segment this node does not have is answered NOT_OWNER
(or OWNER_DOWN) when another node has it, so the client follows it there;
reads of other nodes' segments are answered here, from the owner or from
Tier 2, by the handlers (`remote_segment`). A create claims its name in
Tier 2 first (`ClaimedCreates`), so that names are unique across nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from gateway.cluster.view import REACH_WAIT
from gateway.container.segment_names import validate_name
from gateway.container.streams import is_hidden
from gateway.errors import GatewayError, NotOwner, OwnerDown, SegmentNotFound
from gateway.protocol import wire_pb2 as wire

from .answers import Item, Producer, error_response

if TYPE_CHECKING:
    from gateway.cluster.claims import NameClaims
    from gateway.cluster.remote import RemoteNode
    from gateway.cluster.view import ClusterView
    from gateway.container.segment import Segment

    from .context import Peer, ServerParts
    from .registry import Prepare


async def not_owner(server: ServerParts, e: SegmentNotFound) -> GatewayError:
    """For a request about a segment this node does not have: NotOwner if another has it.

    Known from following the other nodes, or -- for a segment created
    since the last poll -- from its name claim in Tier 2. An owner that
    is down (no heartbeat for ``cluster.down_after``, or fenced) gets
    `OwnerDown` instead: sending the client there would only fail.
    """
    name = str(e.args[0]) if e.args else ""
    cluster, claims = server.cluster, server.claims
    owner = cluster.owner_of(name) if cluster is not None else None
    if owner is None and cluster is not None:
        # A transaction names its container's node (`.txn/<node>/<hex>`): no
        # node follows transactions, but every node knows where that runs.
        owner = _transaction_owner(cluster, name, server.node)
    if owner is None and claims is not None and name:
        try:
            holder = await claims.owner(name)
        except GatewayError:
            holder = None
        if holder is not None and holder != claims.node_id:
            owner = (holder, cluster.address_of(holder) if cluster is not None else "")
    if owner is None:
        return e
    if cluster is not None and not await cluster.await_moved(owner[0], REACH_WAIT):
        return OwnerDown(name, owner[0], cluster.describe(owner[0]), owner[1])
    if cluster is not None:
        owner = (owner[0], cluster.address_of(owner[0]))  # its new process's, if it moved
    return NotOwner(name, *owner)


def _transaction_owner(cluster: ClusterView, name: str, me: str) -> tuple[str, str] | None:
    parts = name.split("/")
    if len(parts) != 3 or not is_hidden(name) or parts[1] == me:
        return None
    node = parts[1]
    return (node, cluster.address_of(node)) if node in cluster.records else None


def remote_segment(server: ServerParts, name: str) -> tuple[RemoteNode, Segment]:
    """Another node's segment with this name, and that node; SegmentNotFound if none."""
    found = server.cluster.find(name) if server.cluster is not None else None
    if found is None:
        raise SegmentNotFound(name)
    return found


async def find_remote(server: ServerParts, name: str) -> tuple[RemoteNode, Segment] | None:
    """Another node's segment with this name, and that node, looking harder than
    `remote_segment`: None if no node has it.

    A name no view here shows yet may be a segment created since its owner
    was last polled, or just before its container moved (the view waits for
    the new process). Its claim in Tier 2 names the owner: the view of that
    owner is refreshed now (`ClusterView.reach`, then `RemoteNode.refreshed`:
    ``REACH_WAIT`` each at most) and asked again. So a segment whose create
    was acknowledged reads through any node at once. A name nobody claims
    costs one Tier-2 read, as a create or append of it would.
    """
    cluster, claims = server.cluster, server.claims
    if cluster is None:
        return None
    found = cluster.find(name)
    if found is not None or claims is None or not name:
        return found
    try:
        holder = await claims.owner(name)
    except GatewayError:
        return None
    node = cluster.nodes.get(holder) if holder is not None else None
    if node is None or not await cluster.reach(node):
        return None
    await node.refreshed(REACH_WAIT)
    return cluster.find(name)


class ClaimedCreates:
    """One connection's creates whose names are being claimed in Tier 2.

    A claim starts when its create is read, so that the claims of
    pipelined creates overlap (as many at once as Tier 2 takes:
    ``tier2.max_concurrency``, the chunk layer's limiter). Each create is
    prepared -- enters the journal -- as soon as its claim is done and the
    create read before it is prepared, not when its answer's turn comes:
    so pipelined creates share the journal's group commits instead of
    waiting for one fdatasync each. Any other request waits until no create
    is pending (`wait_idle`), so every request is still prepared in arrival
    order: of two creates of one name the second fails with SegmentExists.
    """

    def __init__(self) -> None:
        #: Where the claims run (the connection's nursery, once it runs).
        self.nursery: trio.Nursery | None = None
        #: Creates read but not yet prepared (their claims in flight).
        self.pending = 0
        self._idle = trio.Event()
        self._idle.set()
        #: Set once the create read last is prepared (or failed).
        self._last = self._idle
        #: Names of creates claimed and not answered yet, in flight for the
        #: node's claims (`NameClaims.settle` when answered, or by `abandon`).
        self._unanswered: dict[object, str] = {}
        self._abandoned = False
        self._claims: NameClaims | None = None

    def abandon(self) -> None:
        """The connection answers nothing more: its creates are no longer in flight."""
        self._abandoned = True
        unanswered, self._unanswered = self._unanswered, {}
        if self._claims is not None:
            for name in unanswered.values():
                self._claims.settle(name)

    def _answered(self, token: object) -> bool:
        """The create ``token`` is answered; whether it held its name's claim."""
        name = self._unanswered.pop(token, None)
        if name is not None and self._claims is not None:
            self._claims.settle(name)
        return name is not None

    def _release_unless_exists(self, conn: Peer, name: str) -> None:
        """A create that claimed ``name`` failed: free the name unless it exists
        (a second create of it, or one refused for its name or a limit)."""
        claims = conn.server.claims
        try:
            conn.server.container.check_exists(name)
        except GatewayError:
            if claims is not None and self.nursery is not None:
                self.nursery.start_soon(claims.release, name)

    async def wait_idle(self) -> None:
        """Wait until every create read so far has been prepared."""
        await self._idle.wait()

    def start(
        self, conn: Peer, req: wire.Request, prepare: Prepare, name: str, nbytes: int
    ) -> Item:
        """A create in a cluster: its name claimed in Tier 2 first, then created here.

        The claim starts now; the create is prepared (by ``prepare``, as
        without a cluster) once its claim is done and the creates before it
        are prepared; its answer waits for that.
        """
        claims = conn.server.claims
        assert claims is not None and self.nursery is not None
        self._claims = claims
        rid = req.request_id
        container = conn.server.container
        before, prepared = self._last, trio.Event()
        self._last = prepared
        token = object()
        failure: list[GatewayError] = []
        producer: list[Producer] = []

        async def claim_then_prepare() -> None:
            try:
                try:
                    validate_name(name)
                    await claims.claim(name, hold=True)
                except GatewayError as e:
                    failure.append(e)  # not in flight (`claim` settled it)
                else:
                    # In flight (no release drops its claim, fsck's neither)
                    # until the create is answered, or never will be.
                    if self._abandoned:
                        claims.settle(name)
                    else:
                        self._unanswered[token] = name
                await before.wait()
                if not failure:
                    try:
                        producer.append(await container.admit(lambda: prepare(conn, req), nbytes))
                    except GatewayError as e:
                        failure.append(e)
            finally:
                prepared.set()
                self.pending -= 1
                if not self.pending:
                    self._idle.set()

        self.pending += 1
        self._idle = trio.Event()
        self.nursery.start_soon(claim_then_prepare)

        async def produce() -> wire.Response:
            created = False
            try:
                await prepared.wait()
                if failure:
                    return error_response(rid, failure[0])
                response = await producer[0]()
                created = response.WhichOneof("kind") != "error"
                return response
            finally:
                held = self._answered(token)
                if held and not created:
                    self._release_unless_exists(conn, name)

        return Item(rid, nbytes, produce)
