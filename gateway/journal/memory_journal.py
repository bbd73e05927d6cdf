"""A journal in memory, for unit tests of the layers above Tier 1.

`MemoryJournal` implements the container's `OperationJournal` without a
disk: an operation is "durable" when the journal commits it, which by
default is as soon as it is submitted. Operations keep their order and get
sequence numbers as the real journal's do, and every committed operation is
kept, so a test can replay them into a fresh table (a restart). For tests it
also holds operations back and refuses them:

- ``hold()``: submitted operations stay pending until `commit`;
- ``refuse_pending(error)``: fail everything pending with ``error`` (a disk
  that filled: the real journal refuses a group and everything behind it);
- ``files``: where a new journal file starts (`roll`), for truncation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from gateway.buffers import Buffer
from gateway.errors import JournalError, OperationTooLarge
from gateway.journal.groups import JournalStatistics
from gateway.protocol.journal_pb2 import Checkpoint, Operation


class MemoryTicket:
    """A submitted operation of a `MemoryJournal`."""

    __slots__ = ("_done", "error", "sequence")

    def __init__(self, sequence: int) -> None:
        self.sequence = sequence
        self.error: JournalError | None = None
        self._done = trio.Event()

    @property
    def done(self) -> bool:
        """Whether the operation is durable or failed."""
        return self._done.is_set()

    def result(self) -> int:
        """The sequence number; raise if the operation failed (once `done`)."""
        if self.error is not None:
            raise self.error
        return self.sequence

    async def wait(self) -> int:
        """Wait until committed (or refused)."""
        await self._done.wait()
        return self.result()

    def location(self) -> None:
        """No file holds it: the read index keeps the data itself."""
        return None


class MemoryJournal:
    """An ordered log of operations in memory (see the module docstring)."""

    def __init__(self, epoch: int = 1, checkpoint_every: int = 300) -> None:
        self.epoch = epoch
        self.failed: JournalError | None = None
        self.short_of_space = False
        self.checkpoint_every = checkpoint_every
        #: Every committed operation as (sequence number, serialized bytes).
        self.committed: list[tuple[int, bytes]] = []
        #: First sequence numbers of the journal's "files" (oldest first).
        self.files = [1]
        self._next = 1
        self._pending: list[tuple[MemoryTicket, bytes]] = []
        self._held = False
        self._since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        #: The largest operation taken (a test may lower it).
        self.max_operation_bytes = 16 * 1024 * 1024
        self._checkpoints: set[int] = set()
        self.truncated_files = 0
        #: The owner's estimate of a checkpoint of every segment (`estimate_checkpoints`).
        self.checkpoint_estimate: Callable[[], int] = lambda: 0

    # -- test controls -------------------------------------------------------------------

    def hold(self) -> None:
        """Keep submitted operations pending until `commit`."""
        self._held = True

    def commit(self) -> None:
        """Make every pending operation durable, in order; stop holding."""
        self._held = False
        pending, self._pending = self._pending, []
        for ticket, data in pending:
            self.committed.append((ticket.sequence, data))
            ticket._done.set()

    def refuse_pending(self, error: JournalError) -> None:
        """Fail every pending operation with ``error``; stop holding."""
        self._held = False
        pending, self._pending = self._pending, []
        for ticket, _ in pending:
            ticket.error = error
            ticket._done.set()

    def roll(self) -> None:
        """Start a new "file" at the next sequence number."""
        self.files.append(self._next)

    def replay(self, replay: Callable[[int, Operation], None]) -> None:
        """Hand every committed operation to ``replay``, as the real journal does at start."""
        for seq, data in self.committed:
            if seq >= self.files[0]:
                replay(seq, Operation.FromString(data))

    # -- OperationJournal ----------------------------------------------------------------

    def submit(self, parts: Sequence[Buffer], reserved: bool = False) -> MemoryTicket:
        """Queue one operation; committed at once unless held."""
        if self.failed is not None:
            raise self.failed
        ticket = MemoryTicket(self._next)
        self._next += 1
        self._since_checkpoint += 1
        data = b"".join(bytes(p) for p in parts)
        if len(data) > self.max_operation_bytes:
            raise OperationTooLarge(len(data), self.max_operation_bytes)
        self._bytes_since_checkpoint += len(data)
        self._pending.append((ticket, data))
        if not self._held:
            self.commit()
        return ticket

    def submit_checkpoint(self, snapshot: bytes, roll: bool = False) -> MemoryTicket:
        """Queue a checkpoint operation."""
        if roll:
            self.roll()
        op = Operation(checkpoint=Checkpoint(snapshot=snapshot))
        ticket = self.submit((op.SerializeToString(),), reserved=True)
        self._checkpoints.add(ticket.sequence)
        self._since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        return ticket

    @property
    def bytes_since_checkpoint(self) -> int:
        """Bytes submitted since the last checkpoint."""
        return self._bytes_since_checkpoint

    def has_space(self, nbytes: int, reserved: bool = False) -> bool:
        """Room unless short of space (and not ``reserved``)."""
        return reserved or not self.short_of_space

    async def wait_for_space(self, nbytes: int, reserved: bool = False) -> None:
        """Return at once when there is room; else wait until cancelled."""
        await trio.lowlevel.checkpoint()
        if not self.has_space(nbytes, reserved):
            await trio.sleep_forever()

    def checkpoint_due(self) -> bool:
        """After ``checkpoint_every`` operations."""
        return self._since_checkpoint >= self.checkpoint_every

    def file_of(self, sequence: int) -> int:
        """The first sequence number of the "file" holding ``sequence``."""
        return max(f for f in self.files if f <= sequence)

    def oldest_file(self) -> int:
        """The oldest "file" kept."""
        return self.files[0]

    def _limit(self, checkpoint_sequence: int, keep_from: int | None) -> int:
        return checkpoint_sequence if keep_from is None else min(keep_from, checkpoint_sequence)

    def would_truncate(self, checkpoint_sequence: int, keep_from: int | None = None) -> bool:
        """Whether a file lies wholly before the limit."""
        return len(self.files) >= 2 and self.files[1] <= self._limit(checkpoint_sequence, keep_from)

    async def truncate(self, checkpoint_sequence: int, keep_from: int | None = None) -> int:
        """Drop the "files" wholly before the limit; how many."""
        if checkpoint_sequence not in self._checkpoints:
            raise ValueError(f"no checkpoint at sequence {checkpoint_sequence}")
        limit = self._limit(checkpoint_sequence, keep_from)
        deleted = 0
        while len(self.files) >= 2 and self.files[1] <= limit:
            self.files.pop(0)
            deleted += 1
        self.truncated_files += deleted
        await trio.lowlevel.checkpoint()
        return deleted

    def estimate_checkpoints(self, estimate: Callable[[], int]) -> None:
        """Kept for `statistics` (no disk, no reserve)."""
        self.checkpoint_estimate = estimate

    def rolled_checkpoint_frees(self, keep_from: int | None) -> bool:
        """Whether any file would go after a checkpoint in a new one."""
        return len(self.files) >= 2 and (keep_from is None or self.files[1] <= keep_from)

    def statistics(self) -> JournalStatistics:
        """Counters (sizes are those of the operations kept)."""
        size = sum(len(d) for _, d in self.committed)
        return JournalStatistics(
            epoch=self.epoch,
            next_sequence=self._next,
            operations=len(self.committed),
            operation_bytes=size,
            frames=len(self.committed),
            groups=len(self.committed),
            sync_seconds=0.0,
            files=len(self.files),
            disk_bytes=size,
            pending_bytes=sum(len(d) for _, d in self._pending),
            queued_groups=len(self._pending),
            frames_since_checkpoint=self._since_checkpoint,
            bytes_since_checkpoint=self._bytes_since_checkpoint,
            last_checkpoint=max(self._checkpoints, default=0),
            failed=str(self.failed) if self.failed else None,
            short_of_space=self.short_of_space,
            reserve_bytes=0,
            reserve_target=self.checkpoint_estimate(),
            refusals=0,
        )
