"""SegmentWriter: an exactly-once event writer for one segment.

Events are numbered 1, 2, 3... per writer (a UUID) and segment. The writer
batches encoded events into appends of up to ``max_batch_bytes`` (or after
``linger`` seconds), keeps up to ``max_inflight_bytes`` of them in flight on
one connection, and tags each append with its writer id, the number of its
last event and the number of the last event before it. The container stores
the writer's last event number atomically with the data
(ReplaceIfEquals), so an append that already landed cannot land twice.

When the connection breaks (or the daemon restarts), the writer reconnects,
asks for its stored event number, drops the batches that are already stored
and resends the rest, unchanged and in order: every event lands exactly once.

Codecs (docs/FORMATS.md, "Event codecs"): ``raw`` (events as they are),
``lines`` (each event followed by ``\\n``; events must not contain one) and
``framed`` (4-byte big-endian length, then the event).

Bulk producers that have events already encoded (a block of whole lines
read from a file) hand them over with `SegmentWriter.write_encoded`: one
append per block, no per-event Python work and no copy.
"""

from __future__ import annotations

import logging
import math
import ssl
import struct
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from gateway.aio import service_nursery
from gateway.client.client import CONNECT_TIMEOUT, Client, ResponseFuture, open_client
from gateway.container.attributes import AttributeUpdate, Verb
from gateway.container.results import TransactionInfo
from gateway.errors import (
    ConditionalCheckFailed,
    ConnectionLost,
    GatewayError,
    NotOwner,
    Overloaded,
    OwnerDown,
    ProtocolError,
    Unavailable,
)
from gateway.protocol.codec import Codec, whole_frames

log = logging.getLogger(__name__)
T = TypeVar("T")

_LENGTH = struct.Struct(">I")
#: Errors after which reconnecting and resending is the right thing to do.
RETRYABLE = (ConnectionLost, Overloaded, Unavailable, ProtocolError)
#: The longest an append may go unanswered before the writer reconnects and
#: resends (bounded by ``reconnect_timeout``).
ACK_TIMEOUT = 30.0


class WriterFailed(GatewayError):
    """segment writer for {!r} failed: {}"""

    exit_code = 25


class WriterClosed(WriterFailed):
    """segment writer for {!r} failed: {}"""


def closed_value(stored: int) -> int:
    """The value that closes a writer id whose last stored event is ``stored``.

    Negative, so no append of the writer (its previous event number is never
    below 0) matches it again; ``-(stored + 1)`` keeps the number readable.
    """
    return -(stored + 1)


async def close_writer(client: Client, segment: str, writer_id: bytes, stored: int) -> int:
    """Close a writer id for good; return its last stored event number.

    Appends a writer sent may still wait in the daemon after the writer has
    stopped (behind a full journal, in a connection the daemon has not seen
    close yet) and land later. Once this returns none of them can: the
    writer's event number is replaced, by a compare-and-set from the stored
    one, with a value no append expects (`closed_value`). ``stored`` is what
    the caller knows is stored; when an append lands meanwhile, the compare
    fails and the new number is read and closed instead. A writer id that is
    closed refuses to write again (`WriterClosed`): a run that reads its
    input afresh takes a new id.
    """
    while True:
        answer = await client.get_attributes(segment, [writer_id], from_owner=True)
        current = answer.get(writer_id, 0)
        if current < 0:
            return -current - 1  # closed already
        stored = max(stored, current)
        try:
            await client.update_attributes(
                segment,
                [
                    AttributeUpdate(
                        writer_id,
                        Verb.REPLACE_IF_EQUALS,
                        closed_value(stored),
                        compare_value=stored,
                        expect_absent=stored == 0,
                    )
                ],
            )
        except ConditionalCheckFailed:
            continue  # an append landed meanwhile: read the number again
        return stored


class _Resync(Exception):
    """The server's view of this writer differs from ours: reconnect and resync."""


@dataclass(slots=True)
class _Batch:
    first: int  # number of the first event in it
    last: int  # number of the last event in it
    data: bytes  # the encoded events, as sent (and resent)
    sent_at: float = 0.0  # when it was last sent (trio clock)

    @property
    def count(self) -> int:
        return self.last - self.first + 1


class SegmentWriter:
    """Writes events to one segment exactly once. Get one from `open_segment_writer`.

    When the producer is faster than the daemon, the window fills and an
    event's acknowledgement waits about ``max_inflight_bytes`` / throughput.
    The defaults (64 KiB batches, 512 KiB in flight) were measured here to
    give ~0.8M 100-byte events/s from one writer with p99 acks of 10-13 ms;
    128 KiB / 1 MiB gave ~1M/s at p99 16-20 ms, 512 KiB / 8 MiB ~1.1M/s at
    p99 ~100 ms (docs/PERFORMANCE.md).

    ``token``, ``ssl_context`` and ``server_hostname`` are passed to
    `gateway.client.client.open_client` on every (re)connection.
    """

    def __init__(
        self,
        address: str,
        segment: str,
        *,
        writer_id: bytes | None = None,
        codec: Codec | str = Codec.RAW,
        token: str = "",
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        max_batch_bytes: int = 64 * 1024,
        linger: float = 0.002,
        max_inflight_bytes: int = 512 * 1024,
        reconnect_timeout: float = 300.0,
    ) -> None:
        self.address = address
        #: Where the writer was pointed: asked again when the owner it was
        #: sent to stops answering (the owner may have moved or come back).
        self._home = address
        self.segment = segment
        self.writer_id = writer_id or uuid.uuid4().bytes
        if len(self.writer_id) != 16:
            raise ValueError("writer_id must be 16 bytes (a UUID)")
        self.codec = Codec(codec)
        self._token = token
        # Every reconnect uses the same TLS settings (see `open_client`).
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname
        self._max_batch = max_batch_bytes
        self._linger = linger
        self._max_inflight = max_inflight_bytes
        self._reconnect_timeout = reconnect_timeout
        #: An append unanswered this long means the connection is dead.
        self._ack_timeout = max(1.0, min(reconnect_timeout, ACK_TIMEOUT))

        self._buf = bytearray()
        self._buf_events = 0
        self._batch_gen = 0
        self._next_event = 1
        self._unsent: deque[_Batch] = deque()
        self._unacked: deque[_Batch] = deque()
        self._window = 0
        self._has_work = trio.Event()
        self._progress = trio.Event()
        self._linger_start = trio.Event()
        self._failed: GatewayError | None = None
        #: Highest event number known to be stored.
        self.acked_event = 0
        #: The daemon's largest append (its Hello answer); 0: not known.
        self.max_append_bytes = 0
        #: When the writer last started failing without an acknowledgement since.
        self._broken_since: float | None = None
        self.reconnects = 0
        self.duplicates = 0
        self.appends = 0

    # -- writing -------------------------------------------------------------------

    async def write(self, event: bytes) -> None:
        """Queue one event. Waits only when ``max_inflight_bytes`` are unacknowledged.

        Yields to the scheduler once per batch, not per event: this is called
        hundreds of thousands of times a second.
        """
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        if self.codec is Codec.LINES:
            if b"\n" in event:
                raise ValueError("an event of the lines codec must not contain a newline")
            buf += event
            buf += b"\n"
        elif self.codec is Codec.FRAMED:
            buf += _LENGTH.pack(len(event))
            buf += event
        else:
            buf += event
        self._buf_events += 1
        if len(buf) >= self._max_batch:
            self._cut()
            # Once per batch, let the sender put it on the wire now; without
            # this a fast producer fills the whole window before anything is
            # sent, and every ack waits behind max_inflight_bytes.
            await trio.lowlevel.checkpoint()
            while self._window > self._max_inflight:
                await self._wait_progress()
        elif self._buf_events == 1:
            self._linger_start.set()

    async def write_encoded(self, data: bytes, events: int | None = None) -> int:
        """Queue a block of events already encoded by the writer's codec, as one append.

        ``data`` must be exactly what `write` would have sent for its events:
        for ``lines`` each event followed by ``\\n`` (the last byte is one),
        for ``framed`` whole frames, for ``raw`` any bytes. ``events`` is how
        many events it holds: counted when None (raw: one), checked when
        given. A block that is not whole events, or is larger than the
        daemon's ``max_append_bytes``, is refused (ValueError) with nothing
        queued. The events get the next numbers, after anything written
        before; returns how many there are. ``data`` is sent as it is,
        without a copy, and kept until it is acknowledged (it may be resent).
        Waits like `write` when the window is full.
        """
        if self._failed is not None:
            raise self._failed
        if self.max_append_bytes and len(data) > self.max_append_bytes:
            raise ValueError(
                f"a block of {len(data)} bytes is larger than the daemon's largest append "
                f"({self.max_append_bytes} bytes)"
            )
        found = _count_encoded(self.codec, data, events)
        self._cut()  # what write() buffered goes first: numbers stay in order
        first = self._next_event
        self._next_event = first + found
        self._unsent.append(_Batch(first, first + found - 1, data))
        self._window += len(data)
        self._has_work.set()
        await trio.lowlevel.checkpoint()
        while self._window > self._max_inflight:
            await self._wait_progress()
        return found

    def _cut(self) -> None:
        """Turn the buffered events into a batch ready to send."""
        if not self._buf_events:
            return
        first = self._next_event
        batch = _Batch(first, first + self._buf_events - 1, bytes(self._buf))
        self._next_event = batch.last + 1
        self._buf.clear()
        self._buf_events = 0
        self._batch_gen += 1
        self._unsent.append(batch)
        self._window += len(batch.data)
        self._has_work.set()

    async def _wait_progress(self) -> None:
        if self._failed is not None:
            raise self._failed
        await self._progress.wait()
        if self._failed is not None:
            raise self._failed

    async def flush(self) -> None:
        """Send what is buffered and wait until every event written so far is stored."""
        self._cut()
        while self._unsent or self._unacked:
            await self._wait_progress()
        if self._failed is not None:
            raise self._failed

    @property
    def next_event_number(self) -> int:
        """The number the next written event gets."""
        return self._next_event + self._buf_events

    def statistics(self) -> dict[str, int]:
        """Counters for tests and benchmarks."""
        return {
            "acked_event": self.acked_event,
            "appends": self.appends,
            "reconnects": self.reconnects,
            "duplicates": self.duplicates,
            "inflight_bytes": self._window,
        }

    # -- background: linger, connection, sending, acknowledgements -------------------

    async def _run_linger(self) -> None:
        while True:
            await self._linger_start.wait()
            self._linger_start = trio.Event()
            gen = self._batch_gen
            await trio.sleep(self._linger)
            if gen == self._batch_gen:
                self._cut()

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _fail(self, e: GatewayError) -> None:
        """Stop for good: later writes and flushes raise ``e`` (the server's own error)."""
        if self._failed is None:
            self._failed = e
        self._signal_progress()

    def _resume(self, stored: int) -> None:
        """Drop what the server has stored, queue the rest for resending, in order."""
        if stored < self.acked_event:
            raise WriterFailed(
                self.segment,
                f"the server has event {stored} stored for writer {self.writer_id.hex()}, "
                f"but event {self.acked_event} was acknowledged",
            )
        pending = [*self._unacked, *self._unsent]
        self._unacked.clear()
        self._unsent.clear()
        for b in pending:
            if b.last <= stored:
                self._window -= len(b.data)
                self.duplicates += 1
            elif b.first <= stored:
                raise WriterFailed(self.segment, f"stored event {stored} splits a batch")
            else:
                self._unsent.append(b)
        self.acked_event = max(self.acked_event, stored)
        if self._unsent:
            self._has_work.set()
        self._signal_progress()

    async def _run(self, *, task_status: trio.TaskStatus[None]) -> None:
        first = True
        delay = 0.05
        followed = False
        while True:
            try:
                async with open_client(
                    self.address,
                    self._token,
                    ssl_context=self._ssl_context,
                    server_hostname=self._server_hostname,
                    connect_timeout=min(CONNECT_TIMEOUT, max(1.0, self._reconnect_timeout)),
                ) as client:
                    if client.server_hello is not None:
                        self.max_append_bytes = client.server_hello.max_append_bytes
                    # From the owner: another node's view may be older than
                    # what was acknowledged (its owner down since its snapshot).
                    # Bounded like an append: an owner (or the node that
                    # forwards to it) that takes the question and never
                    # answers counts as gone, and the writer tries again.
                    try:
                        with trio.fail_after(self._ack_timeout):
                            answer = await client.get_attributes(
                                self.segment, [self.writer_id], from_owner=True
                            )
                    except trio.TooSlowError:
                        raise ConnectionLost(
                            self.address,
                            f"no answer to the writer's event number within {self._ack_timeout:g}s",
                        ) from None
                    stored = answer.get(self.writer_id, 0)
                    if stored < 0:
                        raise WriterClosed(
                            self.segment,
                            f"writer {uuid.UUID(bytes=self.writer_id)} was closed after its "
                            f"event {-stored - 1} (a run that gave up); a new run takes a new "
                            "writer id",
                        )
                    if first:
                        self._next_event = stored + 1
                        self.acked_event = stored
                    self._resume(stored)
                    if first:
                        task_status.started()
                        first = False
                    await self._session(client)
            except NotOwner as e:
                # Another node owns the segment: write there (once; nothing
                # was appended here, and the owner's stored event number
                # decides what is resent).
                if followed or not e.owner_address:
                    self._fail(e)
                    if first:
                        raise
                    return
                followed = True
                log.info("segment writer %s: the segment lives on node %s at %s; following",
                         self.segment, e.owner, e.owner_address)  # fmt: skip
                self.address = e.owner_address
            except (*RETRYABLE, _Resync) as e:
                if first:
                    raise
                # Stuck since the first failure after the last acknowledgement:
                # a daemon that accepts connections but refuses every append
                # (Overloaded: a full disk) counts as down.
                now = trio.current_time()
                if self._broken_since is None:
                    # The first failure since an acknowledgement: retry soon.
                    # (Not after every connect: a daemon that takes the
                    # connection and refuses every append -- a full disk, no
                    # lease -- would be asked many times a second.)
                    self._broken_since = now
                    delay = 0.05
                if now - self._broken_since > self._reconnect_timeout:
                    why = f"gave up after {self._reconnect_timeout:g}s of retrying: {e}"
                    # A down owner keeps its own error (and exit code): it
                    # says which segment, which node, and since when.
                    self._fail(
                        OwnerDown.from_text(why)
                        if isinstance(e, OwnerDown)
                        else WriterFailed(self.segment, why)
                    )
                    return
                self.reconnects += 1
                if self.address != self._home and isinstance(e, ConnectionLost | Unavailable):
                    # The owner we were sent to does not answer, or no longer
                    # speaks for the segment (taken over): ask again where it
                    # lives now.
                    self.address = self._home
                    followed = False
                log.info("segment writer %s: %s; reconnecting in %.2fs", self.segment, e, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except GatewayError as e:
                self._fail(e)
                if first:
                    raise
                return

    async def _session(self, client: Client) -> None:
        send, receive = trio.open_memory_channel[Any](float("inf"))
        async with service_nursery() as nursery:
            nursery.start_soon(self._send_loop, client, send)
            try:
                await self._ack_loop(receive)
            finally:
                nursery.cancel_scope.cancel()

    async def _send_loop(self, client: Client, send: trio.MemorySendChannel[Any]) -> None:
        """Send batches in order; never raises (errors go to the ack loop)."""
        while True:
            while not self._unsent:
                await self._has_work.wait()
                self._has_work = trio.Event()
            batch = self._unsent.popleft()
            batch.sent_at = trio.current_time()
            self._unacked.append(batch)
            try:
                fut = await client.start_append(
                    self.segment,
                    batch.data,
                    writer_id=self.writer_id,
                    event_number=batch.last,
                    previous_event_number=batch.first - 1,
                    event_count=batch.count,
                )
            except GatewayError as e:
                send.send_nowait(e)
                return
            self.appends += 1
            send.send_nowait((batch, fut))

    async def _ack_loop(self, receive: trio.MemoryReceiveChannel[Any]) -> None:
        while True:
            # An append still being sent (the daemon reads nothing: stopped,
            # hung) is under the same deadline as one sent and unanswered.
            deadline = self._unacked[0].sent_at + self._ack_timeout if self._unacked else math.inf
            try:
                with trio.fail_at(deadline):
                    item = await receive.receive()
            except trio.EndOfChannel:
                return
            except trio.TooSlowError:
                if self._broken_since is None:
                    self._broken_since = self._unacked[0].sent_at
                raise ConnectionLost(
                    self.address, f"an append not sent within {self._ack_timeout:g}s"
                ) from None
            if isinstance(item, BaseException):
                raise item
            batch: _Batch = item[0]
            fut: ResponseFuture = item[1]
            try:
                # A daemon that takes the append and never answers (stopped,
                # hung, cut off) counts as gone once the oldest append has
                # waited the whole timeout: reconnect and resend.
                with trio.fail_at(batch.sent_at + self._ack_timeout):
                    await fut.wait()
            except trio.TooSlowError:
                if self._broken_since is None:
                    self._broken_since = batch.sent_at
                raise ConnectionLost(
                    self.address,
                    f"no acknowledgement within {self._ack_timeout:g}s",
                ) from None
            except ConditionalCheckFailed as e:
                if e.last_event_number < batch.last:
                    raise _Resync(f"server has event {e.last_event_number} stored") from None
                self.duplicates += 1  # it was stored before: a resend of a landed append
            if not self._unacked or self._unacked[0] is not batch:
                raise _Resync("acknowledgement out of order")
            self._unacked.popleft()
            self._window -= len(batch.data)
            self.acked_event = batch.last
            self._broken_since = None
            self._signal_progress()


def _count_encoded(codec: Codec, data: bytes, events: int | None) -> int:
    """How many events of ``codec`` ``data`` holds (``events`` if given and right).

    Raises ValueError when ``data`` is not whole events or ``events`` is wrong.
    """
    if codec is Codec.LINES:
        if not data.endswith(b"\n"):
            raise ValueError("a block of lines must end with a newline")
        found = data.count(b"\n")  # in C, ~0.3 ms per MiB: no per-event Python
    elif codec is Codec.FRAMED:
        view = memoryview(data)
        n, pos, found = len(view), 0, 0
        unpack = _LENGTH.unpack_from
        while pos + 4 <= n:
            pos += 4 + unpack(view, pos)[0]
            found += 1
        if pos != n or not n:
            raise ValueError(f"a block of frames: {whole_frames(view) or 'it is empty'}")
    else:
        found = 1 if events is None else events
    if events is not None and events != found:
        raise ValueError(f"the block holds {found} {codec.value} event(s), not {events}")
    if found < 1:
        raise ValueError(f"a block holds at least one event, not {found}")
    return found


@asynccontextmanager
async def open_segment_writer(
    address: str, segment: str, **kwargs: Any
) -> AsyncIterator[SegmentWriter]:
    """Connect, find the writer's stored event number, and yield a SegmentWriter.

    On a normal exit everything written is flushed first. Keywords as in
    `SegmentWriter`; pass the same ``writer_id`` to continue a writer's
    numbering after a restart.
    """
    writer = SegmentWriter(address, segment, **kwargs)
    async with service_nursery() as nursery:
        await nursery.start(writer._run)
        nursery.start_soon(writer._run_linger)
        try:
            yield writer
            await writer.flush()
        finally:
            nursery.cancel_scope.cancel()


class Transaction:
    """A transaction from `open_transaction`: events written now appear in its
    parent all at once at `commit`, or never (`abort`, an error, the timeout).

    The transaction survives a daemon restart, and so do `commit` and
    `abort`: a broken connection is reconnected and the request sent again,
    for up to ``retry_timeout`` seconds. A request sent again is answered
    from the daemon's record of finished transactions: a commit that went
    through before its answer was lost returns where it landed, once.
    """

    def __init__(
        self,
        client: Client,
        info: TransactionInfo,
        writer: SegmentWriter,
        connect: dict[str, Any] | None = None,
        retry_timeout: float = 300.0,
    ) -> None:
        self._client = client
        self.info = info
        self.writer = writer
        #: `open_client` keywords for a new connection (token, TLS).
        self._connect = connect or {}
        self._retry_timeout = retry_timeout
        #: Where the events landed, once committed.
        self.committed: TransactionInfo | None = None
        self.aborted = False
        #: Requests sent again on a new connection.
        self.retries = 0

    @property
    def name(self) -> str:
        """The transaction segment's name (hidden; appends go there)."""
        return self.info.name

    async def write(self, event: bytes) -> None:
        """Queue one event (exactly once, as `SegmentWriter.write`)."""
        await self.writer.write(event)

    async def commit(self) -> TransactionInfo:
        """Flush every event written, then merge them into the parent atomically."""
        if self.aborted:
            raise WriterFailed("the transaction was aborted")
        if self.committed is None:
            await self.writer.flush()
            self.committed = await self._retried(
                "commit", lambda c: c.commit_transaction(self.name)
            )
        return self.committed

    async def abort(self) -> None:
        """Drop the transaction: none of its events ever appear."""
        if self.committed is not None:
            raise WriterFailed("the transaction is committed already")
        if not self.aborted:
            self.aborted = True
            await self._retried("abort", lambda c: c.abort_transaction(self.name))

    async def _retried(self, what: str, call: Callable[[Client], Awaitable[T]]) -> T:
        """``call`` on this transaction's client; on a broken connection or an
        overloaded daemon, again on a new connection until ``retry_timeout``.

        Safe to repeat: the daemon answers a commit or abort it already
        carried out from its record of finished transactions.
        """
        try:
            return await call(self._client)
        except RETRYABLE as e:
            last: GatewayError = e
        # The node the writer writes to (the parent's owner, after a redirect).
        address = self.writer.address
        delay = 0.05
        with trio.move_on_after(self._retry_timeout):
            while True:
                log.info("transaction %s: %s: %s; again in %.2fs", self.name, what, last, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                self.retries += 1
                try:
                    async with open_client(address, **self._connect) as client:
                        return await call(client)
                except RETRYABLE as e:
                    last = e
        raise WriterFailed(
            self.name,
            f"{what} gave up after {self._retry_timeout:g}s of retrying ({last}); "
            f"its outcome is unknown: {what} it again to learn it",
        )


@asynccontextmanager
async def open_transaction(
    address: str, parent: str, *, txn_timeout: float = 0.0, **kwargs: Any
) -> AsyncIterator[Transaction]:
    """Begin a transaction on a segment or stream and yield it; commit on a normal exit.

    An exception in the block aborts it. Events are written by an exactly-
    once `SegmentWriter` (keywords as there), so a broken connection inside
    the block loses and duplicates nothing. A daemon restart does not either,
    in the block or at the commit: the commit is sent again on a new
    connection for up to ``reconnect_timeout`` seconds (the writer's, 300 by
    default), and one that went through before its answer was lost returns
    where it landed. The daemon aborts a transaction that is not committed
    within ``txn_timeout`` seconds (0: its ``streams.txn_timeout``); a commit
    after that raises `TransactionTimedOut`.
    """
    connect: dict[str, Any] = {
        k: kwargs[k] for k in ("token", "ssl_context", "server_hostname") if k in kwargs
    }
    retry_timeout = kwargs.get("reconnect_timeout", 300.0)
    async with open_client(address, **connect) as client:
        info = await client.begin_transaction(parent, txn_timeout)
        writer_cm = open_segment_writer(address, info.name, **kwargs)
        txn: Transaction | None = None
        try:
            async with writer_cm as writer:
                txn = Transaction(client, info, writer, connect, retry_timeout)
                yield txn
            if not txn.aborted:
                await txn.commit()
        except BaseException:
            if txn is None or (txn.committed is None and not txn.aborted):
                with trio.CancelScope(shield=True), suppress(GatewayError):
                    await client.abort_transaction(info.name)
            raise
