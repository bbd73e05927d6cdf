"""The chunk layer: the async face of Tier 2 that the rest of the daemon uses.

A `ChunkLayer` wraps one `ChunkStorage` binding. Every operation runs the
binding's blocking call in a worker thread, behind one `trio.CapacityLimiter`
(the bound on Tier-2 requests in flight, ``[tier2] max_concurrency``), inside
the retry policy of `gateway.storage.retry`. Callers therefore see either the
result or a `Tier2Error` (`ChunkNotFound` for a missing object), never a
botocore or OS exception.

With the embedded SeaweedFS behind the binding, every attempt first asks it
whether it is up (`EmbeddedS3.check_available`): while it is down or
restarting, calls fail at once with `EmbeddedS3Down` instead of retrying
against a dead server for ``retry_deadline``.

Cancellation abandons the worker thread (``abandon_on_cancel=True``): the
caller returns at once, the request finishes or times out on its own, and its
limiter slot stays taken until then.
"""

from __future__ import annotations

import builtins
import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import trio

from gateway.buffers import Buffer
from gateway.errors import ChunkNotFound, Tier2Error
from gateway.stats import LATENCY_BUCKETS, Histogram
from gateway.storage.interface import ChunkStorage, ObjectInfo
from gateway.storage.retry import RetryEvent, retrying

__all__ = ["ChunkLayer", "ChunkLayerStatistics", "LocalServer"]


class LocalServer(Protocol):
    """A Tier-2 server this process runs itself (the embedded SeaweedFS).

    Known here only by what the layer asks of it, so that the bindings sit
    below the embedded server that uses them.
    """

    def check_available(self) -> None:
        """Raise at once (a `Tier2Error`) while the server is down or restarting."""

    def statistics(self) -> Any:
        """Its statistics, for /metrics."""


T = TypeVar("T")


@dataclass(frozen=True)
class ChunkLayerStatistics:
    """Counters of a `ChunkLayer` since it was created (`ChunkLayer.statistics`)."""

    #: Binding calls made, retries included.
    requests: int
    #: Attempts that failed temporarily and were retried.
    retries: int
    #: Operations that failed for good (raised `Tier2Error`; missing objects not counted).
    failures: int
    #: Operations that found no object (`ChunkNotFound`).
    not_found: int
    #: Bytes handed to successful writes and appends.
    bytes_written: int
    #: Bytes returned by successful reads.
    bytes_read: int
    #: Binding calls per operation ("write", "read", ...), retries included.
    requests_by_operation: Mapping[str, int] = field(default_factory=dict)


def _nbytes(data: Buffer) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


class ChunkLayer:
    """Async, retrying, concurrency-limited access to a `ChunkStorage`."""

    def __init__(
        self,
        storage: ChunkStorage,
        *,
        max_concurrency: int = 8,
        retry_deadline: float = 60.0,
        barrier: Callable[[], None] | None = None,
        embedded: LocalServer | None = None,
    ) -> None:
        """Wrap ``storage``; at most ``max_concurrency`` calls run at once.

        ``retry_deadline`` is how long one operation keeps retrying temporary
        failures before it raises `Tier2Error` (each method may override it).
        ``barrier`` (blocking) makes every acknowledged write durable, for
        servers that acknowledge before their disk has the data (see
        `durability_barrier`). ``embedded``: the embedded server ``storage``
        talks to, whose state gates every attempt.
        """
        #: The binding underneath (its flags tell which operations exist).
        self.storage = storage
        #: The embedded S3 server behind ``storage``, if any (its statistics go to /metrics).
        self.embedded = embedded
        self._barrier = barrier
        self.retry_deadline = retry_deadline
        self._limiter = trio.CapacityLimiter(max_concurrency)
        # Bound once: bindings without Retry-After support simply lack it.
        self._retry_after: Callable[[BaseException], float | None] | None = getattr(
            storage, "retry_after", None
        )
        self._requests: collections.Counter[str] = collections.Counter()
        #: Latency per operation ("write", "read", ...), retries and backoff included.
        self.latency: dict[str, Histogram] = {}
        self._retries = 0
        self._failures = 0
        self._not_found = 0
        self._bytes_written = 0
        self._bytes_read = 0

    def __repr__(self) -> str:
        return f"ChunkLayer({self.storage!r})"

    async def durability_barrier(self) -> None:
        """Return once every write acknowledged so far survives a power loss.

        The journal calls it before dropping files whose data is now only in
        chunks. A no-op for S3 and the filesystem binding (durable on
        acknowledgement); the embedded SeaweedFS acknowledges from the page
        cache, so for it this is a ``syncfs`` of its data directory.
        """
        if self._barrier is None:
            return
        try:
            await trio.to_thread.run_sync(self._barrier, limiter=self._limiter)
        except OSError as e:
            raise Tier2Error(f"syncing the embedded S3 server's data: {e}") from e

    async def _call(
        self, operation: str, what: str, deadline: float | None, fn: Callable[[], T]
    ) -> T:
        """Run ``fn`` in a worker thread under the limiter, retried by the one policy."""

        async def attempt() -> T:
            if self.embedded is not None:
                # Not temporary for the retry policy: fails the operation now.
                self.embedded.check_available()
            # Counted here, in the trio thread: no lock needed.
            self._requests[operation] += 1
            return await trio.to_thread.run_sync(fn, limiter=self._limiter, abandon_on_cancel=True)

        started = time.monotonic()
        try:
            return await retrying(
                attempt,
                is_temp_failure=self.storage.is_temp_failure,
                what=f"{what} on {self.storage.kind}",
                deadline=self.retry_deadline if deadline is None else deadline,
                retry_after=self._retry_after,
                on_retry=self._on_retry,
            )
        except ChunkNotFound:
            self._not_found += 1
            raise
        except Exception:
            self._failures += 1
            raise
        finally:
            latency = self.latency.get(operation)
            if latency is None:
                latency = self.latency[operation] = Histogram(LATENCY_BUCKETS)
            latency.observe(time.monotonic() - started)

    def _on_retry(self, event: RetryEvent) -> None:
        self._retries += 1

    @property
    def retries(self) -> int:
        """Attempts that failed and were retried so far, every operation's."""
        return self._retries

    async def write(
        self,
        key: str,
        data: Buffer,
        metadata: Mapping[str, str],
        *,
        deadline: float | None = None,
    ) -> None:
        """Create or replace the object ``key``; ``data`` must not change until this returns."""
        size = _nbytes(data)
        await self._call(
            "write",
            f"write {key!r} ({size} bytes)",
            deadline,
            lambda: self.storage.write(key, data, metadata),
        )
        self._bytes_written += size

    async def write_if_absent(
        self,
        key: str,
        data: Buffer,
        metadata: Mapping[str, str],
        *,
        deadline: float | None = None,
    ) -> bool:
        """Create ``key`` unless it exists; whether this call created it.

        A retried attempt whose first try did create the object (the answer
        was lost) sees it as existing: callers that must know tell their own
        object apart by its content.
        """
        size = _nbytes(data)
        created = await self._call(
            "write",
            f"create {key!r} ({size} bytes)",
            deadline,
            lambda: self.storage.write_if_absent(key, data, metadata),
        )
        if created:
            self._bytes_written += size
        return created

    async def read(
        self, key: str, offset: int, length: int, *, deadline: float | None = None
    ) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key``, shorter only at its end."""
        data = await self._call(
            "read",
            f"read {key!r} [{offset}, {offset + length})",
            deadline,
            lambda: self.storage.read(key, offset, length),
        )
        self._bytes_read += len(data)
        return data

    async def delete(self, key: str, *, deadline: float | None = None) -> None:
        """Delete ``key``; a missing object is not an error."""
        await self._call("delete", f"delete {key!r}", deadline, lambda: self.storage.delete(key))

    async def stat(self, key: str, *, deadline: float | None = None) -> ObjectInfo:
        """Size, mtime and user metadata of ``key``; `ChunkNotFound` if missing."""
        return await self._call("stat", f"stat {key!r}", deadline, lambda: self.storage.stat(key))

    async def append(
        self,
        key: str,
        offset: int,
        data: Buffer,
        metadata: Mapping[str, str],
        *,
        deadline: float | None = None,
    ) -> None:
        """Write ``data`` at ``offset`` of ``key`` (bindings with ``supports_append`` only)."""
        size = _nbytes(data)
        await self._call(
            "append",
            f"append {key!r} at {offset} ({size} bytes)",
            deadline,
            lambda: self.storage.append(key, offset, data, metadata),
        )
        self._bytes_written += size

    async def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
        deadline: float | None = None,
    ) -> None:
        """Create ``key`` from ``sources`` (bindings with ``supports_concat`` only).

        ``sizes``: the bytes to take of each source (see `ChunkStorage.concat`).
        """
        sources = builtins.list(sources)
        lengths = None if sizes is None else builtins.list(sizes)
        await self._call(
            "concat",
            f"concat {len(sources)} objects into {key!r}",
            deadline,
            lambda: self.storage.concat(key, sources, metadata, sizes=lengths),
        )

    async def any_under(self, prefix: str, *, deadline: float | None = None) -> bool:
        """Whether any object's key starts with ``prefix`` (reads one page at most)."""
        return await self._call(
            "list",
            f"list {prefix!r} (first)",
            deadline,
            lambda: next(iter(self.storage.list(prefix)), None) is not None,
        )

    async def list(
        self, prefix: str, *, deadline: float | None = None
    ) -> builtins.list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""
        # The whole listing is collected in the worker thread: the binding's
        # iterator may block on the next page.
        return await self._call(
            "list",
            f"list {prefix!r}",
            deadline,
            lambda: builtins.list(self.storage.list(prefix)),
        )

    def statistics(self) -> ChunkLayerStatistics:
        """A snapshot of the counters."""
        return ChunkLayerStatistics(
            requests=sum(self._requests.values()),
            retries=self._retries,
            failures=self._failures,
            not_found=self._not_found,
            bytes_written=self._bytes_written,
            bytes_read=self._bytes_read,
            requests_by_operation=MappingProxyType(dict(self._requests)),
        )
