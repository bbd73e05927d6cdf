"""What the journal's group commit hands around: write groups, tickets, statistics."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Protocol

import trio

from gateway.buffers import Buffer
from gateway.errors import JournalError
from gateway.journal.files import JournalFile

__all__ = ["JournalStatistics", "ReplicationSink", "Ticket", "WriteGroup"]


class ReplicationSink(Protocol):
    """Where a replicated journal sends its write groups (`gateway.replication`).

    The journal knows nothing of peers: it hands each written group's frames
    over and, before a group counts as durable, waits until the sink says
    enough copies are synced.
    """

    def written(self, first_sequence: int, end_sequence: int, frames: bytes | None) -> None:
        """A group was written locally (``frames`` None: read it from the files)."""

    async def wait_replicated(self, end_sequence: int) -> None:
        """Return once every operation below ``end_sequence`` is on an ack quorum."""


class WriteGroup:
    """Operations written together and made durable by one fdatasync."""

    __slots__ = (
        "count", "created", "data_at", "done", "ends", "error", "file", "first_sequence",
        "frames", "nbytes", "parts", "path", "replicated", "reserved", "roll", "sizes",
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
        #: Written while the journal is replicated: its frames, byte for byte,
        #: for the peers, and the syncer waits for the ack quorum too.
        self.replicated = False
        self.frames: bytes | None = None


class Ticket:
    """A submitted operation (`Journal.submit`)."""

    __slots__ = ("_group", "_index")

    def __init__(self, group: WriteGroup, index: int) -> None:
        self._group = group
        self._index = index

    @property
    def group(self) -> WriteGroup:
        """The write group the operation went into."""
        return self._group

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
