"""Protobuf fields encoded by hand, for the two places that must not copy data.

The journal's frames and the wire protocol's append requests and read
responses both end in a large bytes field; serializing them through protobuf
would copy those bytes once more. Both write the message's head with
protobuf and the bytes field's tag and length here, then hand the data on as
it is. A leaf module: the journal and the protocol share it without either
importing the other.
"""

from __future__ import annotations

from gateway.buffers import Buffer


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_trailing_bytes(head: bytes, field_number: int, data: Buffer) -> bytes:
    """The bytes that, followed by ``data``, serialize a message whose other
    fields serialize to ``head`` and whose bytes field ``field_number`` (the
    highest-numbered field) holds ``data``."""
    if not data:
        return head
    return head + varint((field_number << 3) | 2) + varint(len(data))
