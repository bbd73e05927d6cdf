"""Byte layout of journal frames (docs/FORMATS.md, "Journal frame").

A frame is a fixed 48-byte little-endian header followed by the payload, a
serialized ``Frame`` protobuf. The CRC32C covers the header's first 44 bytes
and the payload, so a torn or misdirected write of either is detected.

=======  ====  ===========================================================
offset   size  field
=======  ====  ===========================================================
0        4     magic ``SGWJ``
4        2     format version (1)
6        2     flags (0; reserved)
8        4     payload length in bytes
12       4     operation count (operations in the payload, >= 1)
16       8     first sequence number (of the payload's first operation)
24       8     group sequence number: first sequence number of the write
               group (the frames written by one fdatasync) holding this frame
32       8     epoch of the process that wrote the frame
40       4     reserved (0)
44       4     CRC32C of bytes 0..43 and the payload
=======  ====  ===========================================================
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import crc32c

from gateway.buffers import Buffer
from gateway.protocol.encoding import encode_trailing_bytes, varint
from gateway.protocol.metadata_pb2 import AttributeValue

MAGIC = b"SGWJ"
VERSION = 1
HEADER = struct.Struct("<4sHHIIQQQII")
HEADER_SIZE = HEADER.size
_CRC_OFFSET = HEADER_SIZE - 4
_ZERO_HEADER = bytes(HEADER_SIZE)

# A serialized `Frame` is, per operation, the field-1 length-delimited tag
# (0x0A), a varint length, then the serialized `Operation`. Building that by
# hand avoids a protobuf object per operation on the append path.
_OPERATION_TAG = 0x0A
_SMALL_PREFIXES = [bytes((_OPERATION_TAG, n)) for n in range(0x80)]

assert HEADER_SIZE == 48


class FrameError(Exception):
    """A frame at some offset is not a valid frame; the message says why."""


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A decoded frame header."""

    version: int
    flags: int
    payload_length: int
    operation_count: int
    first_sequence: int
    group_sequence: int
    epoch: int
    crc: int

    @property
    def end_sequence(self) -> int:
        """One past the last operation's sequence number."""
        return self.first_sequence + self.operation_count

    @property
    def frame_length(self) -> int:
        """Header plus payload."""
        return HEADER_SIZE + self.payload_length


def operation_prefix(length: int) -> bytes:
    """The bytes that precede a serialized Operation of ``length`` bytes in a Frame."""
    if length < 0x80:
        return _SMALL_PREFIXES[length]
    return bytes((_OPERATION_TAG,)) + varint(length)


# Operation.append is field 10; Append.segment_id 1, .offset 2, .attributes 3,
# .at_ms 4, .data 15 (see journal.proto).
_APPEND_TAG = bytes(((10 << 3) | 2,))


def encode_append(
    segment_id: int, offset: int, data: Buffer, attributes: bytes = b"", at_ms: int = 0
) -> tuple[bytes, Buffer]:
    """A serialized ``Operation(append=Append(...))`` as (head, data), data not copied.

    ``attributes`` is the serialized ``repeated AttributeValue`` field (field
    3, already tagged), if any. Byte for byte what protobuf's
    SerializeToString gives (a test checks it), without building a message:
    for large appends the message constructor copies the data and dominates
    the append path.
    """
    inner = bytearray()
    if segment_id:
        inner += b"\x08" + varint(segment_id)
    if offset:
        inner += b"\x10" + varint(offset)
    inner += attributes
    if at_ms > 0:
        inner += b"\x20" + varint(at_ms)
    head = encode_trailing_bytes(bytes(inner), 15, data)
    return _APPEND_TAG + varint(len(head) + len(data)) + head, data


def encode_header(
    payload: Sequence[Buffer],
    payload_length: int,
    operation_count: int,
    first_sequence: int,
    group_sequence: int,
    epoch: int,
) -> bytes:
    """The header for a payload given as consecutive buffers."""
    prefix = HEADER.pack(
        MAGIC, VERSION, 0, payload_length, operation_count,
        first_sequence, group_sequence, epoch, 0, 0,
    )[:_CRC_OFFSET]  # fmt: skip
    crc = crc32c.crc32c(prefix)
    for part in payload:
        crc = crc32c.crc32c(part, crc)
    return prefix + crc.to_bytes(4, "little")


#: Buffers at least this large are handed to pwritev as they are; runs of
#: smaller ones are joined first (a copy is cheaper than an iovec and a CRC call).
COALESCE_BYTES = 64 * 1024


def _coalesce(parts: Sequence[Buffer]) -> list[Buffer]:
    out: list[Buffer] = []
    run: list[Buffer] = []
    for p in parts:
        if len(p) >= COALESCE_BYTES:
            if run:
                out.append(b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(b"".join(run))
    return out


def encode_group(
    parts: Sequence[Buffer],
    ends: Sequence[int],
    sizes: Sequence[int],
    first_sequence: int,
    epoch: int,
    max_frame_bytes: int,
) -> tuple[list[Buffer], int, int]:
    """Frame one write group; return (buffers for pwritev, total bytes, frame count).

    Operation ``k`` is ``parts[ends[k-1]:ends[k]]`` (its Frame-field prefix,
    then its serialized buffers) and is ``sizes[k]`` bytes long. Frames hold
    whole operations and at most ``max_frame_bytes`` of payload, except that
    one larger operation gets a frame of its own. Every frame's group
    sequence number is ``first_sequence``.
    """
    buffers: list[Buffer] = []
    seq, total, frames, part_start = first_sequence, 0, 0, 0
    for i, j, size in _frames(sizes, max_frame_bytes):
        payload = _coalesce(parts[part_start : ends[j - 1]])
        buffers.append(encode_header(payload, size, j - i, seq, first_sequence, epoch))
        buffers.extend(payload)
        total += HEADER_SIZE + size
        frames += 1
        seq += j - i
        part_start = ends[j - 1]
    return buffers, total, frames


def _frames(sizes: Sequence[int], max_frame_bytes: int) -> Iterator[tuple[int, int, int]]:
    """How `encode_group` cuts operations into frames: (first, past the last, payload bytes)."""
    i, n = 0, len(sizes)
    while i < n:
        j, size = i + 1, sizes[i]
        while j < n and size + sizes[j] <= max_frame_bytes:
            size += sizes[j]
            j += 1
        yield i, j, size
        i = j


def operation_ends(payload: Buffer) -> list[int] | None:
    """Where each Operation of a Frame payload ends (offsets in the payload).

    None if the payload is not a plain sequence of ``operations`` fields
    (the decoder, not this, says whether it is valid).
    """
    view = memoryview(payload)
    ends: list[int] = []
    at, n = 0, len(view)
    while at < n:
        if view[at] != _OPERATION_TAG:
            return None
        at += 1
        length = shift = 0
        while True:
            if at >= n or shift > 63:
                return None
            b = view[at]
            at += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        at += length
        if at > n:
            return None
        ends.append(at)
    return ends


def last_part_offsets(
    parts: Sequence[Buffer], ends: Sequence[int], sizes: Sequence[int], max_frame_bytes: int
) -> list[int]:
    """Where each operation's last part lands, from the start of `encode_group`'s output.

    An append's data is its last part (`encode_append`), so this is where
    its bytes lie in the journal file: the read index reads unflushed data
    from there instead of keeping a second copy.
    """
    offsets: list[int] = []
    at = 0
    for i, j, _ in _frames(sizes, max_frame_bytes):
        at += HEADER_SIZE
        for k in range(i, j):
            offsets.append(at + sizes[k] - len(parts[ends[k] - 1]))
            at += sizes[k]
    return offsets


def decode_header(buf: Buffer) -> FrameHeader:
    """Decode and sanity-check a header (not yet its CRC); raise FrameError."""
    view = memoryview(buf)
    if len(view) < HEADER_SIZE:
        raise FrameError(f"short header ({len(view)} of {HEADER_SIZE} bytes)")
    raw = view[:HEADER_SIZE]
    if raw == _ZERO_HEADER:
        raise FrameError("zero-filled header (end of written data)")
    magic, version, flags, length, count, first, group, epoch, _reserved, crc = HEADER.unpack(raw)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported frame format version {version}")
    if count == 0 or first == 0 or group == 0 or group > first:
        raise FrameError(
            f"impossible header (operations={count} first_seq={first} group_seq={group})"
        )
    return FrameHeader(version, flags, length, count, first, group, epoch, crc)


def frame_crc_ok(header_bytes: Buffer, payload: Buffer) -> bool:
    """Whether the CRC in ``header_bytes`` matches the header and ``payload``."""
    h = memoryview(header_bytes)
    stored = int.from_bytes(h[_CRC_OFFSET:HEADER_SIZE], "little")
    return crc32c.crc32c(payload, crc32c.crc32c(h[:_CRC_OFFSET])) == stored


def attribute_records(values: Mapping[bytes, int | None]) -> list[AttributeValue]:
    """``values`` as AttributeValue messages (``None``: removed)."""
    return [
        AttributeValue(id=k, removed=True) if v is None else AttributeValue(id=k, value=v)
        for k, v in values.items()
    ]


def encode_attribute_values(values: Mapping[bytes, int | None], field_number: int) -> bytes:
    """``values`` as a serialized ``repeated AttributeValue`` field, tag included."""
    out = bytearray()
    tag = varint((field_number << 3) | 2)
    for rec in attribute_records(values):
        body = rec.SerializeToString()
        out += tag + varint(len(body)) + body
    return bytes(out)
