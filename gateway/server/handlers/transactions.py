"""Transactions: begin, commit, abort (one request kind, by action)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.errors import BadRequest
from gateway.protocol import wire_pb2 as wire

from ..answers import Producer
from ..registry import handles

if TYPE_CHECKING:
    from ..context import Peer


@handles("transaction", changes=True)
def transaction(conn: Peer, req: wire.Request) -> Producer:
    """Transactions: begin, commit, abort."""
    c = conn.server.container
    t = req.transaction
    rid = req.request_id
    if t.action == wire.TXN_BEGIN:
        op = c.prepare_begin(t.parent, t.timeout_ms / 1000)
    elif t.action == wire.TXN_COMMIT:
        op = c.prepare_commit(t.name)
    elif t.action == wire.TXN_ABORT:
        op = c.prepare_abort(t.name)

        async def aborted() -> wire.Response:
            await op.wait()
            return wire.Response(request_id=rid, done=wire.Done())

        return aborted
    else:
        raise BadRequest(f"unknown transaction action {t.action}")

    async def answered() -> wire.Response:
        return wire.Response(request_id=rid, transaction=(await op.wait()).to_wire())

    return answered
