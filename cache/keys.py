"""RocksDB key encoding for the cache's key spaces.

Every key starts with one byte naming its key space; the rest is chosen so that
RocksDB's bytewise order is the order a reader of the data expects:

=============  ==========================================================
key space      layout (integers big-endian, unsigned)
=============  ==========================================================
``APPEND``     ``0x01`` · segment id (8) · offset (8).
               Value: the append's bytes.
``BLOCK``      ``0x02`` · escaped chunk name · block index (8).
               Value: the block's bytes.
``BLOCK_META`` ``0x03`` · escaped chunk name · block index (8).
               Value: `BLOCK_META` struct: block size (8), insertion
               sequence (8). Written in the same batch as the block, so
               opening the store can rebuild sizes and LRU order by reading
               these small values instead of every cached byte.
=============  ==========================================================

Chunk names are arbitrary UTF-8, so they are escaped the way FoundationDB's
tuple layer escapes byte strings: ``0x00`` becomes ``0x00 0xFF``, and the name
ends with ``0x00 0x01``. The escaped form never contains ``0x00 0x01``, which
makes it prefix-free (one chunk's keys are never a prefix range of another's)
and keeps bytewise order equal to name order. So keys sort by (segment id,
offset) and by (chunk name, block index), and one chunk's blocks are the
contiguous range `block_range` returns.
"""

from __future__ import annotations

import struct

APPEND = b"\x01"
BLOCK = b"\x02"
BLOCK_META = b"\x03"
#: Exclusive upper bound of the key spaces above (for whole-space ranges).
END = b"\x04"

_U64 = struct.Struct(">Q")
_APPEND = struct.Struct(">cQQ")
#: Value of a `BLOCK_META` key: block size in bytes, then the insertion
#: sequence number (a per-store counter; larger is newer).
BLOCK_META_VALUE = struct.Struct(">QQ")

_NAME_END = b"\x00\x01"
_U64_MAX = 2**64 - 1


class BadKey(ValueError):
    """A key that is not in the expected key space or is malformed."""


def _check_u64(what: str, value: int) -> None:
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"{what} must be in 0..2**64-1, got {value}")


def append_key(segment_id: int, offset: int) -> bytes:
    """The key of the append data of ``segment_id`` starting at ``offset``."""
    _check_u64("segment id", segment_id)
    _check_u64("offset", offset)
    return _APPEND.pack(APPEND, segment_id, offset)


def decode_append_key(key: bytes) -> tuple[int, int]:
    """``(segment id, offset)`` from an `append_key`."""
    if len(key) != _APPEND.size or key[:1] != APPEND:
        raise BadKey(f"not an append key: {key!r}")
    _, segment_id, offset = _APPEND.unpack(key)
    return segment_id, offset


def segment_range(segment_id: int) -> tuple[bytes, bytes]:
    """``[begin, end)`` covering every append key of ``segment_id``."""
    _check_u64("segment id", segment_id)
    begin = APPEND + _U64.pack(segment_id)
    # segment_id + 1 may overflow 64 bits; the next key space bounds the last one.
    end = APPEND + _U64.pack(segment_id + 1) if segment_id < _U64_MAX else BLOCK
    return begin, end


def _escape(chunk: str) -> bytes:
    return chunk.encode("utf-8").replace(b"\x00", b"\x00\xff") + _NAME_END


def _block_key(space: bytes, chunk: str, index: int) -> bytes:
    _check_u64("block index", index)
    return space + _escape(chunk) + _U64.pack(index)


def block_key(chunk: str, index: int) -> bytes:
    """The key of block ``index`` of Tier-2 chunk ``chunk``."""
    return _block_key(BLOCK, chunk, index)


def block_meta_key(chunk: str, index: int) -> bytes:
    """The key of the size/sequence record of block ``index`` of ``chunk``."""
    return _block_key(BLOCK_META, chunk, index)


def decode_block_key(key: bytes) -> tuple[str, int]:
    """``(chunk name, block index)`` from a `block_key` or a `block_meta_key`."""
    if key[:1] not in (BLOCK, BLOCK_META) or len(key) < 1 + len(_NAME_END) + _U64.size:
        raise BadKey(f"not a block key: {key!r}")
    name, index = key[1 : -_U64.size], key[-_U64.size :]
    if not name.endswith(_NAME_END):
        raise BadKey(f"block key without a name terminator: {key!r}")
    escaped = name[: -len(_NAME_END)]
    # Every 0x00 inside the name must be an escaped one (0x00 0xFF).
    if escaped.count(b"\x00") != escaped.count(b"\x00\xff"):
        raise BadKey(f"block key with a badly escaped name: {key!r}")
    try:
        chunk = escaped.replace(b"\x00\xff", b"\x00").decode("utf-8")
    except UnicodeDecodeError:
        raise BadKey(f"block key whose name is not UTF-8: {key!r}") from None
    return chunk, _U64.unpack(index)[0]


def chunk_range(space: bytes, chunk: str) -> tuple[bytes, bytes]:
    """``[begin, end)`` covering every key of ``chunk`` in ``space`` (BLOCK or BLOCK_META)."""
    prefix = space + _escape(chunk)
    # The prefix ends in 0x00 0x01; replacing the last byte by 0x02 bounds
    # exactly the keys that start with the prefix (index bytes follow it).
    return prefix, prefix[:-1] + b"\x02"
