"""What a prepared request becomes: how and when it is answered.

A request is prepared when it is read (in arrival order) and answered when
its turn comes (in request order): preparing returns a `Producer`, an
awaitable made now that builds the response later, wrapped in an `Item`
that the connection queues for its responder.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from gateway.container.container import PendingOperation
from gateway.errors import GatewayError
from gateway.protocol import wire_pb2 as wire

Producer = Callable[[], Awaitable[wire.Response]]


@dataclass
class Item:
    """One request in a connection's answer queue."""

    request_id: int
    nbytes: int
    #: How to answer (None for reads, which use `stream`).
    produce: Producer | None
    close_after: bool = False
    #: What it is charged to its connection and the server (`MemoryBudget`).
    cost: int = 0
    #: For reads: the pieces of the answer, produced one at a time.
    stream: Callable[[], AsyncGenerator[list[bytes], None]] | None = None
    #: For fsck: sends its answer's messages itself, through the function it
    #: is given (its checks run tasks in parallel, which an async generator
    #: cannot do across a yield).
    push: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]] | None = None


def ready(response: wire.Response) -> Producer:
    """A producer for an answer that is already known."""

    async def produce() -> wire.Response:
        return response

    return produce


def framed(response: wire.Response) -> bytes:
    """A response as it goes on the wire: its 4-byte big-endian length, then the message."""
    data = response.SerializeToString()
    return len(data).to_bytes(4, "big") + data


def error_response(request_id: int, e: GatewayError) -> wire.Response:
    """The wire form of an error."""
    err = wire.Error(code=e.wire_code, message=str(e))
    expected = getattr(e, "expected_offset", None)
    if expected is not None:
        err.expected_offset = expected
    last = getattr(e, "last_event_number", 0)
    if last:
        err.last_event_number = last
    owner = getattr(e, "owner", "")
    if owner:
        err.owner = owner
        err.owner_address = getattr(e, "owner_address", "")
    return wire.Response(request_id=request_id, error=err)


def error_item(request_id: int, e: GatewayError, close: bool = False) -> Item:
    """An item that answers with an error (and, with ``close``, ends the connection)."""
    return Item(request_id, 0, ready(error_response(request_id, e)), close)


def pending_info(rid: int, op: PendingOperation) -> Producer:
    """Answers with the segment's info once ``op`` is durable."""

    async def produce() -> wire.Response:
        return wire.Response(request_id=rid, info=(await op.wait()).to_wire())

    return produce
