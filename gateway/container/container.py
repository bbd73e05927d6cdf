"""The segment container: segment metadata and the operation processor.

Every change goes through the same steps (Pravega's operation processor):

1. *prepare* (synchronous): validate against the pending view in Pravega's
   order -- deleted -> sealed -> attribute conditions -> expected offset --,
   assign the offset, submit the journal operation, update the pending view;
2. *wait*: the journal makes the operation durable (group commit);
3. *apply*: operations are applied to the committed view strictly in
   submission order, by whichever waiter runs first, through the segment
   table (`gateway.container.table`), whose ``apply_*`` methods a replay of
   the journal runs too.

Because prepare never yields, operations enter the journal in exactly the
order they were validated, and a caller that prepares requests in arrival
order (the server, per connection) keeps that order end to end. A request
comes in through `SegmentContainer.admit`: wait for room, then prepare.

`SegmentContainer` keeps the prepares of segments and the committed view,
and composes the parts that do the rest, each in its own module:

- `gateway.container.operations`: the operation queue (`PendingOperation`,
  operations in flight, settling in order, undoing refused ones);
- `gateway.container.attribute_cache`: attribute values loaded from the
  attribute index, evicted, bounded;
- `gateway.container.stream_policies`: streams, rolls, retention and the
  timed policy runs;
- `gateway.container.transactions`: begin, commit, abort, timeouts, outcomes;
- `gateway.container.storage_operations`: what the storage writer records;
- `gateway.container.maintenance`: capacity waits, checkpoints, truncation.
"""

from __future__ import annotations

import builtins
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import trio

from gateway import failpoints
from gateway.buffers import Buffer
from gateway.config import ContainerConfig, StreamsConfig
from gateway.container.attribute_cache import AttributeCache
from gateway.container.attributes import (
    CODEC,
    EVENT_COUNT,
    EVENT_END,
    AttributesNotLoaded,
    AttributeUpdate,
    check_id,
    closes_writers,
    needs_current,
    resolve,
)
from gateway.container.interfaces import (
    AttributeStore,
    LeaseGate,
    NamespaceWatcher,
    OperationJournal,
    StorageListener,
)
from gateway.container.largest import LargestSegments
from gateway.container.maintenance import Maintenance
from gateway.container.operations import OperationQueue, PendingOperation
from gateway.container.results import AppendResult, ReadResult, SegmentInfo
from gateway.container.segment import Segment
from gateway.container.segment_names import check_creatable, validate_name, validate_prefix
from gateway.container.storage_operations import StorageOperations
from gateway.container.stream_policies import StreamPolicies
from gateway.container.streams import TXN_DIR, is_hidden
from gateway.container.table import SegmentTable
from gateway.container.transactions import Transactions
from gateway.errors import (
    BadAttributeUpdate,
    BadOffset,
    BadRequest,
    ConditionalCheckFailed,
    GatewayError,
    InvalidName,
    LimitExceeded,
    SegmentExists,
    SegmentSealed,
    SegmentTruncated,
    TooLarge,
    Unavailable,
)
from gateway.journal import JournalStatistics
from gateway.journal.format import attribute_records, encode_append, encode_attribute_values
from gateway.protocol.codec import Codec, lines_end, whole_frames
from gateway.protocol.journal_pb2 import (
    CreateSegment,
    DeleteSegment,
    Operation,
    SealSegment,
    TruncateSegment,
    UpdateAttributes,
)
from gateway.protocol.metadata_pb2 import ContainerSnapshot, SegmentRecord
from gateway.read.index import ReadIndex
from gateway.stats import LATENCY_BUCKETS, Histogram

__all__ = ["PendingOperation", "SegmentContainer"]

log = logging.getLogger(__name__)

_LINES = Codec.LINES.number
_FRAMED = Codec.FRAMED.number

T = TypeVar("T")


class _PartCounter:
    """A counter one of the container's parts keeps, read on the container."""

    def __init__(self, part: str, name: str) -> None:
        self._part = part
        self._name = name

    def __get__(self, container: object, owner: type | None = None) -> int:
        value: int = getattr(getattr(container, self._part), self._name)
        return value


class SegmentContainer:
    """All segments of this node: validates, journals and applies every change.

    Built over a segment table that a replay of ``journal`` has filled
    (`gateway.node.open_node` does both); `run_maintenance` must run
    beside it for checkpoints and journal truncation.
    """

    def __init__(
        self,
        config: ContainerConfig,
        table: SegmentTable,
        journal: OperationJournal,
        streams: StreamsConfig | None = None,
    ) -> None:
        self._cfg = config
        self.streams_config = streams or StreamsConfig()
        self._table = table
        table.outcomes.configure(
            self.streams_config.txn_outcomes, int(self.streams_config.txn_outcome_age * 1000)
        )
        self._journal = journal
        self._queue = queue = OperationQueue(config, table, journal)
        #: Told about creates, seals, truncations and deletes (the mount).
        self.watchers: list[NamespaceWatcher] = queue.watchers
        #: Appends made durable, their bytes, and the time from validation to durable.
        self.appends = 0
        self.append_bytes = 0
        self.append_latency = Histogram(LATENCY_BUCKETS)
        # The parts. Each gets the queue and the prepares it builds on; none
        # reaches back into the container.
        self._attributes = AttributeCache(queue)
        self._transactions = Transactions(
            queue,
            self._attributes,
            self.streams_config,
            create=self._prepare_create,
            seal=self.prepare_seal,
            delete=self.prepare_delete,
            append_target=self._append_target,
        )
        self._streams = StreamPolicies(
            queue,
            self.streams_config,
            create=self._prepare_create,
            seal=self.prepare_seal,
            delete=self.prepare_delete,
            truncate=self.prepare_truncate,
            expire=self._transactions.expire,
        )
        self._storage_ops = StorageOperations(queue, self._attributes)
        self._maintenance = Maintenance(queue)

        # The parts' operations, under the names the server, the storage
        # writer and the mount call them by.
        self.wait_settled = queue.wait_settled
        self.get_attributes = self._attributes.get
        self.load_attributes = self._attributes.load
        self.attribute_range = self._attributes.range
        self.prepare_set_stream = self._streams.prepare_set_stream
        self.prepare_delete_stream = self._streams.prepare_delete_stream
        self.prepare_roll = self._streams.prepare_roll
        self.stream_info = self._streams.stream_info
        self.stream_names = self._streams.stream_names
        self.list_streams = self._streams.list_streams
        self.enforce_streams = self._streams.enforce
        self.run_streams = self._streams.run
        self.prepare_begin = self._transactions.prepare_begin
        self.prepare_commit = self._transactions.prepare_commit
        self.prepare_abort = self._transactions.prepare_abort
        self.prepare_merge_completed = self._storage_ops.prepare_merge_completed
        self.prepare_chunk_added = self._storage_ops.prepare_chunk_added
        self.prepare_chunks_replaced = self._storage_ops.prepare_chunks_replaced
        self.prepare_attribute_index_updated = self._storage_ops.prepare_attribute_index_updated
        self.prepare_storage_sealed = self._storage_ops.prepare_storage_sealed
        self.wait_for_capacity = self._maintenance.wait_for_capacity
        self.checkpoint = self._maintenance.checkpoint
        self.run_maintenance = self._maintenance.run
        self.run_cooling = self._maintenance.run_cooling

    # -- what the node wires in, and the state the parts share ---------------------------

    @property
    def now_ms(self) -> Callable[[], int]:
        """Wall-clock Unix milliseconds (a test may set its own clock)."""
        return self._queue.now_ms

    @now_ms.setter
    def now_ms(self, clock: Callable[[], int]) -> None:
        self._queue.now_ms = clock

    @property
    def node_id(self) -> str:
        """The node id this container is (named in transaction names; "": none)."""
        return self._transactions.node_id

    @node_id.setter
    def node_id(self, node_id: str) -> None:
        self._transactions.node_id = node_id

    @property
    def lease(self) -> LeaseGate | None:
        """In a cluster: changes are admitted and acknowledged only while it is held."""
        return self._queue.lease

    @lease.setter
    def lease(self, lease: LeaseGate | None) -> None:
        self._queue.lease = lease

    @property
    def storage(self) -> StorageListener | None:
        """The storage writer, once Tier 2 runs."""
        return self._queue.storage

    @storage.setter
    def storage(self, storage: StorageListener | None) -> None:
        self._queue.storage = storage

    @property
    def attribute_store(self) -> AttributeStore | None:
        """Reads attribute indexes in Tier 2 (set with ``storage``)."""
        return self._attributes.store

    @attribute_store.setter
    def attribute_store(self, store: AttributeStore | None) -> None:
        self._attributes.store = store

    @property
    def fenced(self) -> GatewayError | None:
        """Set when another process took this node id over (`fence`): no more changes."""
        return self._queue.fenced

    def fence(self, error: GatewayError) -> None:
        """Another process took this node id over: refuse every change from now on."""
        self._queue.fenced = error

    @property
    def max_attributes(self) -> int:
        """Attribute values a segment keeps in memory (``container.max_attributes``)."""
        return self._cfg.max_attributes

    @property
    def applied_seq(self) -> int:
        """Journal sequence of the last operation applied to the committed view."""
        return self._table.seq

    @property
    def read_index(self) -> ReadIndex:
        """Where the committed bytes are (the table keeps it in step)."""
        return self._table.read_index

    @property
    def journal(self) -> OperationJournal:
        """The journal the container writes to."""
        return self._journal

    def journal_statistics(self) -> JournalStatistics:
        """The journal's counters (size on disk, files, syncs)."""
        return self._journal.statistics()

    # -- counters the parts keep (metrics and tests read them here) ----------------------

    #: Extended attribute values read from attribute indexes, and dropped again.
    attributes_loaded = _PartCounter("_attributes", "loaded")
    attributes_evicted = _PartCounter("_attributes", "evicted")
    #: Checkpoints written, and journal files deleted after them.
    checkpoints = _PartCounter("_maintenance", "checkpoints")
    journal_files_truncated = _PartCounter("_maintenance", "journal_files_truncated")
    #: Of those, written whole; segment records and bytes in all of them; segments
    #: cold (only their record in memory) after the last cooling pass.
    full_checkpoints = _PartCounter("_maintenance", "full_checkpoints")
    checkpoint_records = _PartCounter("_maintenance", "checkpoint_records")
    checkpoint_bytes = _PartCounter("_maintenance", "checkpoint_bytes")
    cold_segments = _PartCounter("_maintenance", "cold_segments")
    #: Stream segments sealed by rolling; what retention deleted and truncated away.
    rolls = _PartCounter("_streams", "rolls")
    retention_deleted_segments = _PartCounter("_streams", "retention_deleted_segments")
    retention_deleted_bytes = _PartCounter("_streams", "retention_deleted_bytes")
    retention_truncated_bytes = _PartCounter("_streams", "retention_truncated_bytes")
    #: Transactions begun, committed, aborted by a client, aborted at their deadline.
    txn_begun = _PartCounter("_transactions", "begun")
    txn_committed = _PartCounter("_transactions", "committed")
    txn_aborted = _PartCounter("_transactions", "aborted")
    txn_timed_out = _PartCounter("_transactions", "timed_out")

    # -- admission: the one way a request comes in ---------------------------------------

    async def admit(
        self,
        prepare: Callable[[], T],
        nbytes: int,
        *,
        reserved: bool = False,
        changes: bool = True,
    ) -> T:
        """Wait for room, then prepare: how the server and the tests admit a request.

        ``changes``: the request changes something, so it first waits until
        the journal and the cache can take ``nbytes`` (`wait_for_capacity`;
        ``reserved`` for deletions and truncations, which free space); a
        read-only request does not wait. Then ``prepare()`` runs; when it
        needs attribute values that are only in the attribute index
        (AttributesNotLoaded), the request waits while they are loaded --
        and so do the requests behind it, keeping their order -- and is
        prepared again. Returns what ``prepare`` returns (a PendingOperation
        for the container's own prepares).
        """
        if changes:
            await self.wait_for_capacity(nbytes, reserved)
        while True:
            try:
                return prepare()
            except AttributesNotLoaded as e:
                await self.load_attributes(e.segment, e.ids)

    # -- reading the committed view -------------------------------------------------------

    def _committed(self, name: str) -> Segment:
        return self._queue.committed(name)

    def info(self, name: str) -> SegmentInfo:
        """Committed metadata of one segment."""
        return self._committed(name).info()

    def check_exists(self, name: str) -> None:
        """Raise SegmentNotFound unless ``name`` is a committed segment or stream."""
        stream = self._table.streams.get(name)
        if stream is None or not stream.durable:
            self._committed(name)

    def record(self, name: str) -> SegmentRecord:
        """One segment's whole committed record (chunks, attributes, event index)."""
        return self._committed(name).committed_record()

    def changes_since(
        self, seq: int
    ) -> tuple[list[tuple[int, Segment]], list[tuple[int, int, str]]] | None:
        """What changed in the committed view after journal sequence ``seq``, newest
        first: (sequence of its last change, segment) and (sequence, id, name) of
        those deleted; None if that is before what the table keeps (a follower's
        change feed, `gateway.cluster.feed`)."""
        table = self._table
        found = table.changed_since(seq)
        if found is None:
            return None
        changes, deletions = table.changes, table.deletions
        changed = [(changes[s.id], s) for s in found[0]]
        return changed, [(deletions[i][0], i, name) for i, name in found[1]]

    def list(self, prefix: str = "", start_after: str = "", limit: int = 0) -> list[SegmentInfo]:
        """Committed metadata of the segments whose names start with ``prefix``, sorted."""
        validate_prefix(prefix)
        shown = self.committed_segments(prefix, start_after)
        return [seg.info() for seg in itertools.islice(shown, limit or None)]

    def committed_segments(self, prefix: str = "", start_after: str = "") -> Iterator[Segment]:
        """The segments a listing shows, in name order after ``start_after`` (also
        the change feed's walk). Consume it before the table changes (no await)."""
        table = self._table
        for name in table.names_from(prefix, start_after):
            seg = table.committed_named(name)
            if seg is not None and seg.durable and not seg.hidden:
                yield seg

    @property
    def segment_count(self) -> int:
        """Live segments (committed)."""
        return self._table.live_count

    @property
    def total_blocks(self) -> int:
        """4 KiB blocks of the live segments (each committed length rounded up)."""
        return self._table.total_blocks

    @property
    def sealed_count(self) -> int:
        """Live segments (committed) that are sealed."""
        return self._table.sealed_count

    @property
    def largest(self) -> LargestSegments:
        """The longest segments, kept as lengths change (the status page ranks them)."""
        return self._table.largest

    def segment_by_id(self, segment_id: int) -> Segment | None:
        """The committed segment with this id, if it is live."""
        seg = self._table.by_id.get(segment_id)
        return seg if seg is not None and seg.durable else None

    def segments(self) -> Sequence[Segment]:
        """Every committed live segment (for the storage writer and GC)."""
        return builtins.list(self._table.committed())

    def committed_snapshot(self, segments: bool = True) -> ContainerSnapshot:
        """The committed view of every segment (Tier-2 metadata snapshots); without
        ``segments``, all but their records."""
        return self._table.committed_snapshot(segments)

    def changed_since(
        self, seq: int
    ) -> tuple[builtins.list[Segment], builtins.list[tuple[int, str]]] | None:
        """Segments whose committed view changed after journal sequence ``seq``, and
        (id, name) of those deleted since; None if that is too long ago to tell."""
        return self._table.changed_since(seq)

    async def read(
        self,
        name: str,
        offset: int,
        max_length: int,
        wait: float = 0.0,
        zeros_below_start: bool = False,
    ) -> ReadResult:
        """Committed bytes of ``name`` from ``offset`` (at most ``max_length``).

        Below the start offset: SegmentTruncated, or zeros with
        ``zeros_below_start`` (file-like readers). At the tail of an active
        segment, waits up to ``wait`` seconds for the next append.
        """
        seg = self._committed(name)
        if offset < seg.start_offset and not zeros_below_start:
            raise SegmentTruncated(name, offset, seg.start_offset)
        if offset >= seg.length and not seg.sealed and wait > 0:
            with trio.move_on_after(wait):
                while True:
                    changed = self.read_index.changed(seg.id)
                    seg = self._committed(name)  # it may be gone now
                    if offset < seg.length or seg.sealed:
                        break
                    await changed.wait()
            seg = self._committed(name)
        data = await self.read_index.read(seg.view(), offset, max_length)
        return ReadResult(offset, data, seg.length, seg.start_offset, seg.sealed)

    async def flush(self, name: str = "", within: float | None = None, retry: bool = False) -> None:
        """Flush one segment (or all, for "") to Tier 2 and wait until it is there.

        ``within`` and ``retry`` as for `StorageListener.flush`.
        """
        if self.storage is None:
            raise Unavailable("Tier 2 is not running in this process")
        ids = [self._committed(name).id] if name else None
        await self.storage.flush(ids, within, retry)

    # -- preparing segment operations (synchronous: validate, submit, update pending) ----

    def _append_target(self, name: str) -> Segment:
        """The segment an append to ``name`` goes to: itself, or a stream's current one."""
        return self._streams.append_target(name)

    def prepare_create(
        self, name: str, attributes: Sequence[AttributeUpdate] = (), codec: Codec = Codec.RAW
    ) -> PendingOperation:
        """Create a segment (result: its SegmentInfo); ``codec`` says how its events end."""
        self._queue.start()
        validate_name(name)
        check_creatable(name)
        if is_hidden(name):
            raise InvalidName(name, f"{TXN_DIR}/ is where transactions live (txn begin)")
        if name in self._table.streams:
            raise SegmentExists(name)
        parent = name.rpartition("/")[0]
        if parent and self._streams.stream_above(parent) is not None:
            raise InvalidName(
                name, "it is inside a stream, whose segments the stream itself creates"
            )
        values: dict[bytes, int | None] = {}
        resolve(name, {}, attributes, values)
        values = {k: v for k, v in values.items() if v is not None}
        if len(values) > self._cfg.max_attributes:
            raise LimitExceeded(f"more than {self._cfg.max_attributes} attributes")
        if codec is not Codec.RAW:
            values[CODEC] = codec.number
        return self._prepare_create(name, values)

    def _prepare_create(
        self,
        name: str,
        values: Mapping[bytes, int | None],
        txn_parent: str = "",
        txn_deadline_ms: int = 0,
        attributes_from: Segment | None = None,
    ) -> PendingOperation:
        """Create a segment with resolved attribute values (streams and transactions too).

        A name whose segment's deletion is still in flight may be created: the
        deletion applies first (journal order), and if it is refused, so is this.
        """
        old = self._table.by_name.get(name)
        if old is not None and not old.p_deleted:
            raise SegmentExists(name)
        if len(self._table.by_name) >= self._cfg.max_segments:
            raise LimitExceeded(f"{self._cfg.max_segments} segments exist (container.max_segments)")
        seg = Segment(self._table.next_id, name, self.now_ms())
        seg.txn_parent = txn_parent
        seg.txn_deadline_ms = txn_deadline_ms
        self._table.next_id += 1
        op = Operation(
            create_segment=CreateSegment(
                segment_id=seg.id,
                name=name,
                created_at_ms=seg.created_at_ms,
                attributes=attribute_records(values),
                txn_parent=txn_parent,
                txn_deadline_ms=txn_deadline_ms,
                attributes_from=attributes_from.id if attributes_from is not None else 0,
            )
        )
        ticket = self._queue.submit((op.SerializeToString(),))
        seg.set_pending_attributes(values)
        if attributes_from is not None:
            # Already now, for the appends prepared behind the create: values
            # memory lacks are in the predecessor's index (the same record,
            # which the create hands over when it applies).
            seg.attr_index = attributes_from.attr_index
        self._table.add(seg)
        from_id = attributes_from.id if attributes_from is not None else 0

        def apply(seq: int) -> None:
            self._table.apply_create(seg, values, from_id)
            if not seg.hidden:
                for w in self.watchers:
                    w.on_created(seg)

        return self._queue.track(ticket, None, apply, seg)._with_result(lambda: seg.info())

    def prepare_append(
        self,
        name: str,
        data: Buffer,
        expected_offset: int | None = None,
        attribute_updates: Sequence[AttributeUpdate] = (),
        writer_id: bytes = b"",
        event_number: int = 0,
        previous_event_number: int = 0,
        event_count: int = 0,
    ) -> PendingOperation:
        """Append ``data`` (result: AppendResult). See wire.proto AppendRequest."""
        self._queue.start()
        if len(data) > self._cfg.max_append_bytes:
            raise TooLarge("append", len(data), self._cfg.max_append_bytes)
        seg = self._append_target(name)
        if seg.p_sealed:
            raise SegmentSealed(name)
        if writer_id:
            check_id(name, writer_id)
        index = seg.attr_index
        if index is not None and index.root_length:
            wanted = needs_current(attribute_updates) if attribute_updates else []
            if writer_id:
                wanted.append(writer_id)
            missing = seg.missing_attributes(wanted) if wanted else None
            if missing:
                raise AttributesNotLoaded(seg.name, missing)
        # Pending values without a ChainMap per append (this is the hot path).
        pending, committed = seg.p_attributes, seg.attributes

        def current(k: bytes) -> int | None:
            return pending[k] if k in pending else committed.get(k)

        values: dict[bytes, int | None] = {}
        if writer_id:
            stored = current(writer_id) or 0
            if stored != previous_event_number:
                return self._writer_condition_failed(seg, writer_id, previous_event_number)
            if event_number <= previous_event_number:
                raise BadAttributeUpdate(
                    name,
                    f"event number {event_number} must be greater than the previous "
                    f"{previous_event_number}",
                )
            values[writer_id] = event_number
        if attribute_updates:
            resolve(name, seg.pending_attributes(), attribute_updates, values)
        values[EVENT_COUNT] = (current(EVENT_COUNT) or 0) + (event_count or 1)
        codec = current(CODEC) or 0
        if codec == _LINES and data:
            end = lines_end(seg.p_length, data, current(EVENT_END) or 0)
            if end != (current(EVENT_END) or 0):
                values[EVENT_END] = end
        elif codec == _FRAMED and not writer_id:
            # A writer's appends are whole frames by construction (it
            # declared the codec); a raw append is checked.
            problem = whole_frames(data)
            if problem:
                raise BadRequest(f"append to framed segment {name!r}: not whole events: {problem}")
        self._attributes.check_room(seg, values)
        offset = seg.p_length
        if expected_offset is not None and expected_offset != offset:
            raise BadOffset(name, f"append expected at offset {expected_offset}", offset)
        at_ms = self.now_ms()
        prepared = time.monotonic()
        ticket = self._queue.submit(
            encode_append(seg.id, offset, data, encode_attribute_values(values, 3), at_ms)
        )
        end = offset + len(data)
        seg.p_length = end
        seg.set_pending_attributes(values)
        self._queue.pending_pinned += len(data)

        def apply(seq: int) -> None:
            self._queue.pending_pinned -= len(data)
            self.appends += 1
            self.append_bytes += len(data)
            self.append_latency.observe(time.monotonic() - prepared)
            self._table.apply_append(
                seg, offset, data, values, at_ms, self._journal.file_of(seq), ticket.location()
            )
            if self.storage is not None:
                self.storage.on_append(seg)

        return self._queue.track(ticket, AppendResult(offset, end, seg.name), apply, seg)

    def _writer_condition_failed(
        self, seg: Segment, writer_id: bytes, previous: int
    ) -> PendingOperation:
        """A writer's append whose previous event number does not match.

        The answer must carry the *committed* event number (what is surely
        stored), so it is given once the operations in flight have settled.
        """

        def error() -> GatewayError:
            stored = seg.attributes.get(writer_id) or 0
            e = ConditionalCheckFailed(
                seg.name,
                f"writer {writer_id.hex()} last stored event {stored}, "
                f"the append expected {previous}",
            )
            e.last_event_number = stored
            return e

        tail = self._queue.inflight[-1].ticket if self._queue.inflight else None
        op = PendingOperation(self._queue, tail, None)
        op._deferred = error
        if tail is None:
            op.error = error()
        else:
            self._queue.inflight.append(op)
            # Keep the writer's value in memory until the answer is built:
            # an index batch applied meanwhile must not evict it (a pending
            # value, unchanged, is never evicted; the reset drops it).
            if writer_id not in seg.p_attributes:
                seg.p_attributes[writer_id] = seg.attributes.get(writer_id)
                self._queue.dirty.add(seg)
        return op

    def prepare_seal(self, name: str) -> PendingOperation:
        """Seal a segment (result: SegmentInfo)."""
        self._queue.start()
        seg = self._queue.pending(name)
        if seg.p_sealed:
            raise SegmentSealed(name)
        at_ms = self.now_ms()
        op = Operation(seal_segment=SealSegment(segment_id=seg.id, at_ms=at_ms))
        ticket = self._queue.submit((op.SerializeToString(),))
        seg.p_sealed = True

        def apply(seq: int) -> None:
            self._table.apply_seal(seg, at_ms)
            if seg.hidden:
                failpoints.hit("txn_commit_sealed")
            if self.storage is not None:
                self.storage.on_seal(seg)
            if not seg.hidden:
                for w in self.watchers:
                    w.on_sealed(seg)

        return self._queue.track(ticket, None, apply, seg)._with_result(lambda: seg.info())

    def prepare_truncate(self, name: str, offset: int) -> PendingOperation:
        """Drop the bytes below ``offset`` (result: SegmentInfo)."""
        self._queue.start()
        seg = self._queue.pending(name)
        if not seg.p_start_offset <= offset <= seg.p_length:
            raise BadOffset(
                name,
                f"truncate offset {offset} is outside [{seg.p_start_offset}, {seg.p_length}]",
                seg.p_length,
            )
        at_ms = self.now_ms()
        op = Operation(
            truncate_segment=TruncateSegment(segment_id=seg.id, offset=offset, at_ms=at_ms)
        )
        # Reserved when it drops bytes: that can free journal space on a full disk.
        ticket = self._queue.submit((op.SerializeToString(),), reserved=offset > seg.p_start_offset)
        seg.p_start_offset = offset

        def apply(seq: int) -> None:
            dropped = self._table.apply_truncate(seg, offset, at_ms)
            self._queue.signal_pinned_freed()
            if self.storage is not None:
                self.storage.on_dropped(seg, dropped, deleted=False)
            for w in self.watchers:
                w.on_truncated(seg)

        pending = self._queue.track(ticket, None, apply, seg)
        pending.storage = True  # drops chunks, raises the storage length
        return pending._with_result(lambda: seg.info())

    def prepare_delete(self, name: str, txn_timed_out: bool = False) -> PendingOperation:
        """Delete a segment (result: None); ``txn_timed_out``: a transaction past its deadline."""
        self._queue.start()
        seg = self._queue.pending(name)
        at_ms = self.now_ms()
        op = Operation(
            delete_segment=DeleteSegment(
                segment_id=seg.id, txn_timed_out=txn_timed_out, at_ms=at_ms
            )
        )
        ticket = self._queue.submit((op.SerializeToString(),), reserved=True)  # it frees space
        seg.p_deleted = True

        def apply(seq: int) -> None:
            for gone in self._table.apply_delete(seg, txn_timed_out, at_ms):
                if self.storage is not None:
                    chunks = list(gone.chunks)
                    if gone.attr_index is not None:
                        chunks += gone.attr_index.chunks
                    self.storage.on_dropped(gone, chunks, deleted=True)
            self._queue.signal_pinned_freed()
            if not seg.hidden:
                for w in self.watchers:
                    w.on_deleted(seg)

        pending = self._queue.track(ticket, None, apply, seg)
        # A transaction's outcome record is not in the pending view.
        pending.storage = bool(seg.txn_parent)
        return pending

    def prepare_update_attributes(
        self, name: str, updates: Sequence[AttributeUpdate]
    ) -> PendingOperation:
        """Update attributes atomically (result: SegmentInfo)."""
        self._queue.start()
        seg = self._append_target(name)
        if seg.p_sealed:
            raise SegmentSealed(name)
        missing = seg.missing_attributes(needs_current(updates))
        if missing:
            raise AttributesNotLoaded(seg.name, missing)
        current = seg.pending_attributes()
        values: dict[bytes, int | None] = {}
        resolve(name, current, updates, values)
        self._attributes.check_room(seg, values)
        at_ms = self.now_ms()
        op = Operation(
            update_attributes=UpdateAttributes(
                segment_id=seg.id,
                attributes=attribute_records(values),
                at_ms=at_ms,
            )
        )
        ticket = self._queue.submit((op.SerializeToString(),), reserved=closes_writers(updates))
        seg.set_pending_attributes(values)

        def apply(seq: int) -> None:
            self._table.apply_attributes(seg, values, at_ms)
            if self.storage is not None:
                self.storage.on_attributes(seg)

        return self._queue.track(ticket, None, apply, seg)._with_result(lambda: seg.info())

    # -- stopping and statistics -------------------------------------------------------

    def close(self) -> None:
        """Refuse new operations and stop `run_maintenance` (the node is stopping)."""
        self._queue.closing = True
        self.storage = None
        self._queue.want_maintenance()

    def statistics(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        return {
            "segments": self.segment_count,
            "inflight": len(self._queue.inflight),
            "checkpoints": self.checkpoints,
            "journal_files_truncated": self.journal_files_truncated,
            "journal_files_in_use": len(self._table.file_usage),
            "streams": sum(1 for s in self._table.streams.values() if s.durable),
            "rolls": self.rolls,
            "transactions_open": sum(
                1 for s in self._table.transactions if s.durable and s.hidden and not s.gone
            ),
            "txn_begun": self.txn_begun,
            "txn_committed": self.txn_committed,
            "txn_aborted": self.txn_aborted,
            "txn_timed_out": self.txn_timed_out,
            "retention_deleted_segments": self.retention_deleted_segments,
            "retention_deleted_bytes": self.retention_deleted_bytes,
            "retention_truncated_bytes": self.retention_truncated_bytes,
        }
