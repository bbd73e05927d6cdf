"""Length-prefixed messages over a trio stream (docs/FORMATS.md, "Wire protocol").

Each message is a 4-byte big-endian length and that many bytes of protobuf.
Requests carrying bulk data are encoded by hand with the data last
(`encode_append_request`), because assigning a large ``bytes`` field into a
nested protobuf message copies it slowly (~0.6 ms per MiB).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from gateway.errors import ProtocolError
from gateway.protocol.encoding import encode_trailing_bytes, varint
from gateway.protocol.wire_pb2 import (
    AppendRequest,
    ReadResponse,
    ReplicaWriteRequest,
    Request,
    Response,
)

LENGTH = struct.Struct(">I")
#: Bigger receives make fewer syscalls; small messages are parsed from one read.
_RECEIVE_BYTES = 256 * 1024
_APPEND_FIELD_TAG = varint((4 << 3) | 2)  # Request.append
_READ_FIELD_TAG = varint((9 << 3) | 2)  # Response.read
#: Messages at least this large that are not yet buffered are received directly.
_DIRECT_BYTES = 64 * 1024


class MessageTooLarge(ProtocolError):
    """message of {} bytes exceeds the limit of {} bytes"""

    wire_code = "TOO_LARGE"


class MessageTimeout(ProtocolError):
    """a {}-byte message did not arrive within {:g}s of its length ({} bytes came)"""


#: Called with a large message's length before its buffer is allocated; it may
#: wait, and raises (a GatewayError) to refuse the message.
Reserve = Callable[[int], Awaitable[None]]


class MessageStream:
    """Reads and writes length-prefixed messages on a stream.

    ``reserve`` is awaited with the length of every message received into a
    buffer of its own (``_DIRECT_BYTES`` and up) before that buffer exists,
    so a server can account for the memory first. Once a message's length
    has arrived, the rest must arrive within ``message_timeout`` seconds
    (MessageTimeout), so a peer that trickles a message in cannot hold its
    memory for ever. ``send_started`` says since when a send has been
    waiting for the peer (a server closes peers that stop reading; a
    timestamp costs less per message than a cancel scope).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        max_message_bytes: int,
        *,
        reserve: Reserve | None = None,
        message_timeout: float = math.inf,
    ) -> None:
        self.stream = stream
        self.max_message_bytes = max_message_bytes
        self.reserve = reserve
        self.message_timeout = message_timeout
        #: trio.current_time() when the send in progress began (None: none is).
        self.send_started: float | None = None
        self._buf = bytearray()
        self._pos = 0
        #: Bytes of the message being received directly (for MessageTimeout).
        self._got = 0

    async def _fill(self, need: int) -> bool:
        """Buffer at least ``need`` unread bytes; False on a clean EOF at a boundary."""
        while len(self._buf) - self._pos < need:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            chunk = await self.stream.receive_some(max(_RECEIVE_BYTES, need - len(self._buf)))
            if not chunk:
                if self._buf:
                    raise ProtocolError(
                        f"connection closed in the middle of a message "
                        f"({len(self._buf)} of {need} bytes)"
                    )
                return False
            self._buf += chunk
        return True

    async def receive(self) -> bytes | bytearray | None:
        """The next message, or None when the peer closed the connection cleanly.

        Raises MessageTooLarge (without reading the body) when the length
        exceeds the limit, ProtocolError when the stream ends mid-message.
        A large message is received straight into a buffer of its own (one
        copy from the kernel; protobuf parses a bytearray as it is).
        """
        if not await self._fill(4):
            return None
        (length,) = LENGTH.unpack_from(self._buf, self._pos)
        if length > self.max_message_bytes:
            raise MessageTooLarge(length, self.max_message_bytes)
        self._pos += 4
        have = len(self._buf) - self._pos
        if have < length and length >= _DIRECT_BYTES:
            if self.reserve is not None:
                await self.reserve(length)
            with trio.move_on_after(self.message_timeout):
                return await self._receive_direct(length, have)
            raise MessageTimeout(length, self.message_timeout, self._got)
        if have < length:
            with trio.move_on_after(self.message_timeout):
                if not await self._fill(length):
                    raise ProtocolError(f"connection closed before a {length}-byte message")
            if len(self._buf) - self._pos < length:
                raise MessageTimeout(length, self.message_timeout, len(self._buf) - self._pos)
        start = self._pos
        self._pos += length
        # Through a memoryview: slicing the bytearray itself makes a new
        # bytearray first, which costs ~20x more for large messages.
        with memoryview(self._buf) as view:
            return bytes(view[start : self._pos])

    async def _receive_direct(self, length: int, have: int) -> bytearray:
        message = bytearray(length)
        with memoryview(self._buf) as view:
            message[:have] = view[self._pos :]
        self._buf.clear()
        self._pos = 0
        sock = getattr(self.stream, "socket", None)
        self._got = have
        with memoryview(message) as target:
            got = have
            while got < length:
                if sock is not None:
                    n = await sock.recv_into(target[got:], length - got)
                else:
                    chunk = await self.stream.receive_some(length - got)
                    n = len(chunk)
                    target[got : got + n] = chunk
                if not n:
                    raise ProtocolError(
                        f"connection closed in the middle of a message ({got} of {length} bytes)"
                    )
                got += n
                self._got = got
        return message

    async def send(self, parts: Sequence[bytes]) -> None:
        """Send one message made of ``parts`` (concatenated)."""
        total = sum(map(len, parts))
        header = LENGTH.pack(total)
        self.send_started = trio.current_time()
        try:
            if total < 64 * 1024:
                await self.stream.send_all(header + b"".join(parts))
            else:
                # Large data goes out from the caller's buffer, uncopied.
                await self.stream.send_all(header + parts[0])
                for p in parts[1:]:
                    await self.stream.send_all(p)
        finally:
            self.send_started = None

    async def send_message(self, message: bytes) -> None:
        """Send one serialized message."""
        self.send_started = trio.current_time()
        try:
            await self.stream.send_all(LENGTH.pack(len(message)) + message)
        finally:
            self.send_started = None


def _varint_at(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _skip_field(buf: memoryview, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint_at(buf, pos)[1]
    if wire_type == 2:
        n, pos = _varint_at(buf, pos)
        return pos + n
    if wire_type == 1:
        return pos + 8
    if wire_type == 5:
        return pos + 4
    raise ValueError(f"wire type {wire_type}")


#: Per message type: its oneofs that hold a message field, and its other
#: message fields as (name, repeated).
_SHAPES: dict[Any, tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]] = {}


def _shape(descriptor: Any) -> tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]:
    """Where messages may sit inside a message type (cached per type)."""
    shape = _SHAPES.get(descriptor)
    if shape is None:
        fields = [f for f in descriptor.fields if f.message_type is not None]
        oneofs = tuple(
            sorted({f.containing_oneof.name for f in fields if f.containing_oneof is not None})
        )
        plain = tuple((f.name, f.is_repeated) for f in fields if f.containing_oneof is None)
        shape = _SHAPES[descriptor] = (oneofs, plain)
    return shape


def misencoded_field(message: Message) -> str | None:
    """The first field of ``message`` (or of a message inside it) that was sent
    with the wrong wire type, described for an error message; None if none.

    protobuf keeps a field whose number it knows but whose wire type is wrong
    as an *unknown* field and leaves the real one unset, so an append whose
    data is a varint would parse as an empty append. Unknown fields with
    numbers this version does not know are left alone: newer clients may
    send them.
    """
    descriptor = message.DESCRIPTOR
    unknown_set = unknown_fields.UnknownFieldSet(message)
    if len(unknown_set):
        by_number = descriptor.fields_by_number
        for i in range(len(unknown_set)):
            unknown = unknown_set[i]
            known = by_number.get(unknown.field_number)
            if known is not None:
                return (
                    f"field {descriptor.name}.{known.name} ({unknown.field_number}) has "
                    f"wire type {unknown.wire_type}"
                )
    oneofs, plain = _shape(descriptor)
    inner: list[Message] = []
    for oneof in oneofs:
        name = message.WhichOneof(oneof)
        if name is not None:
            value = getattr(message, name)
            if isinstance(value, Message):
                inner.append(value)
    for name, repeated in plain:
        if repeated:
            inner.extend(getattr(message, name))
        elif message.HasField(name):
            inner.append(getattr(message, name))
    for m in inner:
        if (found := misencoded_field(m)) is not None:
            return found
    return None


def split_append_request(raw: bytes | bytearray) -> tuple[int, AppendRequest, memoryview] | None:
    """(request id, the append without its data, the data) for an append request
    whose data field comes last, as `encode_append_request` writes it.

    The data is a view of ``raw``, not a copy: for a 1 MiB append that saves
    copying it out of the parsed message (~12% of the event loop under load).
    Returns None for anything else, anything unusual included (another field
    of Request, a field with an unexpected wire type); the caller then parses
    ``raw`` normally (protobuf allows fields in any order) and checks it.
    """
    buf = memoryview(raw)
    try:
        pos, rid = 0, 0
        while pos < len(buf):
            tag, pos = _varint_at(buf, pos)
            field, wire_type = tag >> 3, tag & 7
            if field == 1 and wire_type == 0:
                rid, pos = _varint_at(buf, pos)
            elif field != 4 or wire_type != 2:
                return None
            else:
                n, start = _varint_at(buf, pos)
                if start + n != len(buf):
                    return None  # the append is not the last field
                pos = start
                while pos < len(buf):
                    field_start = pos
                    tag, pos = _varint_at(buf, pos)
                    if tag >> 3 == 15:  # AppendRequest.data
                        if tag & 7 != 2:
                            return None
                        size, data_start = _varint_at(buf, pos)
                        if data_start + size != len(buf):
                            return None
                        head = AppendRequest.FromString(bytes(buf[start:field_start]))
                        if misencoded_field(head) is not None:
                            return None
                        return rid, head, buf[data_start:]
                    pos = _skip_field(buf, pos, tag & 7)
                return None
    except (ValueError, IndexError, DecodeError):
        return None
    return None


def close_now(stream: trio.abc.Stream) -> None:
    """Close a stream without a checkpoint (safe in ``finally`` under cancellation)."""
    sock = getattr(stream, "socket", None)
    if sock is not None:
        sock.close()


def encode_read_response(request_id: int, read: ReadResponse, data: bytes) -> list[bytes]:
    """A serialized ``Response(request_id, read=read with data)`` as buffers, data last."""
    inner = encode_trailing_bytes(read.SerializeToString(), 15, data)
    head = Response(request_id=request_id).SerializeToString()
    head += _READ_FIELD_TAG + varint(len(inner) + len(data)) + inner
    return [head, data] if data else [head]


def encode_append_request(request_id: int, append: AppendRequest, data: bytes) -> list[bytes]:
    """A serialized ``Request(request_id, append=append with data)`` as buffers, data last."""
    inner = encode_trailing_bytes(append.SerializeToString(), 15, data)
    head = Request(request_id=request_id).SerializeToString()
    head += _APPEND_FIELD_TAG + varint(len(inner) + len(data)) + inner
    return [head, data] if data else [head]


_REPLICA_WRITE_FIELD_TAG = varint(
    (Request.DESCRIPTOR.fields_by_name["replica_write"].number << 3) | 2
)
_FRAMES_FIELD = ReplicaWriteRequest.DESCRIPTOR.fields_by_name["frames"].number


def encode_replica_write_request(
    request_id: int, write: ReplicaWriteRequest, frames: bytes
) -> list[bytes]:
    """A serialized ``Request(request_id, replica_write=write with frames)`` as buffers,
    the frames last and not copied (``write`` itself holds none; protobuf reads a
    field wherever it comes)."""
    inner = encode_trailing_bytes(write.SerializeToString(), _FRAMES_FIELD, frames)
    head = Request(request_id=request_id).SerializeToString()
    head += _REPLICA_WRITE_FIELD_TAG + varint(len(inner) + len(frames)) + inner
    return [head, frames] if len(frames) else [head]
