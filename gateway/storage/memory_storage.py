"""The in-memory binding, for unit tests of the layers above Tier 2.

`MemoryStorage` keeps objects in a dict and behaves like the other bindings
(the conformance suite in tests/test_tier2_storage.py runs against all of
them). For tests it also injects faults and counts calls:

- ``fail_next(n, exc, ops)``: the next ``n`` calls (of the named operations
  only, if given) raise ``exc``, by default a `TemporaryFailure`, which its
  `MemoryStorage.is_temp_failure` recognises; ``after=True`` makes the
  operation take effect first, as when a response is lost on the way back;
- ``set_down(True)``: every call raises `TemporaryFailure` until
  ``set_down(False)``, like an S3 outage;
- ``calls``: how often each operation was called, failed calls included.

Operation names are the method names: ``write``, ``read``, ``delete``,
``list``, ``stat``, ``append``, ``concat``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.buffers import Buffer
from gateway.errors import BindingUnsupported, ChunkNotFound, Tier2Error
from gateway.storage.interface import ObjectInfo

if TYPE_CHECKING:
    from gateway.storage.interface import ChunkStorage

__all__ = ["OPERATIONS", "MemoryStorage", "TemporaryFailure"]

#: The operations faults can be injected into and calls are counted for.
OPERATIONS = frozenset({"write", "read", "delete", "list", "stat", "append", "concat"})


class TemporaryFailure(Exception):
    """An injected failure that `MemoryStorage.is_temp_failure` calls temporary."""


@dataclass(frozen=True)
class _Object:
    data: bytes
    metadata: dict[str, str]
    mtime: float


@dataclass
class _Fault:
    remaining: int
    exc: BaseException | None
    ops: frozenset[str] | None
    after: bool


class MemoryStorage:
    """`ChunkStorage` in a dict, thread-safe, with fault injection for tests."""

    kind = "memory"

    def __init__(self, *, supports_append: bool = True, supports_concat: bool = True) -> None:
        """An empty store; the flags turn the optional operations off (as on S3)."""
        self.supports_append = supports_append
        self.supports_concat = supports_concat
        #: Calls per operation name, failed ones included.
        self.calls: collections.Counter[str] = collections.Counter()
        self._objects: dict[str, _Object] = {}
        self._faults: list[_Fault] = []
        self._down = False
        # One lock for objects, faults and counters: operations are tiny, and
        # a single lock makes every operation atomic, as S3 PUTs are.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryStorage({len(self._objects)} objects)"

    # -- fault injection ------------------------------------------------------

    def fail_next(
        self,
        n: int,
        exc: BaseException | None = None,
        ops: set[str] | None = None,
        *,
        after: bool = False,
    ) -> None:
        """Make the next ``n`` calls (of ``ops`` only, if given) raise ``exc``.

        ``exc`` defaults to a fresh `TemporaryFailure` per call. With
        ``after``, the operation takes effect before the error is raised (a
        lost response: the caller cannot tell whether it happened; if the
        operation fails by itself, its own error wins). Faults queue up: a
        call consumes the oldest one that matches it.
        """
        if n < 0:
            raise ValueError(f"negative fault count {n}")
        unknown = (ops or set()) - OPERATIONS
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}; known: {sorted(OPERATIONS)}")
        with self._lock:
            self._faults.append(_Fault(n, exc, None if ops is None else frozenset(ops), after))

    def set_down(self, down: bool) -> None:
        """While down, every call raises `TemporaryFailure` and changes nothing."""
        with self._lock:
            self._down = down

    def _begin(self, op: str, supported: bool = True) -> _Fault | None:
        """Count the call and raise or return the fault it meets (lock held)."""
        self.calls[op] += 1
        if not supported:
            # Before outages and faults: it is what the binding is, not a failure.
            raise BindingUnsupported(self.kind, op)
        if self._down:
            raise TemporaryFailure(f"memory storage is down ({op})")
        for fault in self._faults:
            if fault.remaining > 0 and (fault.ops is None or op in fault.ops):
                fault.remaining -= 1
                self._faults = [f for f in self._faults if f.remaining > 0]
                if not fault.after:
                    raise _injected(fault, op)
                return fault
        return None

    # -- ChunkStorage -----------------------------------------------------------

    def write(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> None:
        """Create or replace ``key`` (the bytes are copied)."""
        _check_key(key)
        with self._lock:
            fault = self._begin("write")
            self._objects[key] = _Object(bytes(data), dict(metadata), time.time())
            _raise_after(fault, "write")

    def write_if_absent(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> bool:
        """Create ``key`` only if it does not exist."""
        _check_key(key)
        with self._lock:
            fault = self._begin("write")
            if key in self._objects:
                return False
            self._objects[key] = _Object(bytes(data), dict(metadata), time.time())
            _raise_after(fault, "write")
            return True

    def read(self, key: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key``; shorter only at its end."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad range: offset {offset}, length {length}")
        with self._lock:
            fault = self._begin("read")
            obj = self._get(key)
            _raise_after(fault, "read")
            return obj.data[offset : offset + length]

    def delete(self, key: str) -> None:
        """Delete ``key``; missing is fine."""
        with self._lock:
            fault = self._begin("delete")
            self._objects.pop(key, None)
            _raise_after(fault, "delete")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order (no metadata)."""
        with self._lock:
            fault = self._begin("list")
            found = [
                ObjectInfo(key, len(obj.data), obj.mtime)
                for key, obj in self._objects.items()
                if key.startswith(prefix)
            ]
            _raise_after(fault, "list")
        found.sort(key=lambda info: info.key)
        return iter(found)

    def stat(self, key: str) -> ObjectInfo:
        """Size, mtime and user metadata of ``key``; `ChunkNotFound` if missing."""
        with self._lock:
            fault = self._begin("stat")
            obj = self._get(key)
            _raise_after(fault, "stat")
            return ObjectInfo(key, len(obj.data), obj.mtime, dict(obj.metadata))

    def append(self, key: str, offset: int, data: Buffer, metadata: Mapping[str, str]) -> None:
        """Write ``data`` at ``offset`` of ``key``, which then ends there (see the protocol)."""
        if offset < 0:
            raise ValueError(f"bad append offset {offset}")
        with self._lock:
            fault = self._begin("append", self.supports_append)
            obj = self._get(key)
            if len(obj.data) < offset:
                raise Tier2Error(
                    f"append to {key!r} at offset {offset}, "
                    f"but the object has only {len(obj.data)} bytes"
                )
            self._objects[key] = _Object(
                obj.data[:offset] + bytes(data), dict(metadata), time.time()
            )
            _raise_after(fault, "append")

    def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Create ``key`` as the concatenation of ``sources`` (which stay).

        ``sizes``: the bytes taken of each source (None: each whole).
        """
        _check_key(key)
        if sizes is not None and len(sizes) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(sizes)} sizes")
        with self._lock:
            fault = self._begin("concat", self.supports_concat)
            pieces = [self._get(source).data for source in sources]
            if sizes is not None:
                for source, piece, want in zip(sources, pieces, sizes, strict=True):
                    if len(piece) < want:
                        raise Tier2Error(
                            f"concat into {key!r}: {source!r} holds {len(piece)} bytes, not {want}"
                        )
                pieces = [p[:n] for p, n in zip(pieces, sizes, strict=True)]
            data = b"".join(pieces)
            self._objects[key] = _Object(data, dict(metadata), time.time())
            _raise_after(fault, "concat")

    def is_temp_failure(self, exc: BaseException) -> bool:
        """Only `TemporaryFailure` is temporary; injected exceptions of other types are final."""
        return isinstance(exc, TemporaryFailure)

    def close(self) -> None:
        """Nothing to release; the objects stay readable (tests inspect them)."""

    def _get(self, key: str) -> _Object:
        try:
            return self._objects[key]
        except KeyError:
            raise ChunkNotFound(key) from None


def _check_key(key: str) -> None:
    # The rule every binding shares (see gateway.storage.interface).
    if not key or key.startswith("/"):
        raise ValueError(f"bad object key {key!r}: empty or starting with '/'")


def _injected(fault: _Fault, op: str) -> BaseException:
    if fault.exc is None:
        return TemporaryFailure(f"injected temporary failure ({op})")
    # Raised more than once: drop the previous raise's traceback each time.
    return fault.exc.with_traceback(None)


def _raise_after(fault: _Fault | None, op: str) -> None:
    """Raise an ``after`` fault once the operation has taken effect."""
    if fault is not None:
        raise _injected(fault, op)


if TYPE_CHECKING:
    # mypy proves here that the binding satisfies the protocol.
    _protocol_check: type[ChunkStorage] = MemoryStorage
