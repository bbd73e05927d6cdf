"""Client library: the async (trio) client.

::

    async with open_client("127.0.0.1:9410") as client:
        await client.create("scope/stream/0")
        r = await client.append("scope/stream/0", b"event")

Requests are pipelined: many may be in flight on one connection, and
`Client.start_append` sends an append without waiting for its answer. Errors
arrive as the same exception classes the daemon raises (gateway.errors).
For exactly-once event streams use `gateway.client.writer.SegmentWriter`;
for a blocking client, `gateway.client.sync.SyncClient`.

TLS (a daemon with ``server.tls_cert``): pass ``tls_ca="ca.pem"`` to trust
that CA only, or ``ssl_context=client_ssl_context()`` for the system CAs (or
any context of your own, e.g. with a client certificate for
``server.tls_client_ca``). The server's certificate and name are verified;
a failure is a `ConnectionLost` saying why.
"""

from __future__ import annotations

import builtins
import math
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from gateway import __version__
from gateway.aio import service_nursery
from gateway.client.connection import (
    DEFAULT_MAX_MESSAGE,
    Connection,
    ResponseFuture,
    error_from_wire,
)
from gateway.client.tls import client_ssl_context, describe_tls_failure, start_tls
from gateway.config import parse_host_port
from gateway.container import AppendResult, AttributeUpdate, ReadResult, SegmentInfo
from gateway.container.results import StreamInfo, TransactionInfo
from gateway.errors import ConnectionLost, GatewayError, Unsupported
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.codec import Codec
from gateway.protocol.framing import close_now, encode_append_request
from gateway.protocol.metadata_pb2 import MetadataSnapshot, SegmentRecord

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_MAX_MESSAGE",
    "Client",
    "ResponseFuture",
    "client_ssl_context",
    "describe_tls_failure",
    "error_from_wire",
    "open_client",
]


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


class Client(Connection):
    """One connection to a daemon and the requests it sends. Get one from `open_client`."""

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

    def serves(self, kind: str) -> bool:
        """Whether the server named request ``kind`` among its features in Hello
        (kinds added after protocol version 1's first set, such as "changes")."""
        hello = self.server_hello
        return hello is not None and kind in hello.features

    async def changes(
        self,
        cursor: wire.ChangeCursor | None = None,
        limit: int = 0,
        streams_digest: int = 0,
        walk_after: str | None = None,
    ) -> wire.ChangesResponse:
        """One page of what changed among the connected node's own segments since
        ``cursor`` (None: none yet; answered ``resync``): docs/FORMATS.md, "Change feed".
        With ``walk_after`` (a name, "" for the first), a page of the walk instead:
        every segment's record in name order after it.

        Ask only if `serves` ("changes"): an older server closes the connection.
        """
        request = wire.ChangesRequest(cursor=cursor, limit=limit, streams_digest=streams_digest)
        if walk_after is not None:
            request.walk = True
            request.walk_after = walk_after
        return (await self._call(changes=request)).changes

    async def cluster(self, take_over: str = "", forget: str = "") -> list[wire.NodeStatus]:
        """The cluster's nodes as the connected node sees them in the registry.

        ``take_over``: first have the connected node take that node's container
        over (a drain; `gateway.cluster.handover`). ``forget``: first retire that
        node for good (``cluster forget``).
        """
        request = wire.ClusterRequest(take_over=take_over, forget=forget)
        return list((await self._call(cluster=request)).cluster.nodes)

    async def status(self) -> wire.NodeSummary:
        """The connected node at a glance (`segment-gateway status`); Unsupported from
        a server that does not name "status" among its features."""
        if not self.serves("status"):
            raise Unsupported("the daemon is older than the status request: see its /metrics")
        return (await self._call(status=wire.StatusRequest())).status

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
                stream = await start_tls(tcp, address, ssl_context, server_hostname or host)
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
