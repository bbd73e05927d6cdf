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

A full disk must not wedge the node: the journal keeps a reserve of disk
space for the operations that free space, and is *short of space* until it
is whole again (`gateway.journal.space`).
"""

from __future__ import annotations

import bisect
import logging
import math
import pathlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress

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
    fsync_directory,
)
from gateway.journal.format import HEADER_SIZE, encode_group, last_part_offsets, operation_prefix
from gateway.journal.groups import JournalStatistics, ReplicationSink, Ticket, WriteGroup
from gateway.journal.reader import DataCallback, ReplayCallback, ReplayResult, replay_journal
from gateway.journal.space import SpaceKeeper
from gateway.protocol.journal_pb2 import Checkpoint, EpochStarted, Operation
from gateway.stats import LATENCY_BUCKETS, SIZE_BUCKETS, Histogram

log = logging.getLogger(__name__)


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
        #: Operations below this were in the journal when it was opened:
        #: earlier epochs wrote them (a replica of such an epoch may seed
        #: this epoch's, `gateway.replication.replicator`).
        self.opened_end = recovered.next_sequence
        #: Files holding frames, oldest first; the last one is the active file
        #: once this process has written.
        self._files: list[JournalFileName] = list(recovered.files)
        self._file: JournalFile | None = None
        self._disk_bytes = recovered.data_bytes
        self._checkpoints: list[int] = list(recovered.checkpoints)
        self._pending_checkpoints: list[Ticket] = []

        self._open_group = WriteGroup()
        self._queue: deque[WriteGroup] = deque()
        self._pending_bytes = 0
        self._space = trio.Event()
        self._admission = trio.Lock()
        self._wake = trio.Event()
        self._group_closed = trio.Event()
        self._committer_idle = False
        self._closing = False
        self._error: JournalError | None = None
        #: The reserve and the short-of-space state; its file is opened by `open_journal`.
        self._room = SpaceKeeper(directory, config)
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
        #: Set once the node replicates its journal: every group written from
        #: then on goes to it and is durable only once on an ack quorum.
        self._replication: ReplicationSink | None = None
        #: The node replicates (`require_replication`): a group written before
        #: the sink is attached waits for it -- durable on this disk alone is
        #: not durable -- and one written after it detached is never durable.
        self.replication_required = False
        self._replication_ended = False
        self._replication_changed = trio.Event()
        #: Groups synced here and waiting for their ack quorum (settled in order).
        self._awaiting_quorum = 0

    @property
    def replication(self) -> ReplicationSink | None:
        """Where written groups go to be replicated (None: not attached)."""
        return self._replication

    @replication.setter
    def replication(self, sink: ReplicationSink | None) -> None:
        if sink is None and self._replication is not None:
            self._replication_ended = True
        self._replication = sink
        self._replication_changed.set()
        self._replication_changed = trio.Event()

    def require_replication(self) -> None:
        """From now on nothing is durable until on an ack quorum, attached or not yet.

        Without it, the node's own bookkeeping (a chunk recorded, an attribute
        index batch, a stream rolled) journaled between the start and the
        replication's attaching would count as durable on this disk alone --
        and act on it (delete the chunks it dropped) although a recovery from
        the replicas would not have it.
        """
        self.replication_required = True

    @property
    def replication_ended(self) -> bool:
        """Required, and detached for good (stopping, fenced): nothing more is durable."""
        return (
            self.replication_required
            and self._replication is None
            and (self._replication_ended or self._closing)
        )

    # -- appending -----------------------------------------------------------

    @property
    def short_of_space(self) -> bool:
        """Short of disk space: client operations wait, reserved ones may use the reserve."""
        return self._room.short_of_space

    @property
    def bytes_since_checkpoint(self) -> int:
        """Bytes journaled since the last checkpoint was written."""
        return self._bytes_since_checkpoint

    @property
    def max_operation_bytes(self) -> int:
        """The largest operation `submit` takes (``journal.max_operation_bytes``)."""
        return self._cfg.max_operation_bytes

    @property
    def refusals(self) -> int:
        """Groups refused (disk full, no descriptors) without failing the journal."""
        return self._room.refusals

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
            await self._room.space_restored.wait()

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
            self._room.note_refusal(None)
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
        self._open_group = WriteGroup()
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
            ticket.group.roll = True
        self._room.last_checkpoint_bytes = len(snapshot)
        self._pending_checkpoints.append(ticket)
        return ticket

    def files(self) -> list[tuple[int, pathlib.Path]]:
        """(first sequence, path) of every journal file, oldest first."""
        return [(f.first_sequence, f.path) for f in self._files]

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
            self._room.poke.set()  # room again, perhaps: try the refill now
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
        return freed > self._room.roll_bytes()

    def estimate_checkpoints(self, estimate: Callable[[], int]) -> None:
        """``estimate()``: the bytes of a checkpoint of every segment now (the owner's
        estimate, cheap to call). The reserve holds one, since the checkpoint that frees
        a full disk is such a one (`rolled_checkpoint_frees`), and grows with it."""
        self._room.checkpoint_estimate = estimate
        self._room.poke.set()

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
        send, receive = trio.open_memory_channel[WriteGroup](0)
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

    async def _take_group(self) -> WriteGroup | None:
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

    async def _run_syncs(self, receive: trio.MemoryReceiveChannel[WriteGroup]) -> None:
        # Replicated groups wait for their ack quorum in a task of their own,
        # in order, so that the next group's fdatasync need not wait for the
        # replicas too: many groups may be on their way to the peers at once.
        quorum_send, quorum_receive = trio.open_memory_channel[WriteGroup](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_quorum_waits, quorum_receive)
            async with receive, quorum_send:
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
                    self._synced_one()
                    if self._awaiting_quorum or group.replicated:
                        # Behind earlier groups still waiting: groups settle in order.
                        self._awaiting_quorum += 1
                        quorum_send.send_nowait(group)
                        continue
                    self._durable(group)

    async def _run_quorum_waits(self, receive: trio.MemoryReceiveChannel[WriteGroup]) -> None:
        """Settle locally synced groups once on an ack quorum too, in order."""
        async with receive:
            async for group in receive:
                error: JournalError | None = None
                if group.replicated:
                    # Durable here; durable for the node once on an ack quorum.
                    # Replication stopped meanwhile (the node is stopping, or
                    # fenced): never acknowledged -- and so neither is any group
                    # after it that was written to be replicated; a restart
                    # replays them from here.
                    try:
                        while self._replication is None and not self.replication_ended:
                            changed = self._replication_changed
                            await changed.wait()  # attached soon after the start
                        if self._replication is None:
                            raise JournalClosed()
                        await self._replication.wait_replicated(group.first_sequence + group.count)
                    except JournalError as e:
                        error = e
                self._awaiting_quorum -= 1
                if error is not None:
                    # The group is on this disk and will be replayed at the next
                    # start: nothing may be journaled after it that assumes it
                    # is not (a checkpoint of the state without it), so the
                    # journal takes nothing more.
                    if self._error is None:
                        self._error = error
                        log.warning(
                            "journal: replication stopped with groups not on an ack quorum "
                            "(%s); the journal takes nothing more",
                            error,
                        )
                    self._settle(group, error)
                    self._fail_waiting(error)
                    self._wake_committer()
                else:
                    self._durable(group)

    def _durable(self, group: WriteGroup) -> None:
        """A synced (and, if replicated, quorum-held) group: count it and release its waiters."""
        self._operations += group.count
        self._operation_bytes += group.nbytes
        if self._pending_checkpoints:
            self._note_checkpoints(group)
        self._settle(group, None)

    def _settle(self, group: WriteGroup, error: JournalError | None) -> None:
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

    def _might_roll(self, group: WriteGroup) -> bool:
        """Whether writing ``group`` may start a new file (an upper bound on its size)."""
        f = self._file
        if f is None or group.roll or self.short_of_space:
            return True
        return f.size + group.nbytes + HEADER_SIZE * group.count > self._cfg.file_size

    async def _write(self, group: WriteGroup) -> bool:
        """Frame and write one group (not synced yet); False if it was refused or failed."""
        first = self._next_sequence
        group.replicated = self._replication is not None or self.replication_required
        try:
            await trio.to_thread.run_sync(self._write_group, group, first, limiter=self._limiter)
        except JournalRefused as e:
            # Everything queued behind a refused group is refused too: an
            # owner that assigned positions in submission order (segment
            # offsets) would otherwise see a later operation land without
            # an earlier one.
            self._room.refusals += 1
            self._room.note_refusal(e)
            self._room.become_short()
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
            if self._room.used_reserve:
                self._room.used_reserve = False
                self._room.become_short()
        group.first_sequence = first
        self._next_sequence = first + group.count
        if self.replication is not None:
            self.replication.written(first, self._next_sequence, group.frames)
            group.frames = None
        return True

    def _write_group(self, group: WriteGroup, first: int) -> None:
        """Frame and write one group (worker thread); `_sync_group` makes it durable."""
        buffers, total, frames = encode_group(
            group.parts, group.ends, group.sizes, first, self.epoch, self._cfg.max_frame_bytes
        )
        f = self._allocate(group, first, total)
        base = f.size
        f.write(buffers)
        if group.replicated:
            group.frames = b"".join(buffers)
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

    def _sync_group(self, group: WriteGroup) -> None:
        """fdatasync the file a group was written to (worker thread)."""
        failpoints.hit("journal_sync")
        started = time.perf_counter()
        assert group.file is not None
        group.file.sync()
        took = time.perf_counter() - started
        self._sync_seconds += took
        self.sync_latency.observe(took)

    def _allocate(self, group: WriteGroup, first: int, total: int) -> JournalFile:
        """The file to write ``total`` bytes of ``group`` into, with the space allocated.

        Raises JournalRefused (nothing written) when there is no room and
        the group may not, or cannot, use the reserve.
        """
        f = self._file
        roll = f is None or (f.size > 0 and (f.size + total > self._cfg.file_size or group.roll))
        try:
            return self._take_space(f, roll, first, total, exact=False)
        except JournalRefused:
            if not group.reserved or self._room.reserve is None:
                raise
        # The disk is full and every operation of the group frees space
        # sooner or later: take what it needs, to the page, from the reserve.
        # Growing the active file past file_size costs less than a new one.
        if roll and not group.roll and f is not None:
            roll = False
        need = total if f is None or roll else f.size + total - f.allocated
        self._room.release(need)
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

    async def _keep_room(self) -> None:
        """While short of space, retry the refill (`SpaceKeeper.keep`)."""
        await self._room.keep(
            lambda: not self._closing and self._error is None,
            lambda: self._room.has_room(self._file),
            self._limiter,
        )

    def _note_checkpoints(self, group: WriteGroup) -> None:
        """Register the checkpoints that just became durable."""
        still = []
        for t in self._pending_checkpoints:
            if t.group is group:
                bisect.insort(self._checkpoints, t.result())
                self._frames_since_checkpoint = 0
                self._bytes_since_checkpoint = 0
            elif not t.done:
                still.append(t)
        self._pending_checkpoints = still

    def _fail_waiting(self, error: JournalError) -> None:
        groups = [*self._queue, self._open_group]
        self._queue.clear()
        self._open_group = WriteGroup()
        for g in groups:
            if g.count and not g.done.is_set():
                g.error = error
                self._pending_bytes -= g.nbytes
                g.done.set()
        self._space.set()
        if not isinstance(error, JournalRefused):
            self._room.space_restored.set()  # waiters for room see the failure or the close

    # -- lifecycle -------------------------------------------------------------

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
        self._replication_changed.set()  # a group waiting for the sink: it never comes
        self._room.wake_all()
        self._wake_committer()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.seal()
            self._file = None
        self._room.close()

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
            reserve_bytes=self._room.reserve.size if self._room.reserve is not None else 0,
            reserve_target=self._room.target(),
            refusals=self._room.refusals,
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
        if not await trio.to_thread.run_sync(journal._room.open):
            journal._room.become_short()
        async with service_nursery() as nursery:
            nursery.start_soon(journal._run_commits)
            nursery.start_soon(journal._keep_room)
            try:
                await journal._start_epoch()
                yield journal
            finally:
                journal._begin_close()
    finally:
        if journal is not None:
            journal._close_file()
        lock.release()
