"""Client library: an async (trio) client and a small synchronous wrapper.

::

    async with open_client("127.0.0.1:9410") as client:
        await client.create("scope/stream/0")
        r = await client.append("scope/stream/0", b"event")

Requests are pipelined: many may be in flight on one connection, and
`Client.start_append` sends an append without waiting for its answer. Errors
arrive as the same exception classes the daemon raises (gateway.errors).
For exactly-once event streams use `gateway.writer.SegmentWriter`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import trio

from gateway import __version__
from gateway.aio import service_nursery
from gateway.config import parse_host_port
from gateway.container.attributes import AttributeUpdate
from gateway.container.container import AppendResult, ReadResult
from gateway.container.segment import SegmentInfo
from gateway.errors import BY_WIRE_CODE, ConnectionLost, GatewayError, ProtocolError
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import MessageStream, close_now, encode_append_request

T = TypeVar("T")
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024


def error_from_wire(err: wire.Error) -> GatewayError:
    """The exception for an Error response."""
    cls = BY_WIRE_CODE.get(wire.ErrorCode.Name(err.code), GatewayError)
    e = cls.from_text(err.message)
    if err.code in (wire.BAD_OFFSET, wire.SEGMENT_TRUNCATED):
        e.expected_offset = err.expected_offset  # type: ignore[attr-defined]
    if err.code == wire.CONDITIONAL_CHECK_FAILED:
        e.last_event_number = err.last_event_number  # type: ignore[attr-defined]
    return e


def info_from_wire(m: wire.SegmentInfo) -> SegmentInfo:
    """A SegmentInfo from its wire form."""
    return SegmentInfo(
        name=m.name,
        id=m.id,
        start_offset=m.start_offset,
        length=m.length,
        storage_length=m.storage_length,
        sealed=m.sealed,
        sealed_in_storage=m.sealed_in_storage,
        created_at_ms=m.created_at_ms,
        last_modified_ms=m.last_modified_ms,
        event_count=m.event_count,
        attribute_count=m.attribute_count,
        chunk_count=m.chunk_count,
    )


def _wire_updates(updates: Iterable[AttributeUpdate]) -> list[wire.AttributeUpdate]:
    return [
        wire.AttributeUpdate(
            id=u.id,
            verb=int(u.verb),  # type: ignore[arg-type]
            value=u.value,
            compare_value=u.compare_value,
            expect_absent=u.expect_absent,
        )
        for u in updates
    ]


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


class Client:
    """One connection to a daemon. Get one from `open_client`."""

    def __init__(self, stream: trio.abc.Stream, address: str) -> None:
        self.address = address
        self._messages = MessageStream(stream, DEFAULT_MAX_MESSAGE)
        self._pending: dict[int, ResponseFuture] = {}
        #: Requests answered by several responses (reads): their pieces go here.
        self._streams: dict[int, trio.MemorySendChannel[wire.Response | GatewayError]] = {}
        self._next_id = 1
        self._send_lock = trio.Lock()
        self._broken: GatewayError | None = None
        #: The server's Hello answer (limits, version).
        self.server_hello: wire.HelloResponse | None = None

    # -- plumbing ------------------------------------------------------------------

    def _fail_all(self, error: GatewayError) -> None:
        if self._broken is None:
            self._broken = error
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            fut._set(None, error)
        streams, self._streams = self._streams, {}
        for channel in streams.values():
            channel.send_nowait(error)
            channel.close()

    async def _receive_loop(self) -> None:
        try:
            while True:
                raw = await self._messages.receive()
                if raw is None:
                    raise ConnectionLost(self.address, "the server closed the connection")
                # upb parses any buffer; the stubs only say bytes.
                response = wire.Response.FromString(raw)  # type: ignore[arg-type]
                channel = self._streams.get(response.request_id)
                if channel is not None:
                    channel.send_nowait(response)
                    if response.WhichOneof("kind") != "read" or response.read.last:
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
            self._fail_all(ConnectionLost(self.address, str(e) or type(e).__name__))
        except Exception as e:  # undecodable response: the stream is unusable
            self._fail_all(ProtocolError(f"bad response from {self.address}: {e}"))

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
                close_now(self._messages.stream)
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

    async def read_pieces(
        self, segment: str, offset: int = 0, max_length: int = 1 << 20, wait: float = 0.0
    ) -> AsyncIterator[ReadResult]:
        """The answer to one read, piece by piece (each at most 1 MiB), as they arrive.

        At the tail of an active segment the server waits up to ``wait``
        seconds for data; an empty piece means none came. Raises
        SegmentTruncated below the start offset.
        """
        rid = self._new_request_id()
        send, receive = trio.open_memory_channel[wire.Response | GatewayError](math.inf)
        self._streams[rid] = send
        req = wire.Request(
            request_id=rid,
            read=wire.ReadRequest(
                segment=segment, offset=offset, max_length=max_length, wait_ms=int(wait * 1000)
            ),
        )
        await self._send((req.SerializeToString(),))
        async with receive:
            async for item in receive:
                if isinstance(item, GatewayError):
                    raise item
                if item.WhichOneof("kind") == "error":
                    raise error_from_wire(item.error)
                r = item.read
                yield ReadResult(r.offset, r.data, r.length, r.start_offset, r.sealed)

    async def read(
        self, segment: str, offset: int = 0, max_length: int = 1 << 20, wait: float = 0.0
    ) -> ReadResult:
        """Up to ``max_length`` committed bytes from ``offset`` (see `read_pieces`)."""
        data = bytearray()
        last: ReadResult | None = None
        async for piece in self.read_pieces(segment, offset, max_length, wait):
            data += piece.data
            last = piece
        assert last is not None
        return ReadResult(offset, bytes(data), last.length, last.start_offset, last.sealed)

    async def _call(self, **kind: Any) -> wire.Response:
        def build(rid: int) -> Sequence[bytes]:
            return (wire.Request(request_id=rid, **kind).SerializeToString(),)

        return await (await self.start(build)).wait()

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
        close_now(self._messages.stream)
        await trio.lowlevel.checkpoint()

    # -- operations ------------------------------------------------------------------

    async def create(self, segment: str, attributes: Sequence[AttributeUpdate] = ()) -> SegmentInfo:
        """Create a segment."""
        r = await self._call(
            create=wire.CreateSegmentRequest(segment=segment, attributes=_wire_updates(attributes))
        )
        return info_from_wire(r.info)

    async def start_append(
        self,
        segment: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        attribute_updates: Sequence[AttributeUpdate] = (),
        writer_id: bytes = b"",
        event_number: int = 0,
        previous_event_number: int = 0,
        event_count: int = 0,
    ) -> ResponseFuture:
        """Send an append; await `ResponseFuture.wait` for its answer later."""
        req = wire.AppendRequest(
            segment=segment,
            attribute_updates=_wire_updates(attribute_updates),
            writer_id=writer_id,
            event_number=event_number,
            previous_event_number=previous_event_number,
            event_count=event_count,
        )
        if expected_offset is not None:
            req.expected_offset = expected_offset
        return await self.start(partial(_append_parts, req, data))

    async def append(self, segment: str, data: bytes, **kwargs: Any) -> AppendResult:
        """Append and wait for the acknowledgement (keywords as `start_append`)."""
        r = await (await self.start_append(segment, data, **kwargs)).wait()
        return AppendResult(r.append.offset, r.append.length)

    async def seal(self, segment: str) -> SegmentInfo:
        """Seal a segment."""
        return info_from_wire((await self._call(seal=wire.SealRequest(segment=segment))).info)

    async def truncate(self, segment: str, offset: int) -> SegmentInfo:
        """Drop the bytes below ``offset``."""
        r = await self._call(truncate=wire.TruncateRequest(segment=segment, offset=offset))
        return info_from_wire(r.info)

    async def delete(self, segment: str) -> None:
        """Delete a segment."""
        await self._call(delete=wire.DeleteRequest(segment=segment))

    async def flush(self, segment: str = "") -> None:
        """Flush a segment ("" = all) to Tier 2; returns once it is there."""
        await self._call(flush=wire.FlushRequest(segment=segment))

    async def info(self, segment: str) -> SegmentInfo:
        """A segment's committed metadata."""
        return info_from_wire(
            (await self._call(get_info=wire.GetInfoRequest(segment=segment))).info
        )

    async def list(self, prefix: str = "") -> list[SegmentInfo]:
        """Every segment whose name starts with ``prefix`` (all pages), sorted by name."""
        out: list[SegmentInfo] = []
        start_after = ""
        while True:
            r = await self._call(
                list=wire.ListSegmentsRequest(prefix=prefix, start_after=start_after)
            )
            out.extend(info_from_wire(m) for m in r.list.segments)
            if not r.list.truncated or not r.list.segments:
                return out
            start_after = r.list.segments[-1].name

    async def get_attributes(self, segment: str, ids: Iterable[bytes] = ()) -> dict[bytes, int]:
        """Attribute values (all, or those of ``ids`` that exist)."""
        r = await self._call(
            get_attributes=wire.GetAttributesRequest(segment=segment, ids=list(ids))
        )
        return {v.id: v.value for v in r.attributes.values}

    async def update_attributes(
        self, segment: str, updates: Sequence[AttributeUpdate]
    ) -> SegmentInfo:
        """Update attributes atomically."""
        r = await self._call(
            update_attributes=wire.UpdateAttributesRequest(
                segment=segment, updates=_wire_updates(updates)
            )
        )
        return info_from_wire(r.info)


def _append_parts(req: wire.AppendRequest, data: bytes, rid: int) -> Sequence[bytes]:
    return encode_append_request(rid, req, data)


async def _connect(host: str, port: int) -> trio.SocketStream:
    """A TCP stream whose socket is closed on any failure, cancellation included.

    (trio.open_tcp_stream cancelled just after connecting can leave its
    socket to the garbage collector.)
    """
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    family, type_, proto, _, addr = infos[0]
    sock = trio.socket.socket(family, type_, proto)
    try:
        await sock.connect(addr)
        return trio.SocketStream(sock)
    except BaseException:
        sock.close()
        raise


@asynccontextmanager
async def open_client(
    address: str, token: str = "", client_name: str = f"segment-gateway-client/{__version__}"
) -> AsyncIterator[Client]:
    """Connect to ``address`` (``HOST:PORT``), say Hello, and yield a Client."""
    host, port = parse_host_port(address)
    try:
        stream = await _connect(host, port)
    except OSError as e:
        raise ConnectionLost(address, f"cannot connect: {e.strerror or e}") from None
    client = Client(stream, address)
    try:
        async with service_nursery() as nursery:
            nursery.start_soon(client._receive_loop)
            try:
                await client._hello(token, client_name)
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await client.aclose()


class SyncClient:
    """A blocking wrapper: the async client on a trio loop in a background thread.

    ::

        with SyncClient("127.0.0.1:9410") as c:
            c.create("logs/app")
            c.append("logs/app", b"line\\n")
    """

    def __init__(self, address: str, token: str = "") -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, address, token), daemon=True, name="gateway-client"
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, address: str, token: str) -> None:
        try:
            async with open_client(address, token) as client:
                self._client = client
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:
            self._error = e
        finally:
            self._ready.set()

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self._token is None:
            raise ConnectionLost("?", "the client is closed")
        return trio.from_thread.run(partial(fn, *args, **kwargs), trio_token=self._token)

    def create(self, segment: str, attributes: Sequence[AttributeUpdate] = ()) -> SegmentInfo:
        """See `Client.create`."""
        assert self._client is not None
        return self._run(self._client.create, segment, attributes)

    def append(self, segment: str, data: bytes, **kwargs: Any) -> AppendResult:
        """See `Client.append`."""
        assert self._client is not None
        return self._run(self._client.append, segment, data, **kwargs)

    def seal(self, segment: str) -> SegmentInfo:
        """See `Client.seal`."""
        assert self._client is not None
        return self._run(self._client.seal, segment)

    def flush(self, segment: str = "") -> None:
        """See `Client.flush`."""
        assert self._client is not None
        self._run(self._client.flush, segment)

    def truncate(self, segment: str, offset: int) -> SegmentInfo:
        """See `Client.truncate`."""
        assert self._client is not None
        return self._run(self._client.truncate, segment, offset)

    def delete(self, segment: str) -> None:
        """See `Client.delete`."""
        assert self._client is not None
        self._run(self._client.delete, segment)

    def info(self, segment: str) -> SegmentInfo:
        """See `Client.info`."""
        assert self._client is not None
        return self._run(self._client.info, segment)

    def list(self, prefix: str = "") -> list[SegmentInfo]:
        """See `Client.list`."""
        assert self._client is not None
        return self._run(self._client.list, prefix)

    def read(
        self, segment: str, offset: int = 0, max_length: int = 1 << 20, wait: float = 0.0
    ) -> ReadResult:
        """See `Client.read`."""
        assert self._client is not None
        return self._run(self._client.read, segment, offset, max_length, wait)

    def get_attributes(self, segment: str, ids: Iterable[bytes] = ()) -> dict[bytes, int]:
        """See `Client.get_attributes`."""
        assert self._client is not None
        return self._run(self._client.get_attributes, segment, list(ids))

    def close(self) -> None:
        """Disconnect and stop the background thread."""
        token, self._token = self._token, None
        if token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=token)
        self._thread.join()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
