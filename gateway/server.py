"""The protocol server: TCP connections in, container operations out.

Per connection, one reader task reads requests in order and *prepares* each
one at once (validation, offset assignment and journal submission happen in
arrival order), then hands an awaitable to the connection's responder task,
which sends the responses strictly in request order. A connection therefore
gets its appends acknowledged in order while many are in flight.

Memory (docs/SECURITY.md, "What a peer can do"): every queued request is
charged to its connection and to the server's `MemoryBudget` -- its own
bytes, a bound or estimate of its answer's (a read: the piece it holds; a
list: its entries, built only when its turn to be answered comes) and a
fixed ITEM_BYTES for its bookkeeping. A connection whose charge passes
``server.max_inflight_bytes`` stops being read (TCP pushes back on the
client); a request that does not fit in ``server.max_memory`` waits for
room before it is prepared. A large message reserves its length before its
buffer is allocated, waits at most ``server.memory_timeout`` for room (then
``Overloaded``, and the connection is closed), and must arrive within
``server.message_timeout``; an answer the peer does not take within
``server.send_timeout`` closes the connection, so a peer that stops reading
gives its memory back. The container answers ``Overloaded`` when the
journal cannot keep up within ``container.overload_timeout``.

File descriptors: connections are refused (LIMIT_EXCEEDED, then closed at
once) beyond ``server.max_connections`` or beyond what the descriptor limit
leaves after FD_RESERVE for the daemon's own files, whichever is lower, so
peers can never make the journal's next file fail to open.

Bad input never affects other connections: a malformed length, an
undecodable message, an unknown request kind or an oversize message gets an
error response (when one can be sent) and the connection is closed; nothing
of it was applied.

Security (docs/SECURITY.md): with ``server.tls_cert`` each accepted stream
is wrapped in TLS (1.2 at least) and the handshake runs in the connection's
own task under a deadline, so a slow, plaintext or hostile peer only costs
its own connection. With ``server.token`` the first request must be a Hello
carrying it (compared in constant time); nothing else is read before that.
With or without a token, the Hello must come within the same deadline and
be small (MAX_HELLO_BYTES), so unauthenticated peers cannot hoard
connection slots or memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import resource
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from google.protobuf.message import DecodeError

from gateway import __version__
from gateway.buffers import Buffer
from gateway.client.codec import Codec
from gateway.cluster.registry import UP
from gateway.cluster.remote import TAIL_READ_TIMEOUT, remote_attributes
from gateway.config import (
    STREAM_POLICY_MAX,
    ServerConfig,
    parse_host_port,
    stream_policy_text,
)
from gateway.container import AppendResult, AttributeUpdate, Verb
from gateway.container.attributes import ID_BYTES as ATTRIBUTE_ID_BYTES
from gateway.container.attributes import AttributesNotLoaded, closes_writers
from gateway.container.container import PendingOperation, SegmentContainer
from gateway.container.results import POLICY_FIELDS, ReadResult
from gateway.container.segment import Segment
from gateway.container.segment_names import validate_name, validate_prefix
from gateway.errors import (
    BadRequest,
    ConnectionLost,
    GatewayError,
    LimitExceeded,
    NotOwner,
    Overloaded,
    OwnerDown,
    ProtocolError,
    SegmentNotFound,
    Unauthorized,
    Unavailable,
    Unsupported,
)
from gateway.protocol import wire_pb2 as wire
from gateway.protocol.framing import (
    MessageStream,
    close_now,
    encode_read_response,
    misencoded_field,
    split_append_request,
)
from gateway.protocol.metadata_pb2 import AttributeValue

if TYPE_CHECKING:
    from gateway.cluster.claims import NameClaims
    from gateway.cluster.remote import RemoteNode
    from gateway.cluster.view import ClusterView
    from gateway.fsck.checks import Target

log = logging.getLogger(__name__)

PROTOCOL_VERSION = wire.PROTOCOL_VERSION_1
MAX_LIST = 10_000
#: A read request is answered with at most this much, in pieces of READ_PIECE.
MAX_READ = 64 * 1024 * 1024
READ_PIECE = 1024 * 1024
#: Seconds a client has to complete the TLS handshake, and then to send Hello.
HANDSHAKE_TIMEOUT = 10.0
#: The first message (Hello) may be at most this large, whatever max_message_bytes says.
MAX_HELLO_BYTES = 64 * 1024
#: What every queued request costs besides its bytes: its parsed form, its
#: queue entry, the closures that answer it (a queued read took ~1 KiB).
ITEM_BYTES = 4 * 1024
#: Estimated memory per segment of a List answer (or of an exported
#: snapshot) while it is built and sent: SegmentInfo objects, protobuf
#: messages, the wire form (measured: ~850 bytes with 10-character names;
#: longer names take more).
LIST_ENTRY_BYTES = 1024
#: Estimated memory of an fsck answer's messages in flight.
FSCK_BYTES = 1024 * 1024
#: Estimated bytes per attribute in a GetAttributes answer.
ATTRIBUTE_BYTES = 64
#: Attributes in a range answer: when the request says no limit, and at most.
DEFAULT_ATTRIBUTE_RANGE = 1000
MAX_ATTRIBUTE_RANGE = 10_000
#: File descriptors kept for the daemon's own files besides those open when
#: serving starts: new journal files, RocksDB tables, Tier-2 sockets, the
#: metrics endpoint's connections, fsck.
FD_RESERVE = 128
#: Refused connections are logged at most once per this many seconds.
REFUSAL_LOG_INTERVAL = 10.0

Producer = Callable[[], Awaitable[wire.Response]]


def _ready(response: wire.Response) -> Producer:
    """A producer for an answer that is already known."""

    async def produce() -> wire.Response:
        return response

    return produce


def _framed(response: wire.Response) -> bytes:
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


def _token_matches(given: str, token: str) -> bool:
    """Compare in constant time.

    Hashing first makes the time independent of the lengths too
    (`hmac.compare_digest` returns early when they differ).
    """
    return hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(token.encode()).digest()
    )


def _is_loopback(host: str) -> bool:
    """Whether a listen host is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _tls_reason(e: BaseException) -> str:
    """OpenSSL's words for why a TLS stream broke (trio wraps them)."""
    cause = e.__cause__ or e.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause)
    return str(cause or e) or "connection closed during the handshake"


def _codec(number: int) -> Codec:
    codec = Codec.from_number(number)
    if codec.number != number:
        raise BadRequest(f"unknown event codec {number}")
    return codec


def _updates(updates: list[wire.AttributeUpdate]) -> list[AttributeUpdate]:
    out = []
    for u in updates:
        try:
            verb = Verb(u.verb)
        except ValueError:
            raise BadRequest(f"unknown attribute verb {u.verb}") from None
        out.append(AttributeUpdate(u.id, verb, u.value, u.compare_value, u.expect_absent))
    return out


#: Appends at least this large skip copying their data out of the message.
_SPLIT_BYTES = 64 * 1024


@dataclass(eq=False)
class _Waiter:
    nbytes: int
    event: trio.Event
    granted: bool = False


class MemoryBudget:
    """The bytes all connections together may hold (``server.max_memory``).

    Waiters are served first come, first served, so a large message is not
    starved by a stream of small ones. When nothing is held, one holder may
    take more than the limit: a single request larger than it still goes
    through, alone.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        #: The most ever held at once.
        self.peak = 0
        #: Waits that ended without room (memory_timeout).
        self.refusals = 0
        self._waiters: deque[_Waiter] = deque()

    def _fits(self, nbytes: int) -> bool:
        return self.used == 0 or self.used + nbytes <= self.limit

    def _take(self, nbytes: int) -> None:
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def take(self, nbytes: int) -> None:
        """Account for ``nbytes`` without waiting (small, already in memory)."""
        self._take(nbytes)

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit, and take them (nothing is taken if cancelled)."""
        if not self._waiters and self._fits(nbytes):
            self._take(nbytes)
            return
        waiter = _Waiter(nbytes, trio.Event())
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            self._abandon(waiter)
            raise

    async def acquire_within(self, nbytes: int, seconds: float) -> bool:
        """`acquire`, waiting at most ``seconds``; False (nothing taken) if they did not fit."""
        with trio.move_on_after(seconds):
            await self.acquire(nbytes)
            return True
        self.refusals += 1
        return False

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.granted:
            self.release(waiter.nbytes)
        else:
            self._waiters.remove(waiter)
            self._wake()  # the next waiter may fit now that this one left the head

    def release(self, nbytes: int) -> None:
        """Give back what `take` or `acquire` accounted for."""
        self.used -= nbytes
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0].nbytes):
            waiter = self._waiters.popleft()
            self._take(waiter.nbytes)
            waiter.granted = True
            waiter.event.set()

    def statistics(self) -> dict[str, int]:
        """Bytes held now and at most, the limit, waiters, refusals."""
        return {
            "used": self.used,
            "peak": self.peak,
            "limit": self.limit,
            "waiting": len(self._waiters),
            "refusals": self.refusals,
        }


def fd_connection_limit(max_connections: int) -> tuple[int, str]:
    """How many connections the descriptor limit allows, and why (for the log).

    What is left of the soft RLIMIT_NOFILE after the descriptors open now
    (the journal, RocksDB, Tier 2, the mount, the metrics listener are all
    up when the server starts) and FD_RESERVE for what they open later.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections, "no file descriptor limit"
    try:
        in_use = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
    except OSError:
        in_use = 64  # no /proc: a typical count at this point
    allowed = soft - in_use - FD_RESERVE
    why = f"file descriptors: limit {soft}, {in_use} in use, {FD_RESERVE} kept for the daemon"
    if allowed < 1:
        log.warning(
            "%s: no room left for client connections; serving one at a time. "
            "Raise the limit (LimitNOFILE= in the unit, ulimit -n)",
            why,
        )
        return 1, why
    return allowed, why


@dataclass
class _Item:
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


class Connection:
    """One client connection."""

    def __init__(
        self,
        server: Server,
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
        #: Where name claims run (started when a create is read, so that the
        #: claims of pipelined creates overlap).
        self._nursery: trio.Nursery | None = None
        #: Creates read but not yet prepared (their claims in flight), and an
        #: event set when there are none: any other request waits for it, so
        #: every request is still prepared in arrival order.
        self._creates_pending = 0
        self._creates_idle = trio.Event()
        self._creates_idle.set()

    @property
    def inflight_bytes(self) -> int:
        """Bytes charged to this connection (requests and their answers)."""
        return self.charge

    async def run(self) -> None:
        send, receive = trio.open_memory_channel[_Item](math.inf)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
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

    async def _read_loop(self, send: trio.MemorySendChannel[_Item]) -> None:
        while True:
            try:
                if self.greeted:
                    raw = await self.messages.receive()
                else:
                    raw = await self._receive_hello()
            except (ProtocolError, Overloaded) as e:
                log.info("connection %s: %s; closing", self.peer, e)
                self._unreserve()
                await send.send(self._ready_error(0, e, close=True))
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

    async def _admit_message(self, raw: bytes | bytearray, reserved: int) -> _Item:
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
        decoded: wire.Request | _Item | None = None
        if split is not None:
            cost = nbytes + ITEM_BYTES
        else:
            decoded = self._decode(raw)
            if isinstance(decoded, _Item):
                cost = ITEM_BYTES
            else:
                cost = nbytes + ITEM_BYTES + self._answer_bytes(decoded)
        budget = self.server.memory
        extra = cost - reserved
        refused: GatewayError | None = None
        if extra <= 0:
            budget.release(-extra)
        elif isinstance(decoded, _Item):
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
        creating = isinstance(decoded, wire.Request) and _claims_name(decoded) is not None
        if self._creates_pending and not creating:
            # A create before it is still waiting for its name claim.
            await self._creates_idle.wait()
        if split is not None:
            item = await self._prepare_split_append(*split, nbytes)
        elif isinstance(decoded, _Item):
            item = decoded
        else:
            assert decoded is not None
            if refused is not None:
                item = self._ready_error(decoded.request_id, refused)
            else:
                item = await self._prepare(decoded, nbytes)
        item.cost = cost
        return item

    def _answer_bytes(self, req: wire.Request) -> int:
        """A bound (or, for answers of many segments, an estimate) of an answer's memory."""
        kind = req.WhichOneof("kind")
        if kind == "read":
            return min(req.read.max_length, MAX_READ, READ_PIECE) + 1024
        if kind == "list":
            limit = min(req.list.limit or MAX_LIST, MAX_LIST)
            return min(limit, self.server.container.segment_count) * LIST_ENTRY_BYTES
        if kind == "export_metadata":
            return self.server.container.segment_count * LIST_ENTRY_BYTES
        if kind == "fsck":
            return FSCK_BYTES
        if kind == "get_attributes":
            g = req.get_attributes
            n = len(g.ids) or min(g.limit or DEFAULT_ATTRIBUTE_RANGE, MAX_ATTRIBUTE_RANGE)
            return n * ATTRIBUTE_BYTES
        return 0

    async def _receive_hello(self) -> bytes | bytearray | None:
        """The first message: small, and within the handshake deadline.

        Until a client has said Hello (with the token) it may hold neither a
        connection slot for long nor much memory: otherwise anyone who can
        reach the port could fill server.max_connections with idle sockets
        or make the server buffer max_message_bytes each.
        """
        limit = self.messages.max_message_bytes
        self.messages.max_message_bytes = min(limit, MAX_HELLO_BYTES)
        try:
            with trio.move_on_after(self.server.handshake_timeout):
                return await self.messages.receive()
            log.info(
                "connection %s: no Hello within %.0fs; closing",
                self.peer,
                self.server.handshake_timeout,
            )
            return None
        finally:
            self.messages.max_message_bytes = limit

    def _ready_error(self, request_id: int, e: GatewayError, close: bool = False) -> _Item:
        return _Item(request_id, 0, _ready(error_response(request_id, e)), close)

    def _decode(self, raw: bytes | bytearray) -> wire.Request | _Item:
        """The request, or the error item that answers (and ends) the connection."""
        try:
            # upb parses any buffer (a bytearray saves a 1 MiB copy); stubs say bytes.
            req = wire.Request.FromString(raw)  # type: ignore[arg-type]
        except DecodeError as de:
            return self._ready_error(0, ProtocolError(f"undecodable request: {de}"), close=True)
        rid = req.request_id
        misencoded = misencoded_field(req)
        if misencoded is not None:
            return self._ready_error(
                rid, BadRequest(f"malformed request: {misencoded}"), close=not self.greeted
            )
        kind = req.WhichOneof("kind")
        if kind is None:
            return self._ready_error(
                rid, Unsupported("unknown or missing request kind (newer client?)"), close=True
            )
        if not self.greeted:
            if kind != "hello":
                e: GatewayError = (
                    Unauthorized("send Hello with the token first")
                    if self.server.config.token
                    else BadRequest("the first request must be Hello")
                )
                return self._ready_error(rid, e, close=True)
            return self._hello(rid, req.hello)
        if kind == "hello":
            return self._ready_error(rid, BadRequest("Hello was already sent"))
        return req

    async def _prepare(self, req: wire.Request, nbytes: int) -> _Item:
        """Prepare one request, in arrival order: it enters the journal now."""
        kind = str(req.WhichOneof("kind"))
        stream = STREAMED.get(kind)
        if stream is not None:
            return stream(self, req)
        handler = HANDLERS.get(kind)
        if handler is None:
            return self._ready_error(
                req.request_id, Unsupported(f"request kind {kind!r} is not served here")
            )
        if self.server.claims is not None and _claims_name(req) is not None:
            return self._claimed_create(req, nbytes)
        return await self._admit(
            req.request_id,
            nbytes,
            handler.changes and not _reads_only(req),
            lambda: handler.prepare(self, req),
            handler.frees
            or (
                kind == "update_attributes"
                and closes_writers(_updates(list(req.update_attributes.updates)))
            ),
        )

    async def _admit(
        self,
        rid: int,
        nbytes: int,
        mutating: bool,
        prepare: Callable[[], Producer],
        frees: bool = False,
    ) -> _Item:
        """Wait for room if the request changes anything, then prepare it.

        ``frees``: a deletion or truncation, which may go ahead while the
        journal's disk is full (the container decides whether it frees space).
        """
        try:
            if mutating:
                await self.server.container.wait_for_capacity(nbytes, reserved=frees)
            while True:
                try:
                    produce = prepare()
                    break
                except AttributesNotLoaded as e:
                    # Prefetch: the request waits (and the connection's later
                    # ones behind it, keeping their order) while the values
                    # come from the attribute index; then it is prepared again.
                    await self.server.container.load_attributes(e.segment, e.ids)
        except SegmentNotFound as e:
            return self._ready_error(rid, await self.server.not_owner(e))
        except GatewayError as e:
            return self._ready_error(rid, e)
        return _Item(rid, nbytes, produce)

    def _hello(self, rid: int, hello: wire.Hello) -> _Item:
        if hello.protocol_version != PROTOCOL_VERSION:
            return self._ready_error(
                rid,
                Unsupported(
                    f"protocol version {hello.protocol_version}; this server speaks "
                    f"{PROTOCOL_VERSION}"
                ),
                close=True,
            )
        token = self.server.config.token
        if token and not _token_matches(hello.token, token):
            # Never the token itself, nor what was sent instead (it may be a
            # near miss of the real one).
            log.warning("connection %s: bad or missing token; closing", self.peer)
            return self._ready_error(rid, Unauthorized("bad or missing token"), close=True)
        self.greeted = True
        response = wire.Response(
            request_id=rid,
            hello=wire.HelloResponse(
                protocol_version=PROTOCOL_VERSION,
                server=f"segment-gateway {__version__}",
                max_message_bytes=self.server.config.max_message_bytes,
                max_append_bytes=self.server.container_config_max_append,
            ),
        )
        return _Item(rid, 0, _ready(response))

    async def _prepare_split_append(
        self, rid: int, a: wire.AppendRequest, data: memoryview, nbytes: int
    ) -> _Item:
        """`_prepare` for a large append whose data is a view of the message."""
        return await self._admit(rid, nbytes, True, lambda: self._append_data(rid, a, data))

    # -- request kinds: each prepares now and returns how to answer later -------

    @staticmethod
    def _pending_info(rid: int, op: PendingOperation) -> Producer:
        async def produce() -> wire.Response:
            return wire.Response(request_id=rid, info=(await op.wait()).to_wire())

        return produce

    def _claimed_create(self, req: wire.Request, nbytes: int) -> _Item:
        """A create in a cluster: its name claimed in Tier 2 first, then created here.

        The claim starts now; the create is prepared when its answer's turn
        comes and its claim is done. Requests read after it wait for that
        (`_admit_message`), except further creates, whose claims overlap.
        """
        claims = self.server.claims
        assert claims is not None and self._nursery is not None
        name = _claims_name(req)
        assert name is not None
        rid = req.request_id
        container = self.server.container
        claimed = trio.Event()
        failure: list[GatewayError] = []

        async def claim() -> None:
            try:
                validate_name(name)
                await claims.claim(name)
            except GatewayError as e:
                failure.append(e)
            finally:
                claimed.set()

        self._creates_pending += 1
        self._creates_idle = trio.Event()
        self._nursery.start_soon(claim)

        async def produce() -> wire.Response:
            try:
                await claimed.wait()
                if failure:
                    raise failure[0]
                await container.wait_for_capacity(nbytes)
                if req.WhichOneof("kind") == "stream":
                    produce_stream = _stream(self, req)
                else:
                    op = container.prepare_create(
                        name, _updates(list(req.create.attributes)), _codec(req.create.codec)
                    )
            except GatewayError as e:
                return error_response(rid, e)
            finally:
                self._creates_pending -= 1
                if not self._creates_pending:
                    self._creates_idle.set()
            if req.WhichOneof("kind") == "stream":
                return await produce_stream()
            return wire.Response(request_id=rid, info=(await op.wait()).to_wire())

        return _Item(rid, nbytes, produce)

    def _create(self, req: wire.Request) -> Producer:
        op = self.server.container.prepare_create(
            req.create.segment, _updates(list(req.create.attributes)), _codec(req.create.codec)
        )
        return self._pending_info(req.request_id, op)

    def _append(self, req: wire.Request) -> Producer:
        return self._append_data(req.request_id, req.append, req.append.data)

    def _append_data(self, rid: int, a: wire.AppendRequest, data: Buffer) -> Producer:
        op = self.server.container.prepare_append(
            a.segment,
            data,
            expected_offset=a.expected_offset if a.HasField("expected_offset") else None,
            attribute_updates=_updates(list(a.attribute_updates)),
            writer_id=a.writer_id,
            event_number=a.event_number,
            previous_event_number=a.previous_event_number,
            event_count=a.event_count,
        )

        async def produce() -> wire.Response:
            r: AppendResult = await op.wait()
            return wire.Response(
                request_id=rid,
                append=wire.AppendResponse(offset=r.offset, length=r.length, segment=r.segment),
            )

        return produce

    def _seal(self, req: wire.Request) -> Producer:
        return self._pending_info(
            req.request_id, self.server.container.prepare_seal(req.seal.segment)
        )

    def _truncate(self, req: wire.Request) -> Producer:
        t = req.truncate
        return self._pending_info(
            req.request_id, self.server.container.prepare_truncate(t.segment, t.offset)
        )

    def _delete(self, req: wire.Request) -> Producer:
        name = req.delete.segment
        op = self.server.container.prepare_delete(name)
        rid = req.request_id
        claims = self.server.claims

        async def produce() -> wire.Response:
            await op.wait()
            if claims is not None:
                await claims.release(name)  # the name is free for every node again
            return wire.Response(request_id=rid, done=wire.Done())

        return produce

    def _flush(self, req: wire.Request) -> Producer:
        container = self.server.container
        rid = req.request_id
        name = req.flush.segment
        if name:
            container.info(name)  # fail now if missing, in order
        timeout_ms = req.flush.timeout_ms
        if timeout_ms > MAX_FLUSH_TIMEOUT_MS:
            raise BadRequest(
                f"flush timeout of {timeout_ms} ms is above {MAX_FLUSH_TIMEOUT_MS} ms (30 days)"
            )
        within = timeout_ms / 1000 if timeout_ms else None

        async def produce() -> wire.Response:
            # Retried within its time: "make it durable and wait until done"
            # outlasts a Tier 2 that is briefly down (docs/OPERATIONS.md).
            await container.flush(name, within, retry=True)
            return wire.Response(request_id=rid, done=wire.Done())

        return produce

    def _export_metadata(self, req: wire.Request) -> Producer:
        container = self.server.container
        node = self.server.node
        rid = req.request_id

        async def produce() -> wire.Response:
            # Taken when its turn to answer comes: it includes everything
            # this connection asked for before.
            from gateway.tier2.snapshots import build_snapshot

            journal = container.journal
            epoch = journal.epoch if journal is not None else 0
            snapshot = build_snapshot(container.committed_snapshot(), node, epoch)
            return wire.Response(
                request_id=rid,
                metadata=wire.ExportMetadataResponse(snapshot=snapshot.SerializeToString()),
            )

        return produce

    def _update_attributes(self, req: wire.Request) -> Producer:
        u = req.update_attributes
        op = self.server.container.prepare_update_attributes(u.segment, _updates(list(u.updates)))
        return self._pending_info(req.request_id, op)

    def _get_info(self, req: wire.Request) -> Producer:
        name = req.get_info.segment
        rid = req.request_id
        server = self.server
        try:
            info = server.container.info(name)
        except SegmentNotFound:
            node, seg = server.remote_segment(name)

            async def produce() -> wire.Response:
                # From the owner while it answers (as fresh as a local one),
                # else what this node knows of it.
                remote = seg.info()
                client = node.client
                if client is not None:
                    with trio.move_on_after(TAIL_READ_TIMEOUT), contextlib.suppress(GatewayError):
                        remote = await client.info(name)
                return wire.Response(request_id=rid, info=remote.to_wire())

            return produce
        return _ready(wire.Response(request_id=rid, info=info.to_wire()))

    def _get_record(self, req: wire.Request) -> Producer:
        # This node's segments only: other nodes ask each owner.
        response = wire.Response(
            request_id=req.request_id,
            record=self.server.container.record(req.get_record.segment),
        )
        return _ready(response)

    def _cluster(self, req: wire.Request) -> Producer:
        cluster = self.server.cluster
        nodes = cluster.status() if cluster is not None else []
        response = wire.Response(request_id=req.request_id, cluster=wire.ClusterStatus(nodes=nodes))
        return _ready(response)

    def _list(self, req: wire.Request) -> Producer:
        r = req.list
        rid = req.request_id
        container = self.server.container
        limit = min(r.limit or MAX_LIST, MAX_LIST)
        validate_prefix(r.prefix)  # fail now, in order

        async def produce() -> wire.Response:
            # Built when its turn to be answered comes, not when it is read:
            # queued answers would hold memory nobody may be reading. It
            # includes everything this connection asked for before.
            infos = container.list(r.prefix, r.start_after, limit + 1)
            cluster = self.server.cluster
            if cluster is not None and not r.local_only:
                # Other nodes' segments too; a name held twice shows once.
                names = {i.name for i in infos}
                infos += [
                    seg.info()
                    for seg in cluster.segments()
                    if seg.name.startswith(r.prefix)
                    and seg.name > r.start_after
                    and seg.name not in names
                ]
                infos = sorted(infos, key=lambda i: i.name)[: limit + 1]
            return wire.Response(
                request_id=rid,
                list=wire.SegmentList(
                    segments=[i.to_wire() for i in infos[:limit]],
                    truncated=len(infos) > limit,
                ),
            )

        return produce

    def _get_attributes(self, req: wire.Request) -> Producer:
        g = req.get_attributes
        container = self.server.container
        rid = req.request_id
        try:
            container.check_exists(g.segment)  # fail now if missing, in order
        except SegmentNotFound:
            if g.from_owner:
                raise  # NOT_OWNER or OWNER_DOWN (`_admit`), never a view's values
            # Another node's segment: from its owner while it answers, else
            # from what this node knows of it (a down owner's flushed record).
            return self._remote_attributes(req, *self.server.remote_segment(g.segment))

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

    def _remote_attributes(self, req: wire.Request, node: RemoteNode, seg: Segment) -> Producer:
        """Attributes of another node's segment (`_get_attributes` for a remote one)."""
        g = req.get_attributes
        rid = req.request_id
        store = self.server.container.attribute_store
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
                                    values=[
                                        AttributeValue(id=k, value=v) for k, v in values.items()
                                    ]
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

    def _read(self, req: wire.Request) -> _Item:
        r = req.read
        rid = req.request_id
        server = self.server
        container = server.container

        async def read(name: str, offset: int, size: int, wait: float) -> ReadResult:
            try:
                return await container.read(name, offset, size, wait=wait)
            except SegmentNotFound:
                # Another node's segment: read it as this node's mount does.
                node, seg = server.remote_segment(name)
                return await node.read_result(seg, offset, size, wait)

        async def stream() -> AsyncGenerator[list[bytes], None]:
            offset = r.offset
            remaining = min(r.max_length, MAX_READ)
            wait = r.wait_ms / 1000
            while True:
                result = await read(r.segment, offset, min(remaining, READ_PIECE), wait)
                wait = 0.0  # only the first piece waits at the tail
                offset += len(result.data)
                remaining -= len(result.data)
                last = not result.data or remaining <= 0 or offset >= result.length
                head = wire.ReadResponse(
                    offset=result.offset,
                    length=result.length,
                    start_offset=result.start_offset,
                    sealed=result.sealed,
                    last=last,
                )
                yield encode_read_response(rid, head, result.data)
                if last:
                    return

        return _Item(rid, 0, None, stream=stream)

    def _fsck(self, req: wire.Request) -> _Item:
        """fsck's checks on the live state (gateway/fsck/online.py), answered as they go."""
        server = self.server
        rid = req.request_id

        async def push(send: Callable[[bytes], Awaitable[None]]) -> None:
            from gateway.fsck.online import live_target, serve_fsck

            target = server.fsck_target() if server.fsck_target else live_target(server.container)
            await serve_fsck(target, req.fsck, rid, send)

        return _Item(rid, 0, None, push=push)

    # -- responses ---------------------------------------------------------------

    async def _send_stream(self, item: _Item) -> None:
        """Send a read's pieces as they are produced (errors end the answer)."""
        if item.push is not None:
            await item.push(self.messages.send_message)
            return
        assert item.stream is not None
        # Closed here even when a send fails, not whenever it is collected.
        async with contextlib.aclosing(item.stream()) as pieces:
            async for parts in pieces:
                await self.messages.send(parts)

    async def _respond(self, receive: trio.MemoryReceiveChannel[_Item]) -> None:
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
            close_now(self.transport)


#: The longest wait a flush request may ask for (FlushRequest.timeout_ms).
MAX_FLUSH_TIMEOUT_MS = 30 * 86400 * 1000


def _reads_only(req: wire.Request) -> bool:
    """A request of a changing kind that changes nothing (a stream's get or list):
    answered without waiting for room in the journal, like any read."""
    return req.WhichOneof("kind") == "stream" and req.stream.action in (
        wire.STREAM_GET,
        wire.STREAM_LIST,
    )


def _claims_name(req: wire.Request) -> str | None:
    """The name a request creates, which a cluster claims first (segment or stream create)."""
    kind = req.WhichOneof("kind")
    if kind == "create":
        return req.create.segment
    if kind == "stream" and req.stream.action == wire.STREAM_CREATE:
        return req.stream.name
    return None


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


def _stream(conn: Connection, req: wire.Request) -> Producer:
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
        op = c.prepare_set_stream(r.name, _policy(r.policy), create=True, codec=_codec(r.codec))
    elif action == wire.STREAM_SET:
        op = c.prepare_set_stream(r.name, _policy(r.policy))
    else:
        raise BadRequest(f"unknown stream action {action}")

    async def changed() -> wire.Response:
        return wire.Response(request_id=rid, stream=(await op.wait()).to_wire())

    return changed


def _transaction(conn: Connection, req: wire.Request) -> Producer:
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


@dataclass(frozen=True)
class Handler:
    """How the server takes one kind of request."""

    #: Prepares it now (in arrival order) and returns how to answer later.
    prepare: Callable[[Connection, wire.Request], Producer]
    #: Changes something: waits for room in the journal and the cache first.
    changes: bool = False
    #: Frees journal space (a deletion or truncation): admitted while the
    #: journal's disk is full.
    frees: bool = False


#: Every request kind after Hello, by its name in wire.proto's Request.kind
#: (tests/test_protocol.py checks that none is missing).
HANDLERS: dict[str, Handler] = {
    "create": Handler(Connection._create, changes=True),
    "append": Handler(Connection._append, changes=True),
    "seal": Handler(Connection._seal, changes=True),
    "truncate": Handler(Connection._truncate, changes=True, frees=True),
    "delete": Handler(Connection._delete, changes=True, frees=True),
    "update_attributes": Handler(Connection._update_attributes, changes=True),
    "flush": Handler(Connection._flush),
    "export_metadata": Handler(Connection._export_metadata),
    "get_info": Handler(Connection._get_info),
    "get_record": Handler(Connection._get_record),
    "cluster": Handler(Connection._cluster),
    "list": Handler(Connection._list),
    "get_attributes": Handler(Connection._get_attributes),
    "stream": Handler(_stream, changes=True),
    "transaction": Handler(_transaction, changes=True),
}
#: Kinds answered as a stream of responses, produced as they go.
STREAMED: dict[str, Callable[[Connection, wire.Request], _Item]] = {
    "read": Connection._read,
    "fsck": Connection._fsck,
}


class Server:
    """Accepts connections and serves the protocol until cancelled."""

    def __init__(
        self,
        container: SegmentContainer,
        config: ServerConfig,
        max_append: int,
        node: str = "",
        fsck_target: Callable[[], Target] | None = None,
        cluster: ClusterView | None = None,
        claims: NameClaims | None = None,
    ) -> None:
        self.container = container
        #: Other nodes and their segments (None: this node alone).
        self.cluster = cluster
        #: Cluster-wide name claims (None: names are this node's alone).
        self.claims = claims
        self.config = config
        #: ``node.id``, named in exported metadata snapshots.
        self.node = node
        #: The live state fsck checks (its Tier-2 parts included); without
        #: it, the container alone (no Tier 2 to check).
        self.fsck_target = fsck_target
        #: TLS for every connection (None: plain TCP); ConfigError if the files do not load.
        self.ssl_context: ssl.SSLContext | None = config.ssl_context()
        #: Seconds a client has to complete the TLS handshake, and then to send Hello.
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        #: TLS handshakes in progress, and those that failed or timed out.
        self.handshaking = 0
        self.handshake_failures = 0
        self.container_config_max_append = max_append
        self.connections: set[Connection] = set()
        self.accepted = 0
        #: What all connections together hold in memory (server.max_memory).
        self.memory = MemoryBudget(config.max_memory)
        #: Connections allowed at once: server.max_connections, or fewer if
        #: the file descriptor limit says so (set when serving starts).
        self.connection_limit = config.max_connections
        #: Sockets (TLS handshakes and connections) the descriptor limit allows.
        self.socket_limit = config.max_connections
        self._limit_reason = "server.max_connections"
        #: Connections closed because their peer stopped taking answers.
        self.stalled_closed = 0
        #: Connections refused for a limit, and when refusals were last logged.
        self.refused = 0
        self._refused_logged = 0
        self._next_refusal_log = -math.inf
        self._listeners: list[trio.SocketListener] = []
        self._accepting = trio.CancelScope()
        self._no_connections = trio.Event()
        self._no_connections.set()

    async def not_owner(self, e: SegmentNotFound) -> GatewayError:
        """For a request about a segment this node does not have: NotOwner if another has it.

        Known from following the other nodes, or -- for a segment created
        since the last poll -- from its name claim in Tier 2. An owner that
        is down (no heartbeat for ``cluster.down_after``, or fenced) gets
        `OwnerDown` instead: sending the client there would only fail.
        """
        name = str(e.args[0]) if e.args else ""
        cluster, claims = self.cluster, self.claims
        owner = cluster.owner_of(name) if cluster is not None else None
        if owner is None and claims is not None and name:
            try:
                holder = await claims.owner(name)
            except GatewayError:
                holder = None
            if holder is not None and holder != claims.node_id:
                owner = (holder, cluster.address_of(holder) if cluster is not None else "")
        if owner is None:
            return e
        if cluster is not None and cluster.state_of(owner[0]) != UP:
            return OwnerDown(name, owner[0], cluster.describe(owner[0]), owner[1])
        return NotOwner(name, *owner)

    def remote_segment(self, name: str) -> tuple[RemoteNode, Segment]:
        """Another node's segment with this name, and that node; SegmentNotFound if none."""
        found = self.cluster.find(name) if self.cluster is not None else None
        if found is None:
            raise SegmentNotFound(name)
        return found

    async def serve(self, *, task_status: trio.TaskStatus[list[tuple[str, int]]]) -> None:
        """Listen on ``server.listen``; ``task_status.started`` gets the bound addresses."""
        host, port = parse_host_port(self.config.listen)
        if not _is_loopback(host):
            self._warn_exposed()
        self._listeners = await trio.open_tcp_listeners(port, host=host)
        addresses = [tuple(lst.socket.getsockname()[:2]) for lst in self._listeners]
        log.info("serving the protocol on %s", ", ".join(f"{h}:{p}" for h, p in addresses))
        self._apply_fd_limit()
        task_status.started(addresses)
        async with trio.open_nursery() as watch:
            watch.start_soon(self._close_stalled_readers)
            # Connections carry on after accepting stops, and the watch with them.
            async with trio.open_nursery() as nursery:
                with self._accepting:
                    await trio.serve_listeners(
                        self._handle, self._listeners, handler_nursery=nursery
                    )
            watch.cancel_scope.cancel()

    async def _close_stalled_readers(self) -> None:
        """Close connections whose peer has not taken an answer for server.send_timeout.

        Their queued answers hold memory (``server.max_inflight_bytes`` each)
        that other clients may be waiting for. One look a second (or four
        per timeout, if it is short) costs less than a deadline per message.
        """
        timeout = self.config.send_timeout
        while True:
            await trio.sleep(min(1.0, timeout / 4))
            now = trio.current_time()
            for conn in list(self.connections):
                started = conn.messages.send_started
                if started is not None and now - started >= timeout:
                    log.info(
                        "connection %s: answers not taken for %.0fs (server.send_timeout); closing",
                        conn.peer,
                        now - started,
                    )
                    self.stalled_closed += 1
                    conn.abort()

    def _apply_fd_limit(self) -> None:
        """Bound connections by what the file descriptor limit leaves (logged)."""
        allowed, why = fd_connection_limit(self.config.max_connections)
        self.socket_limit = allowed
        self.connection_limit = min(self.config.max_connections, allowed)
        if allowed < self.config.max_connections:
            self._limit_reason = "the file descriptor limit; server.max_connections is " + str(
                self.config.max_connections
            )
        log.info(
            "connections: at most %d (server.max_connections %d; %s)",
            self.connection_limit,
            self.config.max_connections,
            why,
        )

    def _note_refusal(self, peer: str, what: str) -> None:
        """Count a refused connection; log at most once per REFUSAL_LOG_INTERVAL."""
        self.refused += 1
        now = trio.current_time()
        if now < self._next_refusal_log:
            return
        log.warning(
            "refusing connections: %s (%d refused since the last report, the latest from %s; "
            "reported at most every %.0fs)",
            what,
            self.refused - self._refused_logged,
            peer,
            REFUSAL_LOG_INTERVAL,
        )
        self._refused_logged = self.refused
        self._next_refusal_log = now + REFUSAL_LOG_INTERVAL

    def _limit_error(self) -> LimitExceeded:
        return LimitExceeded(f"{self.connection_limit} connections ({self._limit_reason})")

    async def _refuse(self, tcp: trio.SocketStream, peer: str, plaintext: bool) -> None:
        """Say LIMIT_EXCEEDED (when that costs nothing) and close at once."""
        e = self._limit_error()
        self._note_refusal(peer, str(e))
        try:
            if plaintext:
                with trio.move_on_after(1):
                    await tcp.send_all(_framed(error_response(0, e)))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            close_now(tcp)

    def _warn_exposed(self) -> None:
        """Say loudly what a non-loopback listener exposes without a token or TLS."""
        listen, tls = self.config.listen, self.ssl_context is not None
        if not self.config.token:
            log.warning(
                "server.listen is %s without server.token: ANYONE who can reach this port "
                "can read, write, truncate and delete EVERY segment%s. Set server.token "
                "(and server.tls_cert/server.tls_key), or listen on 127.0.0.1",
                listen,
                "" if tls else ", and the data crosses the network unencrypted",
            )
        elif not tls:
            log.warning(
                "server.listen is %s without TLS: the token and all segment data cross the "
                "network in clear text; anyone who can watch the traffic can steal the token. "
                "Set server.tls_cert and server.tls_key",
                listen,
            )

    def stop_accepting(self) -> None:
        """Close the listening sockets; established connections carry on."""
        self._accepting.cancel()

    def stop_reading(self) -> None:
        """Stop reading new requests on every connection; queued ones are answered."""
        for conn in list(self.connections):
            conn.reader_scope.cancel()

    async def _handshake(
        self, tcp: trio.SocketStream, peer: str
    ) -> trio.SSLStream[trio.SocketStream] | None:
        """The TLS stream over ``tcp`` once the handshake is done; None if it failed."""
        assert self.ssl_context is not None
        tls = trio.SSLStream(tcp, self.ssl_context, server_side=True)
        reason = "timed out"
        with trio.move_on_after(self.handshake_timeout):
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as e:
                # A plaintext client, a client that does not trust our
                # certificate, or (with tls_client_ca) one without a good
                # certificate: an everyday event, not the server's problem.
                reason = _tls_reason(e)
            else:
                return tls
        self.handshake_failures += 1
        log.info("connection %s: TLS handshake failed: %s; closing", peer, reason)
        close_now(tcp)
        return None

    async def _handle(self, tcp: trio.SocketStream) -> None:
        try:
            peer = "{}:{}".format(*tcp.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        self.accepted += 1
        if self.handshaking + len(self.connections) >= self.socket_limit:
            # Every socket is a descriptor, wherever it is in its life: the
            # daemon's own files must never be the ones that do not open.
            await self._refuse(tcp, peer, plaintext=self.ssl_context is None)
            return
        stream: trio.abc.Stream = tcp
        if self.ssl_context is not None:
            # Handshakes cost CPU and are not yet Connections: bound them too.
            if self.handshaking >= self.connection_limit:
                log.info("connection %s: too many TLS handshakes in progress; closing", peer)
                self.handshake_failures += 1
                close_now(tcp)
                return
            self.handshaking += 1
            try:
                tls = await self._handshake(tcp, peer)
            finally:
                self.handshaking -= 1
            if tls is None:
                return
            if self._accepting.cancel_called:
                close_now(tcp)  # the daemon began stopping during the handshake
                return
            stream = tls
        conn = Connection(self, stream, peer, transport=tcp)
        if len(self.connections) >= self.connection_limit:
            e = self._limit_error()
            self._note_refusal(peer, str(e))
            try:
                with trio.move_on_after(1):
                    await conn.messages.send_message(error_response(0, e).SerializeToString())
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ProtocolError):
                pass
            finally:
                close_now(tcp)
            return
        self.connections.add(conn)
        if self._no_connections.is_set():
            self._no_connections = trio.Event()
        try:
            await conn.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.connections.discard(conn)
            if not self.connections:
                self._no_connections.set()

    def statistics(self) -> dict[str, int]:
        """Counters for tests and status: connections, refusals, handshakes, memory."""
        memory = self.memory.statistics()
        return {
            "connections": len(self.connections),
            "connection_limit": self.connection_limit,
            "accepted": self.accepted,
            "refused": self.refused,
            "stalled_closed": self.stalled_closed,
            "handshaking": self.handshaking,
            "handshake_failures": self.handshake_failures,
            "memory_used": memory["used"],
            "memory_peak": memory["peak"],
            "memory_refusals": memory["refusals"],
        }

    async def wait_connections_closed(self) -> None:
        """Wait until no connection is open."""
        await self._no_connections.wait()
