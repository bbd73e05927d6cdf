"""Attributes: update a segment's, and get them by id or by range."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from gateway.cluster.remote import TAIL_READ_TIMEOUT, remote_attributes
from gateway.container.attributes import ID_BYTES as ATTRIBUTE_ID_BYTES
from gateway.container.attributes import closes_writers
from gateway.errors import BadRequest, ConnectionLost, SegmentNotFound, Unavailable
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.metadata_pb2 import AttributeValue

from ..answers import Producer, pending_info
from ..registry import handles
from ..routing import remote_segment
from .convert import updates

if TYPE_CHECKING:
    from gateway.cluster.remote import RemoteNode
    from gateway.container.segment import Segment

    from ..context import Peer

#: Estimated bytes per attribute in a GetAttributes answer.
ATTRIBUTE_BYTES = 64
#: Attributes in a range answer: when the request says no limit, and at most.
DEFAULT_ATTRIBUTE_RANGE = 1000
MAX_ATTRIBUTE_RANGE = 10_000


def _closes_writers(req: wire.Request) -> bool:
    # Closing a writer id is admitted on a full disk, like a deletion. The
    # wire updates as they came: an unknown verb closes nothing, and is
    # answered BAD_REQUEST when prepared (`Connection.admit`).
    return closes_writers(req.update_attributes.updates)


@handles("update_attributes", changes=True, frees=_closes_writers)
def update_attributes(conn: Peer, req: wire.Request) -> Producer:
    """Apply attribute updates to a segment."""
    u = req.update_attributes
    op = conn.server.container.prepare_update_attributes(u.segment, updates(list(u.updates)))
    return pending_info(req.request_id, op)


def _get_bytes(conn: Peer, req: wire.Request) -> int:
    g = req.get_attributes
    n = len(g.ids) or min(g.limit or DEFAULT_ATTRIBUTE_RANGE, MAX_ATTRIBUTE_RANGE)
    return n * ATTRIBUTE_BYTES


@handles("get_attributes", answer_bytes=_get_bytes)
def get_attributes(conn: Peer, req: wire.Request) -> Producer:
    """Attribute values by id, or a range of them in id order."""
    g = req.get_attributes
    container = conn.server.container
    rid = req.request_id
    try:
        container.check_exists(g.segment)  # fail now if missing, in order
    except SegmentNotFound:
        if g.from_owner:
            raise  # NOT_OWNER or OWNER_DOWN (`Connection.admit`), never a view's values
        # Another node's segment: from its owner while it answers, else
        # from what this node knows of it (a down owner's flushed record).
        return _remote(conn, req, *remote_segment(conn.server, g.segment))

    if not g.ids:
        if g.start and len(g.start) != ATTRIBUTE_ID_BYTES:
            raise BadRequest(f"range start must be {ATTRIBUTE_ID_BYTES} bytes")
        limit = min(g.limit or DEFAULT_ATTRIBUTE_RANGE, MAX_ATTRIBUTE_RANGE)

        async def produce_range() -> wire.Response:
            # One more than asked: whether the range goes on, and where.
            items = await container.attribute_range(g.segment, g.start, limit + 1)
            more = items[limit][0] if len(items) > limit else b""
            return wire.Response(
                request_id=rid,
                attributes=wire.Attributes(
                    values=[AttributeValue(id=k, value=v) for k, v in items[:limit]],
                    next=more,
                ),
            )

        return produce_range

    async def produce() -> wire.Response:
        values = await container.get_attributes(g.segment, list(g.ids))
        return wire.Response(
            request_id=rid,
            attributes=wire.Attributes(
                values=[AttributeValue(id=k, value=v) for k, v in values.items()]
            ),
        )

    return produce


def _remote(conn: Peer, req: wire.Request, node: RemoteNode, seg: Segment) -> Producer:
    """Attributes of another node's segment (`get_attributes` for a remote one)."""
    g = req.get_attributes
    rid = req.request_id
    store = conn.server.container.attribute_store
    if g.start and len(g.start) != ATTRIBUTE_ID_BYTES:
        raise BadRequest(f"range start must be {ATTRIBUTE_ID_BYTES} bytes")
    limit = min(g.limit or DEFAULT_ATTRIBUTE_RANGE, MAX_ATTRIBUTE_RANGE)

    async def produce() -> wire.Response:
        client = node.client
        if client is not None:
            with trio.move_on_after(TAIL_READ_TIMEOUT):
                try:
                    if g.ids:
                        values = await client.get_attributes(g.segment, list(g.ids))
                        return wire.Response(
                            request_id=rid,
                            attributes=wire.Attributes(
                                values=[AttributeValue(id=k, value=v) for k, v in values.items()]
                            ),
                        )
                    items, more = await client.attribute_range(g.segment, g.start, limit)
                    return wire.Response(
                        request_id=rid,
                        attributes=wire.Attributes(
                            values=[AttributeValue(id=k, value=v) for k, v in items],
                            next=more,
                        ),
                    )
                except (ConnectionLost, Unavailable):
                    pass  # the owner went away meanwhile: what this node knows
        known = await remote_attributes(seg, store, g.start, 0 if g.ids else limit + 1)
        if g.ids:
            wanted = set(g.ids)
            return wire.Response(
                request_id=rid,
                attributes=wire.Attributes(
                    values=[AttributeValue(id=k, value=v) for k, v in known if k in wanted]
                ),
            )
        more = known[limit][0] if len(known) > limit else b""
        return wire.Response(
            request_id=rid,
            attributes=wire.Attributes(
                values=[AttributeValue(id=k, value=v) for k, v in known[:limit]], next=more
            ),
        )

    return produce
