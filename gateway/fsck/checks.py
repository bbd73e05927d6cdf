"""fsck's checks: one function per named check, run in a fixed order.

1. ``journal`` (`check_journal`): every frame and its CRC32C, sequence
   numbers and epochs, as recovery reads them; a torn tail, files without
   frames, and corruption (a bad frame with valid frames after it).
2. ``metadata`` (`check_metadata`): the committed metadata's invariants per
   segment: ``start_offset <= storage_length <= length``, chunks sorted,
   contiguous and non-overlapping, covering ``[start_offset,
   storage_length)``, ``sealed_in_storage`` only when sealed and all in Tier
   2, the event index in range, and the bytes above Tier 2 in the journal.
3. ``chunks`` (`check_chunks`): every chunk object exists (HEAD) with at
   least its recorded length.
4. ``chunk-data`` (`check_chunk_data`, ``--deep`` only): every chunk read in
   full and its CRC32C compared with the record (and cached blocks with
   the bytes read).
5. ``orphans`` (`check_orphans`): chunk objects no segment names, found
   with GC's own pass (`gateway.tier2.gc.collect`).
6. ``cache`` (`check_cache`): Tier-2 blocks in the cache whose chunk no
   segment names or whose size disagrees with the chunk record.

The journal is checked from its files; the others from a `Target`: the
committed metadata, the Tier-2 binding and the cache of one node, either
rebuilt from a stopped node's directories (`gateway.fsck.run`) or the
running daemon's own (`gateway.fsck.online`). A check that finds something
it can safely fix fixes it only when asked (``--repair``) and says so.

When a stopped node's journal is corrupt, checks 3-5 run against the newest
metadata snapshot in Tier 2 instead (`run_snapshot_checks`): what it names
is checked, what came after it is not known, so nothing in Tier 2 is
changed on its word.
"""

from __future__ import annotations

import itertools
import math
import pathlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from cache import CacheStore
from gateway.aio import crc32c_of
from gateway.config import Tier2Config
from gateway.errors import ChunkNotFound, GatewayError, JournalCorrupt, Tier2Error
from gateway.journal.files import list_files
from gateway.journal.reader import FileEnd, mapped, read_frames, replay_journal, valid_frames_after
from gateway.protocol.metadata_pb2 import ChunkRecord, ContainerSnapshot, SegmentRecord
from gateway.read.chunks import BLOCK_SIZE
from gateway.read.index import ReadIndex, SegmentView
from gateway.storage.layer import ChunkLayer
from gateway.tier2 import gc
from gateway.tier2 import object_keys as names

from .report import CheckDone, Finding, Progress, Sink

T = TypeVar("T")

#: A deep read fetches a chunk in ranged GETs of this size (whole cache blocks).
READ_PIECE = 8 * BLOCK_SIZE
#: Progress events at most this often (seconds).
PROGRESS_INTERVAL = 0.5
#: Running daemon: a journal read that races with its writer is read again.
ONLINE_JOURNAL_ATTEMPTS = 3
#: Checked against a snapshot: a chunk object written this long before the
#: snapshot may be an upload whose ChunkAdded was not committed yet when it
#: was taken (so the journal, not the snapshot, names it).
SNAPSHOT_UPLOAD_MARGIN = 60.0
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


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _age(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{max(seconds, 0):.0f} s"


async def _each(items: Sequence[T], fn: Callable[[T], Awaitable[None]], concurrency: int) -> None:
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


# -- 1. journal ----------------------------------------------------------------------


@dataclass
class JournalScan:
    """What the journal check found (computed in a worker thread, reported after)."""

    findings: list[Finding] = field(default_factory=list)
    detail: str = ""
    #: Acknowledged operations are unreadable: the metadata cannot be rebuilt.
    corrupt: bool = False


def _first_bad_frames(directory: pathlib.Path) -> list[tuple[FileEnd, int]]:
    """Per file, the first bad frame (if any) and how many valid frames follow it there."""
    bad = []
    for jf in list_files(directory):
        with mapped(jf.path) as data:
            for item in read_frames(data, jf.path):
                if isinstance(item, FileEnd) and not item.is_clean:
                    later = sum(1 for _ in valid_frames_after(data, item.offset + 1, jf.path))
                    bad.append((item, later))
    return bad


def _scan_journal(directory: pathlib.Path, online: bool, repair: bool) -> JournalScan:
    """Read the journal as recovery does, without changing it unless repairing."""
    scan = JournalScan()
    name = "journal"
    bad = _first_bad_frames(directory)
    corrupt: JournalCorrupt | None = None
    try:
        result = replay_journal(directory, repair=False)
    except JournalCorrupt as e:
        corrupt = e
    if corrupt is not None:
        scan.corrupt = True
        # Removing an unreadable frame would lose acknowledged operations,
        # and every later operation's sequence number depends on it.
        action = "not repaired: no safe repair exists (docs/OPERATIONS.md, fsck)" if repair else ""
        where = (corrupt.path, corrupt.offset)
        scan.findings.append(
            Finding(
                name,
                True,
                f"{pathlib.Path(corrupt.path).name} offset {corrupt.offset}: {corrupt.reason}; "
                "acknowledged operations there cannot be read, so the daemon refuses to start",
                action,
                file=corrupt.path,
                offset=corrupt.offset,
            )
        )
        for end, later in bad:
            if (str(end.path), end.offset) != where:
                scan.findings.append(
                    Finding(
                        name,
                        True,
                        f"{end.path.name} offset {end.offset}: bad frame ({end.reason}), "
                        f"{later} valid frame(s) after it in the file",
                        action,
                        file=str(end.path),
                        offset=end.offset,
                    )
                )
        return scan
    scan.detail = (
        f"{len(result.files)} file(s), {result.frames} frame(s), "
        f"{result.operations} operation(s), {len(result.checkpoints)} checkpoint(s), "
        f"last epoch {result.max_epoch}"
    )
    torn = result.torn
    fixable = not online and (torn is not None or result.empty_files)
    if repair and fixable:
        # What the daemon's next start would do, under the lock fsck holds.
        replay_journal(directory, repair=True)
    if torn is not None:
        if online:
            scan.findings.append(
                Finding(
                    name,
                    False,
                    f"{torn.path.name} offset {torn.offset}: the tail is being written "
                    f"({torn.reason})",
                    file=str(torn.path),
                    offset=torn.offset,
                )
            )
        else:
            scan.findings.append(
                Finding(
                    name,
                    True,
                    f"{torn.path.name} offset {torn.offset}: torn write at the tail "
                    f"({torn.reason}); it was never acknowledged and the next start cuts it off",
                    "cut off" if repair else "",
                    repaired=repair,
                    file=str(torn.path),
                    offset=torn.offset,
                )
            )
    for path in result.empty_files:
        if online:
            scan.findings.append(
                Finding(name, False, f"{path.name}: no frames yet (being created)", file=str(path))
            )
        else:
            scan.findings.append(
                Finding(
                    name,
                    True,
                    f"{path.name}: holds no frames (a crash right after creating it)",
                    "deleted" if repair else "",
                    repaired=repair,
                    file=str(path),
                )
            )
    return scan


def scan_journal(directory: pathlib.Path, online: bool, repair: bool) -> JournalScan:
    """The journal check's findings (blocking; see `check_journal`)."""
    attempts = ONLINE_JOURNAL_ATTEMPTS if online else 1
    for attempt in range(1, attempts + 1):
        try:
            scan = _scan_journal(directory, online, repair and not online)
        except FileNotFoundError:
            # The daemon deleted a file it no longer needs while we read.
            if attempt == attempts:
                raise
            continue
        # A group being written may look like corruption to a reader that
        # saw its frames half written and the next group complete: a real
        # corruption is still there when read again.
        if scan.corrupt and attempt < attempts:
            time.sleep(0.2)
            continue
        return scan
    raise AssertionError("unreachable")


async def check_journal(directory: pathlib.Path, run: CheckRun, online: bool = False) -> bool:
    """Check 1: the journal's frames. Returns False if it is corrupt or unreadable.

    Read-only and lock-free like ``journal-dump``; ``online`` (a daemon
    writes it) means a torn tail is the group being written: a note. With
    ``--repair`` offline, a torn tail is cut off and files without frames
    are deleted, as the next start would; corruption is never touched.
    """
    try:
        scan = await trio.to_thread.run_sync(scan_journal, directory, online, run.options.repair)
    except OSError as e:
        await run.problem(f"cannot read the journal in {directory}: {e}", file=str(directory))
        await run.done()
        return False
    for f in scan.findings:
        if f.problem:
            await run.problem(
                f.message, action=f.action, repaired=f.repaired, file=f.file, offset=f.offset
            )
        else:
            await run.note(f.message, file=f.file)
    run.detail = scan.detail
    await run.done()
    return not scan.corrupt


# -- the target of the other checks ------------------------------------------------------


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
    #: Keys being uploaded (named soon; a running daemon only).
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

    def referenced(self) -> set[str]:
        """Keys that are not garbage now."""
        return set(self.chunks_now()) | self.uploading()


@dataclass
class _State:
    """What the metadata check passes on to the later checks."""

    #: (segment name, chunk) for every chunk, in segment and offset order.
    chunks: list[tuple[str, ChunkRecord]] = field(default_factory=list)
    #: Keys of chunks found missing, short or unreadable (not read again).
    bad: set[str] = field(default_factory=set)
    #: chunk key -> indexes of cached blocks that differ from Tier 2 (deep).
    cache_mismatch: dict[str, set[int]] = field(default_factory=dict)


# -- 2. metadata -------------------------------------------------------------------------


def segment_problems(r: SegmentRecord) -> Iterable[tuple[str, int | None]]:
    """What is wrong with one segment's metadata: (message, offset) pairs."""
    name = repr(r.name)
    if not r.start_offset <= r.storage_length <= r.length:
        yield (
            f"segment {name}: start offset {r.start_offset}, storage length "
            f"{r.storage_length} and length {r.length} are out of order "
            "(start offset <= storage length <= length)",
            None,
        )
    if r.sealed_in_storage and not (r.sealed and r.storage_length == r.length):
        why = (
            "it is not sealed"
            if not r.sealed
            else f"only {r.storage_length} of its {r.length} bytes are in Tier 2"
        )
        yield f"segment {name}: marked sealed in storage, but {why}", None
    chunks = list(r.chunks)
    if not chunks:
        if r.storage_length > r.start_offset:
            yield (
                f"segment {name}: no chunks, but bytes [{r.start_offset}, {r.storage_length}) "
                "are said to be in Tier 2",
                r.start_offset,
            )
    else:
        first, last = chunks[0], chunks[-1]
        if first.start_offset > r.start_offset:
            yield (
                f"segment {name}: no chunk holds [{r.start_offset}, {first.start_offset})",
                r.start_offset,
            )
        if first.start_offset + first.length <= r.start_offset:
            yield (
                f"segment {name}: chunk {first.name} [{first.start_offset}, "
                f"{first.start_offset + first.length}) lies wholly below the start offset "
                f"{r.start_offset}",
                first.start_offset,
            )
        for a, b in itertools.pairwise(chunks):
            end = a.start_offset + a.length
            if b.start_offset > end:
                yield (f"segment {name}: no chunk holds [{end}, {b.start_offset})", end)
            elif b.start_offset < end:
                yield (
                    f"segment {name}: chunks {a.name} and {b.name} overlap at "
                    f"[{b.start_offset}, {min(end, b.start_offset + b.length)})",
                    b.start_offset,
                )
        last_end = last.start_offset + last.length
        total = sum(c.length for c in chunks)
        if last_end != r.storage_length:
            yield (
                f"segment {name}: chunks end at {last_end}, the storage length is "
                f"{r.storage_length} (chunk lengths sum to {total} from "
                f"{first.start_offset})",
                min(last_end, r.storage_length),
            )
    index = list(r.event_index)
    if index and (index != sorted(set(index)) or index[0] < r.start_offset or index[-1] > r.length):
        yield (
            f"segment {name}: event index is not ascending within [{r.start_offset}, {r.length}]",
            None,
        )


def _merge_problems(r: SegmentRecord, by_id: dict[int, SegmentRecord]) -> Iterator[str]:
    """A merge not yet done in Tier 2 must fit its target (the "merged" shape of a commit)."""
    if not r.merged_into:
        return
    t = by_id.get(r.merged_into)
    if t is None:
        yield f"segment {r.name}: merged into segment id {r.merged_into}, which does not exist"
        return
    if not r.sealed:
        yield f"segment {r.name}: merged into {t.name} but not sealed"
    if r.merge_offset + r.length > t.length:
        yield (
            f"segment {r.name}: merged into {t.name} at {r.merge_offset}, past its length "
            f"{t.length}"
        )
    # (A target truncated past the merge offset no longer needs the bytes.)
    if t.start_offset <= r.merge_offset < t.storage_length:
        yield (
            f"segment {r.name}: merged into {t.name} at {r.merge_offset}, but the target is "
            f"in Tier 2 up to {t.storage_length} without its chunks"
        )


async def check_metadata(target: Target, run: CheckRun) -> _State:
    """Check 2: invariants of the committed metadata; nothing is repaired.

    The metadata is the journal's (its operations and checkpoints): fsck
    does not rewrite it, so every problem here is left for the operator.
    """
    # Snapshot and journal coverage are read together, without yielding, so
    # a running daemon cannot change one between them.
    snap = target.snapshot()
    gaps: dict[int, str] = {}
    by_id = {r.id: r for r in snap.segments}
    # Committed transactions whose merge is not done in Tier 2 yet: the
    # target's bytes at [merge_offset, + source length) are the source's.
    merged: dict[int, list[SegmentRecord]] = {}
    for r in snap.segments:
        if r.merged_into:
            merged.setdefault(r.merged_into, []).append(r)

    def view_of(r: SegmentRecord) -> SegmentView:
        sources = sorted(merged.get(r.id, []), key=lambda m: m.merge_offset)
        return SegmentView(
            r.id,
            r.name,
            r.start_offset,
            r.length,
            r.sealed,
            r.storage_length,
            list(r.chunks),
            tuple((m.merge_offset, view_of(m)) for m in sources),
        )

    if target.read_index is not None:
        for r in snap.segments:
            gap = target.read_index.coverage_gap(view_of(r))
            if gap is not None:
                gaps[r.id] = gap
    action = (
        "not repaired: fsck does not rewrite the journal's metadata" if run.options.repair else ""
    )
    state = _State()
    records = sorted(snap.segments, key=lambda r: r.name)
    for r in records:
        for message, offset in segment_problems(r):
            await run.problem(message, action=action, segment=r.name, offset=offset)
        for message in _merge_problems(r, by_id):
            await run.problem(message, action=action, segment=r.name)
        if r.id in gaps:
            await run.problem(
                f"segment {r.name!r}: bytes above Tier 2 are not all in the journal: {gaps[r.id]}",
                action=action,
                segment=r.name,
            )
        state.chunks.extend((r.name, c) for c in record_chunks(r))
    stored = sum(r.storage_length - r.start_offset for r in records)
    run.detail = (
        f"{len(records)} segment(s), {len(state.chunks)} chunk(s), "
        f"{_size(sum(r.length for r in records))} committed, {_size(max(stored, 0))} in Tier 2"
    )
    await run.done()
    return state


async def _without_tier2(target: Target, run: CheckRun, first: bool) -> bool:
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


async def _restore_from_cache(
    target: Target, run: CheckRun, segment: str, c: ChunkRecord
) -> tuple[bool, str]:
    """Rewrite a lost or damaged chunk object from its cached blocks: (done, action).

    Only offline (a running daemon may append to its own chunks), and only
    when the cache holds every block and their bytes match the record's
    CRC32C: then they are exactly the bytes that were flushed.
    """
    store, layer = target.store, target.layer
    if not run.options.repair:
        return False, ""
    if target.online:
        return False, "not repaired here: stop the daemon; fsck --repair may then restore it"
    if target.basis:
        return False, f"not repaired: {HANDS_OFF}"
    count = -(-c.length // BLOCK_SIZE)
    pieces = []
    for index in range(count):
        block = store.get_block(c.name, index) if store is not None else None
        expected = min(BLOCK_SIZE, c.length - index * BLOCK_SIZE)
        if block is None or len(block) < expected:
            have = sum(1 for i in range(count) if store is not None and store.block_size(c.name, i))
            return False, (
                "not repaired: no copy left to restore it from "
                f"(the cache holds {have} of its {count} block(s))"
            )
        pieces.append(block[:expected])
    data = b"".join(pieces)
    if await crc32c_of(data) != c.crc32c:
        return False, "not repaired: the cached copy does not match the record's CRC32C either"
    assert layer is not None
    try:
        await layer.write(
            c.name, data, names.chunk_metadata(segment, c.start_offset, c.length, c.crc32c, c.epoch)
        )
    except Tier2Error as e:
        return False, f"not repaired: writing the cached copy back failed: {e}"
    return True, "restored from the cache (CRC32C verified)"


# -- 3. chunks (HEAD) ----------------------------------------------------------------------


async def check_chunks(target: Target, state: _State, run: CheckRun) -> None:
    """Check 3: every chunk object exists with at least its recorded length.

    The journal lets flushed bytes go, so a missing or short object can be
    repaired only from the cache: with ``--repair`` offline, when every
    block is cached and they match the record's CRC32C, they are written
    back (`_restore_from_cache`). Otherwise the bytes are lost.
    """
    layer = target.layer
    if layer is None:
        await _without_tier2(target, run, first=True)
        return
    found: dict[str, tuple[int, str]] = {}  # key -> (size, error)

    async def head(item: tuple[str, ChunkRecord]) -> None:
        key = item[1].name
        try:
            found[key] = ((await layer.stat(key)).size, "")
        except ChunkNotFound:
            found[key] = (-1, "")
        except Tier2Error as e:
            found[key] = (-1, str(e))

    await _each(state.chunks, head, target.tier2.max_concurrency)
    # A running daemon may have dropped a chunk (truncation) since the
    # snapshot, and deleted its object: only chunks still named count.
    named = set(target.chunks_now()) if target.online else None
    for segment, c in state.chunks:
        size, error = found[c.name]
        end = c.start_offset + c.length
        where = f"segment {segment!r} [{c.start_offset}, {end})"
        if size >= c.length:
            if size > c.length:
                await run.note(
                    f"chunk object {c.name} holds {size - c.length} byte(s) past its recorded "
                    f"length {c.length} (an append {'in progress or ' if target.online else ''}"
                    "cut off by a crash; they are never read)",
                    segment=segment,
                    key=c.name,
                )
            continue
        if named is not None and c.name not in named:
            continue
        state.bad.add(c.name)
        repaired, action = False, ""
        if error:
            message = f"{where}: cannot stat chunk object {c.name}: {error}"
        else:
            if size < 0:
                message = f"{where}: chunk object {c.name} is missing; reads of these bytes fail"
            else:
                message = (
                    f"{where}: chunk object {c.name} has {size} bytes, its record says "
                    f"{c.length}; reads of [{c.start_offset + size}, {end}) fail"
                )
            if target.basis:
                message += (
                    " (named by the snapshot; a truncation or deletion since may have dropped it)"
                )
            repaired, action = await _restore_from_cache(target, run, segment, c)
        await run.problem(
            message,
            action=action,
            repaired=repaired,
            segment=segment,
            key=c.name,
            offset=c.start_offset,
        )
    run.detail = f"{len(state.chunks)} chunk object(s)" + _per(target)
    await run.done()


# -- 4. chunk-data (--deep) ------------------------------------------------------------------


def _cache_differs(store: CacheStore, key: str, start: int, data: bytes) -> list[int]:
    """Indexes of cached blocks of ``key`` within ``data`` (read at ``start``) that differ."""
    differ = []
    if names.is_attribute_chunk(key):
        # Attribute index pages are cached by their offset in the chunk.
        for chunk, offset, size in store.blocks():
            if chunk != key or not start <= offset < start + len(data):
                continue
            cached = store.get_block(key, offset)
            want = data[offset - start : offset - start + size]
            if cached is not None and cached != want:
                differ.append(offset)
        return differ
    for rel in range(0, len(data), BLOCK_SIZE):
        index = (start + rel) // BLOCK_SIZE
        if store.block_size(key, index) is None:
            continue
        cached = store.get_block(key, index)
        want = data[rel : rel + BLOCK_SIZE]
        # A cached block may be shorter (the chunk grew since); never different.
        if cached is not None and cached != want[: len(cached)]:
            differ.append(index)
    return differ


async def check_chunk_data(target: Target, state: _State, run: CheckRun) -> None:
    """Check 4 (``--deep``): read every chunk, compare its CRC32C with the record.

    Reads go through the chunk layer in parallel (``tier2.max_concurrency``),
    in 8 MiB ranged GETs; cached blocks are compared with the bytes read
    (the cache check reports the ones that differ). A damaged chunk is
    repaired as a missing one is: from the cache, if it holds a good copy.
    """
    layer = target.layer
    if not run.options.deep:
        await run.done("--deep reads every chunk")
        return
    if layer is None:
        await _without_tier2(target, run, first=False)
        return
    todo = [(s, c) for s, c in state.chunks if c.name not in state.bad]
    total = sum(c.length for _, c in todo)
    done_bytes = done_chunks = 0
    #: (segment, chunk, why, whether a copy from the cache would fix it)
    damaged: list[tuple[str, ChunkRecord, str, bool]] = []
    store = target.store
    started = time.monotonic()
    await run.progress(0, total, 0, len(todo))

    async def read(item: tuple[str, ChunkRecord]) -> None:
        nonlocal done_bytes, done_chunks
        segment, c = item
        crc = 0
        mismatched: list[int] = []
        pos = 0
        try:
            while pos < c.length:
                want = min(READ_PIECE, c.length - pos)
                data = await layer.read(c.name, pos, want)
                if len(data) != want:
                    damaged.append((segment, c, f"read {len(data)} of {want} bytes at {pos}", True))
                    return
                crc = await crc32c_of(data, crc)
                if store is not None:
                    mismatched += _cache_differs(store, c.name, pos, data)
                pos += want
                done_bytes += want
                await run.progress(done_bytes, total, done_chunks, len(todo))
        except Tier2Error as e:
            damaged.append((segment, c, f"read failed: {e}", False))
            return
        finally:
            done_chunks += 1
            done_bytes += c.length - pos
        if crc != c.crc32c:
            damaged.append((segment, c, f"CRC32C {crc:08x}, its record says {c.crc32c:08x}", True))
        elif mismatched:
            # Only against bytes that proved right: when the chunk is
            # damaged, the cached copy may be the good one.
            state.cache_mismatch[c.name] = set(mismatched)

    await _each(todo, read, target.tier2.max_concurrency)
    await run.progress(total, total, len(todo), len(todo))
    named = set(target.chunks_now()) if target.online else None
    order = {c.name: i for i, (_, c) in enumerate(state.chunks)}
    for segment, c, why, restorable in sorted(damaged, key=lambda d: order[d[1].name]):
        if named is not None and c.name not in named:
            continue  # dropped (truncated, deleted) while it was read
        state.bad.add(c.name)
        repaired, action = False, ""
        if restorable:
            repaired, action = await _restore_from_cache(target, run, segment, c)
        await run.problem(
            f"segment {segment!r} [{c.start_offset}, {c.start_offset + c.length}): chunk object "
            f"{c.name} is damaged: {why}",
            action=action,
            repaired=repaired,
            segment=segment,
            key=c.name,
            offset=c.start_offset,
        )
    elapsed = time.monotonic() - started
    run.detail = f"{len(todo)} chunk(s), {_size(total)} read in {elapsed:.1f}s" + _per(target)
    await run.done()


# -- 5. orphans --------------------------------------------------------------------------------


def _gc_overdue(tier2: Tier2Config) -> float:
    """Age past which a running daemon's GC should have deleted an orphan (seconds).

    GC passes run every ``gc_interval`` and delete what is older than
    ``gc_grace``; allow two passes, each retrying Tier 2 for its deadline.
    """
    return tier2.gc_grace + 2 * (tier2.gc_interval + tier2.retry_deadline)


async def check_orphans(target: Target, run: CheckRun) -> None:
    """Check 5: chunk objects that no segment names, with GC's own rules.

    With ``--repair`` exactly what GC would delete is deleted: garbage older
    than ``tier2.gc_grace``. Younger garbage is reported and kept (offline
    it is a problem left; on a running daemon it may be an upload or a
    delete in progress, so a note). On a running daemon, garbage that its
    GC deletes at one of its next passes is expected: only garbage that GC
    should have deleted by now is a problem (`_gc_overdue`).
    """
    layer = target.layer
    if layer is None:
        await _without_tier2(target, run, first=False)
        return
    repair = run.options.repair
    grace = target.tier2.gc_grace
    if target.basis:
        await _orphans_per_snapshot(target, run)
        return
    try:
        result = await gc.collect(
            layer, target.node, target.referenced, grace=grace, dry_run=not repair
        )
    except Tier2Error as e:
        await run.problem(f"cannot list the node's objects in Tier 2: {e}")
        await run.done()
        return
    now = time.time()
    deleted, failed = set(result.deleted_keys), set(result.failed_keys)
    for obj in result.garbage:
        if target.online and not repair and now - obj.mtime <= _gc_overdue(target.tier2):
            await run.note(
                f"orphan object {obj.key} ({_size(obj.size)}, {_age(now - obj.mtime)} old): "
                "no segment names it; the daemon's GC deletes it at its next pass",
                key=obj.key,
            )
            continue
        action = ""
        if obj.key in deleted:
            action = "deleted"
            if target.store is not None:
                await trio.to_thread.run_sync(target.store.drop_chunk, obj.key)
            target.forget_chunk(obj.key)
        elif obj.key in failed:
            action = "not deleted: the delete failed (see the log)"
        await run.problem(
            f"orphan object {obj.key} ({_size(obj.size)}, {_age(now - obj.mtime)} old): "
            "no segment names it",
            action=action,
            repaired=obj.key in deleted,
            key=obj.key,
        )
    named = target.referenced() if result.young else set()
    for obj in result.young:
        if obj.key in named:
            continue
        what = f"orphan object {obj.key} ({_size(obj.size)}, {_age(now - obj.mtime)} old)"
        if target.online:
            await run.note(
                f"{what}: younger than tier2.gc_grace, so perhaps an upload or a delete in "
                "progress; GC decides once it is older",
                key=obj.key,
            )
        else:
            await run.problem(
                f"{what}: no segment names it",
                action=f"kept: younger than tier2.gc_grace ({_age(grace)}); run fsck --repair "
                "again once it is older"
                if repair
                else "",
                key=obj.key,
            )
    for key in result.unknown_keys:
        await run.note(f"unknown object {key} under the node's prefix (not a chunk; left alone)")
    run.detail = f"{result.listed} chunk object(s) listed, {result.referenced} named"
    await run.done()


async def _orphans_per_snapshot(target: Target, run: CheckRun) -> None:
    """Check 5 against a snapshot: report what it does not name, delete nothing.

    Objects written after the snapshot (or just before it, see
    `SNAPSHOT_UPLOAD_MARGIN`) may be chunks the journal names: notes. Older
    ones no snapshot names are garbage as far as fsck can tell: problems,
    left for GC once the node runs again.
    """
    assert target.layer is not None
    try:
        # grace=inf: every unnamed object comes back in ``young``, none deleted.
        result = await gc.collect(
            target.layer, target.node, target.referenced, grace=math.inf, dry_run=True
        )
    except Tier2Error as e:
        await run.problem(f"cannot list the node's objects in Tier 2: {e}")
        await run.done()
        return
    now = time.time()
    action = f"not deleted: {HANDS_OFF}" if run.options.repair else ""
    for obj in result.young:
        what = f"orphan object {obj.key} ({_size(obj.size)}, {_age(now - obj.mtime)} old)"
        if obj.mtime >= target.basis_time - SNAPSHOT_UPLOAD_MARGIN:
            await run.note(
                f"{what}: written after the snapshot, which does not name it; the journal may",
                key=obj.key,
            )
        else:
            await run.problem(f"{what}: no segment names it", action=action, key=obj.key)
    for key in result.unknown_keys:
        await run.note(f"unknown object {key} under the node's prefix (not a chunk; left alone)")
    run.detail = f"{result.listed} chunk object(s) listed, {result.referenced} named" + _per(target)
    await run.done()


# -- 6. cache ------------------------------------------------------------------------------------


async def check_cache(target: Target, state: _State, run: CheckRun) -> None:
    """Check 6: cached Tier-2 blocks that disagree with the chunk records.

    A block of a chunk no segment names, a block past its chunk's end, a
    block longer than the record allows, or (``--deep``) one whose bytes
    differ from Tier 2. With ``--repair`` all blocks of such a chunk are
    dropped: the cache is only a copy. A block *shorter* than expected is
    fine: its chunk grew by an append since, and readers fetch it again.
    Blocks of other nodes' chunks (a cluster's mount reads them through
    this cache) are not judged: their records are their owners'.
    """
    store = target.store
    if store is None:
        if target.cache_error:
            await run.problem(target.cache_error)
            await run.done()
        else:
            await run.done("no cache here")
        return
    blocks = await trio.to_thread.run_sync(store.blocks)
    # After the listing: a chunk named (or grown) since is seen as it is now.
    records = target.chunks_now()
    uploading = target.uploading()
    by_chunk: dict[str, list[tuple[int, int]]] = {}
    own = names.node_prefix(target.node)
    others = 0
    for chunk, index, size in blocks:
        if not chunk.startswith(own):
            others += 1
            continue
        by_chunk.setdefault(chunk, []).append((index, size))
    for chunk, found in sorted(by_chunk.items()):
        reasons = []
        rec = records.get(chunk)
        if rec is None:
            if chunk in uploading:
                continue
            reasons.append("no segment names the chunk")
        else:
            for index, size in found:
                if names.is_attribute_chunk(chunk):
                    # A page, cached by its offset in the chunk.
                    if index + size > rec.length:
                        reasons.append(
                            f"page at {index} ({size} bytes) lies past the chunk's end "
                            f"({rec.length} bytes)"
                        )
                    continue
                expected = min(BLOCK_SIZE, rec.length - index * BLOCK_SIZE)
                if expected <= 0:
                    reasons.append(f"block {index} lies past the chunk's end ({rec.length} bytes)")
                elif size > expected:
                    reasons.append(f"block {index} has {size} bytes, the record allows {expected}")
            for index in sorted(state.cache_mismatch.get(chunk, ())):
                reasons.append(f"block {index} differs from the chunk in Tier 2")
        if not reasons:
            continue
        action = ""
        if run.options.repair:
            await trio.to_thread.run_sync(store.drop_chunk, chunk)
            target.forget_chunk(chunk)
            action = f"dropped its {len(found)} cached block(s)"
        await run.problem(
            f"cache: {len(found)} block(s) of chunk {chunk}: {'; '.join(reasons)}",
            action=action,
            repaired=run.options.repair,
            key=chunk,
        )
    run.detail = f"{len(blocks) - others} block(s) of {len(by_chunk)} chunk(s)"
    if others:
        run.detail += f"; {others} block(s) of other nodes' chunks, not checked here"
    await run.done()


def record_chunks(r: SegmentRecord) -> list[ChunkRecord]:
    """Every chunk a segment record names: its bytes' and its attribute index's."""
    return [*r.chunks, *r.attribute_index.chunks]


async def check_attribute_indexes(target: Target, state: _State, run: CheckRun) -> None:
    """Check 4b: every attribute index is a sound tree.

    Its pages parse (magic, version, CRC32C), keys are in order within and
    across pages, each index entry's lowest-page-offset bookkeeping holds,
    and no live page lies below the index's truncation offset (so deleting
    the chunks below it lost nothing). Pages are read through the cache and
    Tier 2; an index whose chunks the chunk check found bad is reported
    there only. Nothing is repaired: the journal's values are the truth
    until the next batch rewrites the pages.
    """
    from gateway.attrindex.btree import IndexCorrupt
    from gateway.attrindex.store import AttributeIndexStore

    layer = target.layer
    records = [
        r
        for r in sorted(target.snapshot().segments, key=lambda r: r.name)
        if r.attribute_index.root_length
    ]
    if layer is None:
        if not records:
            await run.done("no attribute indexes")
        else:
            await _without_tier2(target, run, first=False)
        return
    # Pages come through the cache when it has them, but fsck never adds
    # any: beside a running daemon it could cache a chunk being deleted.
    indexes = AttributeIndexStore(
        layer, target.node, target.store, page_cache_bytes=0, cache_writes=False
    )
    for r in records:
        if any(c.name in state.bad for c in r.attribute_index.chunks):
            continue
        index = r.attribute_index
        for _ in range(3):
            try:
                problems = await indexes.verify(r.id, index)
            except (IndexCorrupt, GatewayError) as e:
                problems = [str(e)]
            if not problems or not target.online:
                break
            # A running daemon may have moved the index on since the
            # snapshot (and deleted chunks it named): check it as it is now.
            now = next((s for s in target.snapshot().segments if s.id == r.id), None)
            if now is None:
                problems = []  # deleted meanwhile
                break
            if (now.attribute_index.root_offset, now.attribute_index.length) == (
                index.root_offset,
                index.length,
            ):
                break
            index = now.attribute_index
        for message in problems:
            await run.problem(
                f"segment {r.name!r}: attribute index: {message}",
                action="not repaired" if run.options.repair else "",
                segment=r.name,
            )
    run.detail = f"{len(records)} attribute index(es)" + _per(target)
    await run.done()


# -- all checks after the journal ---------------------------------------------------------------


def _per(target: Target) -> str:
    return f", per {target.basis}" if target.basis else ""


async def run_snapshot_checks(target: Target, options: Options, sink: Sink) -> None:
    """Checks 3-5 on a target whose metadata is a Tier-2 snapshot (``target.basis``).

    The metadata check is the caller's (it says why the journal's metadata
    is missing); the cache is skipped, since which chunks the metadata names
    now is not known. Nothing in Tier 2 is changed, whatever ``--repair``.
    """
    state = _State()
    for r in sorted(target.snapshot().segments, key=lambda r: r.name):
        state.chunks.extend((r.name, c) for c in record_chunks(r))
    await check_chunks(target, state, CheckRun("chunks", sink, options))
    await check_chunk_data(target, state, CheckRun("chunk-data", sink, options))
    await check_attribute_indexes(target, state, CheckRun("attribute-index", sink, options))
    await check_orphans(target, CheckRun("orphans", sink, options))
    await skip(
        "cache",
        sink,
        "the journal is corrupt: which chunks its metadata names now is not known",
    )


async def run_target_checks(target: Target, options: Options, sink: Sink) -> None:
    """Checks 2-6 on ``target``, in order."""

    def run(name: str) -> CheckRun:
        return CheckRun(name, sink, options)

    state = await check_metadata(target, run("metadata"))
    await check_chunks(target, state, run("chunks"))
    await check_chunk_data(target, state, run("chunk-data"))
    await check_attribute_indexes(target, state, run("attribute-index"))
    await check_orphans(target, run("orphans"))
    await check_cache(target, state, run("cache"))
