"""Object keys and user metadata of Tier-2 objects (docs/FORMATS.md, "Tier 2").

Every key is relative to the binding's prefix (``s3://bucket/PREFIX``):

- chunks: ``<node>/chunks/<segment id>/<start offset, 20 digits>.e<epoch>.<uuid hex>``
- metadata snapshots: ``<node>/meta/<Unix ms, 20 digits>.e<epoch>.snapshot``

A chunk's user metadata names what it holds, so an operator (or fsck) can
tell from the object alone (Pulsar's offload metadata).
"""

from __future__ import annotations

import re
import uuid

import gateway

#: Version of the chunk format: the object is the segment's bytes, nothing else.
CHUNK_FORMAT_VERSION = 1

_CHUNK_NAME = re.compile(r"(?:.*/)?chunks/(\d+)/(\d{20})\.e(\d+)\.[0-9a-f]{32}")
#: Chunks of attribute segments (`gateway.attrindex`): the same shape under attributes/.
_ATTRIBUTE_CHUNK_NAME = re.compile(r"(?:.*/)?attributes/(\d+)/(\d{20})\.e(\d+)\.[0-9a-f]{32}")
_SNAPSHOT_NAME = re.compile(r"(?:.*/)?meta/(\d{20})\.e(\d+)\.snapshot")
_DELTA_NAME = re.compile(r"(?:.*/)?meta/(\d{20})\.e(\d+)\.d(\d{8})\.delta")


def node_prefix(node: str) -> str:
    """Every object of ``node`` lies under this prefix."""
    return f"{node}/"


def chunks_prefix(node: str) -> str:
    """Chunks of ``node``."""
    return f"{node}/chunks/"


def meta_prefix(node: str) -> str:
    """Metadata snapshots of ``node``."""
    return f"{node}/meta/"


def chunk_key(node: str, segment_id: int, start_offset: int, epoch: int) -> str:
    """A new, unique chunk key."""
    return f"{node}/chunks/{segment_id}/{start_offset:020d}.e{epoch}.{uuid.uuid4().hex}"


def attributes_prefix(node: str) -> str:
    """Chunks of ``node``'s attribute segments."""
    return f"{node}/attributes/"


def attribute_chunk_key(node: str, segment_id: int, start_offset: int, epoch: int) -> str:
    """A new, unique key for a chunk of a segment's attribute segment."""
    return f"{node}/attributes/{segment_id}/{start_offset:020d}.e{epoch}.{uuid.uuid4().hex}"


def is_attribute_chunk(key: str) -> bool:
    """Whether ``key`` names a chunk of an attribute segment (its cached pieces are pages)."""
    return _ATTRIBUTE_CHUNK_NAME.fullmatch(key) is not None


def chunk_epoch(key: str) -> int | None:
    """The epoch a chunk key (of a segment or an attribute segment) carries, or None."""
    m = _CHUNK_NAME.fullmatch(key) or _ATTRIBUTE_CHUNK_NAME.fullmatch(key)
    return int(m.group(3)) if m else None


def parse_chunk_key(key: str) -> tuple[int, int, int] | None:
    """(segment id, start offset, epoch) of a chunk key, or None if it is not one."""
    m = _CHUNK_NAME.fullmatch(key)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def parse_attribute_chunk_key(key: str) -> tuple[int, int, int] | None:
    """(segment id, start offset, epoch) of an attribute segment's chunk key, or None."""
    m = _ATTRIBUTE_CHUNK_NAME.fullmatch(key)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def attribute_index_metadata(
    root_offset: int, root_length: int, length: int, start: int, through: int | None = None
) -> dict[str, str]:
    """Extra user metadata of an attribute index batch: the tree after it (for recovery).

    ``through``: the journal sequence number whose committed values the batch
    holds (its epoch is the key's); recovery compares it with a snapshot's
    ``applied-seq`` to tell which of the two holds the newer values.
    """
    md = {
        "index-root-offset": str(root_offset),
        "index-root-length": str(root_length),
        "index-length": str(length),
        "index-start": str(start),
    }
    if through is not None:
        md[INDEX_THROUGH] = str(through)
    return md


#: User metadata of an attribute index batch: the journal sequence its values are of.
INDEX_THROUGH = "index-through"
#: User metadata of a metadata snapshot: the journal sequence its committed view is of.
APPLIED_SEQ = "applied-seq"


def parse_snapshot_key(key: str) -> tuple[int, int] | None:
    """(Unix ms, epoch) of a metadata snapshot key, or None if it is not one."""
    m = _SNAPSHOT_NAME.fullmatch(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def snapshot_key(node: str, at_ms: int, epoch: int) -> str:
    """Key of a metadata snapshot taken at ``at_ms``; keys sort by time."""
    return f"{node}/meta/{at_ms:020d}.e{epoch}.snapshot"


def delta_key(base_key: str, number: int) -> str:
    """Key of delta ``number`` of the whole snapshot ``base_key`` (sorts after it)."""
    return f"{base_key.removesuffix('.snapshot')}.d{number:08d}.delta"


def parse_delta_key(key: str) -> tuple[str, int] | None:
    """(key of its whole snapshot, number) of a snapshot delta key, or None."""
    m = _DELTA_NAME.fullmatch(key)
    if m is None:
        return None
    return key[: m.end(2)] + ".snapshot", int(m.group(3))


def chunk_metadata(segment: str, offset: int, length: int, crc: int, epoch: int) -> dict[str, str]:
    """User metadata of a chunk object (S3 ``x-amz-meta-*``; ASCII only)."""
    return {
        "segment": segment,
        "offset": str(offset),
        "length": str(length),
        "crc32c": f"{crc:08x}",
        "epoch": str(epoch),
        "format-version": str(CHUNK_FORMAT_VERSION),
        "software-version": gateway.__version__,
    }
