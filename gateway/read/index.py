"""The read index: where every committed byte of every segment is (Pravega's ReadIndex).

One read path serves the protocol, the CLI and the FUSE mount. Per segment
the index holds sorted entries, one per append, saying where the bytes are:
in the journal file the append was written to (read back with ``pread``,
usually from the page cache), in the cache's pinned key space (appends
replayed at start, and those of a journal that keeps no files), or, once
Tier 2 exists, in a chunk. Keeping unflushed data only in the journal halves
what the disk writes per appended byte: a second copy in RocksDB was
written to the disk again by its memtable flushes. Entries are added
only when the segment container applies a durable append, so a read never
sees an unacknowledged byte, and always sees an acknowledged one.

``read`` returns the bytes available from an offset, zeros below the
truncation offset (for file-like readers), and at the tail either returns
empty or waits for the next append ("future read"), waking as soon as one is
applied.
"""

from __future__ import annotations

import bisect
import logging
import os
import pathlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from gateway.buffers import Buffer
from gateway.errors import GatewayError
from gateway.protocol.metadata_pb2 import ChunkRecord

log = logging.getLogger(__name__)

#: Recently fetched entries kept in memory: a sequential reader reading less
#: than an entry at a time would otherwise fetch the entry once per read.
RECENT_BYTES = 16 * 1024 * 1024


class AppendStore(Protocol):
    """Where appended bytes are kept until they are in Tier 2 (the cache store's
    pinned key space, `cache.CacheStore`; `cache.memory_store.MemoryCache` in unit tests)."""

    def put_append(self, segment_id: int, offset: int, data: Buffer) -> None:
        """Keep (pin) the bytes of one append."""

    def get_append(self, segment_id: int, offset: int) -> bytes | None:
        """The bytes of the append at ``offset``, if kept."""

    def unpin_appends(self, segment_id: int, below: int) -> int:
        """Drop the appends that end at or below ``below``; the bytes dropped."""

    def drop_segment(self, segment_id: int) -> int:
        """Drop every append of the segment; the bytes dropped."""

    def pinned_room(self, nbytes: int, held: int = 0) -> bool:
        """Whether ``nbytes`` more pinned bytes stay within their share of the budget
        (``held``: pinned bytes kept outside the store)."""


class FlushedBytes(Protocol):
    """Where flushed bytes whose cache entries are gone are read from (Tier 2's
    chunk reader, `gateway.read.chunks.ChunkReader`)."""

    async def read(
        self,
        segment_id: int,
        name: str,
        chunks: Sequence[ChunkRecord],
        offset: int,
        length: int,
        read_ahead: bool = True,
    ) -> Buffer:
        """``length`` bytes of the segment from ``offset``, all within ``chunks``."""


class ReadIndexCorrupt(GatewayError):
    """segment data is missing: {}. Run `segment-gateway fsck`"""

    exit_code = 3


@dataclass
class _SegmentIndex:
    """Entries of one segment: entry k covers [starts[k], ends[k])."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    #: Set (and replaced) whenever the segment grows, is sealed or deleted.
    changed: trio.Event = field(default_factory=trio.Event)
    #: The latest storage length (a reader's view may be older than a flush
    #: that dropped entries while it waited for Tier 2).
    flushed: int = 0


class _JournalFile:
    """A journal file that holds appended bytes the index reads back, open for reading.

    The descriptor stays open while any entry needs it, even after the
    journal deletes the file (it does so only once the bytes are in Tier 2
    and their entries are gone, but a read may still be under way).
    """

    __slots__ = ("fd", "path", "refs")

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.refs = 0


@dataclass(frozen=True)
class SegmentView:
    """What a read needs to know of a segment's committed metadata."""

    id: int
    name: str
    start_offset: int
    length: int
    sealed: bool
    #: Bytes [0, storage_length) are in Tier 2, in ``chunks`` (sorted by offset).
    storage_length: int = 0
    chunks: Sequence[ChunkRecord] = ()
    #: Merged segments whose bytes are not in this segment's chunks yet:
    #: (offset here, the source's view); reads of [offset, offset + source
    #: length) go to the source. Sorted by offset, all at or above the
    #: storage length.
    merged: Sequence[tuple[int, SegmentView]] = ()


class ReadIndex:
    """Committed bytes of all segments, over the cache store."""

    def __init__(self, store: AppendStore, tier2: FlushedBytes | None = None) -> None:
        self.store = store
        #: Reads flushed bytes whose cache entries are gone (None: no Tier 2,
        #: so every committed byte is in the cache).
        self.tier2 = tier2
        self._segments: dict[int, _SegmentIndex] = {}
        #: Once the store queue runs, store operations are queued for it, in
        #: order, and appended bytes are served from here until they are put.
        #: (During recovery, which runs in a worker thread, they go inline.)
        self._background = False
        self._unwritten: dict[tuple[int, int], Buffer] = {}
        self.unwritten_bytes = 0
        self._ops: list[tuple[str, int, int, Buffer]] = []
        self._ops_ready = trio.Event()
        self._ops_done = trio.Event()
        self._applying = False
        self._recent: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._recent_bytes = 0
        #: Entries whose bytes are read from their journal file: (file, where, length).
        self._located: dict[tuple[int, int], tuple[_JournalFile, int, int]] = {}
        self._files: dict[pathlib.Path, _JournalFile] = {}
        #: Bytes of the entries in ``_located`` (they count as pinned: see `pinned_bytes`).
        self.located_bytes = 0
        self.reads = 0
        self.bytes_read = 0

    # -- fed by the container (committed operations) ----------------------------

    @property
    def pinned_bytes(self) -> int:
        """Unflushed bytes the index holds outside Tier 2 that the cache store does not count.

        Those read from journal files and those queued for the store: the
        budget for unflushed data (`cache.CacheStore.pinned_room`) covers
        them too, wherever they are kept.
        """
        return self.located_bytes + self.unwritten_bytes

    def on_append(
        self,
        segment_id: int,
        offset: int,
        data: Buffer,
        where: tuple[pathlib.Path, int] | None = None,
    ) -> None:
        """A durable append: index its bytes and keep them until they are in Tier 2.

        ``where``: the journal file holding them and their position in it;
        the bytes are then read from there. Without it they are put in the
        cache store (pinned).
        """
        if not len(data):
            return
        key = (segment_id, offset)
        if where is not None:
            path, at = where
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = _JournalFile(path)
            f.refs += 1
            self._located[key] = (f, at, len(data))
            self.located_bytes += len(data)
        else:
            if self._background:
                self._unwritten[key] = data
                self.unwritten_bytes += len(data)
            self._store_op("put", segment_id, offset, data)
        idx = self._segments.get(segment_id)
        if idx is None:
            idx = self._segments[segment_id] = _SegmentIndex()
        idx.starts.append(offset)
        idx.ends.append(offset + len(data))
        self._wake(idx)

    def is_entry_boundary(self, segment_id: int, offset: int) -> bool:
        """Whether an indexed entry (an append) starts or ends at ``offset``."""
        idx = self._segments.get(segment_id)
        if idx is None:
            return False
        k = bisect.bisect_left(idx.starts, offset)
        if k < len(idx.starts) and idx.starts[k] == offset:
            return True
        k = bisect.bisect_left(idx.ends, offset)
        return k < len(idx.ends) and idx.ends[k] == offset

    def byte_before(self, segment_id: int, offset: int) -> int | None:
        """The last byte of the indexed append ending at ``offset``; None if none ends there."""
        idx = self._segments.get(segment_id)
        if idx is None:
            return None
        k = bisect.bisect_left(idx.ends, offset)
        if k == len(idx.ends) or idx.ends[k] != offset:
            return None
        data = self._cached(segment_id, idx.starts[k])
        return data[-1] if data else None

    def first_event_at_or_after(self, segment_id: int, offset: int, lines: bool) -> int | None:
        """The first event boundary at or after ``offset`` that the cached appends show.

        Every append is whole events but for ``lines`` segments, so: the first
        append starting at or after ``offset``; for lines, just past the
        first newline at or after ``offset - 1`` (looking at most 4 MiB on).
        None when the appends there are not in the index.
        """
        idx = self._segments.get(segment_id)
        if idx is None:
            return None
        if not lines:
            k = bisect.bisect_left(idx.starts, offset)
            return idx.starts[k] if k < len(idx.starts) else None
        at = max(0, offset - 1)
        k = bisect.bisect_right(idx.ends, at)  # the append holding byte ``at``
        scanned = 0
        while k < len(idx.starts) and idx.starts[k] <= at and scanned < 4 * 1024 * 1024:
            data = self._cached(segment_id, idx.starts[k])
            if data is None:
                return None
            lo = at - idx.starts[k]
            nl = data.find(b"\n", lo)
            if nl >= 0:
                return idx.starts[k] + nl + 1
            scanned += len(data) - lo
            at = idx.ends[k]
            k += 1
        return None

    def holds(self, segment_id: int) -> bool:
        """Whether any bytes of the segment are indexed here."""
        idx = self._segments.get(segment_id)
        return idx is not None and bool(idx.starts)

    def on_truncate(self, segment_id: int, start_offset: int) -> None:
        """Bytes below ``start_offset`` are gone (or flushed): drop whole entries below it."""
        idx = self._segments.get(segment_id)
        if idx is None:
            return
        k = bisect.bisect_right(idx.ends, start_offset)
        if k:
            self._store_op("unpin", segment_id, idx.ends[k - 1])
            for start in idx.starts[:k]:
                self._forget(segment_id, start)
            del idx.starts[:k]
            del idx.ends[:k]

    def on_flushed(self, segment_id: int, storage_length: int) -> None:
        """Bytes below ``storage_length`` are in Tier 2: unpin the entries wholly below it.

        An entry that straddles it stays (and keeps serving its bytes) until a
        later flush covers it.
        """
        idx = self._segments.get(segment_id)
        if idx is not None:
            idx.flushed = max(idx.flushed, storage_length)
        self.on_truncate(segment_id, storage_length)

    def on_change(self, segment_id: int) -> None:
        """The segment was sealed: wake readers waiting at its tail."""
        idx = self._segments.get(segment_id)
        if idx is not None:
            self._wake(idx)

    def on_delete(self, segment_id: int) -> None:
        """The segment is gone: drop its data, wake its waiting readers."""
        idx = self._segments.pop(segment_id, None)
        self._store_op("drop", segment_id, 0)
        if idx is not None:
            for start in idx.starts:
                self._forget(segment_id, start)
            idx.changed.set()

    # -- the store queue: store operations off the event loop, in order ------------

    def _store_op(self, kind: str, segment_id: int, offset: int, data: Buffer = b"") -> None:
        """Queue a store operation for `run_store_queue`, or, before it runs, do it now."""
        if self._background:
            self._ops.append((kind, segment_id, offset, data))
            self._ops_ready.set()
        else:
            self._apply_ops([(kind, segment_id, offset, data)])

    def _apply_ops(self, ops: list[tuple[str, int, int, Buffer]]) -> None:
        """Run queued store operations in order (worker thread)."""
        for kind, segment_id, offset, data in ops:
            if kind == "put":
                self.store.put_append(segment_id, offset, data)
            elif kind == "unpin":
                self.store.unpin_appends(segment_id, offset)
            else:
                self.store.drop_segment(segment_id)

    async def run_store_queue(self) -> None:
        """Apply store operations in a worker thread, in the order they were queued.

        RocksDB writes can stall while it compacts, and the store then backs
        off with sleeps; in a worker thread those never hold up the event
        loop. Reads of bytes not yet put are served from memory meanwhile.
        """
        self._background = True
        while True:
            if not self._ops:
                self._ops_done.set()
                self._ops_done = trio.Event()
                await self._ops_ready.wait()
                self._ops_ready = trio.Event()
                continue
            ops, self._ops = self._ops, []
            self._applying = True
            try:
                await trio.to_thread.run_sync(self._apply_ops, ops)
            finally:
                self._applying = False
            for kind, segment_id, offset, data in ops:
                if kind == "put" and self._unwritten.get((segment_id, offset)) is data:
                    del self._unwritten[(segment_id, offset)]
                    self.unwritten_bytes -= len(data)

    async def wait_written(self) -> None:
        """Wait until every queued store operation is done (before closing the store)."""
        while self._ops or self._unwritten or self._applying:
            await self._ops_done.wait()

    def _forget(self, segment_id: int, start: int) -> None:
        data = self._recent.pop((segment_id, start), None)
        if data is not None:
            self._recent_bytes -= len(data)
        located = self._located.pop((segment_id, start), None)
        if located is not None:
            f, _, length = located
            self.located_bytes -= length
            f.refs -= 1
            if not f.refs:
                del self._files[f.path]
                os.close(f.fd)

    def close(self) -> None:
        """Close the journal files entries were read from (the node is stopping)."""
        for f in self._files.values():
            os.close(f.fd)
        self._files.clear()
        self._located.clear()
        self.located_bytes = 0

    def _remember(self, key: tuple[int, int], data: bytes) -> None:
        if len(data) > RECENT_BYTES // 4:
            return
        self._recent[key] = data
        self._recent_bytes += len(data)
        while self._recent_bytes > RECENT_BYTES:
            _, old = self._recent.popitem(last=False)
            self._recent_bytes -= len(old)

    def _entry(self, seg: SegmentView, start: int) -> bytes:
        """The bytes of the entry starting at ``start`` (recently used ones from memory)."""
        data = self._cached(seg.id, start)
        if data is None:
            raise ReadIndexCorrupt(f"{seg.name!r}: cached bytes at offset {start} are missing")
        return data

    def _cached(self, segment_id: int, start: int) -> bytes | None:
        """The bytes of the entry starting at ``start``, or None if the store lacks them."""
        key = (segment_id, start)
        data = self._recent.get(key)
        if data is not None:
            self._recent.move_to_end(key)
            return data
        unwritten = self._unwritten.get(key)
        if unwritten is not None:
            return bytes(unwritten)
        located = self._located.get(key)
        if located is not None:
            # Inline too: a pread of the page cache costs about what a
            # RocksDB get does, and releases the GIL while it copies.
            f, at, length = located
            data = os.pread(f.fd, length, at)
            if len(data) != length:
                raise ReadIndexCorrupt(
                    f"journal file {f.path} ends before the {length} bytes at {at} "
                    f"of segment {segment_id} offset {start}"
                )
            self._remember(key, data)
            return data
        # Inline, whatever the size: rocksdict holds the GIL for a whole get,
        # so a worker thread would not free the event loop, only add its hop
        # (measured: a 1 MiB get takes ~120 us, a thread round trip 60-150 us).
        fetched = self.store.get_append(segment_id, start)
        if fetched is None:
            return None
        self._remember(key, fetched)
        return fetched

    @staticmethod
    def _wake(idx: _SegmentIndex) -> None:
        idx.changed.set()
        idx.changed = trio.Event()

    def coverage_gap(self, seg: SegmentView) -> str | None:
        """Why the segment's bytes above Tier 2 are not all indexed; None if they are.

        Merged ranges count as covered (their source is checked on its own).
        """
        idx = self._segments.get(seg.id)
        starts = idx.starts if idx else []
        ends = idx.ends if idx else []
        if seg.merged:
            ranges = sorted(
                [*zip(starts, ends, strict=True)]
                + [(off, off + src.length) for off, src in seg.merged if src.length]
            )
            starts = [a for a, _ in ranges]
            ends = [b for _, b in ranges]
        need = max(seg.start_offset, seg.storage_length)
        if seg.length > need:
            k = bisect.bisect_right(ends, need)
            if k == len(ends) or starts[k] > need:
                return f"{seg.name!r} has no bytes at offset {need}"
            for j in range(k + 1, len(starts)):
                if starts[j] != ends[j - 1]:
                    return f"{seg.name!r} has a gap at [{ends[j - 1]}, {starts[j]})"
            if ends[-1] != seg.length:
                return f"{seg.name!r} is indexed up to {ends[-1]}, its length is {seg.length}"
        return None

    def check_coverage(self, segments: list[SegmentView]) -> None:
        """After recovery: every live segment's needed bytes are indexed, without gaps."""
        for seg in segments:
            gap = self.coverage_gap(seg)
            if gap is not None:
                raise ReadIndexCorrupt(gap)
        live = {s.id for s in segments}
        for segment_id in [s for s in self._segments if s not in live]:
            self.on_delete(segment_id)

    # -- reading ---------------------------------------------------------------------

    def changed(self, segment_id: int) -> trio.Event:
        """An event set when the segment next grows, is sealed or deleted."""
        idx = self._segments.get(segment_id)
        if idx is None:
            idx = self._segments[segment_id] = _SegmentIndex()
        return idx.changed

    @staticmethod
    def _stored(seg: SegmentView, idx: _SegmentIndex | None) -> int:
        """The storage length now: ``seg`` may predate a flush applied since."""
        return max(seg.storage_length, idx.flushed if idx is not None else 0)

    async def read(
        self, seg: SegmentView, offset: int, max_length: int, read_ahead: bool = True
    ) -> bytes:
        """Up to ``max_length`` committed bytes from ``offset`` (< ``seg.length``).

        Bytes below the truncation offset read as zeros. The caller handles
        the tail (offset >= length) and waiting. ``read_ahead=False``: the
        caller prefetches Tier-2 bytes itself (see `ChunkReader.read`).
        """
        pieces = await self.read_pieces(seg, offset, max_length, read_ahead)
        if len(pieces) == 1 and isinstance(pieces[0], bytes):
            return pieces[0]  # a whole entry or block: no copy
        return b"".join(pieces)

    async def read_buffer(
        self, seg: SegmentView, offset: int, max_length: int, read_ahead: bool = True
    ) -> Buffer:
        """Like `read`, but a single piece comes back as it is, possibly a view.

        For callers that hand the bytes straight on (the mount's replies to
        the kernel take any buffer): no copy of a block fetched from Tier 2.
        """
        pieces = await self.read_pieces(seg, offset, max_length, read_ahead)
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    async def read_pieces(
        self, seg: SegmentView, offset: int, max_length: int, read_ahead: bool = True
    ) -> list[Buffer]:
        """Like `read`, but the bytes as pieces (views of entries), not joined.

        For callers that hand the bytes on in a worker thread (the storage
        writer's uploads): joining 64 MiB on the event loop would stall it.
        """
        # A checkpoint per read: the bytes come from the cache without
        # blocking, and a reader in a tight loop must not starve other tasks.
        await trio.lowlevel.checkpoint()
        end = min(seg.length, offset + max_length)
        pieces: list[Buffer] = []
        if offset >= end:
            return pieces
        total = end - offset
        if offset < seg.start_offset:
            zeros = min(end, seg.start_offset) - offset
            pieces.append(bytes(zeros))
            offset += zeros
        if offset < end:
            idx = self._segments.get(seg.id)
            starts = idx.starts if idx is not None else []
            ends = idx.ends if idx is not None else []
            k = bisect.bisect_right(starts, offset) - 1
            while offset < end:
                merged = _merged_at(seg, offset)
                if merged is not None:
                    # A merged transaction not yet in this segment's chunks:
                    # its bytes are still the source segment's.
                    at, src = merged
                    stop = min(end, at + src.length)
                    pieces.extend(
                        await self.read_pieces(src, offset - at, stop - offset, read_ahead)
                    )
                    offset = stop
                    k = bisect.bisect_right(starts, offset) - 1
                    continue
                if 0 <= k < len(starts) and starts[k] <= offset < ends[k]:
                    entry_start, entry_end = starts[k], ends[k]
                    data = self._entry(seg, entry_start)
                    take_end = min(end, entry_end)
                    if offset == entry_start and take_end == entry_end:
                        pieces.append(data)
                    else:
                        pieces.append(
                            memoryview(data)[offset - entry_start : take_end - entry_start]
                        )
                    offset = take_end
                    k += 1
                elif self.tier2 is not None and offset < (stored := self._stored(seg, idx)):
                    # Flushed bytes whose cache entries are gone: read them
                    # from the chunks, up to the next entry still in the cache.
                    stop = min(end, stored)
                    if k + 1 < len(starts):
                        stop = min(stop, starts[k + 1])
                    pieces.append(
                        await self.tier2.read(
                            seg.id, seg.name, seg.chunks, offset, stop - offset, read_ahead
                        )
                    )
                    offset = stop
                    k = bisect.bisect_right(starts, offset) - 1
                else:
                    raise ReadIndexCorrupt(f"{seg.name!r} has no bytes at offset {offset}")
        self.reads += 1
        self.bytes_read += total
        return pieces


def _merged_at(seg: SegmentView, offset: int) -> tuple[int, SegmentView] | None:
    """The merged source holding ``offset`` of ``seg``, if any."""
    for at, src in seg.merged:
        if at <= offset < at + src.length:
            return at, src
    return None
