"""The Tier-1 journal: durable, ordered, group-committed operations.

``await journal.append(op)`` returns the operation's sequence number only
after the frame holding it has been written and fdatasync'd. Concurrent
appenders share that work: operations collect in an open *group* while the
previous group is being written; one committer task then writes the whole
group (split into frames of at most ``max_frame_bytes``) with one ``pwritev``
in a worker thread and hands it to a syncer task, whose ``fdatasync`` (in a
thread of its own) runs while the next group is written, and which wakes
every appender of the group at once. Never more than two groups are
unsynced (the hand-over has no buffer), which recovery's torn-write rule
allows for. An appender costs one list append and one park/unpark; the disk
sees one sync per group (BookKeeper's journal).

Failure model (DESIGN.md, Tier 1): an error from write or fdatasync is fatal
-- the page cache state of the file is unknown, so nothing is retried on that
descriptor; the group and everything queued fail with JournalFailed and later
appends are refused. Running out of space (or of file descriptors, opening a
new file) is *not* fatal: space is allocated before anything is written, so
the group fails with JournalRefused/JournalFull, nothing was written, and
later appends may succeed once space is freed.

A full disk must not wedge the node: the only way out is to flush to Tier 2,
record that, checkpoint and delete files, and all of those need journal
space. So operations are submitted either as *client* operations or as
*reserved* ones (Tier-2 progress, checkpoints, deletions: the operations
that free space). The journal keeps a `ReserveFile` of disk space that only
groups made of reserved operations may take when the disk is full. From the
first refusal (or the first use of the reserve) until the reserve is whole
again and there is room for a preallocation step, the journal is *short of
space*: client operations wait (`wait_for_space`) or are refused at once
(`submit`), reserved ones go on, and a background task retries the refill.
"""

from __future__ import annotations

import bisect
import logging
import os
import pathlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import trio

from gateway import __version__, failpoints
from gateway.aio import service_nursery
from gateway.buffers import Buffer
from gateway.config import JournalConfig
from gateway.errors import (
    JournalClosed,
    JournalError,
    JournalFailed,
    JournalRefused,
    OperationTooLarge,
)
from gateway.journal.files import (
    DirectoryLock,
    JournalFile,
    JournalFileName,
    ReserveFile,
    fsync_directory,
)
from gateway.journal.format import HEADER_SIZE, encode_group, last_part_offsets, operation_prefix
from gateway.journal.reader import DataCallback, ReplayCallback, ReplayResult, replay_journal
from gateway.protocol.journal_pb2 import Checkpoint, EpochStarted, Operation
from gateway.stats import LATENCY_BUCKETS, SIZE_BUCKETS, Histogram

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
#: How often a journal short of space tries to make its reserve whole again.
RESERVE_RETRY_SECONDS = 0.2
#: Refusals while short of space are logged once, then at most this often.
REFUSAL_LOG_SECONDS = 60.0


def auto_reserve(directory: pathlib.Path) -> int:
    """``journal.reserve = 0``: 1/16 of the file system, within [256 KiB, 16 MiB]."""
    st = os.statvfs(directory)
    size = st.f_blocks * st.f_frsize // 16
    return max(256 * KiB, min(16 * MiB, size - size % 4096))


class _Group:
    """Operations written together and made durable by one fdatasync."""

    __slots__ = (
        "count", "created", "data_at", "done", "ends", "error", "file", "first_sequence",
        "nbytes", "parts", "path", "reserved", "roll", "sizes",
    )  # fmt: skip

    def __init__(self) -> None:
        #: Per operation: its Frame-field prefix, then its serialized buffers.
        self.parts: list[Buffer] = []
        #: Per operation: the index in ``parts`` just past it.
        self.ends: list[int] = []
        #: Per operation: its payload bytes, prefix included.
        self.sizes: list[int] = []
        self.count = 0
        #: Payload bytes (prefixes + operations).
        self.nbytes = 0
        self.done = trio.Event()
        #: Set by the committer once the group is durable.
        self.first_sequence = 0
        self.error: JournalError | None = None
        #: trio clock time of the first operation (only tracked when lingering).
        self.created = 0.0
        #: Every operation in it may use the reserve (see the module docstring).
        self.reserved = True
        #: Start a new file with this group (a checkpoint that frees the old ones).
        self.roll = False
        #: Once written: the file, and per operation where its last part lies in it.
        self.file: JournalFile | None = None
        self.path: pathlib.Path | None = None
        self.data_at: list[int] = []


class Ticket:
    """A submitted operation (`Journal.submit`)."""

    __slots__ = ("_group", "_index")

    def __init__(self, group: _Group, index: int) -> None:
        self._group = group
        self._index = index

    @property
    def done(self) -> bool:
        """Whether the operation is durable or failed."""
        return self._group.done.is_set()

    def result(self) -> int:
        """The sequence number of a durable operation; raise if it failed.

        Only valid once `done`.
        """
        if self._group.error is not None:
            raise self._group.error
        return self._group.first_sequence + self._index

    async def wait(self) -> int:
        """Wait until the operation is durable; return its sequence number."""
        await self._group.done.wait()
        return self.result()

    def location(self) -> tuple[pathlib.Path, int] | None:
        """The journal file holding a durable operation, and where its last part lies in it.

        For an append that last part is its data (`encode_append`); the bytes
        stay there until the file is deleted, which happens only once they
        are in Tier 2. None if the operation is not durable.
        """
        group = self._group
        if group.error is not None or group.path is None or not group.done.is_set():
            return None
        return group.path, group.data_at[self._index]


@dataclass(frozen=True)
class JournalStatistics:
    """A snapshot of the journal's counters (``Journal.statistics()``)."""

    epoch: int
    next_sequence: int
    operations: int
    operation_bytes: int
    frames: int
    groups: int
    sync_seconds: float
    files: int
    disk_bytes: int
    pending_bytes: int
    queued_groups: int
    frames_since_checkpoint: int
    bytes_since_checkpoint: int
    last_checkpoint: int
    failed: str | None
    #: Short of space: client operations wait, reserved ones may use the reserve.
    short_of_space: bool
    #: Bytes in the reserve file now, and what it should hold.
    reserve_bytes: int
    reserve_target: int
    #: Groups refused (disk full, no descriptors) without failing the journal.
    refusals: int


class Journal:
    """An open journal. Get one from `open_journal`."""

    def __init__(
        self,
        directory: pathlib.Path,
        config: JournalConfig,
        recovered: ReplayResult,
        min_epoch: int = 1,
    ) -> None:
        self.directory = directory
        self._cfg = config
        #: This process's epoch: one more than any epoch in the journal, and
        #: at least ``min_epoch`` (a node rebuilt from Tier 2 starts above
        #: every epoch its chunk names carry).
        self.epoch = max(recovered.max_epoch + 1, min_epoch)
        self._next_sequence = recovered.next_sequence
        #: Files holding frames, oldest first; the last one is the active file
        #: once this process has written.
        self._files: list[JournalFileName] = list(recovered.files)
        self._file: JournalFile | None = None
        self._disk_bytes = recovered.data_bytes
        self._checkpoints: list[int] = list(recovered.checkpoints)
        self._pending_checkpoints: list[Ticket] = []

        self._open_group = _Group()
        self._queue: deque[_Group] = deque()
        self._pending_bytes = 0
        self._space = trio.Event()
        self._admission = trio.Lock()
        self._wake = trio.Event()
        self._group_closed = trio.Event()
        self._committer_idle = False
        self._closing = False
        self._error: JournalError | None = None
        #: How many times a group was refused without failing the journal
        #: (disk full). Each refusal also refused everything queued then.
        self.refusals = 0
        #: Disk space for reserved operations; opened by `open_journal`.
        self._reserve: ReserveFile | None = None
        self._reserve_base = config.reserve
        self._last_checkpoint_bytes = 0
        #: See the module docstring. Set by the committer, cleared by `_keep_reserve`.
        self.short_of_space = False
        self._space_lost = trio.Event()
        self._space_restored = trio.Event()
        self._space_restored.set()
        self._reserve_poke = trio.Event()
        #: Set by the committer thread when a group took space from the reserve.
        self._used_reserve = False
        self._refusal_logged = -float("inf")
        self._refusals_unlogged = 0
        # One thread at a time touches the files: the committer's groups and
        # truncation are serialized by this limiter.
        self._limiter = trio.CapacityLimiter(1)
        # The fdatasync of the last group written runs beside the next write.
        self._sync_limiter = trio.CapacityLimiter(1)
        #: Groups written (or being handed over) and not yet settled by the syncer.
        self._unsynced = 0
        self._all_synced = trio.Event()

        self._operations = 0
        self._operation_bytes = 0
        self._frames = 0
        self._groups = 0
        self._sync_seconds = 0.0
        #: fdatasync latency and bytes per write group (written by the committer thread).
        self.sync_latency = Histogram(LATENCY_BUCKETS)
        self.group_bytes = Histogram(SIZE_BUCKETS)
        self._frames_since_checkpoint = 0
        self._bytes_since_checkpoint = 0

    # -- appending -----------------------------------------------------------

    @property
    def next_sequence(self) -> int:
        """The sequence number the next durable operation will get."""
        return self._next_sequence

    async def append(self, op: Operation) -> int:
        """Make ``op`` durable; return its sequence number.

        Returns only after the frame holding ``op`` is fdatasync'd. If the
        caller is cancelled while waiting, the operation may still become
        durable. Raises JournalFailed, JournalFull, JournalClosed or
        OperationTooLarge.
        """
        return await self.append_parts((op.SerializeToString(),))

    async def append_parts(self, parts: Sequence[Buffer]) -> int:
        """`append` for an Operation already serialized into consecutive buffers.

        The buffers are written as they are, never copied (see
        ``format.encode_append``); the caller must not change them until
        this returns. While the journal is short of disk space this raises
        JournalRefused at once instead of waiting for room.
        """
        # Waits for the queue only (``reserved``); `submit` refuses at once.
        await self.wait_for_space(sum(map(len, parts)), reserved=True)
        return await self.submit(parts).wait()

    def has_space(self, nbytes: int, reserved: bool = False) -> bool:
        """Whether an operation of ``nbytes`` would be queued without waiting."""
        if self.short_of_space and not reserved:
            return False
        return not self._admission.locked() and (
            not self._pending_bytes
            or self._pending_bytes + nbytes + 10 <= self._cfg.max_pending_bytes
        )

    async def wait_for_space(self, nbytes: int, reserved: bool = False) -> None:
        """Wait until an operation of ``nbytes`` fits under ``max_pending_bytes``.

        Client operations (not ``reserved``) also wait while the journal is
        short of disk space. Waiters are served in FIFO order, and while
        anyone waits newcomers queue behind them, so no appender starves.
        Callers that must keep operations in order call `submit` right after
        this returns, with no checkpoint in between.
        """
        if self.has_space(nbytes, reserved):
            return
        if self.short_of_space and not reserved:
            await self.wait_room()
            if self._error is not None:
                raise self._error
            if self._closing:
                raise JournalClosed()
        async with self._admission:
            limit = self._cfg.max_pending_bytes
            while self._pending_bytes and self._pending_bytes + nbytes + 10 > limit:
                await self._space.wait()
                if self._error is not None:
                    raise self._error
                if self._closing:
                    raise JournalClosed()

    async def wait_room(self) -> None:
        """Wait until the journal is no longer short of disk space (or closes)."""
        while self.short_of_space and not self._closing and self._error is None:
            await self._space_restored.wait()

    def submit(self, parts: Sequence[Buffer], reserved: bool = False) -> Ticket:
        """Queue an operation without waiting; `Ticket.wait` gives its sequence number.

        Operations are made durable in the order they are submitted. This
        never blocks, so it does not apply backpressure: call
        `wait_for_space` first. ``reserved``: the operation helps free disk
        space (module docstring) and may use the reserve. Raises
        JournalFailed, JournalClosed, OperationTooLarge, or JournalRefused
        for a client operation while the journal is short of space, at once.
        """
        size = sum(map(len, parts))
        if self._error is not None:
            raise self._error
        if self._closing:
            raise JournalClosed()
        if size > self._cfg.max_operation_bytes:
            raise OperationTooLarge(size, self._cfg.max_operation_bytes)
        if self.short_of_space and not reserved:
            self._note_refusal(None)
            raise JournalRefused(
                "its disk is full; client operations wait until flushes to Tier 2 and "
                "checkpoints free space"
            )
        prefix = operation_prefix(size)
        nbytes = len(prefix) + size
        group = self._open_group
        if group.count and group.nbytes + nbytes > self._cfg.max_group_bytes:
            self._close_open_group()
            group = self._open_group
        if group.count == 0 and self._cfg.group_commit_wait:
            group.created = trio.current_time()
        index = group.count
        group.reserved = group.reserved and reserved
        group.parts.append(prefix)
        group.parts.extend(parts)
        group.ends.append(len(group.parts))
        group.sizes.append(nbytes)
        group.count += 1
        group.nbytes += nbytes
        self._pending_bytes += nbytes
        self._wake_committer()
        return Ticket(group, index)

    def _wake_committer(self) -> None:
        if self._committer_idle:
            self._committer_idle = False
            self._wake.set()

    def _close_open_group(self) -> None:
        self._queue.append(self._open_group)
        self._open_group = _Group()
        self._group_closed.set()

    def file_of(self, sequence: int) -> int:
        """First sequence number of the file that holds operation ``sequence``."""
        if self._files and sequence >= self._files[-1].first_sequence:
            return self._files[-1].first_sequence  # the common case: the active file
        i = bisect.bisect_right(self._files, sequence, key=lambda f: f.first_sequence)
        if i == 0:
            raise ValueError(f"sequence {sequence} precedes the journal")
        return self._files[i - 1].first_sequence

    # -- checkpoints and truncation -------------------------------------------

    async def checkpoint(self, snapshot: bytes, roll: bool = False) -> int:
        """Journal a checkpoint holding ``snapshot``; return its sequence number.

        Recovery that finds this checkpoint can start from it; `truncate` can
        then delete the files before it.
        """
        await self.wait_for_space(len(snapshot) + 16, reserved=True)
        return await self.submit_checkpoint(snapshot, roll).wait()

    def submit_checkpoint(self, snapshot: bytes, roll: bool = False) -> Ticket:
        """`checkpoint` without waiting: queue it now, in order with `submit`.

        ``roll``: write it at the start of a new file, so that `truncate` may
        delete every file before it (the way out of a full disk when the
        active file holds only data that is already in Tier 2).
        """
        if roll and self._open_group.count:
            self._close_open_group()
        ticket = self.submit(
            (Operation(checkpoint=Checkpoint(snapshot=snapshot)).SerializeToString(),),
            reserved=True,
        )
        if roll:
            ticket._group.roll = True
        self._last_checkpoint_bytes = len(snapshot)
        self._pending_checkpoints.append(ticket)
        return ticket

    def oldest_file(self) -> int:
        """First sequence number of the oldest journal file (0 if none)."""
        return self._files[0].first_sequence if self._files else 0

    def checkpoint_due(self) -> bool:
        """Whether enough frames or bytes went by since the last checkpoint."""
        return (
            self._frames_since_checkpoint >= self._cfg.checkpoint_every_frames
            or self._bytes_since_checkpoint >= self._cfg.checkpoint_every_bytes
        )

    async def truncate(self, checkpoint_sequence: int, keep_from: int | None = None) -> int:
        """Delete the files that lie entirely before a checkpoint; return how many.

        ``checkpoint_sequence`` must be the sequence number of a durable
        checkpoint. The file holding it and all later files stay, as does the
        active file, so recovery always finds that checkpoint. With
        ``keep_from``, the file holding that sequence number and all later
        ones stay too (the owner still needs their data).
        """
        if checkpoint_sequence not in self._checkpoints:
            raise ValueError(f"no checkpoint at sequence {checkpoint_sequence}")
        limit = checkpoint_sequence if keep_from is None else min(keep_from, checkpoint_sequence)
        deleted = await trio.to_thread.run_sync(
            self._delete_files_before, limit, limiter=self._limiter
        )
        if deleted:
            self._reserve_poke.set()  # room again, perhaps: try the refill now
        return deleted

    def rolled_checkpoint_frees(self, keep_from: int | None) -> bool:
        """Whether a checkpoint written now into a new file (``roll``) would free space.

        That is, whether `truncate` after it, keeping ``keep_from`` (as in
        `truncate`), would delete files holding clearly more than the
        checkpoint costs, so that checkpoints taken for space always make
        progress and never chase each other.
        """
        limit = self._next_sequence if keep_from is None else min(keep_from, self._next_sequence)
        freed = 0
        starts = [f.first_sequence for f in self._files[1:]] + [self._next_sequence]
        for f, following in zip(self._files, starts, strict=True):
            if following > limit:
                break
            with suppress(FileNotFoundError):
                freed += f.path.stat().st_size
        return freed > 2 * self._last_checkpoint_bytes + 64 * KiB

    def would_truncate(self, checkpoint_sequence: int, keep_from: int | None = None) -> bool:
        """Whether `truncate` with these arguments would delete a file."""
        limit = checkpoint_sequence if keep_from is None else min(keep_from, checkpoint_sequence)
        return len(self._files) >= 2 and self._files[1].first_sequence <= limit

    def _delete_files_before(self, limit: int) -> int:
        doomed = []
        # A file may go when the next one starts at or before the limit:
        # then every operation in it precedes the limit.
        while len(self._files) >= 2 and self._files[1].first_sequence <= limit:
            doomed.append(self._files.pop(0))
        for f in doomed:
            self._disk_bytes -= f.path.stat().st_size
            f.path.unlink()
            log.info("journal: truncated %s", f.path.name)
        if doomed:
            fsync_directory(self.directory)
            first = self._files[0].first_sequence
            self._checkpoints = [c for c in self._checkpoints if c >= first]
        return len(doomed)

    # -- the committer: group commit ------------------------------------------------------------

    async def _run_commits(self) -> None:
        """Write groups and sync them, overlapping the two: group N+1 is written
        while group N's fdatasync runs (at most two groups are ever unsynced;
        recovery's torn-write rule allows for it, see `replay_journal`)."""
        send, receive = trio.open_memory_channel[_Group](0)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_syncs, receive)
                async with send:
                    while True:
                        group = await self._take_group()
                        if group is None:
                            return
                        if self._might_roll(group):
                            # A new file seals the old one: not under a sync.
                            await self._wait_synced()
                        if not await self._write(group):
                            if self._error is not None:
                                return
                            continue
                        self._unsynced += 1
                        self._all_synced = trio.Event()
                        try:
                            await send.send(group)
                        except trio.BrokenResourceError:
                            self._settle(group, self._error or JournalClosed())
                            self._synced_one()
                            return
        finally:
            self._begin_close()
            self._fail_waiting(self._error or JournalClosed())

    async def _take_group(self) -> _Group | None:
        if not self._queue:
            while self._open_group.count == 0:
                if self._closing or self._error is not None:
                    return None
                self._wake = trio.Event()
                self._committer_idle = True
                await self._wake.wait()
            # Appenders made runnable together with us (say, by the previous
            # group's ack) get to join this group before it is cut.
            await trio.lowlevel.cancel_shielded_checkpoint()
            wait = self._cfg.group_commit_wait
            if wait and not self._queue:
                self._group_closed = trio.Event()
                with trio.move_on_at(self._open_group.created + wait):
                    await self._group_closed.wait()
            if not self._queue:
                self._close_open_group()
        return self._queue.popleft()

    async def _run_syncs(self, receive: trio.MemoryReceiveChannel[_Group]) -> None:
        async with receive:
            async for group in receive:
                try:
                    await trio.to_thread.run_sync(
                        self._sync_group, group, limiter=self._sync_limiter
                    )
                except OSError as e:
                    # Fatal: no retry on the same descriptor (the page cache's
                    # state is unknown); the writer sees the error and stops.
                    if self._error is None:
                        self._error = JournalFailed(f"{e.strerror or e} syncing {group.path}")
                        log.critical("journal: %s", self._error)
                    self._settle(group, self._error)
                    self._synced_one()
                    self._wake_committer()
                    return
                self._operations += group.count
                self._operation_bytes += group.nbytes
                if self._pending_checkpoints:
                    self._note_checkpoints(group)
                self._settle(group, None)
                self._synced_one()

    def _settle(self, group: _Group, error: JournalError | None) -> None:
        """A group is durable (``error`` None) or failed: release its waiters."""
        group.error = error
        self._pending_bytes -= group.nbytes
        self._space.set()
        self._space = trio.Event()
        group.done.set()

    def _synced_one(self) -> None:
        self._unsynced -= 1
        if not self._unsynced:
            self._all_synced.set()

    async def _wait_synced(self) -> None:
        while self._unsynced:
            await self._all_synced.wait()

    def _might_roll(self, group: _Group) -> bool:
        """Whether writing ``group`` may start a new file (an upper bound on its size)."""
        f = self._file
        if f is None or group.roll or self.short_of_space:
            return True
        return f.size + group.nbytes + HEADER_SIZE * group.count > self._cfg.file_size

    async def _write(self, group: _Group) -> bool:
        """Frame and write one group (not synced yet); False if it was refused or failed."""
        first = self._next_sequence
        try:
            await trio.to_thread.run_sync(self._write_group, group, first, limiter=self._limiter)
        except JournalRefused as e:
            # Everything queued behind a refused group is refused too: an
            # owner that assigned positions in submission order (segment
            # offsets) would otherwise see a later operation land without
            # an earlier one.
            self.refusals += 1
            self._note_refusal(e)
            self._become_short_of_space()
            self._settle(group, e)
            self._fail_waiting(e)
            return False
        except OSError as e:
            self._error = JournalFailed(
                f"{e.strerror or e} writing {self._file.path if self._file else self.directory}"
            )
            log.critical("journal: %s", self._error)
            self._settle(group, self._error)
            return False
        finally:
            if self._used_reserve:
                self._used_reserve = False
                self._become_short_of_space()
        group.first_sequence = first
        self._next_sequence = first + group.count
        return True

    def _write_group(self, group: _Group, first: int) -> None:
        """Frame and write one group (worker thread); `_sync_group` makes it durable."""
        buffers, total, frames = encode_group(
            group.parts, group.ends, group.sizes, first, self.epoch, self._cfg.max_frame_bytes
        )
        f = self._allocate(group, first, total)
        base = f.size
        f.write(buffers)
        group.file = f
        group.path = f.path
        group.data_at = [
            base + at
            for at in last_part_offsets(
                group.parts, group.ends, group.sizes, self._cfg.max_frame_bytes
            )
        ]
        self.group_bytes.observe(total)
        self._disk_bytes += total
        self._frames += frames
        self._groups += 1
        self._frames_since_checkpoint += frames
        self._bytes_since_checkpoint += total

    def _sync_group(self, group: _Group) -> None:
        """fdatasync the file a group was written to (worker thread)."""
        failpoints.hit("journal_sync")
        started = time.perf_counter()
        assert group.file is not None
        group.file.sync()
        took = time.perf_counter() - started
        self._sync_seconds += took
        self.sync_latency.observe(took)

    def _allocate(self, group: _Group, first: int, total: int) -> JournalFile:
        """The file to write ``total`` bytes of ``group`` into, with the space allocated.

        Raises JournalRefused (nothing written) when there is no room and
        the group may not, or cannot, use the reserve.
        """
        f = self._file
        roll = f is None or (f.size > 0 and (f.size + total > self._cfg.file_size or group.roll))
        try:
            return self._take_space(f, roll, first, total, exact=False)
        except JournalRefused:
            if not group.reserved or self._reserve is None:
                raise
        # The disk is full and every operation of the group frees space
        # sooner or later: take what it needs, to the page, from the reserve.
        # Growing the active file past file_size costs less than a new one.
        if roll and not group.roll and f is not None:
            roll = False
        need = total if f is None or roll else f.size + total - f.allocated
        self._reserve.release(need)
        self._used_reserve = True
        return self._take_space(f, roll, first, total, exact=True)

    def _take_space(
        self, f: JournalFile | None, roll: bool, first: int, total: int, exact: bool
    ) -> JournalFile:
        if f is not None and not roll:
            f.ensure_space(total, exact)
            return f
        # A group never spans files: recovery relies on it.
        new = JournalFile.create(self.directory, first, self._cfg.preallocate_step, total, exact)
        if f is not None:
            # Only now that the new file exists: on a full disk, a reserved
            # group that cannot have a new file grows the old one instead.
            f.seal()
        self._file = new
        self._files.append(JournalFileName(first, new.path))
        return new

    # -- running short of space --------------------------------------------------

    def _reserve_target(self) -> int:
        """Bytes the reserve should hold: the configured floor, and twice the last checkpoint."""
        return max(self._reserve_base, 2 * self._last_checkpoint_bytes + 64 * KiB)

    def _become_short_of_space(self) -> None:
        """Client operations now wait until `_keep_reserve` finds room again."""
        if not self.short_of_space:
            self.short_of_space = True
            self._space_restored = trio.Event()
            self._space_lost.set()
        self._reserve_poke.set()

    def _note_refusal(self, e: JournalError | None) -> None:
        """Log a refusal: the first at once, then a count at most every REFUSAL_LOG_SECONDS."""
        now = time.monotonic()
        self._refusals_unlogged += 1
        if now - self._refusal_logged < REFUSAL_LOG_SECONDS:
            return
        what = f": {e}" if e is not None else ""
        if self._refusal_logged == -float("inf"):
            log.error(
                "journal refused client operations%s; they wait and are refused until "
                "flushes to Tier 2 and checkpoints free space (the reserve keeps room for those)",
                what,
            )
        else:
            log.warning(
                "journal: still short of space: %d refusal(s) in the last %.0fs%s",
                self._refusals_unlogged,
                now - self._refusal_logged,
                what,
            )
        self._refusal_logged = now
        self._refusals_unlogged = 0

    def _has_room(self) -> bool:
        """Make the reserve whole; then is there room for client groups? (worker thread)"""
        if self._reserve is None:
            return True
        if not self._reserve.grow_to(self._reserve_target()):
            return False
        f = self._file
        if f is not None and f.allocated - f.size >= self._cfg.max_group_bytes:
            return True
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize >= self._cfg.preallocate_step

    async def _keep_reserve(self) -> None:
        """While short of space, retry the refill; when it works, let clients in again."""
        while not self._closing and self._error is None:
            if not self.short_of_space:
                await self._space_lost.wait()
                self._space_lost = trio.Event()
                continue
            try:
                room = await trio.to_thread.run_sync(self._has_room, limiter=self._limiter)
            except OSError as e:
                log.warning("journal: cannot grow the reserve %s: %s", self._reserve, e)
                room = False
            if room and self.short_of_space:
                self.short_of_space = False
                self._space_restored.set()
                log.info(
                    "journal: room again (%d refusal(s) meanwhile); client operations resume",
                    self.refusals,
                )
                self._refusal_logged = -float("inf")
                self._refusals_unlogged = 0
                continue
            with trio.move_on_after(RESERVE_RETRY_SECONDS):
                await self._reserve_poke.wait()
            self._reserve_poke = trio.Event()

    def _note_checkpoints(self, group: _Group) -> None:
        """Register the checkpoints that just became durable."""
        still = []
        for t in self._pending_checkpoints:
            if t._group is group:
                bisect.insort(self._checkpoints, t.result())
                self._frames_since_checkpoint = 0
                self._bytes_since_checkpoint = 0
            elif not t.done:
                still.append(t)
        self._pending_checkpoints = still

    def _fail_waiting(self, error: JournalError) -> None:
        groups = [*self._queue, self._open_group]
        self._queue.clear()
        self._open_group = _Group()
        for g in groups:
            if g.count and not g.done.is_set():
                g.error = error
                self._pending_bytes -= g.nbytes
                g.done.set()
        self._space.set()
        if not isinstance(error, JournalRefused):
            self._space_restored.set()  # waiters for room see the failure or the close

    # -- lifecycle -------------------------------------------------------------

    def _open_reserve(self) -> bool:
        """Open the reserve; whether it is whole, or could be made so (worker thread)."""
        if not self._reserve_base:
            self._reserve_base = auto_reserve(self.directory)
        self._reserve = ReserveFile(self.directory)
        if self._reserve.grow_to(self._reserve_target()):
            return True
        log.warning(
            "journal: the disk is full; %d of %d reserve bytes held (%s): client operations "
            "wait until flushes and checkpoints make room",
            self._reserve.size,
            self._reserve_target(),
            self._reserve.path,
        )
        return False

    async def _start_epoch(self) -> None:
        op = Operation(
            epoch_started=EpochStarted(
                epoch=self.epoch,
                started_at_ms=int(time.time() * 1000),
                software_version=__version__,
            )
        )
        # Reserved: a node restarted on a full disk must still be able to
        # fence its epoch, then flush and truncate its way out.
        parts = (op.SerializeToString(),)
        await self.wait_for_space(len(parts[0]), reserved=True)
        await self.submit(parts, reserved=True).wait()
        log.info(
            "journal: opened %s, epoch %d, next sequence %d",
            self.directory,
            self.epoch,
            self._next_sequence,
        )

    def _begin_close(self) -> None:
        self._closing = True
        self._space_restored.set()
        self._space_lost.set()  # `_keep_reserve` ends
        self._reserve_poke.set()
        self._wake_committer()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.seal()
            self._file = None
        if self._reserve is not None:
            self._reserve.close()

    @property
    def failed(self) -> JournalError | None:
        """The fatal error that stopped the journal, if any."""
        return self._error

    def statistics(self) -> JournalStatistics:
        """Counters for metrics, tests and ``journal-dump``."""
        return JournalStatistics(
            epoch=self.epoch,
            next_sequence=self._next_sequence,
            operations=self._operations,
            operation_bytes=self._operation_bytes,
            frames=self._frames,
            groups=self._groups,
            sync_seconds=self._sync_seconds,
            files=len(self._files),
            disk_bytes=self._disk_bytes,
            pending_bytes=self._pending_bytes,
            queued_groups=len(self._queue) + (1 if self._open_group.count else 0),
            frames_since_checkpoint=self._frames_since_checkpoint,
            bytes_since_checkpoint=self._bytes_since_checkpoint,
            last_checkpoint=self._checkpoints[-1] if self._checkpoints else 0,
            failed=str(self._error) if self._error else None,
            short_of_space=self.short_of_space,
            reserve_bytes=self._reserve.size if self._reserve is not None else 0,
            reserve_target=self._reserve_target(),
            refusals=self.refusals,
        )


@asynccontextmanager
async def open_journal(
    directory: str | pathlib.Path,
    config: JournalConfig,
    replay: ReplayCallback | None = None,
    on_file: Callable[[int], None] | None = None,
    min_epoch: int = 1,
    on_data: DataCallback | None = None,
) -> AsyncIterator[Journal]:
    """Lock, replay and open the journal in ``directory`` for appending.

    ``replay(seq, op)`` is called for every operation already in the journal,
    in order, before this returns -- from a worker thread, since recovery
    reads files; ``on_file(first_seq)`` before the operations of each file;
    ``on_data(path, at)`` before an append whose data lies in ``path`` at ``at``.
    A torn tail is cut off; corruption raises JournalCorrupt and leaves the
    files untouched. The new epoch (one more than the journal's highest,
    and at least ``min_epoch``) is journaled before the journal is handed
    out. On exit, queued appends are written, then the files are closed and
    the lock released.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(directory)
    journal: Journal | None = None
    try:
        recovered = await trio.to_thread.run_sync(
            replay_journal, directory, replay, True, on_file, on_data
        )
        journal = Journal(directory, config, recovered, min_epoch)
        if not await trio.to_thread.run_sync(journal._open_reserve):
            journal._become_short_of_space()
        async with service_nursery() as nursery:
            nursery.start_soon(journal._run_commits)
            nursery.start_soon(journal._keep_reserve)
            try:
                await journal._start_epoch()
                yield journal
            finally:
                journal._begin_close()
    finally:
        if journal is not None:
            journal._close_file()
        lock.release()
