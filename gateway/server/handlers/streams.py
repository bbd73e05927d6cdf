"""Streams: create, change, roll, delete, show, list (one request kind, by action)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.config import STREAM_POLICY_MAX, stream_policy_text
from gateway.container.results import POLICY_FIELDS
from gateway.errors import BadRequest
from gateway.protocol import wire_pb2 as wire

from ..answers import Producer
from ..registry import handles
from .convert import codec

if TYPE_CHECKING:
    from ..context import Peer


def _reads_only(req: wire.Request) -> bool:
    return req.stream.action in (wire.STREAM_GET, wire.STREAM_LIST)


def _creates(req: wire.Request) -> str | None:
    return req.stream.name if req.stream.action == wire.STREAM_CREATE else None


def _policy(p: wire.StreamPolicy) -> dict[str, int | None]:
    """A request's stream policy: set fields, and None for fields to reset."""
    policy: dict[str, int | None] = {f: getattr(p, f) for f in POLICY_FIELDS if p.HasField(f)}
    for f, value in policy.items():
        most = STREAM_POLICY_MAX[f]
        if value is not None and value > most:
            # The [streams] defaults' own bounds: a client's value is no wider.
            raise BadRequest(
                f"stream policy {f} of {value} is above its largest value "
                f"{most} ({stream_policy_text(f, most)})"
            )
    for f in p.reset:
        if f not in POLICY_FIELDS:
            raise BadRequest(f"unknown stream policy {f!r} to reset")
        policy[f] = None
    return policy


@handles("stream", changes=True, reads_only=_reads_only, claims_name=_creates)
def stream(conn: Peer, req: wire.Request) -> Producer:
    """Streams: create, change, roll, delete, show, list."""
    c = conn.server.container
    r = req.stream
    rid = req.request_id
    action = r.action
    if action == wire.STREAM_LIST:
        streams = (
            [wire.StreamInfo(name=n) for n in c.stream_names()]
            if r.names_only
            else [s.to_wire() for s in c.list_streams()]
        )

        async def listed() -> wire.Response:
            return wire.Response(request_id=rid, streams=wire.StreamList(streams=streams))

        return listed
    if action == wire.STREAM_GET:
        info = c.stream_info(r.name)

        async def shown() -> wire.Response:
            return wire.Response(request_id=rid, stream=info.to_wire())

        return shown
    if action == wire.STREAM_DELETE:
        op = c.prepare_delete_stream(r.name)
        claims = conn.server.claims

        async def deleted() -> wire.Response:
            await op.wait()
            if claims is not None:
                await claims.release(r.name)  # the name is free for every node again
            return wire.Response(request_id=rid, done=wire.Done())

        return deleted
    if action == wire.STREAM_ROLL:
        op = c.prepare_roll(r.name)
    elif action == wire.STREAM_CREATE:
        op = c.prepare_set_stream(r.name, _policy(r.policy), create=True, codec=codec(r.codec))
    elif action == wire.STREAM_SET:
        op = c.prepare_set_stream(r.name, _policy(r.policy))
    else:
        raise BadRequest(f"unknown stream action {action}")

    async def changed() -> wire.Response:
        return wire.Response(request_id=rid, stream=(await op.wait()).to_wire())

    return changed
