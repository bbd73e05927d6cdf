"""What every fsck check works with: the options, a `CheckRun` to report through,
the `Target` it checks and the `CheckState` the metadata check hands on."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import trio

from cache import CacheStore
from gateway.config import Tier2Config
from gateway.protocol.metadata_pb2 import ChunkRecord, ContainerSnapshot
from gateway.read.index import ReadIndex
from gateway.storage.layer import ChunkLayer

from .report import CheckDone, Finding, Progress, Sink

if TYPE_CHECKING:
    from gateway.cluster.claims import NameClaims

T = TypeVar("T")

#: Progress events at most this often (seconds).
PROGRESS_INTERVAL = 0.5
#: Why nothing is repaired in Tier 2 when the metadata is a snapshot.
HANDS_OFF = "the journal is corrupt, and fsck changes nothing in Tier 2 on a snapshot's word"


@dataclass(frozen=True)
class Options:
    """What the operator asked for."""

    #: Read every chunk and compare CRC32Cs (reads all of Tier 2).
    deep: bool = False
    #: Fix what can be fixed safely.
    repair: bool = False


class CheckRun:
    """One check's reporting: findings go to the sink at once, in order."""

    def __init__(self, name: str, sink: Sink, options: Options) -> None:
        self.name = name
        self.options = options
        self._sink = sink
        # Workers of a parallel check report concurrently; a sink sends one
        # message at a time.
        self._lock = trio.Lock()
        #: What the check covered ("12 segments, 40 chunks"), sent with its end.
        self.detail = ""
        self.problems = 0
        self._last_progress = 0.0

    async def _send(self, event: Finding | CheckDone | Progress) -> None:
        async with self._lock:
            await self._sink(event)

    async def problem(
        self,
        message: str,
        *,
        action: str = "",
        repaired: bool = False,
        segment: str = "",
        key: str = "",
        file: str = "",
        offset: int | None = None,
    ) -> None:
        """Report a problem (``repaired``: and that it was fixed)."""
        self.problems += 1
        await self._send(
            Finding(self.name, True, message, action, repaired, segment, key, file, offset)
        )

    async def note(self, message: str, *, segment: str = "", key: str = "", file: str = "") -> None:
        """Report something worth knowing that is not a problem."""
        await self._send(Finding(self.name, False, message, segment=segment, key=key, file=file))

    async def progress(self, done_bytes: int, total_bytes: int, done: int, total: int) -> None:
        """Say how far the check is (rate-limited; the last call always goes out)."""
        now = time.monotonic()
        if done < total and now - self._last_progress < PROGRESS_INTERVAL:
            return
        self._last_progress = now
        await self._send(Progress(self.name, done_bytes, total_bytes, done, total))

    async def done(self, skipped: str = "") -> None:
        """The check ended (or did not run, and why)."""
        await self._send(CheckDone(self.name, skipped, "" if skipped else self.detail))


async def skip(name: str, sink: Sink, reason: str) -> None:
    """Report that the check ``name`` did not run."""
    await sink(CheckDone(name, reason))


def show_size(n: int) -> str:
    """A byte count for findings: ``"1.5 MiB"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def show_age(seconds: float) -> str:
    """An age for findings: ``"3 h"``."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{max(seconds, 0):.0f} s"


async def for_each(
    items: Sequence[T], fn: Callable[[T], Awaitable[None]], concurrency: int
) -> None:
    """Run ``fn`` over ``items``, at most ``concurrency`` at a time.

    The first error stops the others and is raised as it is (not in an
    exception group): a sink that lost its connection ends fsck the way a
    broken read ends a read.
    """
    todo = iter(items)
    errors: list[Exception] = []

    async def worker(nursery: trio.Nursery) -> None:
        try:
            for item in todo:  # one iterator shared by the workers: each takes the next
                await fn(item)
        except Exception as e:
            errors.append(e)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency, len(items))):
            nursery.start_soon(worker, nursery)
    if errors:
        raise errors[0]


@dataclass
class Target:
    """One node's committed metadata, Tier 2 and cache, as the checks see them."""

    #: A daemon is running on it (its state moves while the checks run).
    online: bool
    node: str
    tier2: Tier2Config
    #: The committed metadata now.
    snapshot: Callable[[], ContainerSnapshot]
    #: Which committed bytes are held above Tier 2 (the journal's append data).
    read_index: ReadIndex | None
    #: Tier 2 (None: ``tier2_error`` or ``no_tier2`` says why).
    layer: ChunkLayer | None
    #: The cache (None: there is none here).
    store: CacheStore | None
    #: Chunk records the metadata names now, by object key.
    chunks_now: Callable[[], dict[str, ChunkRecord]]
    #: Keys being uploaded (named soon), or replaced by the storage optimizer
    #: and kept through GC's grace for readers of the old list (a running daemon only).
    uploading: Callable[[], set[str]] = set
    #: A chunk's cached blocks were dropped: forget copies held in memory too.
    forget_chunk: Callable[[str], None] = lambda key: None
    #: Why ``layer`` is None: Tier 2 failed (a problem), or there is none here.
    tier2_error: str = ""
    no_tier2: str = "Tier 2 is not running here"
    #: Why ``store`` is None although a cache exists (a problem).
    cache_error: str = ""
    #: "" when the metadata is the journal's; else the Tier-2 metadata
    #: snapshot it comes from (the journal is corrupt), for the output.
    basis: str = ""
    #: When that snapshot was taken (seconds since the epoch).
    basis_time: float = 0.0
    #: Whether a name is a live segment or stream now (None: per ``snapshot``).
    alive: Callable[[str], bool] | None = None
    #: The running daemon's name claims: which creates are in flight (online only).
    name_claims: NameClaims | None = None

    def referenced(self) -> set[str]:
        """Keys that are not garbage now."""
        return set(self.chunks_now()) | self.uploading()


@dataclass
class CheckState:
    """What the metadata check passes on to the later checks."""

    #: (segment name, chunk) for every chunk, in segment and offset order.
    chunks: list[tuple[str, ChunkRecord]] = field(default_factory=list)
    #: Keys of chunks found missing, short or unreadable (not read again).
    bad: set[str] = field(default_factory=set)
    #: chunk key -> indexes of cached blocks that differ from Tier 2 (deep).
    cache_mismatch: dict[str, set[int]] = field(default_factory=dict)


def per_basis(target: Target) -> str:
    """``", per <snapshot>"`` when the metadata is a snapshot's, for a check's detail."""
    return f", per {target.basis}" if target.basis else ""


async def without_tier2(target: Target, run: CheckRun, first: bool) -> bool:
    """End ``run`` if there is no Tier 2; True if so. ``first``: report a failure."""
    if target.layer is not None:
        return False
    if target.tier2_error and first:
        await run.problem(target.tier2_error)
        await run.done()
    else:
        await run.done(
            "Tier 2 does not answer (see check chunks)" if target.tier2_error else target.no_tier2
        )
    return True
