"""The chunk storage protocol: what every Tier-2 binding offers.

A binding stores *objects* (chunks and metadata snapshots) under string keys
(``/``-separated, no leading ``/``). Its methods are synchronous and may
block on the network or the disk: callers run them in worker threads
(`gateway.storage.layer.ChunkLayer` does, behind a limiter and the retry
policy). Bindings are thread-safe.

Required operations (Pravega's CRWD): `write` (create or replace a whole
object), `write_if_absent` (create only: the cluster's claims), ranged
`read`, `delete`, `list`, `stat`. Optional ones, announced by the
`supports_append` / `supports_concat` flags: `append` (the filesystem
binding) and `concat` (S3, through multipart UploadPartCopy).

Errors: a missing object raises `ChunkNotFound`; a failure that may go away
by itself (network, 5xx, throttling) is recognised by the binding's
`is_temp_failure`, and the retry policy retries it; everything else is final.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gateway.buffers import Buffer
from gateway.errors import BindingUnsupported, ChunkCorrupt, ChunkNotFound, Tier2Error

__all__ = [
    "BindingUnsupported",
    "ChunkCorrupt",
    "ChunkNotFound",
    "ChunkStorage",
    "ObjectInfo",
    "Tier2Error",
]


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object, as `ChunkStorage.stat` and `ChunkStorage.list` see it."""

    key: str
    size: int
    #: Last modification, Unix seconds (float).
    mtime: float
    #: User metadata (`stat` fills it; `list` may leave it empty).
    metadata: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class ChunkStorage(Protocol):
    """A Tier-2 binding (S3, filesystem, memory). All methods block."""

    #: Short name for messages and metrics ("s3", "file", "memory").
    kind: str
    #: Whether `append` works (data added to an existing object in place).
    supports_append: bool
    #: Whether `concat` works (one object made from others without re-upload).
    supports_concat: bool

    def write(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> None:
        """Create or replace the object ``key`` with ``data`` and user ``metadata``."""

    def write_if_absent(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> bool:
        """Create ``key`` only if no object has it; False (nothing written) if one does.

        Of several callers racing for one key, exactly one gets True (S3's
        ``If-None-Match: *``): the cluster's name claims and fences rest on it.
        """

    def read(self, key: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key``; shorter only at the object's end.

        Raises `ChunkNotFound` if the object does not exist.
        """

    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing object is not an error."""

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""

    def stat(self, key: str) -> ObjectInfo:
        """Size, mtime and user metadata of ``key``; `ChunkNotFound` if missing."""

    def append(self, key: str, offset: int, data: Buffer, metadata: Mapping[str, str]) -> None:
        """Write ``data`` at ``offset`` of the existing object ``key``, which then ends there.

        ``offset`` is the length the caller believes the object has; bytes past
        it (left by an earlier attempt) are replaced, so a retry is idempotent.
        ``metadata`` replaces the object's user metadata. Only when
        `supports_append`; otherwise raises `BindingUnsupported`.
        """

    def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Create ``key`` as the concatenation of ``sources`` (which stay).

        ``sizes``: how many bytes of each source to take (its recorded length;
        an object may hold more, left by an earlier append attempt), which
        also spares a binding the HEAD per source; a source shorter than its
        size raises `Tier2Error`. None: each source whole. A missing source
        raises `ChunkNotFound`; nothing is left at ``key`` after a failure.
        Only when `supports_concat`; otherwise raises `BindingUnsupported`.
        """

    def is_temp_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by a method above) may succeed if retried."""

    def close(self) -> None:
        """Release connections and files."""
