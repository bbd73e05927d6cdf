"""What the segment container talks to, as protocols: its journal and its listeners.

The container is built around these, not around the classes that implement
them today (`gateway.journal.Journal`, the storage writer, the mount): a node
(`gateway.node`) wires the real ones in, and a unit test can hand it a journal
in memory.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.buffers import Buffer
from gateway.container.segment import Segment
from gateway.errors import GatewayError, JournalError
from gateway.journal import JournalStatistics
from gateway.protocol.metadata_pb2 import AttributeIndexRecord, ChunkRecord


class JournalTicket(Protocol):
    """A submitted operation: durable (with its sequence number) or failed."""

    @property
    def done(self) -> bool:
        """Whether the operation is durable or failed."""

    def result(self) -> int:
        """The sequence number of a durable operation; raise if it failed (once `done`)."""

    async def wait(self) -> int:
        """Wait until the operation is durable; return its sequence number."""

    def location(self) -> tuple[pathlib.Path, int] | None:
        """Where a durable operation's last part (an append's data) lies on disk, if in a file."""


class OperationJournal(Protocol):
    """The durable, ordered log the container writes its operations to (Tier 1).

    See `gateway.journal.Journal`, which is the real one, for what each call
    promises: operations are durable in submission order; a refused group
    refuses everything queued behind it; ``reserved`` operations (those that
    free space) may use the reserve while the disk is full.
    """

    @property
    def epoch(self) -> int:
        """This run's epoch."""

    @property
    def failed(self) -> JournalError | None:
        """The error that stopped the journal, if any."""

    @property
    def short_of_space(self) -> bool:
        """Whether client operations are refused for want of disk space."""

    @property
    def bytes_since_checkpoint(self) -> int:
        """Bytes journaled since the last checkpoint was written."""

    @property
    def max_operation_bytes(self) -> int:
        """The largest operation `submit` takes."""

    def submit(self, parts: Sequence[Buffer], reserved: bool = False) -> JournalTicket:
        """Queue one serialized operation (its parts, concatenated)."""

    def submit_checkpoint(self, snapshot: bytes, roll: bool = False) -> JournalTicket:
        """Queue a checkpoint holding ``snapshot``; ``roll``: in a new file."""

    def has_space(self, nbytes: int, reserved: bool = False) -> bool:
        """Whether ``nbytes`` more would be taken now."""

    async def wait_for_space(self, nbytes: int, reserved: bool = False) -> None:
        """Wait until ``nbytes`` more would be taken."""

    def checkpoint_due(self) -> bool:
        """Whether enough went by since the last checkpoint for a new one."""

    def file_of(self, sequence: int) -> int:
        """The journal file (its first sequence number) that holds ``sequence``."""

    def oldest_file(self) -> int:
        """The first sequence number of the oldest file kept."""

    def would_truncate(self, checkpoint_sequence: int, keep_from: int | None = None) -> bool:
        """Whether `truncate` with these arguments would delete a file."""

    async def truncate(self, checkpoint_sequence: int, keep_from: int | None = None) -> int:
        """Delete the files wholly before the checkpoint (and ``keep_from``); how many."""

    def rolled_checkpoint_frees(self, keep_from: int | None) -> bool:
        """Whether a checkpoint in a new file would let files go."""

    def estimate_checkpoints(self, estimate: Callable[[], int]) -> None:
        """``estimate()``: the bytes of a checkpoint of every segment now (the
        journal's disk reserve holds one: it is the checkpoint that frees a full disk)."""

    def statistics(self) -> JournalStatistics:
        """Counters: size on disk, files, syncs."""


class StorageListener(Protocol):
    """Told about committed changes that matter to Tier 2 (the storage writer)."""

    def on_append(self, seg: Segment) -> None:
        """The segment grew."""

    def on_seal(self, seg: Segment) -> None:
        """The segment was sealed."""

    def on_merged(self, target: Segment, source: Segment) -> None:
        """A merge is done in Tier 2: the source's chunks are the target's, the source is gone."""

    def on_dropped(self, seg: Segment, chunks: list[ChunkRecord], deleted: bool) -> None:
        """Chunks left the segment's metadata (truncated, or the segment ``deleted``)."""

    def on_attributes(self, seg: Segment) -> None:
        """The segment's extended attributes waiting for its index fill memory: index them."""

    async def flush(
        self, segment_ids: list[int] | None = None, within: float | None = None, retry: bool = False
    ) -> None:
        """Flush now; return once what was committed before the call is in Tier 2.

        ``retry``: wait through failed attempts (until ``within`` seconds, which
        also bound the whole wait) instead of raising the first one.
        """

    async def durability_barrier(self) -> None:
        """Return once everything flushed so far is durable in Tier 2."""


class AttributeStore(Protocol):
    """Reads segments' attribute indexes in Tier 2 (`gateway.attrindex.store`).

    Each call takes what it needs of ``index`` before its first await: the
    caller may change the record afterwards.
    """

    async def lookup(
        self, segment_id: int, index: AttributeIndexRecord, ids: Sequence[bytes]
    ) -> dict[bytes, int]:
        """The values ``index`` holds for ``ids`` (absent ones left out)."""
        ...

    async def range(
        self, segment_id: int, index: AttributeIndexRecord, start: bytes, limit: int
    ) -> list[tuple[bytes, int]]:
        """Entries of ``index`` with ids >= ``start`` in order, at most ``limit`` (0: all)."""
        ...


class NamespaceWatcher(Protocol):
    """Told about committed changes to which segments exist and what state they
    are in (the FUSE mount keeps its tree and the kernel's caches in step)."""

    def on_created(self, seg: Segment) -> None:
        """The segment now exists."""

    def on_sealed(self, seg: Segment) -> None:
        """The segment was sealed: its length is final."""

    def on_truncated(self, seg: Segment) -> None:
        """Bytes below the new start offset now read as zeros."""

    def on_deleted(self, seg: Segment) -> None:
        """The segment is gone."""

    def on_stream_created(self, name: str) -> None:
        """A stream now exists: its directory shows, with or without segments."""

    def on_stream_deleted(self, name: str) -> None:
        """The stream is gone (its segments went before)."""


class LeaseGate(Protocol):
    """Whether this node may acknowledge changes now (`gateway.cluster.lease.Lease`).

    In a cluster a node acknowledges a change only while it can prove, by
    a recent confirmation in Tier 2, that no other process has taken its
    node id over; past that, it refuses changes until it can confirm again.
    """

    def held(self) -> bool:
        """Whether the lease is held at this instant."""

    def check(self) -> None:
        """Raise `gateway.errors.Unavailable` (a `LeaseLost`) saying why, unless held."""

    @property
    def ack_timeout(self) -> float:
        """How long an acknowledgement may wait to be durable (0: without bound).

        A replicated journal (`gateway.replication`) waits for an ack quorum
        of copies; past this, the change is answered `not_acknowledged`.
        """

    def not_acknowledged(self) -> GatewayError:
        """The error for a change not durable within `ack_timeout`."""
