"""`CacheStore`: append data and Tier-2 blocks in one RocksDB, within a byte budget.

Two kinds of entries (key layout in `cache.keys`):

- **Append data**, keyed by (segment id, offset): bytes acknowledged to a
  writer but not yet in Tier 2. They are *pinned*: never evicted, only removed
  by `CacheStore.unpin_appends` (after the storage writer flushed them) or
  `CacheStore.drop_segment`. The journal is their source of truth, so they are
  dropped when the store opens and the read index re-adds them from the journal.
- **Tier-2 blocks**, keyed by (chunk name, block index): copies of immutable
  chunk ranges, valid across restarts, evicted least recently used first.

The budget covers both: after every insert ``pinned_bytes + block_bytes <=
budget_bytes`` unless pinned data alone is over it. Pinned data is meant to
stay under ``pinned_limit_bytes`` (its share of the budget); the store does
not refuse it, but `CacheStore.pinned_room` tells the caller when to push
back on writers.

RocksDB is configured so that the directory stays near the budget on disk and
memtables stay a small part of it in memory (see `_options`). Writes skip the
WAL: the cache is never the source of truth, and a crash loses at most the
unflushed memtable, which holds only cache copies.

Threads: every method blocks on RocksDB and may be called from any thread, also
concurrently. Mutations are serialized by a lock that gets never take.

rocksdict holds the GIL for the whole of a get or a write. Measured with a
10 µs switch interval: a thread doing warm 4 MiB gets (up to 4.2 ms each)
kept every other thread from running for up to 4.8 ms, and cold ones (5-18
ms) for up to 9.5 ms; a write that RocksDB stalled froze every thread for as
long as the stall (80-95 ms). So a worker thread does not free the trio loop
during a get; it only adds the hop. Gets on the 2-core development VM, warm
page cache: 1.7 µs (miss), 2.4 µs (4 KiB), 4 µs (64 KiB), 28 µs (256 KiB),
120 µs (1 MiB); ``trio.to_thread.run_sync`` of a no-op: 60-150 µs. Gets are
cheaper inline up to about 1 MiB, where the get costs as much as the hop (the
crossover), and above it a thread still blocks the loop for the copy.

Writes never wait inside RocksDB (see `CacheStore._write`): when RocksDB would
stall them, they sleep without the GIL and retry. So puts, unpins and drops
may wait, for compaction to catch up, and belong in a worker thread.
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import rocksdict

from cache import keys
from gateway.buffers import Buffer

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB

#: Smallest budget accepted: below this RocksDB's own overhead (memtables,
#: manifest, info log) would be a large part of it.
MIN_BUDGET_BYTES = 4 * MiB


# How long a write waits before retrying when RocksDB would stall it: doubling
# from the first to the last value, about the time a memtable flush takes.
_STALL_FIRST_WAIT = 0.001
_STALL_MAX_WAIT = 0.05
# Level-0 files at which RocksDB starts stalling writes (see _options).
_LEVEL0_SLOWDOWN = 8
# How often the reclaimer looks again while a flush would stall writes.
_RECLAIM_RETRY = 0.05
# Seconds without writes after which the reclaimer checks that the directory
# settled (see CacheStore._settle).
_SETTLE_IDLE = 1.0


@dataclass(frozen=True)
class CacheStatistics:
    """Counters and sizes of a `CacheStore` at one moment."""

    #: Gets (append or block) that found data.
    hits: int
    #: Gets that found nothing.
    misses: int
    #: Successful puts (append or block), replacements included.
    inserts: int
    #: Blocks evicted to stay within the budget.
    evictions: int
    #: Bytes of append data held (pinned, never evicted).
    pinned_bytes: int
    #: Bytes of Tier-2 blocks held (evictable).
    block_bytes: int
    budget_bytes: int
    #: The pinned share of the budget; `CacheStore.pinned_room` checks against it.
    pinned_limit_bytes: int
    #: Times a put or delete found RocksDB unable to take it without stalling
    #: (compaction behind) and waited: the cache's own backpressure.
    write_waits: int = 0


BlockId = tuple[str, int]


def _as_bytes(data: Buffer) -> bytes:
    # rocksdict in raw mode accepts only `bytes` (not bytearray/memoryview),
    # so anything else costs one copy here.
    return data if isinstance(data, bytes) else bytes(data)


def _block_keys(blocks: Iterable[BlockId]) -> list[bytes]:
    """The data and meta keys of ``blocks``."""
    return [
        k
        for chunk, index in blocks
        for k in (keys.block_key(chunk, index), keys.block_meta_key(chunk, index))
    ]


def _write_buffer_size(budget_bytes: int) -> int:
    """Memtable size: a sixteenth of the budget, within 1..64 MiB.

    At rest up to 3 level-0 files (one short of the compaction trigger) and
    the memtable flushed on close hold evicted blocks' tombstones while the
    evicted bytes still sit in the last level: 4 memtables of garbage, so at
    most 1.25x the budget (1.5x below 16 MiB, where the 1 MiB floor applies).
    An eighth left 1.5x after close at 32 MiB in some runs.
    """
    return max(1 * MiB, min(64 * MiB, budget_bytes // 16))


#: RocksDB's table files open at once (see `_options`).
MAX_OPEN_FILES = 128


def _options(budget_bytes: int) -> rocksdict.Options:
    """RocksDB options that keep disk and memory near ``budget_bytes``.

    Disk: a deleted or replaced value takes space until a compaction rewrites
    the file holding it together with its tombstone. Up to 16 memtables of
    data (1 GiB) the LSM has a single level besides level 0, so every level-0
    compaction drops all garbage; above that, leveled compaction with dynamic
    level sizes keeps the last level (most of the data) clean, and RocksDB
    weighs files by their deletions ("compensated size") when picking what to
    compact. Writes wait (see `CacheStore._write`) once 8 level-0 files or one
    budget of compaction debt pile up, so that a burst of inserts cannot run
    far ahead of compaction. Measured with 10x the budget written (32 MiB; 4
    KiB, 64 KiB and 1 MiB blocks; see ``test_disk_stays_near_budget``): the
    directory settles at 1.03-1.07x the budget once writes stop (with
    `CacheStore._settle`; RocksDB alone stopped at 1.07-1.53x) and 1.07-1.10x
    after close; during a
    burst of 200-300 MB/s it peaks at 2.5-3.5x (a compaction's inputs and
    outputs exist at once; RocksDB's default triggers peaked at 4-5x); disk
    writes are 3-4x the bytes inserted. With a level base of 4 memtables
    (two levels at these budgets) tombstones in the upper level left up to
    1.75x.

    Memory: two memtables of `_write_buffer_size` and a small block cache (the
    kernel's page cache holds hot files, and FUSE's page cache hot segment
    data above us).

    Rejected: BlobDB (values in blob files) halved write amplification and the
    peaks, but gets were 4-15x slower (64 KiB: 57 µs instead of 4 µs) because
    rocksdict cannot give it a blob cache.
    """
    write_buffer = _write_buffer_size(budget_bytes)
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(write_buffer)
    options.set_max_write_buffer_number(2)
    options.set_target_file_size_base(write_buffer)
    options.set_max_bytes_for_level_base(min(budget_bytes, 16 * write_buffer))
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_level_zero_file_num_compaction_trigger(4)
    options.set_level_zero_slowdown_writes_trigger(_LEVEL0_SLOWDOWN)
    options.set_level_zero_stop_writes_trigger(12)
    options.set_soft_pending_compaction_bytes_limit(budget_bytes)
    options.set_hard_pending_compaction_bytes_limit(2 * budget_bytes)
    # Values are Tier-2 bytes (usually compressed already) or appends (opaque
    # to us); compressing them costs CPU for little.
    options.set_compression_type(rocksdict.DBCompressionType.none())
    # A new file in which some 64 consecutive entries hold 32 deletions is
    # compacted soon. Measured: without it, 10x the budget of 4 KiB blocks
    # left the directory at 1.8x the budget instead of 1.1x.
    options.add_compact_on_deletion_collector_factory(64, 32, 0.5)
    table = rocksdict.BlockBasedOptions()
    # Most gets of blocks miss (the read index asks before fetching from Tier
    # 2); a bloom filter answers them without reading data blocks.
    table.set_bloom_filter(10, False)
    table.set_block_cache(rocksdict.Cache(max(1 * MiB, min(32 * MiB, budget_bytes // 32))))
    options.set_block_based_table_factory(table)
    # RocksDB's own files must not eat the budget: the info LOG rolls and is
    # capped, the MANIFEST is rewritten small instead of growing to 1 GiB and
    # is not preallocated (4 MiB by default).
    options.set_max_log_file_size(max(64 * KiB, min(4 * MiB, budget_bytes // 64)))
    options.set_keep_log_file_num(2)
    options.set_max_manifest_file_size(max(1 * MiB, min(64 * MiB, budget_bytes // 64)))
    options.set_manifest_preallocation_size(64 * KiB)
    # RocksDB keeps every table file open by default. A bound keeps the
    # daemon's own descriptors predictable next to client connections (the
    # server sizes its connection limit from what is left); at these budgets
    # there are far fewer files than this, so nothing is reopened.
    options.set_max_open_files(MAX_OPEN_FILES)
    return options


class CacheStore:
    """A RocksDB cache of append data (pinned) and Tier-2 blocks (LRU), within a budget.

    Create with `CacheStore.open`; every method blocks (see the module docstring).
    """

    def __init__(
        self,
        db: rocksdict.Rdict,
        write_options: rocksdict.WriteOptions,
        budget_bytes: int,
        pinned_limit_bytes: int,
    ) -> None:
        self._db = db
        self._write_options = write_options
        self._budget = budget_bytes
        self._pinned_limit = pinned_limit_bytes
        # Held by every mutation for its whole length, so the RocksDB write and
        # the bookkeeping below change together. Gets never take it: a put
        # stalled on a memtable flush must not hold up reads.
        self._write_lock = threading.Lock()
        # Guards the bookkeeping only, never held across RocksDB calls.
        self._lock = threading.Lock()
        # segment id -> {offset: length} of its append entries.
        self._appends: dict[int, dict[int, int]] = {}
        # Every block's size, least recently used first.
        self._lru: OrderedDict[BlockId, int] = OrderedDict()
        # chunk -> its block indexes, so drop_chunk does not scan the LRU.
        self._chunks: dict[str, set[int]] = {}
        self._sequence = 0
        self._pinned_bytes = 0
        self._block_bytes = 0
        self._hits = 0
        self._misses = 0
        self._inserts = 0
        self._evictions = 0
        self._write_waits = 0
        # Bytes deleted since the memtable was last flushed (see _deleted).
        self._deleted_since_flush = 0
        self._flush_after_deleting = _write_buffer_size(budget_bytes)
        # When the last write was, and whether the directory was checked since.
        self._last_write = time.monotonic()
        self._settled = True
        self._closed = False
        self._reclaim_wanted = threading.Event()
        self._stopping = threading.Event()
        # Started by open() once recovery succeeded.
        self._reclaimer = threading.Thread(target=self._reclaim, name="cache-reclaim", daemon=True)

    @classmethod
    def open(
        cls, directory: pathlib.Path, budget_bytes: int, pinned_share: float = 0.5
    ) -> CacheStore:
        """Open (creating) the RocksDB in ``directory``. Blocking: callers run it in a thread.

        Pinned append data from a previous run is dropped (it is rebuilt from the
        journal); Tier-2 blocks are kept (immutable, valid across restarts) and
        their sizes and LRU order rebuilt (order of insertion: reads are not
        recorded on disk). If the kept blocks exceed a smaller budget than last
        time, the oldest are evicted now.
        """
        if budget_bytes < MIN_BUDGET_BYTES:
            raise ValueError(f"cache budget must be at least {MIN_BUDGET_BYTES} bytes")
        if not 0.0 < pinned_share <= 1.0:
            raise ValueError(f"pinned share must be in (0, 1], got {pinned_share}")
        directory.mkdir(parents=True, exist_ok=True)
        db = rocksdict.Rdict(str(directory), _options(budget_bytes))
        try:
            write_options = rocksdict.WriteOptions()
            # A property in rocksdict 0.3.29, although its .pyi declares a method
            # (calling it raises "'bool' object is not callable").
            write_options.disable_wal = True  # type: ignore[assignment]
            write_options.no_slowdown = True
            db.set_write_options(write_options)
            store = cls(db, write_options, budget_bytes, int(budget_bytes * pinned_share))
            store._recover()
        except BaseException:
            db.close()
            raise
        store._reclaimer.start()
        return store

    def _recover(self) -> None:
        """Drop last run's appends; rebuild block bookkeeping from the meta records."""
        db = self._db
        if self._any_key(keys.APPEND, keys.BLOCK):
            # One range tombstone for all of them, compacted right away: a
            # flushed range tombstone alone does not make RocksDB compact, and
            # a backlog left by a crash may be a large part of the budget.
            startup = rocksdict.WriteOptions()
            startup.disable_wal = True  # type: ignore[assignment]
            db.delete_range(keys.APPEND, keys.BLOCK, startup)
            db.compact_range(keys.APPEND, keys.BLOCK)
        found: list[tuple[int, BlockId, int]] = []
        for key, value in self._scan(keys.BLOCK_META, keys.END):
            chunk, index = keys.decode_block_key(key)
            size, sequence = keys.BLOCK_META_VALUE.unpack(value)
            found.append((sequence, (chunk, index), size))
        found.sort()
        for sequence, block, size in found:
            self._lru[block] = size
            self._chunks.setdefault(block[0], set()).add(block[1])
            self._block_bytes += size
            self._sequence = sequence + 1
        victims = self._choose_victims(self._budget, keep=None)
        if victims:
            self._write(deletes=_block_keys(victims))
            with self._lock:
                self._forget_blocks(victims)
                self._evictions += len(victims)

    def _any_key(self, begin: bytes, end: bytes) -> bool:
        return next(iter(self._scan(begin, end)), None) is not None

    def _scan(self, begin: bytes, end: bytes) -> Iterable[tuple[bytes, bytes]]:
        """Keys and values in ``[begin, end)``, in order."""
        read_options = rocksdict.ReadOptions()
        read_options.set_iterate_upper_bound(end)
        it = self._db.iter(read_options)
        it.seek(begin)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    # Append data ---------------------------------------------------------

    def put_append(self, segment_id: int, offset: int, data: Buffer) -> None:
        """Store (or replace) the append data of ``segment_id`` at ``offset``; it stays pinned.

        Evicts blocks if the budget needs it. Never refuses: check `pinned_room`
        first to keep pinned data within its share.
        """
        key = keys.append_key(segment_id, offset)
        value = _as_bytes(data)
        size = len(value)
        with self._write_lock:
            self._check_open()
            with self._lock:
                old = self._appends.get(segment_id, {}).get(offset, 0)
                pinned = self._pinned_bytes - old + size
                victims = self._choose_victims(self._budget - pinned, keep=None)
            self._write(puts=[(key, value)], deletes=_block_keys(victims))
            with self._lock:
                self._appends.setdefault(segment_id, {})[offset] = size
                self._pinned_bytes = pinned
                self._inserts += 1
                self._forget_blocks(victims)
                self._evictions += len(victims)

    def get_append(self, segment_id: int, offset: int) -> bytes | None:
        """The append data stored for ``segment_id`` at ``offset``, or None."""
        self._check_open()
        value: bytes | None = self._db.get(keys.append_key(segment_id, offset))
        with self._lock:
            if value is None:
                self._misses += 1
            else:
                self._hits += 1
        return value

    def unpin_appends(self, segment_id: int, below: int) -> int:
        """Delete this segment's append entries that end at or before ``below``.

        For data now in Tier 2, or truncated away. Returns the bytes freed.
        """
        with self._write_lock:
            self._check_open()
            with self._lock:
                entries = self._appends.get(segment_id, {})
                gone = {o: n for o, n in entries.items() if o + n <= below}
            if not gone:
                return 0
            self._write(deletes=[keys.append_key(segment_id, o) for o in gone])
            freed = sum(gone.values())
            with self._lock:
                for offset in gone:
                    del entries[offset]
                if not entries:
                    self._appends.pop(segment_id, None)
                self._pinned_bytes -= freed
            self._deleted(freed)
            return freed

    def drop_segment(self, segment_id: int) -> int:
        """Delete all append entries of ``segment_id``; returns the bytes freed."""
        with self._write_lock:
            self._check_open()
            with self._lock:
                entries = self._appends.get(segment_id)
            if not entries:
                return 0
            self._write(deletes=[keys.append_key(segment_id, o) for o in entries])
            freed = sum(entries.values())
            with self._lock:
                del self._appends[segment_id]
                self._pinned_bytes -= freed
            self._deleted(freed)
            return freed

    # Tier-2 blocks -------------------------------------------------------

    def put_block(self, chunk: str, index: int, data: Buffer) -> None:
        """Store (or replace) block ``index`` of ``chunk``, evicting LRU blocks if over budget.

        A block larger than the room pinned data leaves is not stored (and an
        older copy under the same key is removed).
        """
        key = keys.block_key(chunk, index)
        value = _as_bytes(data)
        size = len(value)
        block = (chunk, index)
        with self._write_lock:
            self._check_open()
            with self._lock:
                room = self._budget - self._pinned_bytes
                old = self._lru.get(block)
                if size > room:
                    victims = [block] if old is not None else []
                else:
                    victims = self._choose_victims(room - size, keep=block)
                sequence = self._sequence
                self._sequence += 1
            puts = []
            if size <= room:
                meta = keys.BLOCK_META_VALUE.pack(size, sequence)
                puts = [(key, value), (keys.block_meta_key(chunk, index), meta)]
            self._write(puts=puts, deletes=_block_keys(victims))
            with self._lock:
                self._forget_blocks(victims)
                if size > room:
                    return
                self._evictions += len(victims)
                if old is not None:
                    self._block_bytes -= old
                self._lru[block] = size
                self._lru.move_to_end(block)
                self._chunks.setdefault(chunk, set()).add(index)
                self._block_bytes += size
                self._inserts += 1

    def get_block(self, chunk: str, index: int) -> bytes | None:
        """Block ``index`` of ``chunk``, or None; a hit makes it the most recently used."""
        self._check_open()
        value: bytes | None = self._db.get(keys.block_key(chunk, index))
        block = (chunk, index)
        with self._lock:
            if value is None:
                self._misses += 1
            else:
                self._hits += 1
                if block in self._lru:
                    self._lru.move_to_end(block)
        return value

    def block_size(self, chunk: str, index: int) -> int | None:
        """Size of the cached block ``index`` of ``chunk``, or None (no RocksDB call)."""
        with self._lock:
            return self._lru.get((chunk, index))

    def blocks(self) -> list[tuple[str, int, int]]:
        """Every cached block as (chunk name, block index, size), in chunk order (fsck)."""
        with self._lock:
            return sorted((chunk, index, size) for (chunk, index), size in self._lru.items())

    def drop_chunk(self, chunk: str) -> int:
        """Delete every cached block of ``chunk``; returns the bytes freed."""
        with self._write_lock:
            self._check_open()
            with self._lock:
                indexes = self._chunks.get(chunk)
                if not indexes:
                    return 0
                blocks = [(chunk, i) for i in indexes]
            self._write(deletes=_block_keys(blocks))
            with self._lock:
                freed = self._forget_blocks(blocks)
            self._deleted(freed)
            return freed

    # Budget --------------------------------------------------------------

    def pinned_room(self, nbytes: int, held: int = 0) -> bool:
        """True if ``nbytes`` more pinned data stays within the pinned limit.

        ``held``: unflushed bytes kept elsewhere (journal files, memory) that
        count as pinned too. Also True when nothing is pinned, so that one
        append larger than the pinned share can still go through rather than
        wait forever.
        """
        with self._lock:
            pinned = self._pinned_bytes + held
            return pinned == 0 or pinned + nbytes <= self._pinned_limit

    def statistics(self) -> CacheStatistics:
        """Counters and sizes now."""
        with self._lock:
            return CacheStatistics(
                hits=self._hits,
                misses=self._misses,
                inserts=self._inserts,
                evictions=self._evictions,
                pinned_bytes=self._pinned_bytes,
                block_bytes=self._block_bytes,
                budget_bytes=self._budget,
                pinned_limit_bytes=self._pinned_limit,
                write_waits=self._write_waits,
            )

    def close(self) -> None:
        """Flush the memtables (blocks survive a restart) and close the database (idempotent)."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            self._stopping.set()
            self._reclaim_wanted.set()
            self._reclaimer.join()
            try:
                self._db.flush(True)
            finally:
                self._db.close()

    # Internals -----------------------------------------------------------

    def _write(
        self, puts: Sequence[tuple[bytes, bytes]] = (), deletes: Sequence[bytes] = ()
    ) -> None:
        """Apply ``puts`` and ``deletes`` atomically; while RocksDB would stall, sleep and retry.

        rocksdict holds the GIL for the whole of a call, so a write stall inside
        RocksDB (memtables full, too many level-0 files, compaction debt) would
        freeze every thread of the daemon, the trio loop included. With
        ``no_slowdown`` RocksDB fails such a write at once instead, and the
        sleep here waits without the GIL.
        """
        if not puts and not deletes:
            return
        delay = _STALL_FIRST_WAIT
        while True:
            # A batch is consumed by a write even when the write fails.
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in puts:
                batch.put(key, value)
            for key in deletes:
                batch.delete(key)
            try:
                self._db.write(batch, self._write_options)
                with self._lock:
                    self._last_write = time.monotonic()
                    self._settled = False
                return
            except Exception as e:
                # rocksdict raises a bare Exception("Result incomplete: Write stall").
                if "Result incomplete" not in str(e):
                    raise
            with self._lock:
                self._write_waits += 1
            time.sleep(delay)
            delay = min(delay * 2, _STALL_MAX_WAIT)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the cache store is closed")

    def _choose_victims(self, allowed_block_bytes: int, keep: BlockId | None) -> list[BlockId]:
        """Least recently used blocks to evict so that blocks fit ``allowed_block_bytes``.

        ``keep`` (the block being replaced) is not chosen; its old size counts
        as freed. Call with ``_lock`` held (or before the store is shared).
        """
        excess = self._block_bytes - allowed_block_bytes
        if keep is not None:
            excess -= self._lru.get(keep, 0)
        victims = []
        for block, size in self._lru.items():
            if excess <= 0:
                break
            if block != keep:
                victims.append(block)
                excess -= size
        return victims

    def _forget_blocks(self, blocks: list[BlockId]) -> int:
        """Remove ``blocks`` from the bookkeeping; returns their bytes. Needs ``_lock``."""
        freed = 0
        for block in blocks:
            size = self._lru.pop(block, None)
            if size is None:
                continue
            freed += size
            indexes = self._chunks[block[0]]
            indexes.discard(block[1])
            if not indexes:
                del self._chunks[block[0]]
        self._block_bytes -= freed
        return freed

    def _deleted(self, nbytes: int) -> None:
        """Account deleted bytes; once they add up to a memtable, have the memtable flushed.

        Deletions reclaim disk only when compaction sees their tombstones, and
        tombstones in the memtable are invisible to it. Without new writes the
        memtable would not fill, so after a large drop (a deleted segment, the
        last unpin of a quiet writer, a GC'd chunk) the space would stay taken
        until the next restart. Measured: a drop of 75% of the data freed
        nothing without this and all of it within 0.2 s with it
        (``test_drop_reclaims_disk``). Called with ``_write_lock`` held.
        """
        with self._lock:
            self._deleted_since_flush += nbytes
            if self._deleted_since_flush < self._flush_after_deleting:
                return
        self._reclaim_wanted.set()

    def _reclaim(self) -> None:
        """The reclaimer thread: flush the memtable when `_deleted` asks, without stalling.

        A thread, because RocksDB's flush first waits, holding the GIL (see
        `_write`), until flushing would not stall writes; so it is only called
        when `_flush_is_cheap`, and otherwise retried a little later, when
        compaction has caught up. The caller of a delete never waits for it.
        """
        while True:
            wanted = self._reclaim_wanted.wait(_SETTLE_IDLE)
            if self._stopping.is_set():
                return
            if not wanted:
                self._settle()
                continue
            if not self._flush_is_cheap():
                self._stopping.wait(_RECLAIM_RETRY)
                continue
            self._reclaim_wanted.clear()
            with self._lock:
                self._deleted_since_flush = 0
            try:
                self._db.flush(False)
            except Exception as e:
                # Writes stopped between the check and the flush: RocksDB
                # refuses ("Try again"). Compaction is running; retry later.
                log.debug("cache flush for reclaiming deferred: %s", e)
                self._reclaim_wanted.set()
                self._stopping.wait(_RECLAIM_RETRY)

    def _settle(self) -> None:
        """Once writes have stopped, compact away garbage that RocksDB left behind.

        RocksDB compacts when a level outgrows its target, so after a burst
        it may leave an upper level of tombstones over the garbage they shadow
        in the last level, within every target and so never compacted.
        Measured: 1 in about 90 bursts of 10x the budget (32 MiB of 1 MiB
        blocks) stopped at 1.34x the budget, with 10 MiB in level 5 over 32 MiB
        in level 6, and nothing pending for minutes. So once writes have been
        idle for `_SETTLE_IDLE` and nothing is being compacted, table files
        holding more than an eighth of the budget beyond the live bytes are
        compacted by hand, once per idle spell: into the last level, which
        rewrites the last level's files it overlaps (up to the budget of disk
        writes after each burst). The reclaimer's thread waits for it;
        rocksdict lets go of the GIL while it compacts (measured: a 1 ms
        ticker in another thread kept ticking through a 94 ms compaction).
        """
        with self._lock:
            if self._settled or time.monotonic() - self._last_write < _SETTLE_IDLE:
                return
            live = self._pinned_bytes + self._block_bytes
        db = self._db
        busy = sum(
            db.property_int_value(f"rocksdb.{name}") or 0
            for name in ("compaction-pending", "num-running-compactions", "num-running-flushes")
        )
        if busy:
            return  # looked at again after the next wait
        with self._lock:
            self._settled = True
        # Live bytes still in a memtable are not in the files: this
        # underestimates the garbage, never overestimates it.
        tables = db.property_int_value("rocksdb.total-sst-files-size") or 0
        if tables - live <= self._budget // 8:
            return
        try:
            db.compact_range(None, None)
        except Exception as e:
            log.debug("cache settling compaction failed: %s", e)

    def _flush_is_cheap(self) -> bool:
        """True if a flush now would not have to wait for a flush or compaction to finish."""
        db = self._db
        immutable = db.property_int_value("rocksdb.num-immutable-mem-table") or 0
        level0 = db.property_int_value("rocksdb.num-files-at-level0") or 0
        debt = db.property_int_value("rocksdb.estimate-pending-compaction-bytes") or 0
        # One more immutable memtable must stay under max_write_buffer_number
        # (2), one more level-0 file under the slowdown trigger, and the
        # compaction debt under the soft limit (the budget).
        return immutable == 0 and level0 + 1 < _LEVEL0_SLOWDOWN and debt < self._budget
