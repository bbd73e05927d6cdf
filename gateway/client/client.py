"""Client library: an async (trio) client and a small synchronous wrapper.

::

    async with open_client("127.0.0.1:9410") as client:
        await client.create("scope/stream/0")
        r = await client.append("scope/stream/0", b"event")

Requests are pipelined: many may be in flight on one connection, and
`Client.start_append` sends an append without waiting for its answer. Errors
arrive as the same exception classes the daemon raises (gateway.errors).
For exactly-once event streams use `gateway.client.writer.SegmentWriter`.

TLS (a daemon with ``server.tls_cert``): pass ``tls_ca="ca.pem"`` to trust
that CA only, or ``ssl_context=client_ssl_context()`` for the system CAs (or
any context of your own, e.g. with a client certificate for
``server.tls_client_ca``). The server's certificate and name are verified;
a failure is a `ConnectionLost` saying why.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import trio

from gateway import __version__
from gateway.aio import service_nursery
from gateway.client.codec import Codec
from gateway.config import parse_host_port
from gateway.container import AppendResult, AttributeUpdate, ReadResult, SegmentInfo
from gateway.container.results import StreamInfo, TransactionInfo
from gateway.errors import (
    BY_WIRE_CODE,
    ConfigError,
    ConnectionLost,
    GatewayError,
    NotOwner,
    OwnerDown,
    ProtocolError,
    os_reason,
)
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import MessageStream, close_now, encode_append_request
from gateway.protocol.metadata_pb2 import MetadataSnapshot, SegmentRecord

T = TypeVar("T")
log = logging.getLogger(__name__)
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024


def error_from_wire(err: wire.Error) -> GatewayError:
    """The exception for an Error response."""
    cls = BY_WIRE_CODE.get(wire.ErrorCode.Name(err.code), GatewayError)
    e = cls.from_text(err.message)
    if err.code in (wire.BAD_OFFSET, wire.SEGMENT_TRUNCATED):
        e.expected_offset = err.expected_offset  # type: ignore[attr-defined]
    if err.code == wire.CONDITIONAL_CHECK_FAILED:
        e.last_event_number = err.last_event_number  # type: ignore[attr-defined]
    if err.owner:
        e.owner = err.owner  # type: ignore[attr-defined]
        e.owner_address = err.owner_address  # type: ignore[attr-defined]
    return e


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


def client_ssl_context(
    ca_file: str | None = None, *, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A TLS context that verifies the server: against ``ca_file`` only, or the system CAs.

    ``cert_file``/``key_file`` (PEM) present a client certificate, for a
    daemon with ``server.tls_client_ca``. Unreadable or malformed files raise
    ConfigError naming the file.
    """
    errors: list[str] = []
    ctx: ssl.SSLContext | None = None
    try:
        # With a cafile, create_default_context trusts that file alone.
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        errors.append(f"tls_ca {ca_file}: cannot load CA certificates: {os_reason(e)}")
    if ctx is not None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert_file or key_file:
            try:
                ctx.load_cert_chain(cert_file or key_file or "", key_file)
            except (OSError, ssl.SSLError) as e:
                errors.append(f"tls_cert {cert_file} / tls_key {key_file}: {os_reason(e)}")
    if errors or ctx is None:
        raise ConfigError("the client's TLS settings", errors)
    return ctx


#: OpenSSL reasons and what usually causes them.
_TLS_HINTS = (
    (("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE", "UNKNOWN_CA"),
     "the server refused us: does it want a client certificate it trusts?"),
    (("WRONG_VERSION_NUMBER", "RECORD_LAYER", "PACKET_LENGTH_TOO_LONG"),
     "does the server use TLS on this port?"),
    (("EOF",), "the server hung up: does it want a client certificate it trusts?"),
)  # fmt: skip


def describe_tls_failure(e: BaseException, server_hostname: str = "") -> str:
    """One line saying why a TLS connection failed, with a hint at the usual cause.

    trio raises BrokenResourceError with the ssl error as its cause.
    """
    cause = e if isinstance(e, ssl.SSLError) else (e.__cause__ or e.__context__)
    if isinstance(cause, ssl.SSLCertVerificationError):
        what = cause.verify_message or os_reason(cause)
        if "mismatch" in what.lower():
            return (
                f"the server's certificate is not valid for {server_hostname!r}: {what} "
                "(connect by a name the certificate lists, or set the server name to check)"
            )
        return (
            f"the server's certificate is not trusted: {what} (is the CA file the one "
            "that signed the server's certificate?)"
        )
    if isinstance(cause, ssl.SSLError):
        reason = os_reason(cause)
        for marks, hint in _TLS_HINTS:
            if any(m in reason.upper() for m in marks):
                return f"TLS failed: {reason} ({hint})"
        return f"TLS failed: {reason}"
    return str(e) or type(e).__name__


class Client:
    """One connection to a daemon. Get one from `open_client`."""

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
        self._follow: Callable[[str], AbstractAsyncContextManager[Client]] | None = None
        #: Connections to other nodes, by address, and where each segment
        #: this client was sent away for lives.
        self._peers: dict[str, tuple[Client, trio.CancelScope]] = {}
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

    async def fsck(
        self, deep: bool = False, repair: bool = False
    ) -> AsyncIterator[wire.FsckResponse]:
        """Have the daemon run fsck's checks on its state; its messages as they arrive.

        The closing message (``last``) is not yielded. ``repair`` allows only
        the repairs that are safe while it runs (docs/OPERATIONS.md, "fsck").
        """
        rid = self._new_request_id()
        send, receive = trio.open_memory_channel[wire.Response | GatewayError](math.inf)
        self._streams[rid] = send
        req = wire.Request(request_id=rid, fsck=wire.FsckRequest(deep=deep, repair=repair))
        await self._send((req.SerializeToString(),))
        async with receive:
            async for item in receive:
                if isinstance(item, GatewayError):
                    raise item
                if item.WhichOneof("kind") == "error":
                    raise error_from_wire(item.error)
                if not item.fsck.last:
                    yield item.fsck

    async def _call(self, **kind: Any) -> wire.Response:
        def build(rid: int) -> Sequence[bytes]:
            return (wire.Request(request_id=rid, **kind).SerializeToString(),)

        return await (await self.start(build)).wait()

    async def _peer(self, address: str) -> Client:
        """The connection to another node (opened the first time, or again once broken)."""
        async with self._peer_lock:
            held = self._peers.get(address)
            if held is not None and held[0]._broken is None:
                return held[0]
            if held is not None:
                held[1].cancel()
            follow, nursery = self._follow, self._nursery
            assert follow is not None and nursery is not None

            async def hold(
                *, task_status: trio.TaskStatus[tuple[Client, trio.CancelScope]]
            ) -> None:
                # Opened and closed in this task: its nursery must not change tasks.
                with trio.CancelScope() as scope:
                    async with follow(address) as peer:
                        task_status.started((peer, scope))
                        await trio.sleep_forever()

            self._peers[address] = await nursery.start(hold)
            return self._peers[address][0]

    async def _routed(self, segment: str, call: Callable[[Client], Awaitable[T]]) -> T:
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

    # -- operations ------------------------------------------------------------------

    async def create(
        self,
        segment: str,
        attributes: Sequence[AttributeUpdate] = (),
        codec: Codec | str = Codec.RAW,
    ) -> SegmentInfo:
        """Create a segment; ``codec`` (raw, lines, framed) says how its events end."""
        r = await self._call(
            create=wire.CreateSegmentRequest(
                segment=segment,
                attributes=_wire_updates(attributes),
                codec=Codec(codec).number,  # type: ignore[arg-type]
            )
        )
        return SegmentInfo.from_wire(r.info)

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
        address = self._owners.get(segment)
        target = self if address is None else await self._peer(address)
        return await target.start(partial(_append_parts, req, data))

    async def append(self, segment: str, data: bytes, **kwargs: Any) -> AppendResult:
        """Append and wait for the acknowledgement (keywords as `start_append`).

        Sent to the segment's owner: a node that does not have it answers
        NotOwner, and the append goes to the owner instead (once).
        """

        async def append(c: Client) -> wire.Response:
            return await (await c.start_append(segment, data, **kwargs)).wait()

        r = await self._routed(segment, append)
        return AppendResult(r.append.offset, r.append.length, r.append.segment or segment)

    async def seal(self, segment: str) -> SegmentInfo:
        """Seal a segment."""
        return SegmentInfo.from_wire(
            (await self._segment_call(segment, seal=wire.SealRequest(segment=segment))).info
        )

    async def truncate(self, segment: str, offset: int) -> SegmentInfo:
        """Drop the bytes below ``offset``."""
        r = await self._segment_call(
            segment, truncate=wire.TruncateRequest(segment=segment, offset=offset)
        )
        return SegmentInfo.from_wire(r.info)

    async def delete(self, segment: str) -> None:
        """Delete a segment."""
        await self._segment_call(segment, delete=wire.DeleteRequest(segment=segment))

    async def flush(self, segment: str = "", within: float = 0.0) -> None:
        """Flush a segment ("" = all) to Tier 2; returns once it is there.

        The daemon retries failed attempts meanwhile; with ``within`` (seconds,
        0 = no bound) it gives up once that has passed, and the error
        (`Tier2Error`, ``TIER2_UNAVAILABLE``) says what was still to be uploaded.
        """
        request = wire.FlushRequest(segment=segment, timeout_ms=math.ceil(within * 1000))
        if segment:
            await self._segment_call(segment, flush=request)
        else:
            await self._call(flush=request)

    async def export_metadata(self) -> MetadataSnapshot:
        """The committed metadata of every segment (chunk lists, attributes)."""
        response = await self._call(export_metadata=wire.ExportMetadataRequest())
        return MetadataSnapshot.FromString(response.metadata.snapshot)

    async def record(self, segment: str) -> SegmentRecord:
        """A segment's whole committed record: chunk list, attributes, event index."""
        return (await self._call(get_record=wire.GetRecordRequest(segment=segment))).record

    async def cluster(self) -> list[wire.NodeStatus]:
        """The cluster's nodes as the connected node sees them in the registry."""
        return list((await self._call(cluster=wire.ClusterRequest())).cluster.nodes)

    async def info(self, segment: str) -> SegmentInfo:
        """A segment's committed metadata."""
        return SegmentInfo.from_wire(
            (await self._call(get_info=wire.GetInfoRequest(segment=segment))).info
        )

    async def list(self, prefix: str = "", local_only: bool = False) -> list[SegmentInfo]:
        """Every segment whose name starts with ``prefix`` (all pages), sorted by name.

        Every node's segments, as the connected node knows them; with
        ``local_only``, the connected node's own.
        """
        out: list[SegmentInfo] = []
        start_after = ""
        while True:
            r = await self._call(
                list=wire.ListSegmentsRequest(
                    prefix=prefix, start_after=start_after, local_only=local_only
                )
            )
            out.extend(SegmentInfo.from_wire(m) for m in r.list.segments)
            if not r.list.truncated or not r.list.segments:
                return out
            start_after = r.list.segments[-1].name

    async def get_attributes(
        self, segment: str, ids: Iterable[bytes] = (), *, from_owner: bool = False
    ) -> dict[bytes, int]:
        """Attribute values (those of ``ids`` that exist; all of them without ``ids``).

        All of them means every extended attribute in the segment's index:
        with many, prefer `iter_attributes`. ``from_owner`` (with ``ids``):
        only the owner's values, never another node's view of them (which
        may be older); `OwnerDown` while the owner is down.
        """
        wanted = list(ids)
        if not wanted:
            return {k: v async for k, v in self.iter_attributes(segment)}
        request = wire.GetAttributesRequest(segment=segment, ids=wanted, from_owner=from_owner)
        r = await self._segment_call(segment, get_attributes=request)
        return {v.id: v.value for v in r.attributes.values}

    async def attribute_range(
        self, segment: str, start: bytes = b"", limit: int = 0
    ) -> tuple[builtins.list[tuple[bytes, int]], bytes]:
        """Attributes with ids >= ``start`` in id order, at most ``limit`` (0: the server's
        default, 1,000), and the id to continue from (``b""``: no more)."""
        r = await self._segment_call(
            segment,
            get_attributes=wire.GetAttributesRequest(segment=segment, start=start, limit=limit),
        )
        return [(v.id, v.value) for v in r.attributes.values], r.attributes.next

    async def iter_attributes(
        self, segment: str, start: bytes = b"", batch: int = 1000
    ) -> AsyncIterator[tuple[bytes, int]]:
        """Every attribute with id >= ``start``, in id order, ``batch`` per request."""
        while True:
            items, start = await self.attribute_range(segment, start, batch)
            for item in items:
                yield item
            if not start:
                return

    async def update_attributes(
        self, segment: str, updates: Sequence[AttributeUpdate]
    ) -> SegmentInfo:
        """Update attributes atomically."""
        r = await self._segment_call(
            segment,
            update_attributes=wire.UpdateAttributesRequest(
                segment=segment, updates=_wire_updates(updates)
            ),
        )
        return SegmentInfo.from_wire(r.info)

    # -- streams -----------------------------------------------------------------------

    async def _stream_call(
        self,
        action: int,
        name: str = "",
        policy: Mapping[str, int | None] | None = None,
        codec: Codec = Codec.RAW,
    ) -> wire.Response:
        p = wire.StreamPolicy()
        for key, value in (policy or {}).items():
            if value is None:
                p.reset.append(key)
            else:
                setattr(p, key, value)
        request = wire.StreamRequest(
            action=action,  # type: ignore[arg-type]
            name=name,
            policy=p,
            codec=codec.number,  # type: ignore[arg-type]
        )
        if not name:
            return await self._call(stream=request)
        return await self._segment_call(name, stream=request)

    async def create_stream(
        self,
        name: str,
        policy: Mapping[str, int | None] | None = None,
        codec: Codec | str = Codec.RAW,
    ) -> StreamInfo:
        """Create a stream; ``policy``: roll_size, roll_age_ms, retain_size, retain_age_ms
        (unset ones follow the daemon's ``[streams]`` defaults, 0 turns one off);
        ``codec`` (raw, lines, framed): every segment of the stream is created with it."""
        return StreamInfo.from_wire(
            (await self._stream_call(wire.STREAM_CREATE, name, policy, Codec(codec))).stream
        )

    async def set_stream(self, name: str, policy: Mapping[str, int | None]) -> StreamInfo:
        """Change a stream's policies (a None value: back to the default)."""
        return StreamInfo.from_wire((await self._stream_call(wire.STREAM_SET, name, policy)).stream)

    async def stream(self, name: str) -> StreamInfo:
        """A stream's policies and segments."""
        return StreamInfo.from_wire((await self._stream_call(wire.STREAM_GET, name)).stream)

    async def list_streams(self) -> builtins.list[StreamInfo]:
        """Every stream of the connected node."""
        r = await self._stream_call(wire.STREAM_LIST)
        return [StreamInfo.from_wire(m) for m in r.streams.streams]

    async def stream_names(self) -> builtins.list[str]:
        """The names of every stream of the connected node (without their segments)."""
        request = wire.StreamRequest(action=wire.STREAM_LIST, names_only=True)
        r = await self._call(stream=request)
        return [m.name for m in r.streams.streams]

    async def roll_stream(self, name: str) -> StreamInfo:
        """Seal a stream's current segment now."""
        return StreamInfo.from_wire((await self._stream_call(wire.STREAM_ROLL, name)).stream)

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and all its segments."""
        await self._stream_call(wire.STREAM_DELETE, name)

    # -- transactions ----------------------------------------------------------------------

    async def begin_transaction(self, parent: str, txn_timeout: float = 0.0) -> TransactionInfo:
        """Start a transaction on a segment or stream; append to the returned name.

        Aborted by the daemon unless committed within ``txn_timeout`` seconds
        (0: its ``streams.txn_timeout``).
        """
        r = await self._segment_call(
            parent,
            transaction=wire.TransactionRequest(
                action=wire.TXN_BEGIN, parent=parent, timeout_ms=int(txn_timeout * 1000)
            ),
        )
        info = TransactionInfo.from_wire(r.transaction)
        owner = self._owners.get(parent)
        if owner is not None:
            self._owners[info.name] = owner  # the transaction lives beside its parent
        return info

    async def commit_transaction(self, name: str) -> TransactionInfo:
        """Merge a transaction into its parent atomically; where its bytes landed."""
        r = await self._segment_call(
            name, transaction=wire.TransactionRequest(action=wire.TXN_COMMIT, name=name)
        )
        self._owners.pop(name, None)
        return TransactionInfo.from_wire(r.transaction)

    async def abort_transaction(self, name: str) -> None:
        """Drop a transaction."""
        await self._segment_call(
            name, transaction=wire.TransactionRequest(action=wire.TXN_ABORT, name=name)
        )
        self._owners.pop(name, None)


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


async def _start_tls(
    tcp: trio.SocketStream, address: str, ssl_context: ssl.SSLContext, server_hostname: str
) -> trio.SSLStream[trio.SocketStream]:
    """TLS over ``tcp``, handshake done; ConnectionLost saying why if it fails."""
    tls = trio.SSLStream(tcp, ssl_context, server_hostname=server_hostname)
    try:
        # Explicitly, so that a certificate problem is reported as such
        # rather than as a broken first request.
        await tls.do_handshake()
    except trio.BrokenResourceError as e:
        close_now(tcp)
        raise ConnectionLost(address, describe_tls_failure(e, server_hostname)) from None
    except BaseException:
        close_now(tcp)
        raise
    return tls


#: How long connecting (TCP, TLS, Hello) may take by default: a server that
#: accepts and never answers (a stopped process, a black hole) is not waited on.
CONNECT_TIMEOUT = 10.0


@asynccontextmanager
async def open_client(
    address: str,
    token: str = "",
    client_name: str = f"segment-gateway-client/{__version__}",
    *,
    ssl_context: ssl.SSLContext | None = None,
    tls_ca: str | None = None,
    server_hostname: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> AsyncIterator[Client]:
    """Connect to ``address`` (``HOST:PORT``), say Hello, and yield a Client.

    TLS when ``ssl_context`` or ``tls_ca`` (a PEM CA file: shorthand for
    ``client_ssl_context(tls_ca)``) is given; the server's certificate must
    name ``server_hostname`` (default: the host of ``address``). Connecting,
    the TLS handshake and Hello together take at most ``connect_timeout``
    seconds (`ConnectionLost` otherwise); connections this client opens to
    follow a segment to its owning node get the same bound.
    """
    host, port = parse_host_port(address)
    if tls_ca is not None:
        if ssl_context is not None:
            raise ValueError("give ssl_context or tls_ca, not both")
        ssl_context = client_ssl_context(tls_ca)
    deadline = trio.current_time() + connect_timeout
    try:
        with trio.fail_at(deadline):
            tcp = await _connect(host, port)
    except OSError as e:
        raise ConnectionLost(address, f"cannot connect: {e.strerror or e}") from None
    except trio.TooSlowError:
        raise ConnectionLost(
            address, f"cannot connect: no answer within {connect_timeout:g}s"
        ) from None
    stream: trio.abc.Stream = tcp
    if ssl_context is not None:
        try:
            with trio.fail_at(deadline):
                stream = await _start_tls(tcp, address, ssl_context, server_hostname or host)
        except trio.TooSlowError:
            close_now(tcp)
            raise ConnectionLost(address, f"no TLS handshake within {connect_timeout:g}s") from None
    client = Client(stream, address, transport=tcp)
    # Connections to the nodes that own segments this client is sent away
    # for: the same settings, and they never follow further themselves.
    client._follow = partial(
        _open_peer,
        token=token,
        client_name=client_name,
        ssl_context=ssl_context,
        connect_timeout=connect_timeout,
    )
    try:
        async with service_nursery() as nursery:
            client._nursery = nursery
            nursery.start_soon(client._receive_loop)
            try:
                try:
                    with trio.fail_at(deadline):
                        await client._hello(token, client_name)
                except trio.TooSlowError:
                    raise ConnectionLost(
                        address,
                        f"the server accepted the connection but did not answer Hello within "
                        f"{connect_timeout:g}s (is the process stopped or hung?)",
                    ) from None
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await client.aclose()


@asynccontextmanager
async def _open_peer(
    address: str,
    *,
    token: str,
    client_name: str,
    ssl_context: ssl.SSLContext | None,
    connect_timeout: float,
) -> AsyncIterator[Client]:
    async with open_client(
        address, token, client_name, ssl_context=ssl_context, connect_timeout=connect_timeout
    ) as peer:
        peer._follow = None
        yield peer


class SyncClient:
    """A blocking wrapper: the async client on a trio loop in a background thread.

    ::

        with SyncClient("127.0.0.1:9410") as c:
            c.create("logs/app")
            c.append("logs/app", b"line\\n")
    """

    def __init__(
        self,
        address: str,
        token: str = "",
        *,
        ssl_context: ssl.SSLContext | None = None,
        tls_ca: str | None = None,
        server_hostname: str | None = None,
    ) -> None:
        """Connect (TLS keywords as in `open_client`); errors raise here."""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        connect = partial(
            open_client,
            address,
            token,
            ssl_context=ssl_context,
            tls_ca=tls_ca,
            server_hostname=server_hostname,
        )
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, connect), daemon=True, name="gateway-client"
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, connect: Callable[[], AbstractAsyncContextManager[Client]]) -> None:
        try:
            async with connect() as client:
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

    def create(
        self,
        segment: str,
        attributes: Sequence[AttributeUpdate] = (),
        codec: Codec | str = Codec.RAW,
    ) -> SegmentInfo:
        """See `Client.create`."""
        assert self._client is not None
        return self._run(self._client.create, segment, attributes, codec)

    def append(self, segment: str, data: bytes, **kwargs: Any) -> AppendResult:
        """See `Client.append`."""
        assert self._client is not None
        return self._run(self._client.append, segment, data, **kwargs)

    def seal(self, segment: str) -> SegmentInfo:
        """See `Client.seal`."""
        assert self._client is not None
        return self._run(self._client.seal, segment)

    def flush(self, segment: str = "", within: float = 0.0) -> None:
        """See `Client.flush`."""
        assert self._client is not None
        self._run(self._client.flush, segment, within)

    def truncate(self, segment: str, offset: int) -> SegmentInfo:
        """See `Client.truncate`."""
        assert self._client is not None
        return self._run(self._client.truncate, segment, offset)

    def delete(self, segment: str) -> None:
        """See `Client.delete`."""
        assert self._client is not None
        self._run(self._client.delete, segment)

    def export_metadata(self) -> MetadataSnapshot:
        """See `Client.export_metadata`."""
        assert self._client is not None
        return self._run(self._client.export_metadata)

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

    def attribute_range(
        self, segment: str, start: bytes = b"", limit: int = 0
    ) -> tuple[builtins.list[tuple[bytes, int]], bytes]:
        """See `Client.attribute_range`."""
        assert self._client is not None
        return self._run(self._client.attribute_range, segment, start, limit)

    def update_attributes(self, segment: str, updates: Sequence[AttributeUpdate]) -> SegmentInfo:
        """See `Client.update_attributes`."""
        assert self._client is not None
        return self._run(self._client.update_attributes, segment, list(updates))

    def create_stream(
        self,
        name: str,
        policy: Mapping[str, int | None] | None = None,
        codec: Codec | str = Codec.RAW,
    ) -> StreamInfo:
        """See `Client.create_stream`."""
        assert self._client is not None
        return self._run(self._client.create_stream, name, policy, codec)

    def set_stream(self, name: str, policy: Mapping[str, int | None]) -> StreamInfo:
        """See `Client.set_stream`."""
        assert self._client is not None
        return self._run(self._client.set_stream, name, policy)

    def stream(self, name: str) -> StreamInfo:
        """See `Client.stream`."""
        assert self._client is not None
        return self._run(self._client.stream, name)

    def roll_stream(self, name: str) -> StreamInfo:
        """See `Client.roll_stream`."""
        assert self._client is not None
        return self._run(self._client.roll_stream, name)

    def delete_stream(self, name: str) -> None:
        """See `Client.delete_stream`."""
        assert self._client is not None
        self._run(self._client.delete_stream, name)

    def begin_transaction(self, parent: str, txn_timeout: float = 0.0) -> TransactionInfo:
        """See `Client.begin_transaction`."""
        assert self._client is not None
        return self._run(self._client.begin_transaction, parent, txn_timeout)

    def commit_transaction(self, name: str) -> TransactionInfo:
        """See `Client.commit_transaction`."""
        assert self._client is not None
        return self._run(self._client.commit_transaction, name)

    def abort_transaction(self, name: str) -> None:
        """See `Client.abort_transaction`."""
        assert self._client is not None
        self._run(self._client.abort_transaction, name)

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
