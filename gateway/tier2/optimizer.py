"""The storage optimizer: merges runs of small adjacent chunks (Pravega's defragmentation).

S3 objects never grow, so a slow segment gets one new small object per flush
(``tier2.flush_interval``): thousands of tiny chunks, each a PUT to pay for,
a GET for every cold reader and an entry in every checkpoint. In the
background, beside the storage writer, the optimizer

1. picks a run of at least ``defrag_min_chunks`` adjacent chunks of a segment,
   each smaller than ``defrag_small``, none more than half of the run's bytes
   (`pick_run`: each byte is rewritten at most log2(``defrag_small`` / flush
   size) times), never the chunk a flush may still extend (the last one of a
   segment not sealed in Tier 2), at most ``max_chunk_size`` together;
2. concatenates their objects into a NEW object under a fresh chunk key (the
   binding's concat: S3 multipart with UploadPartCopy for parts >= 5 MiB,
   reading and re-uploading smaller ones; the filesystem copies), whose
   CRC32C is combined from the sources' recorded ones (`crc32c_combine`);
3. journals ``ChunksReplaced``, which swaps the run for the new chunk only if
   the segment still holds exactly that run; otherwise (truncated, deleted)
   the new object is garbage and deleted;
4. keeps the replaced objects for ``tier2.gc_grace`` (`retired`: GC counts
   them as named), since readers holding the old chunk list -- a read in
   flight, another node's mount until its next refresh -- still read them,
   then deletes them.

A crash after 2 leaves an orphan that GC deletes; after 3 (before 4 ends)
the replaced objects, which no metadata names any more, are deleted by GC.
Optimizer I/O is paced to ``defrag_rate`` bytes of merged chunks a second,
shared by up to ``defrag_concurrency`` merges at once (each on a segment of
its own: one segment's runs are merged one after another, by one task).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import crc32c
import trio
import trio.lowlevel

from gateway import failpoints
from gateway.config import Tier2Config
from gateway.container.container import SegmentContainer
from gateway.container.interfaces import LeaseGate
from gateway.container.operations import PendingOperation
from gateway.container.segment import Segment
from gateway.errors import ChunkNotFound, GatewayError, Tier2Error
from gateway.protocol.metadata_pb2 import ChunkRecord, SegmentRecord
from gateway.storage import object_keys as names
from gateway.storage.layer import ChunkLayer


class Chores(Protocol):
    """What the optimizer asks of the writer's housekeeping."""

    def delete_later(self, key: str, seg_id: int) -> None:
        """Delete a chunk object once nothing names it."""

    def flushed(self) -> None:
        """Something changed that the next metadata snapshot must hold."""


class WriterState(Protocol):
    """What the optimizer uses of its `StorageWriter` (which builds it)."""

    container: SegmentContainer
    layer: ChunkLayer
    cfg: Tier2Config
    node: str
    uploading: set[str]
    fenced: GatewayError | None
    lease: LeaseGate | None

    @property
    def housekeeping(self) -> Chores:
        """Deletions and snapshots."""

    def check_fence(self) -> None:
        """Raise if the writer may not touch Tier 2."""

    async def journal_upload(self, prepare: Callable[[], PendingOperation]) -> Any:
        """Journal what an upload did (retrying while the journal refuses)."""


log = logging.getLogger(__name__)

__all__ = ["Optimizer", "OptimizerStatistics", "crc32c_combine", "pick_run", "small_limit"]

#: Zeros the CRC combination runs over, a piece at a time.
_ZEROS = bytes(1024 * 1024)
#: Segments looked at between two yields to the event loop.
_SCAN_BATCH = 1000


def _crc_of_zeros(length: int, crc: int) -> int:
    while length:
        n = min(length, len(_ZEROS))
        crc = int(crc32c.crc32c(memoryview(_ZEROS)[:n], crc))
        length -= n
    return crc


def crc32c_combine(parts: Sequence[tuple[int, int]]) -> int:
    """The CRC32C of the concatenation of pieces given as (CRC32C, length), without their bytes.

    CRC32C is affine over GF(2), so crc(A+B) = crc(A continued over |B| zeros)
    xor crc(B) xor crc(|B| zeros). Costs a CRC over as many zeros as the
    pieces after the first are long (hardware CRC32C: a few ms per 10 MiB).
    """
    if not parts:
        return 0
    crc = parts[0][0]
    for piece_crc, length in parts[1:]:
        crc = _crc_of_zeros(length, crc) ^ piece_crc ^ _crc_of_zeros(length, 0)
    return crc


def small_limit(cfg: Tier2Config) -> int:
    """Chunks below this are small (``defrag_small``; 0: a quarter of ``max_chunk_size``)."""
    return cfg.defrag_small or cfg.max_chunk_size // 4


def pick_run(
    chunks: Sequence[ChunkRecord], cfg: Tier2Config, include_last: bool, final: bool = False
) -> tuple[int, int] | None:
    """The first stretch of chunks worth merging, as (first index, count); None if none is.

    A stretch lies within a run of adjacent chunks each below `small_limit`
    (contiguous in offsets); it is the longest one from its first chunk that
    fits ``max_chunk_size``, and is worth merging when it has at least
    ``defrag_min_chunks`` chunks and none of them holds more than half its
    bytes. That last rule bounds the rewriting: a byte is copied again only
    into a chunk at least twice the size of the one it was in, so at most
    log2(``defrag_small`` / flush size) times, rather than every time a few
    more flushes arrive (a merged chunk growing by ``defrag_min_chunks``
    flushes per merge would be rewritten thousands of times on its way to
    ``defrag_small``). The first stretch is returned: the caller picks again
    after each merge. The last chunk counts only with ``include_last``.

    ``final`` (a segment sealed in Tier 2: nothing more arrives): any two or
    more adjacent chunks that fit ``max_chunk_size`` together are merged,
    whatever their sizes, so the segment ends with at most 2 x size /
    ``max_chunk_size`` + 1 objects (usually about size / ``max_chunk_size``).
    """
    # Final: packed into chunks of up to max_chunk_size, whatever is small.
    small = cfg.max_chunk_size if final else small_limit(cfg)
    least = 2 if final else cfg.defrag_min_chunks
    usable = len(chunks) if include_last else len(chunks) - 1
    i = 0
    while i < usable:
        if chunks[i].length >= small:
            i += 1
            continue
        j = i + 1
        while (
            j < usable
            and chunks[j].length < small
            and chunks[j].start_offset == chunks[j - 1].start_offset + chunks[j - 1].length
        ):
            j += 1
        for first in range(i, j - least + 1):
            total = largest = 0
            end = first
            while end < j and total + chunks[end].length <= cfg.max_chunk_size:
                total += chunks[end].length
                largest = max(largest, chunks[end].length)
                end += 1
            if end - first >= least and (final or 2 * largest <= total):
                return first, end - first
        i = j
    return None


@dataclass
class _Pass:
    """What the tasks of one `Optimizer.optimize` pass share."""

    #: Runs merged.
    merged: int = 0
    #: A task was stopped (fenced, lease lost, the journal refused): start no more.
    stopped: bool = False


@dataclass(frozen=True)
class OptimizerStatistics:
    """Counters of the storage optimizer (`Optimizer.statistics`)."""

    #: Runs merged and swapped in.
    runs_merged: int
    #: Chunks replaced by merged ones (their objects deleted after GC's grace).
    chunks_replaced: int
    #: Replaced objects deleted so far.
    objects_deleted: int
    #: Bytes of merged chunks written.
    bytes_merged: int
    #: Of those, bytes copied inside Tier 2 (S3 UploadPartCopy), not read here.
    bytes_copied: int
    #: Of those, bytes read from Tier 2 and uploaded again.
    bytes_reuploaded: int
    #: Merges whose swap no longer applied (the segment changed): the new object was garbage.
    runs_abandoned: int
    #: Merges that failed (Tier 2); retried at a later look.
    failures: int
    #: Replaced objects waiting for GC's grace to end.
    retired: int


class Optimizer:
    """Merges runs of small chunks of the segments of a `StorageWriter`."""

    def __init__(self, writer: WriterState) -> None:
        self._writer = writer
        #: Segment ids that got chunks since the last look (None: look at every segment).
        self._candidates: set[int] | None = None
        #: Replaced object key -> (segment id, trio time its grace ends).
        self.retired: dict[str, tuple[int, float]] = {}
        self._retired_ready = trio.Event()
        #: Trio time before which the next merge may not start (``defrag_rate``).
        self._next_slot = 0.0
        #: Merges at once (``defrag_concurrency``; each segment in at most one).
        self._limiter = trio.CapacityLimiter(writer.cfg.defrag_concurrency)
        #: Segment ids whose runs a task is merging now.
        self._busy: set[int] = set()
        self.runs_merged = 0
        self.chunks_replaced = 0
        self.objects_deleted = 0
        self.bytes_merged = 0
        self.bytes_copied = 0
        self.bytes_reuploaded = 0
        self.runs_abandoned = 0
        self.failures = 0

    def start(self, nursery: trio.Nursery) -> None:
        """Start the optimizer and the deleter of replaced objects in ``nursery``."""
        nursery.start_soon(self._run)
        nursery.start_soon(self._run_retired)

    def on_chunk_added(self, seg_id: int) -> None:
        """A segment got a new chunk: look at it at the next pass."""
        if self._candidates is not None:
            self._candidates.add(seg_id)

    def _enabled(self) -> bool:
        w = self._writer
        return bool(w.cfg.defrag and w.layer.storage.supports_concat)

    async def _run(self) -> None:
        while True:
            await trio.sleep(self._writer.cfg.defrag_interval)
            if self._enabled():
                await self.optimize()

    async def optimize(self) -> int:
        """One pass now over the segments that got chunks since the last; runs merged.

        Up to ``defrag_concurrency`` segments are merged at once (read as
        each segment's task starts, so a reload applies within the pass),
        each by one task that merges its runs one after another; a segment
        another pass is merging is left for the next.
        """
        w = self._writer
        if w.fenced is not None or (w.lease is not None and not w.lease.held()):
            return 0
        if self._candidates is None:
            segments = [s.id for s in w.container.segments()]
        else:
            segments = list(self._candidates)
        self._candidates = set()
        state = _Pass()
        async with trio.open_nursery() as nursery:
            for n, seg_id in enumerate(segments):
                if n % _SCAN_BATCH == _SCAN_BATCH - 1:
                    await trio.lowlevel.checkpoint()
                if state.stopped or not self._enabled():
                    self._candidates.update(segments[n:])
                    break
                if seg_id in self._busy:
                    self._candidates.add(seg_id)  # another pass is merging it
                    continue
                if self._next_run(seg_id) is None:
                    continue
                self._limiter.total_tokens = w.cfg.defrag_concurrency
                token = object()
                await self._limiter.acquire_on_behalf_of(token)
                if state.stopped or seg_id in self._busy:  # while this pass waited
                    self._limiter.release_on_behalf_of(token)
                    self._candidates.update(segments[n:] if state.stopped else [seg_id])
                    if state.stopped:
                        break
                    continue
                self._busy.add(seg_id)
                nursery.start_soon(self._segment_task, seg_id, token, state)
        return state.merged

    async def _segment_task(self, seg_id: int, token: object, state: _Pass) -> None:
        """Merge the runs of one segment; the limiter's ``token`` is released at the end."""
        try:
            merged = await self._optimize_segment(seg_id)
            state.merged += merged  # not `+= await`: that reads the count before the wait
        except Tier2Error as e:
            self.failures += 1
            self._add_candidate(seg_id)  # another look next time
            log.warning("storage optimizer: merging chunks of segment id %d: %s", seg_id, e)
        except GatewayError as e:
            # Fenced, lease lost, the journal refused: not this segment's fault.
            self._add_candidate(seg_id)
            if not state.stopped:
                state.stopped = True
                log.info("storage optimizer: stopped this pass: %s", e)
        finally:
            self._busy.discard(seg_id)
            self._limiter.release_on_behalf_of(token)

    def _add_candidate(self, seg_id: int) -> None:
        if self._candidates is not None:
            self._candidates.add(seg_id)

    def _next_run(self, seg_id: int) -> tuple[Segment, list[ChunkRecord]] | None:
        """The segment and the run of its chunks to merge next; None if none is due."""
        if not self._enabled():
            return None
        seg = self._writer.container.segment_by_id(seg_id)
        if seg is None or seg.txn_parent or seg.merged_into:
            return None
        cold = seg.cold_record()
        if cold is not None:  # sealed and in Tier 2: warm it only to merge
            chunks = SegmentRecord.FromString(cold).chunks
            if pick_run(chunks, self._writer.cfg, include_last=True, final=True) is None:
                return None
        if seg.merges:
            return None
        final = seg.sealed_in_storage
        run = pick_run(seg.chunks, self._writer.cfg, include_last=final, final=final)
        if run is None:
            return None
        first, count = run
        return seg, list(seg.chunks[first : first + count])

    async def _optimize_segment(self, seg_id: int) -> int:
        merged = 0
        while (picked := self._next_run(seg_id)) is not None:
            if not await self.merge(*picked):
                break
            merged += 1
        return merged

    async def _pace(self, nbytes: int) -> None:
        """Wait for ``nbytes`` of optimizer I/O to fit ``defrag_rate``.

        The slot is taken before the wait, so merges running at once share
        the budget: each starts once the bytes of those before it fit.
        """
        start = max(trio.current_time(), self._next_slot)
        self._next_slot = start + nbytes / self._writer.cfg.defrag_rate
        await trio.sleep_until(start)

    async def merge(self, seg: Segment, run: list[ChunkRecord]) -> bool:
        """Merge ``run`` (adjacent chunks of ``seg``) into a new chunk; if it was swapped in."""
        w = self._writer
        start = run[0].start_offset
        length = sum(c.length for c in run)
        await self._pace(length)
        crc = await trio.to_thread.run_sync(crc32c_combine, [(c.crc32c, c.length) for c in run])
        # The run's newest epoch, not this process's: recovery from Tier 2
        # chains a chunk only onto one of the same or an older epoch, and
        # the chunks after the run may be older than this process.
        epoch = max(c.epoch for c in run)
        key = names.chunk_key(w.node, seg.id, start, epoch)
        record = ChunkRecord(name=key, start_offset=start, length=length, crc32c=crc, epoch=epoch)
        metadata = names.chunk_metadata(seg.name, start, length, crc, epoch)
        sources = [c.name for c in run]
        sizes = [c.length for c in run]
        w.check_fence()
        w.uploading.add(key)
        try:
            try:
                await w.layer.concat(key, sources, metadata, sizes=sizes)
            except ChunkNotFound:
                if self._holds(seg.id, sources):
                    raise
                # Truncated or deleted meanwhile, and the objects with it.
                self.runs_abandoned += 1
                return False
            failpoints.hit("after_defrag_concat")
            replaced = await w.journal_upload(
                lambda: w.container.prepare_chunks_replaced(seg.id, sources, record)
            )
        finally:
            w.uploading.discard(key)
        if not replaced:
            self.runs_abandoned += 1
            w.housekeeping.delete_later(key, seg.id)
            return False
        self.runs_merged += 1
        self.chunks_replaced += len(run)
        self.bytes_merged += length
        copied = self._copied_bytes(sizes)
        self.bytes_copied += copied
        self.bytes_reuploaded += length - copied
        until = trio.current_time() + w.cfg.gc_grace
        for c in replaced:
            self.retired[c.name] = (seg.id, until)
        self._retired_ready.set()
        w.housekeeping.flushed()  # the next metadata snapshot names the new chunk
        log.debug(
            "storage optimizer: %d chunks of %r at %d (%d bytes) merged into %s",
            len(run),
            seg.name,
            start,
            length,
            key,
        )
        return True

    def _holds(self, seg_id: int, sources: list[str]) -> bool:
        """Whether the segment still names every one of ``sources``."""
        seg = self._writer.container.segment_by_id(seg_id)
        return seg is not None and set(sources) <= {c.name for c in seg.chunks}

    def _copied_bytes(self, sizes: list[int]) -> int:
        """How many of the merged bytes the binding copied without reading them here."""
        storage = self._writer.layer.storage
        if storage.kind != "s3":
            return sum(sizes) if storage.kind == "file" else 0
        from gateway.storage.s3 import plan_concat

        return sum(part.size for part in plan_concat(sizes) if part.copy)

    async def _run_retired(self) -> None:
        """Delete replaced objects once GC's grace is over (housekeeping's deleter)."""
        w = self._writer
        while True:
            if not self.retired:
                await self._retired_ready.wait()
                self._retired_ready = trio.Event()
                continue
            due = min(until for _, until in self.retired.values())
            now = trio.current_time()
            if due > now:
                with trio.move_on_at(due):
                    await self._retired_ready.wait()
                self._retired_ready = trio.Event()
                continue
            for key, (seg_id, until) in list(self.retired.items()):
                if until <= now:
                    del self.retired[key]
                    w.housekeeping.delete_later(key, seg_id)
                    self.objects_deleted += 1

    def statistics(self) -> OptimizerStatistics:
        """Counters now."""
        return OptimizerStatistics(
            runs_merged=self.runs_merged,
            chunks_replaced=self.chunks_replaced,
            objects_deleted=self.objects_deleted,
            bytes_merged=self.bytes_merged,
            bytes_copied=self.bytes_copied,
            bytes_reuploaded=self.bytes_reuploaded,
            runs_abandoned=self.runs_abandoned,
            failures=self.failures,
            retired=len(self.retired),
        )
