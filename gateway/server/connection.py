"""One client connection: the read loop, admission, and the answers in order.

One reader task reads requests in order and *prepares* each one at once
(validation, offset assignment and journal submission happen in arrival
order), then hands an awaitable to the connection's responder task, which
sends the responses strictly in request order. A connection therefore gets
its appends acknowledged in order while many are in flight. What each kind
of request does is looked up in `HANDLERS` (gateway/server/registry.py).

Memory (docs/SECURITY.md, "What a peer can do"): each queued request is
charged to its connection and to the server's `MemoryBudget`, its answer's
bytes included (a list's entries are built only when its turn to be
answered comes). A connection whose charge passes
``server.max_inflight_bytes`` stops being read (TCP pushes back on the
client); a request that does not fit in ``server.max_memory`` waits for
room before it is prepared. A large message reserves its length before its
buffer is allocated, waits at most ``server.memory_timeout`` for room (then
``Overloaded``, and the connection is closed), and must arrive within
``server.message_timeout``; an answer the peer does not take within
``server.send_timeout`` closes the connection (the listener watches), so a
peer that stops reading gives its memory back.

Bad input never affects other connections: a malformed length, an
undecodable message, an unknown request kind or an oversize message gets an
error response (when one can be sent) and the connection is closed; nothing
of it was applied.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
from google.protobuf.message import DecodeError

from gateway.errors import (
    BadRequest,
    GatewayError,
    Overloaded,
    ProtocolError,
    SegmentNotFound,
    Unauthorized,
    Unsupported,
)
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import (
    MessageStream,
    close_now,
    misencoded_field,
    split_append_request,
)

from .answers import Item, Producer, error_item, error_response
from .budget import ITEM_BYTES
from .handlers.segments import append_data
from .hello import answer_hello, receive_hello
from .registry import HANDLERS
from .routing import ClaimedCreates, not_owner

if TYPE_CHECKING:
    from .context import ServerParts

log = logging.getLogger(__name__)

#: Appends at least this large skip copying their data out of the message.
_SPLIT_BYTES = 64 * 1024


class Connection:
    """One client connection."""

    def __init__(
        self,
        server: ServerParts,
        stream: trio.abc.Stream,
        peer: str,
        transport: trio.abc.Stream | None = None,
    ) -> None:
        self.server = server
        config = server.config
        self.messages = MessageStream(
            stream,
            config.max_message_bytes,
            reserve=self._reserve,
            message_timeout=config.message_timeout,
        )
        #: The TCP stream under a TLS one: what `close_now` can close at once.
        self.transport = transport or stream
        self.peer = peer
        #: Bytes charged to this connection (and to the server's budget):
        #: queued requests with their answers, and a message being received.
        self.charge = 0
        #: The part of `charge` reserved for the message being received.
        self._reserved = 0
        self._space = trio.Event()
        self.reader_scope = trio.CancelScope()
        self.greeted = False
        #: What the client called itself in Hello (another node: "segment-gateway-node/ID").
        self.client_name = ""
        #: Creates whose names are being claimed (in a cluster).
        self.creates = ClaimedCreates()

    @property
    def inflight_bytes(self) -> int:
        """Bytes charged to this connection (requests and their answers)."""
        return self.charge

    async def run(self) -> None:
        """Serve the connection until it ends; whatever it held is given back."""
        send, receive = trio.open_memory_channel[Item](math.inf)
        try:
            async with trio.open_nursery() as nursery:
                self.creates.nursery = nursery
                nursery.start_soon(self._respond, receive)
                async with send:
                    with self.reader_scope:
                        await self._read_loop(send)
        finally:
            # Whatever was never answered (a broken connection) is given back.
            self.server.memory.release(self.charge)
            self.charge = 0

    def abort(self) -> None:
        """Stop reading and close now; the tasks end on their own."""
        self.reader_scope.cancel()
        close_now(self.transport)

    async def _reserve(self, nbytes: int) -> None:
        """Before a large message's buffer exists: room for it (and its item) in the budget."""
        nbytes += ITEM_BYTES
        timeout = self.server.config.memory_timeout
        if not await self.server.memory.acquire_within(nbytes, timeout):
            budget = self.server.memory
            raise Overloaded(
                f"no room for a {nbytes - ITEM_BYTES}-byte message within {timeout:g}s: "
                f"{budget.used} of {budget.limit} bytes (server.max_memory) are held by "
                "requests in flight"
            )
        self._reserved += nbytes
        self.charge += nbytes

    async def _read_loop(self, send: trio.MemorySendChannel[Item]) -> None:
        while True:
            try:
                if self.greeted:
                    raw = await self.messages.receive()
                else:
                    raw = await receive_hello(self)
            except (ProtocolError, Overloaded) as e:
                log.info("connection %s: %s; closing", self.peer, e)
                self._unreserve()
                await send.send(error_item(0, e, close=True))
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if raw is None:
                return
            reserved, self._reserved = self._reserved, 0
            item = await self._admit_message(raw, reserved)
            # Queued before any wait, so a prepared request is always answered.
            send.send_nowait(item)
            if item.close_after:
                return
            while self.charge > self.server.config.max_inflight_bytes:
                await self._space.wait()

    def _unreserve(self) -> None:
        """Give back the reservation of a message that will not be served."""
        self.server.memory.release(self._reserved)
        self.charge -= self._reserved
        self._reserved = 0

    async def _admit_message(self, raw: bytes | bytearray, reserved: int) -> Item:
        """Charge one message and what its answer will hold, then prepare it.

        ``reserved`` is already charged (a large message's length and
        ITEM_BYTES). A request that needs more waits for room: without end
        if nothing of it is held yet (backpressure), at most
        ``server.memory_timeout`` if its message is (then it is answered
        Overloaded and not applied), so that connections holding messages
        never wait for each other's room in a circle.
        """
        nbytes = len(raw)
        split = split_append_request(raw) if self.greeted and nbytes >= _SPLIT_BYTES else None
        decoded: wire.Request | Item | None = None
        if split is not None:
            cost = nbytes + ITEM_BYTES
        else:
            decoded = self._decode(raw)
            if isinstance(decoded, Item):
                cost = ITEM_BYTES
            else:
                cost = nbytes + ITEM_BYTES + self._answer_bytes(decoded)
        budget = self.server.memory
        extra = cost - reserved
        refused: GatewayError | None = None
        if extra <= 0:
            budget.release(-extra)
        elif isinstance(decoded, Item):
            # An error answer, or the answer to Hello (at most MAX_HELLO_BYTES,
            # one per connection): small, and not worth a wait.
            budget.take(extra)
        elif reserved:
            if not await budget.acquire_within(extra, self.server.config.memory_timeout):
                refused = Overloaded(
                    f"no room for the answer ({extra} bytes) within "
                    f"{self.server.config.memory_timeout:g}s (server.max_memory)"
                )
                extra = 0
        else:
            await budget.acquire(extra)
        self.charge += extra
        cost = reserved + extra
        creating = isinstance(decoded, wire.Request) and _claimed_name(decoded) is not None
        if self.creates.pending and not creating:
            # A create before it is still waiting for its name claim.
            await self.creates.wait_idle()
        if split is not None:
            item = await self._prepare_split_append(*split, nbytes)
        elif isinstance(decoded, Item):
            item = decoded
        else:
            assert decoded is not None
            if refused is not None:
                item = error_item(decoded.request_id, refused)
            else:
                item = await self._prepare(decoded, nbytes)
        item.cost = cost
        return item

    def _answer_bytes(self, req: wire.Request) -> int:
        """What the request's kind says its answer will hold (0 if nothing)."""
        handler = HANDLERS.get(str(req.WhichOneof("kind")))
        if handler is None or handler.answer_bytes is None:
            return 0
        return handler.answer_bytes(self, req)

    def _decode(self, raw: bytes | bytearray) -> wire.Request | Item:
        """The request, or the error item that answers (and ends) the connection."""
        try:
            # upb parses any buffer (a bytearray saves a 1 MiB copy); stubs say bytes.
            req = wire.Request.FromString(raw)  # type: ignore[arg-type]
        except DecodeError as de:
            return error_item(0, ProtocolError(f"undecodable request: {de}"), close=True)
        rid = req.request_id
        misencoded = misencoded_field(req)
        if misencoded is not None:
            return error_item(
                rid, BadRequest(f"malformed request: {misencoded}"), close=not self.greeted
            )
        kind = req.WhichOneof("kind")
        if kind is None:
            return error_item(
                rid, Unsupported("unknown or missing request kind (newer client?)"), close=True
            )
        if not self.greeted:
            if kind != "hello":
                e: GatewayError = (
                    Unauthorized("send Hello with the token first")
                    if self.server.config.token
                    else BadRequest("the first request must be Hello")
                )
                return error_item(rid, e, close=True)
            return answer_hello(self, rid, req.hello)
        if kind == "hello":
            return error_item(rid, BadRequest("Hello was already sent"))
        return req

    async def _prepare(self, req: wire.Request, nbytes: int) -> Item:
        """Prepare one request, in arrival order: it enters the journal now."""
        kind = str(req.WhichOneof("kind"))
        handler = HANDLERS.get(kind)
        requests = self.server.requests
        requests[kind] = requests.get(kind, 0) + 1
        if handler is None:
            return error_item(
                req.request_id, Unsupported(f"request kind {kind!r} is not served here")
            )
        if handler.stream is not None:
            return handler.stream(self, req)
        prepare = handler.prepare
        assert prepare is not None
        if self.server.claims is not None:
            name = handler.claimed_name(req)
            if name is not None:
                return self.creates.start(self, req, prepare, name, nbytes)
        return await self.admit(
            req.request_id,
            nbytes,
            handler.mutating(req),
            lambda: prepare(self, req),
            handler.freeing(req),
        )

    async def admit(
        self,
        rid: int,
        nbytes: int,
        mutating: bool,
        prepare: Callable[[], Producer],
        frees: bool = False,
    ) -> Item:
        """Wait for room if the request changes anything, then prepare it.

        ``frees``: a deletion or truncation, which may go ahead while the
        journal's disk is full (the container decides whether it frees space).
        """
        try:
            # The container's one admission path (room, then the prepare,
            # which may first wait for attribute values from the index; the
            # connection's later requests wait behind it, keeping their order).
            produce = await self.server.container.admit(
                prepare, nbytes, reserved=frees, changes=mutating
            )
        except SegmentNotFound as e:
            return error_item(rid, await not_owner(self.server, e))
        except GatewayError as e:
            return error_item(rid, e)
        return Item(rid, nbytes, produce)

    async def _prepare_split_append(
        self, rid: int, a: wire.AppendRequest, data: memoryview, nbytes: int
    ) -> Item:
        """`_prepare` for a large append whose data is a view of the message."""
        return await self.admit(rid, nbytes, True, lambda: append_data(self, rid, a, data))

    # -- responses ---------------------------------------------------------------

    async def _send_stream(self, item: Item) -> None:
        """Send a read's pieces as they are produced (errors end the answer)."""
        if item.push is not None:
            await item.push(self.messages.send_message)
            return
        assert item.stream is not None
        # Closed here even when a send fails, not whenever it is collected.
        async with contextlib.aclosing(item.stream()) as pieces:
            async for parts in pieces:
                await self.messages.send(parts)

    async def _respond(self, receive: trio.MemoryReceiveChannel[Item]) -> None:
        try:
            async for item in receive:
                try:
                    try:
                        if item.stream is not None or item.push is not None:
                            await self._send_stream(item)
                            response = None
                        else:
                            assert item.produce is not None
                            response = await item.produce()
                    except GatewayError as e:
                        response = error_response(item.request_id, e)
                    if response is not None:
                        await self.messages.send_message(response.SerializeToString())
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self.reader_scope.cancel()
                    return
                self.charge -= item.cost
                self.server.memory.release(item.cost)
                self._space.set()
                self._space = trio.Event()
                if item.close_after:
                    return
        finally:
            self.reader_scope.cancel()
            self.creates.abandon()
            close_now(self.transport)


def _claimed_name(req: wire.Request) -> str | None:
    """The name ``req`` creates, which a cluster claims first; None if none."""
    handler = HANDLERS.get(str(req.WhichOneof("kind")))
    return handler.claimed_name(req) if handler is not None else None
