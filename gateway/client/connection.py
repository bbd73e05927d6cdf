"""One connection's plumbing: pipelined requests, the receive loop, and following NOT_OWNER.

Requests carry ids; any number may be in flight, each answered through a
`ResponseFuture` (or, for reads and fsck, a channel of pieces) by one task
that receives every response. A request about a segment that another node
owns gets ``NOT_OWNER`` naming the owner: `Connection._routed` sends it
there once, over a connection of its own kept for later calls. `Client`
(gateway/client/client.py) adds the requests themselves.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Self, TypeVar

import trio

from gateway.client.tls import describe_tls_failure
from gateway.errors import (
    BY_WIRE_CODE,
    ConnectionLost,
    GatewayError,
    NotOwner,
    OwnerDown,
    ProtocolError,
)
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import MessageStream, close_now

T = TypeVar("T")
#: The client library's logger, by the name it has always had (users filter on it).
log = logging.getLogger("gateway.client.client")
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024


def error_from_wire(err: wire.Error) -> GatewayError:
    """The exception for an Error response."""
    cls = BY_WIRE_CODE.get(wire.ErrorCode.Name(err.code), GatewayError)
    e = cls.from_text(err.message)
    if err.code in (wire.BAD_OFFSET, wire.SEGMENT_TRUNCATED, wire.REPLICA_GAP):
        e.expected_offset = err.expected_offset  # type: ignore[attr-defined]
    if err.code == wire.CONDITIONAL_CHECK_FAILED:
        e.last_event_number = err.last_event_number  # type: ignore[attr-defined]
    if err.owner:
        e.owner = err.owner  # type: ignore[attr-defined]
        e.owner_address = err.owner_address  # type: ignore[attr-defined]
    return e


def _more_follows(response: wire.Response) -> bool:
    """Whether more responses answer the same request (reads and fsck come in pieces)."""
    kind = response.WhichOneof("kind")
    if kind == "read":
        return not response.read.last
    if kind == "fsck":
        return not response.fsck.last
    return False


class ResponseFuture:
    """The answer to one pipelined request."""

    __slots__ = ("_done", "_error", "_response")

    def __init__(self) -> None:
        self._done = trio.Event()
        self._response: wire.Response | None = None
        self._error: GatewayError | None = None

    def _set(self, response: wire.Response | None, error: GatewayError | None = None) -> None:
        self._response = response
        self._error = error
        self._done.set()

    async def wait(self) -> wire.Response:
        """The response; raises the error it carries (or ConnectionLost)."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._response is not None
        if self._response.WhichOneof("kind") == "error":
            raise error_from_wire(self._response.error)
        return self._response


class Connection:
    """The plumbing of one connection to a daemon; `Client` adds the requests."""

    def __init__(
        self, stream: trio.abc.Stream, address: str, transport: trio.abc.Stream | None = None
    ) -> None:
        self.address = address
        self._messages = MessageStream(stream, DEFAULT_MAX_MESSAGE)
        #: The TCP stream (under TLS, if any): what `close_now` can close at once.
        self._transport = transport or stream
        self._tls = transport is not None and transport is not stream
        self._pending: dict[int, ResponseFuture] = {}
        #: Requests answered by several responses (reads): their pieces go here.
        self._streams: dict[int, trio.MemorySendChannel[wire.Response | GatewayError]] = {}
        self._next_id = 1
        self._send_lock = trio.Lock()
        self._broken: GatewayError | None = None
        #: The server's Hello answer (limits, version).
        self.server_hello: wire.HelloResponse | None = None
        #: Opens a connection to another node with this one's settings (set by
        #: `open_client`); None: NotOwner answers are not followed.
        self._follow: Callable[[str], AbstractAsyncContextManager[Self]] | None = None
        #: Connections to other nodes, by address, and where each segment
        #: this client was sent away for lives.
        self._peers: dict[str, tuple[Self, trio.CancelScope]] = {}
        self._owners: dict[str, str] = {}
        #: Where peer connections live (each in a task of its own).
        self._nursery: trio.Nursery | None = None
        self._peer_lock = trio.Lock()
        #: NotOwner answers followed to the owner.
        self.redirects = 0

    # -- plumbing ------------------------------------------------------------------

    def _fail_all(self, error: GatewayError) -> None:
        if self._broken is None:
            self._broken = error
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            fut._set(None, error)
        streams, self._streams = self._streams, {}
        for channel in streams.values():
            # A reader that was cancelled has closed its end already.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                channel.send_nowait(error)
            channel.close()

    async def _receive_loop(self) -> None:
        try:
            while True:
                raw = await self._messages.receive()
                if raw is None:
                    raise ConnectionLost(self.address, self._closed_reason())
                # upb parses any buffer; the stubs only say bytes.
                response = wire.Response.FromString(raw)  # type: ignore[arg-type]
                channel = self._streams.get(response.request_id)
                if channel is not None:
                    channel.send_nowait(response)
                    if not _more_follows(response):
                        del self._streams[response.request_id]
                        channel.close()
                    continue
                fut = self._pending.pop(response.request_id, None)
                if fut is not None:
                    fut._set(response)
                elif response.WhichOneof("kind") == "error":
                    # A connection-level error (request id 0): the server closes.
                    self._fail_all(error_from_wire(response.error))
        except GatewayError as e:
            self._fail_all(e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._fail_all(ConnectionLost(self.address, describe_tls_failure(e)))
        except Exception as e:  # undecodable response: the stream is unusable
            self._fail_all(ProtocolError(f"bad response from {self.address}: {e}"))

    def _closed_reason(self) -> str:
        """Why the server closed: a server refusing us says so, except a TLS one."""
        if self.server_hello is None and not self._tls:
            # A TLS server drops a plaintext client at the handshake, without
            # a word this client could read; nothing else closes before Hello.
            return (
                "the server closed the connection without answering Hello: does it "
                "require TLS? (--tls-ca FILE or --tls; tls_ca= or ssl_context= in the library)"
            )
        return "the server closed the connection"

    async def _send(self, parts: Sequence[bytes]) -> None:
        if self._broken is not None:
            raise self._broken
        async with self._send_lock:
            try:
                await self._messages.send(parts)
            except BaseException as e:
                # A message cut short leaves the stream unusable.
                reason = str(e) or type(e).__name__
                self._fail_all(ConnectionLost(self.address, f"send failed: {reason}"))
                close_now(self._transport)
                if isinstance(e, trio.BrokenResourceError | trio.ClosedResourceError | OSError):
                    raise self._broken or ConnectionLost(self.address, reason) from e
                raise

    def _new_request_id(self) -> int:
        if self._broken is not None:
            raise self._broken
        rid = self._next_id
        self._next_id += 1
        return rid

    async def start(self, build: Callable[[int], Sequence[bytes]]) -> ResponseFuture:
        """Send a request built by ``build(request_id)``; return its future."""
        rid = self._new_request_id()
        fut = ResponseFuture()
        self._pending[rid] = fut
        await self._send(build(rid))
        return fut

    async def _call(self, **kind: Any) -> wire.Response:
        def build(rid: int) -> Sequence[bytes]:
            return (wire.Request(request_id=rid, **kind).SerializeToString(),)

        return await (await self.start(build)).wait()

    async def _peer(self, address: str) -> Self:
        """The connection to another node (opened the first time, or again once broken)."""
        async with self._peer_lock:
            held = self._peers.get(address)
            if held is not None and held[0]._broken is None:
                return held[0]
            if held is not None:
                held[1].cancel()
            follow, nursery = self._follow, self._nursery
            assert follow is not None and nursery is not None

            async def hold(*, task_status: trio.TaskStatus[tuple[Self, trio.CancelScope]]) -> None:
                # Opened and closed in this task: its nursery must not change tasks.
                with trio.CancelScope() as scope:
                    async with follow(address) as peer:
                        task_status.started((peer, scope))
                        await trio.sleep_forever()

            self._peers[address] = await nursery.start(hold)
            return self._peers[address][0]

    async def _routed(self, segment: str, call: Callable[[Self], Awaitable[T]]) -> T:
        """``call`` on the node that owns ``segment``, following one NotOwner answer.

        A request that gets NotOwner changed nothing, so sending it again to
        the owner keeps exactly-once; the owner is remembered for later calls.
        An owner that cannot be reached (nothing was sent to it) is forgotten
        and the first node asked again, or, if that one sent us there just
        now, `OwnerDown` names the segment and the owner.
        """
        address = self._owners.get(segment)
        if address is not None:
            try:
                peer = await self._peer(address)
            except ConnectionLost:
                self._owners.pop(segment, None)  # moved, or gone: ask again below
            else:
                try:
                    return await call(peer)
                except ConnectionLost:
                    self._owners.pop(segment, None)
                    raise
        try:
            return await call(self)
        except NotOwner as e:
            if self._follow is None or not e.owner_address:
                raise
            self.redirects += 1
            log.info("segment %r lives on node %s at %s: following", segment, e.owner,
                     e.owner_address)  # fmt: skip
            try:
                peer = await self._peer(e.owner_address)
            except ConnectionLost as lost:
                raise OwnerDown(
                    segment, e.owner, f"not answering at {e.owner_address} ({lost})",
                    e.owner_address,
                ) from None  # fmt: skip
            self._owners[segment] = e.owner_address
            return await call(peer)

    async def _segment_call(self, segment: str, **kind: Any) -> wire.Response:
        """`_call` for a request about one segment, sent to its owner."""
        return await self._routed(segment, lambda c: c._call(**kind))

    async def _hello(self, token: str, client_name: str) -> None:
        r = await self._call(
            hello=wire.Hello(
                protocol_version=wire.PROTOCOL_VERSION_1, token=token, client=client_name
            )
        )
        self.server_hello = r.hello

    async def aclose(self) -> None:
        """Close the connection; requests still pending fail with ConnectionLost."""
        self._fail_all(ConnectionLost(self.address, "closed by the client"))
        close_now(self._transport)
        await trio.lowlevel.checkpoint()
