"""The segment container: segment metadata and the operation processor.

Every change goes through the same steps (Pravega's operation processor):

1. *prepare* (synchronous): validate against the pending view in Pravega's
   order -- deleted -> sealed -> attribute conditions -> expected offset --,
   assign the offset, submit the journal operation, update the pending view;
2. *wait*: the journal makes the operation durable (group commit);
3. *apply*: operations are applied to the committed view strictly in
   submission order, by whichever waiter runs first (`_settle`), through the
   segment table (`gateway.container.table`), whose ``apply_*`` methods a
   replay of the journal runs too.

Because prepare never yields, operations enter the journal in exactly the
order they were validated, and a caller that prepares requests in arrival
order (the server, per connection) keeps that order end to end. If the
journal refuses a group (disk full), it refuses everything queued behind it,
so when the queue of operations in flight drains the pending view is reset
to the committed one and nothing later can depend on a refused operation.

Checkpoints snapshot the pending view at the moment of submission -- it holds
exactly the operations before the checkpoint in the journal -- and after one
is durable the journal is truncated up to the oldest file whose append data
is still needed: data is needed unless it is in Tier 2 (below the storage
length), its segment was deleted, or it was truncated away.
"""

from __future__ import annotations

import builtins
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from functools import partial
from typing import Any

import trio

from gateway import failpoints
from gateway.buffers import Buffer
from gateway.client.codec import Codec, lines_end, whole_frames
from gateway.config import ContainerConfig, StreamsConfig
from gateway.container.attributes import (
    CODEC,
    EVENT_COUNT,
    EVENT_END,
    AttributesNotLoaded,
    AttributeUpdate,
    check_id,
    closes_writers,
    is_core,
    needs_current,
    resolve,
)
from gateway.container.interfaces import (
    AttributeStore,
    JournalTicket,
    LeaseGate,
    NamespaceWatcher,
    OperationJournal,
    StorageListener,
)
from gateway.container.results import (
    POLICY_FIELDS,
    AppendResult,
    ReadResult,
    SegmentInfo,
    StreamInfo,
    TransactionInfo,
)
from gateway.container.segment import Segment
from gateway.container.segment_names import check_creatable, validate_name, validate_prefix
from gateway.container.streams import (
    TXN_DIR,
    Stream,
    is_hidden,
    plan_retention,
    roll_due_by_age,
    roll_due_by_size,
    segment_name,
    split_member,
)
from gateway.container.table import SegmentTable
from gateway.errors import (
    BadAttributeUpdate,
    BadOffset,
    BadRequest,
    ConditionalCheckFailed,
    GatewayError,
    IndexMoved,
    InvalidName,
    JournalClosed,
    JournalError,
    JournalRefused,
    LimitExceeded,
    NotATransaction,
    Overloaded,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    StreamNotFound,
    TooLarge,
    TransactionAborted,
    TransactionCommitted,
    TransactionTimedOut,
    Unavailable,
)
from gateway.journal import JournalStatistics
from gateway.journal.format import attribute_records, encode_append, encode_attribute_values
from gateway.protocol.journal_pb2 import (
    AttributeIndexUpdated,
    ChunkAdded,
    CreateSegment,
    DeleteSegment,
    DeleteStream,
    MergeCompleted,
    MergeSegment,
    Operation,
    SealSegment,
    SetStream,
    StorageSealed,
    TruncateSegment,
    UpdateAttributes,
)
from gateway.protocol.metadata_pb2 import (
    TXN_COMMITTED,
    TXN_TIMED_OUT,
    AttributeIndexRecord,
    ChunkRecord,
    ContainerSnapshot,
    SegmentRecord,
    StreamRecord,
)
from gateway.read.index import ReadIndex
from gateway.stats import LATENCY_BUCKETS, Histogram

log = logging.getLogger(__name__)

#: The core attributes there are (they count against ``max_attributes``).
CORE_IDS = (EVENT_COUNT, CODEC, EVENT_END)
_LINES = Codec.LINES.number
_FRAMED = Codec.FRAMED.number


def _now_ms() -> int:
    return int(time.time() * 1000)


class PendingOperation:
    """A prepared operation; `wait` returns its result once it is durable."""

    __slots__ = (
        "_apply",
        "_container",
        "_deferred",
        "_result_fn",
        "error",
        "internal",
        "result",
        "storage",
        "ticket",
    )

    def __init__(
        self,
        container: SegmentContainer,
        ticket: JournalTicket | None,
        result: Any,
        apply: Callable[[int], None] | None = None,
        deferred: Callable[[], GatewayError] | None = None,
    ) -> None:
        self._container = container
        self.ticket = ticket
        self.result = result
        self._apply = apply
        #: For a failed writer condition: builds the error from the committed
        #: view once the operations in flight before it have settled.
        self._deferred = deferred
        self.error: GatewayError | None = None
        self._result_fn: Callable[[], Any] | None = None
        #: Changes what the pending view (and so a checkpoint's snapshot) does
        #: not carry until it is applied: chunks, the storage length, merge
        #: links, stream records. A checkpoint waits for these to apply.
        self.storage = False
        #: The node's own bookkeeping (chunks recorded, checkpoints), not a
        #: client's change: acknowledged to nobody, so not under the lease.
        self.internal = False

    def _with_result(self, fn: Callable[[], Any]) -> PendingOperation:
        """Compute the result when applied (e.g. the segment's new info)."""
        self._result_fn = fn
        return self

    async def wait(self) -> Any:
        """Wait until durable and applied; return the result or raise the error."""
        if self.ticket is not None:
            with suppress(JournalError):  # _settle maps it
                await self.ticket.wait()
            self._container._settle()
        if self.error is not None:
            raise self.error
        lease = self._container.lease
        if lease is not None and not self.internal and not lease.held():
            # Durable here, but this node can no longer prove that no other
            # process took its node id over: it must not acknowledge (the
            # client retries; exactly-once writers are deduplicated).
            lease.check()
        if self._result_fn is not None:
            return self._result_fn()
        return self.result


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
        #: Wall-clock Unix milliseconds (a test may set its own clock).
        self.now_ms: Callable[[], int] = _now_ms
        self._table = table
        table.outcomes.configure(
            self.streams_config.txn_outcomes, int(self.streams_config.txn_outcome_age * 1000)
        )
        self._journal = journal
        #: Append bytes submitted but not yet applied (and so not yet cached).
        self._pending_pinned = 0
        self._pinned_freed = trio.Event()
        self._inflight: deque[PendingOperation] = deque()
        #: Segments whose pending view may differ from the committed one.
        self._dirty: set[Segment] = set()
        self._maintenance = trio.Event()
        self._closing = False
        #: Set when another process took this node id over (`fence`): no more changes.
        self.fenced: GatewayError | None = None
        #: In a cluster: changes are admitted and acknowledged only while it is held.
        self.lease: LeaseGate | None = None
        #: The storage writer, once Tier 2 runs.
        self.storage: StorageListener | None = None
        #: Reads attribute indexes in Tier 2 (set with ``storage``).
        self.attribute_store: AttributeStore | None = None
        #: Extended attribute values read from attribute indexes.
        self.attributes_loaded = 0
        self.attributes_evicted = 0
        #: Told about creates, seals, truncations and deletes (the mount).
        self.watchers: list[NamespaceWatcher] = []
        self.checkpoints = 0
        self.journal_files_truncated = 0
        #: Appends made durable, their bytes, and the time from validation to durable.
        self.appends = 0
        self.append_bytes = 0
        self.append_latency = Histogram(LATENCY_BUCKETS)
        #: Streams and transactions.
        self.rolls = 0
        self.txn_begun = 0
        self.txn_committed = 0
        self.txn_aborted = 0
        self.txn_timed_out = 0
        self.retention_deleted_segments = 0
        self.retention_deleted_bytes = 0
        self.retention_truncated_bytes = 0

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

    # -- reading the committed view ---------------------------------------------

    def _committed(self, name: str) -> Segment:
        seg = self._table.by_name.get(name)
        if seg is None or not seg.durable or seg.gone:
            validate_name(name)
            raise SegmentNotFound(name)
        return seg

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

    def list(self, prefix: str = "", start_after: str = "", limit: int = 0) -> list[SegmentInfo]:
        """Committed metadata of the segments whose names start with ``prefix``, sorted."""
        validate_prefix(prefix)
        names = sorted(
            n
            for n, s in self._table.by_name.items()
            if s.durable and not s.hidden and n.startswith(prefix) and n > start_after
        )
        if limit:
            names = names[:limit]
        return [self._table.by_name[n].info() for n in names]

    async def get_attributes(self, name: str, ids: Iterable[bytes] = ()) -> dict[bytes, int]:
        """Committed attribute values (all, or those of ``ids`` that exist).

        Waits first until every operation submitted before this call has
        settled, so a writer reconnecting after a broken connection sees the
        outcome of all its earlier appends.
        """
        await self.wait_settled()
        seg = self._attribute_holder(name)
        if seg is None:
            return {}
        wanted = list(ids)
        for i in wanted:
            check_id(name, i, client=False)
        if not wanted:
            return dict(await self.attribute_range(name, b"", 0))
        seg = await self._loaded(seg, wanted)
        found = {i: seg.attributes.get(i) for i in wanted}
        return {i: v for i, v in found.items() if v is not None}

    def _attribute_holder(self, name: str) -> Segment | None:
        """The segment whose attributes ``name`` answers with (None: an empty stream)."""
        stream = self._table.streams.get(name)
        if stream is None or not stream.durable:
            return self._committed(name)
        # A stream's writers: the newest segment carries their event numbers.
        members = stream.committed_members()
        return members[-1] if members else None

    async def _loaded(self, seg: Segment, ids: Sequence[bytes]) -> Segment:
        """``seg`` once memory holds the values of ``ids`` (no await after it returns)."""
        while seg.missing_attributes(ids):
            await self.load_attributes(seg.name, ids)
            now = self._table.by_name.get(seg.name)
            if now is None or now is not seg:
                raise SegmentNotFound(seg.name)
        return seg

    async def load_attributes(self, name: str, ids: Sequence[bytes]) -> None:
        """Bring the values of ``ids`` from the segment's attribute index into memory.

        The prefetch before an operation that conditions on them (Pravega's
        attribute pipeline): a value already in memory is never overwritten
        by the index's older one, and a lookup that overlapped an eviction
        (whose value it may predate) looks again.
        """
        while True:
            seg = self._table.by_name.get(name)
            if seg is None:
                return
            missing = seg.missing_attributes(ids)
            if not missing:
                return
            if self.attribute_store is None:
                raise Unavailable(f"the attribute index of {name!r} is in Tier 2, which is off")
            assert seg.attr_index is not None
            evictions = seg.attr_evictions
            where = seg.attr_index.length
            # The store takes what it needs of the record before it awaits.
            try:
                found = await self.attribute_store.lookup(seg.id, seg.attr_index, missing)
            except IndexMoved:
                if seg.attr_index is None or seg.attr_index.length == where:
                    raise  # not moved on: a chunk really is missing
                continue
            if self._table.by_name.get(name) is not seg or seg.attr_evictions != evictions:
                continue
            seg.load_attributes({k: found.get(k) for k in missing})
            self.attributes_loaded += len(missing)
            # All of the caller's ids stay, loaded now or before (memory may
            # exceed the limit by one request's ids until the next eviction).
            self._evict(seg, keep=ids)
            return

    def _evict(self, seg: Segment, keep: Sequence[bytes] = ()) -> None:
        """Keep the segment's attributes in memory within ``container.max_attributes``.

        ``keep``: values just loaded for a waiting caller, which must find them.
        """
        limit = self._cfg.max_attributes
        if len(seg.attributes) > limit:
            # Oldest loaded first, down to 7/8 of the limit: one pass over
            # the values now and then, not one per value loaded.
            self.attributes_evicted += seg.evict_attributes(limit - limit // 8, set(keep))

    async def attribute_range(
        self, name: str, start: bytes = b"", limit: int = 0
    ) -> builtins.list[tuple[bytes, int]]:
        """Attributes with ids >= ``start`` in id order (core ones first), at most ``limit``.

        Memory's committed values (core, not yet indexed, cached) over the
        index's; 0 = no limit.
        """
        await self.wait_settled()
        seg = self._attribute_holder(name)
        if seg is None:
            return []
        out: builtins.list[tuple[bytes, int]] = []
        index_items: builtins.list[tuple[bytes, int]] = []
        index = seg.attr_index
        want = 0
        if index is not None and index.root_length:
            if self.attribute_store is None:
                raise Unavailable(f"the attribute index of {name!r} is in Tier 2, which is off")
            # Removed ids still in memory hide index entries: ask for that many more.
            hidden = sum(1 for v in seg.attributes.values() if v is None)
            want = limit + hidden if limit else 0
            for attempt in range(10):
                where = index.length
                try:
                    index_items = await self.attribute_store.range(seg.id, index, start, want)
                    break
                except IndexMoved:
                    # Look again with the record as it is now, unless it did
                    # not move (a chunk is really missing) or keeps moving.
                    if seg.attr_index is not index or index.length == where or attempt == 9:
                        raise
            if self._table.by_name.get(seg.name) is not seg:
                raise SegmentNotFound(seg.name)
        merged: dict[bytes, int | None] = dict(index_items)
        # Unless the index gave everything from ``start`` on, memory's values
        # past its last answer cannot be placed among the index's.
        complete = not want or len(index_items) < want
        upper = None if complete else index_items[-1][0]
        for k, v in seg.attributes.items():
            if k >= start and (upper is None or k <= upper):
                merged[k] = v
        for k in sorted(merged):
            v = merged[k]
            if v is not None:
                out.append((k, v))
        return out[:limit] if limit else out

    async def wait_settled(self) -> None:
        """Wait until everything submitted so far is durable (or failed) and applied."""
        if self._inflight:
            last = self._inflight[-1]
            if last.ticket is not None:
                with suppress(JournalError):
                    await last.ticket.wait()
            self._settle()
        else:
            await trio.lowlevel.checkpoint()

    @property
    def journal(self) -> OperationJournal:
        """The journal the container writes to."""
        return self._journal

    def journal_statistics(self) -> JournalStatistics:
        """The journal's counters (size on disk, files, syncs)."""
        return self._journal.statistics()

    @property
    def segment_count(self) -> int:
        """Live segments (committed)."""
        return sum(1 for s in self._table.by_name.values() if s.durable)

    # -- preparing operations (synchronous: validate, submit, update pending) ---

    def _pending(self, name: str) -> Segment:
        seg = self._table.by_name.get(name)
        if seg is None or seg.p_deleted or seg.p_merged:
            validate_name(name)
            raise SegmentNotFound(name)
        return seg

    def _submit(self, parts: Sequence[Buffer], reserved: bool = False) -> JournalTicket:
        """Submit to the journal; ``reserved`` for operations that free space (may use
        the journal's reserve when the disk is full)."""
        try:
            return self._journal.submit(parts, reserved)
        except JournalClosed as e:
            raise Unavailable("the daemon is shutting down") from e
        except JournalRefused as e:
            self._maintenance.set()  # a checkpoint may free space now
            raise Overloaded(str(e)) from e
        except JournalError as e:
            raise Unavailable(str(e)) from e

    def _track(
        self, ticket: JournalTicket, result: Any, apply: Callable[[int], None], seg: Segment | None
    ) -> PendingOperation:
        op = PendingOperation(self, ticket, result, apply)
        self._inflight.append(op)
        if seg is not None:
            self._dirty.add(seg)
        return op

    def _check_attribute_room(self, seg: Segment, values: Mapping[bytes, int | None]) -> None:
        """Refuse changes memory cannot hold until the attribute index takes some.

        Extended values not yet indexed stay in memory; ``max_attributes``
        bounds them. With Tier 2 the storage writer indexes them soon (the
        caller is told Overloaded, to retry); without it nothing can.
        """
        new_ids = sum(
            1
            for k in values
            if not is_core(k) and k not in seg.attr_dirty and k not in seg.p_attributes
        )
        if not new_ids:
            return
        core = sum(1 for k in CORE_IDS if k in seg.attributes or k in values)
        if core + seg.extended_in_memory() + new_ids <= self._cfg.max_attributes:
            return
        limit = self._cfg.max_attributes
        if self.storage is not None and not seg.hidden:
            self.storage.on_attributes(seg)
            raise Overloaded(
                f"segment {seg.name!r} has {seg.extended_in_memory()} attribute changes "
                f"waiting for its attribute index (container.max_attributes = {limit})"
            )
        raise LimitExceeded(f"segment {seg.name!r} would have more than {limit} attributes")

    def _start(self, change: bool = True) -> None:
        """Common start of every prepare: settle, and refuse if the journal failed.

        ``change``: a client's change (not the node's own bookkeeping), which
        also needs the lease.
        """
        self._settle()
        if self._closing:
            raise Unavailable("the daemon is shutting down")
        if self._journal.failed is not None:
            raise Unavailable(str(self._journal.failed))
        if self.fenced is not None:
            raise Unavailable(str(self.fenced))
        if change and self.lease is not None:
            self.lease.check()

    def fence(self, error: GatewayError) -> None:
        """Another process took this node id over: refuse every change from now on."""
        self.fenced = error

    def prepare_create(
        self, name: str, attributes: Sequence[AttributeUpdate] = (), codec: Codec = Codec.RAW
    ) -> PendingOperation:
        """Create a segment (result: its SegmentInfo); ``codec`` says how its events end."""
        self._start()
        validate_name(name)
        check_creatable(name)
        if is_hidden(name):
            raise InvalidName(name, f"{TXN_DIR}/ is where transactions live (txn begin)")
        if name in self._table.streams:
            raise SegmentExists(name)
        parent = name.rpartition("/")[0]
        if parent and self._stream_above(parent) is not None:
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

    def _stream_above(self, path: str) -> Stream | None:
        """The stream at ``path`` or at one of its parent directories, if any."""
        while path:
            stream = self._table.streams.get(path)
            if stream is not None and not stream.p_deleted:
                return stream
            path = path.rpartition("/")[0]
        return None

    def _prepare_create(
        self,
        name: str,
        values: Mapping[bytes, int | None],
        txn_parent: str = "",
        txn_deadline_ms: int = 0,
        attributes_from: Segment | None = None,
    ) -> PendingOperation:
        """Create a segment with resolved attribute values (streams and transactions too)."""
        if name in self._table.by_name:
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
        ticket = self._submit((op.SerializeToString(),))
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

        return self._track(ticket, None, apply, seg)._with_result(lambda: seg.info())

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
        self._start()
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
        self._check_attribute_room(seg, values)
        offset = seg.p_length
        if expected_offset is not None and expected_offset != offset:
            raise BadOffset(name, f"append expected at offset {expected_offset}", offset)
        at_ms = self.now_ms()
        prepared = time.monotonic()
        ticket = self._submit(
            encode_append(seg.id, offset, data, encode_attribute_values(values, 3), at_ms)
        )
        end = offset + len(data)
        seg.p_length = end
        seg.set_pending_attributes(values)
        self._pending_pinned += len(data)

        def apply(seq: int) -> None:
            self._pending_pinned -= len(data)
            self.appends += 1
            self.append_bytes += len(data)
            self.append_latency.observe(time.monotonic() - prepared)
            self._table.apply_append(
                seg, offset, data, values, at_ms, self._file_of(seq), ticket.location()
            )
            if self.storage is not None:
                self.storage.on_append(seg)

        return self._track(ticket, AppendResult(offset, end, seg.name), apply, seg)

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

        tail = self._inflight[-1].ticket if self._inflight else None
        op = PendingOperation(self, tail, None)
        op._deferred = error
        if tail is None:
            op.error = error()
        else:
            self._inflight.append(op)
            # Keep the writer's value in memory until the answer is built:
            # an index batch applied meanwhile must not evict it (a pending
            # value, unchanged, is never evicted; the reset drops it).
            if writer_id not in seg.p_attributes:
                seg.p_attributes[writer_id] = seg.attributes.get(writer_id)
                self._dirty.add(seg)
        return op

    def prepare_seal(self, name: str) -> PendingOperation:
        """Seal a segment (result: SegmentInfo)."""
        self._start()
        seg = self._pending(name)
        if seg.p_sealed:
            raise SegmentSealed(name)
        at_ms = self.now_ms()
        op = Operation(seal_segment=SealSegment(segment_id=seg.id, at_ms=at_ms))
        ticket = self._submit((op.SerializeToString(),))
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

        return self._track(ticket, None, apply, seg)._with_result(lambda: seg.info())

    def prepare_truncate(self, name: str, offset: int) -> PendingOperation:
        """Drop the bytes below ``offset`` (result: SegmentInfo)."""
        self._start()
        seg = self._pending(name)
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
        ticket = self._submit((op.SerializeToString(),), reserved=offset > seg.p_start_offset)
        seg.p_start_offset = offset

        def apply(seq: int) -> None:
            dropped = self._table.apply_truncate(seg, offset, at_ms)
            self._signal_pinned_freed()
            if self.storage is not None:
                self.storage.on_dropped(seg, dropped, deleted=False)
            for w in self.watchers:
                w.on_truncated(seg)

        pending = self._track(ticket, None, apply, seg)
        pending.storage = True  # drops chunks, raises the storage length
        return pending._with_result(lambda: seg.info())

    def prepare_delete(self, name: str, txn_timed_out: bool = False) -> PendingOperation:
        """Delete a segment (result: None); ``txn_timed_out``: a transaction past its deadline."""
        self._start()
        seg = self._pending(name)
        at_ms = self.now_ms()
        op = Operation(
            delete_segment=DeleteSegment(
                segment_id=seg.id, txn_timed_out=txn_timed_out, at_ms=at_ms
            )
        )
        ticket = self._submit((op.SerializeToString(),), reserved=True)  # it frees space
        seg.p_deleted = True

        def apply(seq: int) -> None:
            for gone in self._table.apply_delete(seg, txn_timed_out, at_ms):
                if self.storage is not None:
                    chunks = list(gone.chunks)
                    if gone.attr_index is not None:
                        chunks += gone.attr_index.chunks
                    self.storage.on_dropped(gone, chunks, deleted=True)
            self._signal_pinned_freed()
            if not seg.hidden:
                for w in self.watchers:
                    w.on_deleted(seg)

        pending = self._track(ticket, None, apply, seg)
        # A transaction's outcome record is not in the pending view.
        pending.storage = bool(seg.txn_parent)
        return pending

    def prepare_update_attributes(
        self, name: str, updates: Sequence[AttributeUpdate]
    ) -> PendingOperation:
        """Update attributes atomically (result: SegmentInfo)."""
        self._start()
        seg = self._append_target(name)
        if seg.p_sealed:
            raise SegmentSealed(name)
        missing = seg.missing_attributes(needs_current(updates))
        if missing:
            raise AttributesNotLoaded(seg.name, missing)
        current = seg.pending_attributes()
        values: dict[bytes, int | None] = {}
        resolve(name, current, updates, values)
        self._check_attribute_room(seg, values)
        at_ms = self.now_ms()
        op = Operation(
            update_attributes=UpdateAttributes(
                segment_id=seg.id,
                attributes=attribute_records(values),
                at_ms=at_ms,
            )
        )
        ticket = self._submit((op.SerializeToString(),), reserved=closes_writers(updates))
        seg.set_pending_attributes(values)

        def apply(seq: int) -> None:
            self._table.apply_attributes(seg, values, at_ms)
            if self.storage is not None:
                self.storage.on_attributes(seg)

        return self._track(ticket, None, apply, seg)._with_result(lambda: seg.info())

    # -- streams -------------------------------------------------------------------

    def _append_target(self, name: str) -> Segment:
        """The segment an append to ``name`` goes to: itself, or a stream's current one."""
        stream = self._table.streams.get(name)
        if stream is None or stream.p_deleted:
            return self._pending(name)
        return self._current(stream)

    def _current(self, stream: Stream) -> Segment:
        """The stream's current segment (pending view), rolling or starting it as due.

        Synchronous, like every prepare: the seal of the old segment, the
        create of its successor and the append that follows enter the
        journal in that order, so no event lands in a sealed segment and
        readers see the old segment's final length before the next event.
        """
        cur = stream.pending_current()
        if cur is not None and roll_due_by_size(cur, stream.policy(self.streams_config)):
            self._roll(cur, "size")
            cur = None
        if cur is None:
            cur = self._start_successor(stream)
        return cur

    def _roll(self, seg: Segment, why: str) -> PendingOperation:
        """Seal a stream's current segment (its successor starts with the next append)."""
        op = self.prepare_seal(seg.name)
        self.rolls += 1
        log.info("stream segment %s rolled (%s) at %d bytes", seg.name, why, seg.p_length)
        return op

    def _start_successor(self, stream: Stream) -> Segment:
        """Create the stream's next segment, carrying its writers' event numbers."""
        values: dict[bytes, int | None] = {}
        last = None
        if stream.members:
            # Exactly-once writers go on from the event number they reached:
            # the successor takes over the last segment's attribute index,
            # and the values memory holds that the index may lack.
            last = stream.members[-1]
            attrs = last.pending_attributes()
            values = {k: v for k, v in attrs.items() if not is_core(k) or k == CODEC}
        if stream.codec is not Codec.RAW:
            values[CODEC] = stream.codec.number  # every segment of the stream has it
        name = segment_name(stream.name, stream.p_next_number)
        stream.p_next_number += 1
        self._prepare_create(name, values, attributes_from=last)
        return self._table.by_name[name]

    def _stream_record(
        self, name: str, policy: Mapping[str, int | None], base: StreamRecord
    ) -> StreamRecord:
        record = StreamRecord()
        record.CopyFrom(base)
        record.name = name
        for key, value in policy.items():
            if key not in POLICY_FIELDS:
                raise BadRequest(f"unknown stream policy {key!r}")
            if value is None:
                record.ClearField(key)
            elif value < 0:
                raise BadRequest(f"stream policy {key} must not be negative")
            else:
                setattr(record, key, value)
        return record

    def _pending_stream(self, name: str) -> Stream:
        """The stream (pending view); StreamNotFound if there is none."""
        stream = self._table.streams.get(name)
        if stream is None or stream.p_deleted:
            validate_name(name)
            raise StreamNotFound(name)
        return stream

    def prepare_set_stream(
        self,
        name: str,
        policy: Mapping[str, int | None],
        create: bool = False,
        codec: Codec = Codec.RAW,
    ) -> PendingOperation:
        """Create a stream, or change its policies (result: StreamInfo).

        ``policy`` maps POLICY_FIELDS to a value, or to None to fall back to
        the ``[streams]`` default; fields not given keep their value.
        ``codec`` (create only): the codec every segment of the stream is
        created with, fixed for the stream's life.
        """
        self._start()
        validate_name(name)
        stream = self._table.streams.get(name)
        if stream is not None and stream.p_deleted:
            stream = None
        if create:
            check_creatable(name)
            if stream is not None or name in self._table.by_name:
                raise SegmentExists(name)
            if is_hidden(name) or split_member(name) is not None:
                raise InvalidName(name, "it is a transaction's or a stream segment's name")
            if self._stream_above(name.rpartition("/")[0]) is not None:
                raise InvalidName(name, "it is inside a stream")
            prefix = name + "/"
            if any(n.startswith(prefix) for n in self._table.by_name):
                raise SegmentExists(f"{name} (segments exist below it)")
            base = StreamRecord(created_at_ms=self.now_ms(), next_number=1, codec=codec.number)
        elif stream is None:
            raise StreamNotFound(name)
        else:
            base = stream.record
        record = self._stream_record(name, policy, base)
        ticket = self._submit((Operation(set_stream=SetStream(stream=record)).SerializeToString(),))
        if create:
            # Pending: appends pipelined behind the create find the stream.
            self._table.streams[name] = Stream(
                StreamRecord(name=name, next_number=1, codec=codec.number)
            )

        def apply(seq: int) -> None:
            self._table.apply_set_stream(record)
            if create:
                for w in self.watchers:  # its directory shows before its first segment
                    w.on_stream_created(name)

        op = PendingOperation(self, ticket, None, apply)
        op.storage = True  # the pending view does not carry stream records
        self._inflight.append(op)
        return op._with_result(lambda: self.stream_info(name))

    def prepare_delete_stream(self, name: str) -> PendingOperation:
        """Delete a stream and every segment in it (result: None)."""
        self._start()
        stream = self._pending_stream(name)
        for seg in list(stream.members):
            if not seg.p_deleted:
                self.prepare_delete(seg.name)
        op = Operation(delete_stream=DeleteStream(name=name))
        ticket = self._submit((op.SerializeToString(),), reserved=True)
        stream.p_deleted = True

        def apply(seq: int) -> None:
            self._table.apply_delete_stream(name)
            for w in self.watchers:
                w.on_stream_deleted(name)

        pending = PendingOperation(self, ticket, None, apply)
        pending.storage = True  # the pending view does not carry stream records
        self._inflight.append(pending)
        return pending

    def prepare_roll(self, name: str) -> PendingOperation:
        """Seal a stream's current segment now (result: StreamInfo)."""
        self._start()
        stream = self._pending_stream(name)
        cur = stream.pending_current()
        op = PendingOperation(self, None, None) if cur is None else self._roll(cur, "asked")
        return op._with_result(lambda: self.stream_info(name))

    def stream_info(self, name: str) -> StreamInfo:
        """A stream's policies and segments (committed view)."""
        stream = self._table.streams.get(name)
        if stream is None or not stream.durable:
            validate_name(name)
            raise StreamNotFound(name)
        policy = stream.policy(self.streams_config)
        r = stream.record
        return StreamInfo(
            name=name,
            created_at_ms=r.created_at_ms,
            roll_size=policy.roll_size,
            roll_age_ms=policy.roll_age_ms,
            retain_size=policy.retain_size,
            retain_age_ms=policy.retain_age_ms,
            own={f: getattr(r, f) for f in POLICY_FIELDS if r.HasField(f)},
            segments=[m.info() for m in stream.committed_members()],
            next_number=r.next_number,
            codec=stream.codec.value,
        )

    def stream_names(self) -> builtins.list[str]:
        """The names of every stream (committed view), sorted: the mount's directories."""
        return sorted(n for n, s in self._table.streams.items() if s.durable)

    def list_streams(self) -> builtins.list[StreamInfo]:
        """Every stream, by name."""
        return [
            self.stream_info(n)
            for n in sorted(self._table.streams)
            if self._table.streams[n].durable
        ]

    # -- transactions (Pravega's merge) ------------------------------------------------

    def prepare_begin(self, parent: str, timeout: float = 0.0) -> PendingOperation:
        """Start a transaction on a segment or stream (result: TransactionInfo).

        Append to the transaction's name like to any segment; `prepare_commit`
        merges it into ``parent`` (a stream: its current segment then).
        """
        self._start()
        cfg = self.streams_config
        timeout = timeout or cfg.txn_timeout
        if not 0 < timeout <= cfg.max_txn_timeout:
            raise LimitExceeded(
                f"transaction timeout {timeout:g}s is above streams.max_txn_timeout "
                f"({cfg.max_txn_timeout:g}s)"
            )
        stream = self._table.streams.get(parent)
        values: dict[bytes, int] = {}
        if stream is None or stream.p_deleted:
            target = self._pending(parent)
            if target.hidden:
                raise BadRequest(f"{parent!r} is a transaction; transactions do not nest")
            if target.p_sealed:
                raise SegmentSealed(parent)
            codec = target.pending_attributes().get(CODEC)
            if codec is not None:  # its events are checked alike
                values[CODEC] = codec
        elif stream.codec is not Codec.RAW:
            values[CODEC] = stream.codec.number
        name = f"{TXN_DIR}/{uuid.uuid4().hex}"
        deadline = self.now_ms() + int(timeout * 1000)
        op = self._prepare_create(name, values, txn_parent=parent, txn_deadline_ms=deadline)
        self.txn_begun += 1
        return op._with_result(lambda: TransactionInfo(name, parent, deadline_ms=deadline))

    def _transaction(self, name: str) -> Segment:
        """The open transaction ``name`` (pending view)."""
        if not is_hidden(name):  # only `begin` creates names there
            raise NotATransaction(name)
        return self._pending(name)

    def _finished_transaction(self, name: str, commit: bool) -> PendingOperation | None:
        """A commit (or abort) of a transaction that has ended, or is ending.

        None while ``name`` is open, or unknown. Otherwise the answer comes
        from the record of finished transactions once the operations in
        flight have applied (a commit sent again while the first is still
        being journaled waits for it): a commit of a committed transaction
        gets the same TransactionInfo again, an abort of an aborted one
        succeeds; the others are refused, saying how it ended.
        """
        if not is_hidden(name):
            return None
        seg = self._table.by_name.get(name)
        if seg is not None and not (seg.p_merged or seg.p_deleted):
            return None
        if seg is None and self._table.outcomes.get(name, self.now_ms()) is None:
            return None
        tail = self._inflight[-1].ticket if self._inflight else None
        return PendingOperation(self, tail, None)._with_result(
            partial(self._outcome_answer, name, commit)
        )

    def _outcome_answer(self, name: str, commit: bool) -> TransactionInfo | None:
        """What a commit or abort of the ended transaction ``name`` is answered."""
        record = self._table.outcomes.get(name, self.now_ms())
        if record is None:
            seg = self._table.by_name.get(name)
            if seg is not None and not (seg.p_merged or seg.p_deleted):
                # The operation that was ending it was refused by the journal.
                raise Unavailable(f"transaction {name!r} did not end: send it again")
            raise SegmentNotFound(name)
        if record.outcome == TXN_COMMITTED:
            if not commit:
                raise TransactionCommitted(name, record.segment, record.offset)
            return TransactionInfo(
                name, record.parent, record.segment, record.offset, record.length
            )
        if not commit:
            return None  # aborted already: what an abort wants holds
        if record.outcome == TXN_TIMED_OUT:
            raise TransactionTimedOut(name)
        raise TransactionAborted(name)

    def _commit_too_late(self, txn: Segment) -> PendingOperation:
        """A commit at or after the deadline: abort the transaction, then refuse.

        The deadline holds to the millisecond, not only when the timeout
        sweep (every ``streams.interval``) comes round.
        """
        log.info(
            "transaction %s on %s: commit after its deadline; aborted", txn.name, txn.txn_parent
        )
        error = TransactionTimedOut(txn.name)

        def refuse() -> None:
            raise error

        try:
            aborting = self.prepare_delete(txn.name, txn_timed_out=True)
        except GatewayError as e:
            # Not journaled now (e.g. a full disk): the sweep aborts it later;
            # the commit is refused all the same.
            log.warning("abort of %s: %s", txn.name, e)
            raise error from None
        self.txn_timed_out += 1
        return PendingOperation(self, aborting.ticket, None)._with_result(refuse)

    def prepare_commit(self, name: str) -> PendingOperation:
        """Merge a transaction into its parent atomically (result: TransactionInfo).

        The transaction is sealed, then appended to the end of its parent's
        (pending) length in one journaled operation: readers of the parent see
        all of its bytes at once or none. Its event count adds to the
        parent's, and its writers' event numbers move over. Sent again after
        it ended, it answers from the record of finished transactions
        (`_finished_transaction`); at or after the deadline it aborts the
        transaction and is refused (TransactionTimedOut).
        """
        self._start()
        finished = self._finished_transaction(name, commit=True)
        if finished is not None:
            return finished
        txn = self._transaction(name)
        if self.now_ms() >= txn.txn_deadline_ms:
            return self._commit_too_late(txn)
        target = self._append_target(txn.txn_parent)
        if target.p_sealed:
            raise SegmentSealed(target.name)
        source = txn.pending_attributes()
        missing = target.missing_attributes(list(source))
        if missing:
            raise AttributesNotLoaded(target.name, missing)
        current = target.pending_attributes()
        values: dict[bytes, int | None] = {
            EVENT_COUNT: (current.get(EVENT_COUNT) or 0) + (source.get(EVENT_COUNT) or 0)
        }
        for k, v in source.items():
            if not is_core(k) and v is not None:
                old = current.get(k)
                values[k] = v if old is None else max(v, old)
        self._check_attribute_room(target, values)
        if not txn.p_sealed:
            self.prepare_seal(name)
        offset = target.p_length
        length = txn.p_length
        if (current.get(CODEC) or 0) == _LINES:
            # The sealed transaction ends with a whole event, newline or not.
            values[EVENT_END] = offset + length
        at_ms = self.now_ms()
        op = Operation(
            merge_segment=MergeSegment(
                target_id=target.id,
                source_id=txn.id,
                offset=offset,
                attributes=attribute_records(values),
                at_ms=at_ms,
            )
        )
        ticket = self._submit((op.SerializeToString(),))
        target.p_length = offset + length
        target.set_pending_attributes(values)
        txn.p_merged = True
        self._dirty.add(txn)
        self.txn_committed += 1

        def apply(seq: int) -> None:
            self._table.apply_merge(target, txn, offset, values, at_ms)
            failpoints.hit("txn_commit_merged")
            if self.storage is not None:
                self.storage.on_append(target)

        info = TransactionInfo(name, txn.txn_parent, target.name, offset, length)
        pending = self._track(ticket, info, apply, target)
        pending.storage = True  # the pending view does not carry the merge link
        return pending

    def prepare_abort(self, name: str) -> PendingOperation:
        """Drop a transaction that is not committed (result: None).

        Idempotent: an abort of one already aborted or timed out succeeds;
        one of a committed transaction raises TransactionCommitted.
        """
        self._start()
        finished = self._finished_transaction(name, commit=False)
        if finished is not None:
            return finished
        self._transaction(name)
        op = self.prepare_delete(name)
        self.txn_aborted += 1
        return op

    def prepare_merge_completed(self, target_id: int, source_id: int) -> PendingOperation:
        """Re-reference a merged source's chunks as the target's (the storage writer)."""
        self._start(change=False)
        target = self._pending_by_id(target_id)
        source = self._table.by_id.get(source_id)
        if source is None or source.p_deleted:
            raise SegmentNotFound(f"segment id {source_id}")
        op = Operation(merge_completed=MergeCompleted(target_id=target_id, source_id=source_id))
        ticket = self._submit((op.SerializeToString(),), reserved=True)
        # Gone once this applies: nothing may be journaled for it after.
        source.p_deleted = True
        self._dirty.add(source)

        def apply(seq: int) -> None:
            dropped = self._table.apply_merge_completed(target, source)
            failpoints.hit("after_merge_completed")
            self._signal_pinned_freed()
            if self.storage is not None:
                self.storage.on_merged(target, source)
                if dropped:
                    self.storage.on_dropped(target, dropped, deleted=False)

        pending = self._track(ticket, None, apply, target)
        pending.storage = True
        pending.internal = True
        return pending

    # -- policies over time: rolling by age, transaction timeouts, retention ----------

    async def enforce_streams(self) -> int:
        """Roll by age, abort timed-out transactions and apply retention once.

        Returns how many operations were started. Retention deletes a stream's
        oldest sealed segments and truncates its oldest remaining one as its
        policies say (`gateway.container.streams.plan_retention`), and says
        what it removed in the log and the counters.
        """
        self._settle()
        if self._closing or self.fenced is not None or self._journal.failed is not None:
            return 0
        now = self.now_ms()
        cfg = self.streams_config
        ops: list[tuple[str, PendingOperation]] = []

        def start(what: str, prepare: Callable[[], PendingOperation]) -> None:
            try:
                ops.append((what, prepare()))
            except GatewayError as e:
                log.warning("%s: %s", what, e)

        for seg in list(self._table.transactions):
            if (
                seg.durable
                and not seg.p_merged
                and not seg.p_deleted
                and seg.txn_deadline_ms <= now
            ):
                log.info("transaction %s on %s timed out: aborted", seg.name, seg.txn_parent)
                self.txn_timed_out += 1
                start(f"abort of {seg.name}", partial(self.prepare_delete, seg.name, True))
        self._table.outcomes.prune(now)
        for stream in list(self._table.streams.values()):
            if not stream.durable or stream.p_deleted:
                continue
            policy = stream.policy(cfg)
            cur = stream.pending_current()
            if cur is not None and cur.durable and roll_due_by_age(cur, policy, now):
                start(f"roll of {cur.name}", partial(self._roll, cur, "age"))
            plan = plan_retention(stream.members, policy, now, cfg.retain_unflushed)
            for seg in plan.delete:
                size = seg.length - seg.start_offset
                log.info("retention of %s: deleted %s (%d bytes)", stream.name, seg.name, size)
                self.retention_deleted_segments += 1
                self.retention_deleted_bytes += size
                start(f"retention of {seg.name}", partial(self.prepare_delete, seg.name))
            if plan.truncate is not None:
                seg, offset = plan.truncate
                log.info(
                    "retention of %s: truncated %s at %d (%d bytes)",
                    stream.name,
                    seg.name,
                    offset,
                    offset - seg.start_offset,
                )
                self.retention_truncated_bytes += offset - seg.start_offset
                start(f"retention of {seg.name}", partial(self.prepare_truncate, seg.name, offset))
            if plan.held_unflushed:
                log.debug(
                    "retention of %s waits for %d bytes to reach Tier 2",
                    stream.name,
                    plan.held_unflushed,
                )
        for what, op in ops:
            try:
                await op.wait()
            except GatewayError as e:
                log.warning("%s: %s", what, e)
        return len(ops)

    async def run_streams(self) -> None:
        """`enforce_streams` every ``streams.interval`` (a task)."""
        while not self._closing:
            await trio.sleep(self.streams_config.interval)
            await self.enforce_streams()

    # -- Tier 2: the storage writer's operations ------------------------------------

    def _pending_by_id(self, segment_id: int) -> Segment:
        seg = self._table.by_id.get(segment_id)
        if seg is None or seg.p_deleted:
            raise SegmentNotFound(f"segment id {segment_id}")
        return seg

    def prepare_chunk_added(
        self, segment_id: int, chunk: ChunkRecord, extends_last: bool
    ) -> PendingOperation:
        """Record an uploaded chunk (result: whether it was added; False if truncated away)."""
        self._start(change=False)
        seg = self._pending_by_id(segment_id)
        op = Operation(
            chunk_added=ChunkAdded(segment_id=segment_id, chunk=chunk, extends_last=extends_last)
        )
        # Reserved: recording Tier-2 progress is what lets the journal shrink.
        ticket = self._submit((op.SerializeToString(),), reserved=True)
        added: list[bool] = []

        def apply(seq: int) -> None:
            added.append(self._table.apply_chunk_added(seg, chunk, extends_last))
            self._signal_pinned_freed()

        pending = self._track(ticket, None, apply, seg)
        pending.storage = True
        pending.internal = True
        return pending._with_result(lambda: added[0])

    def prepare_attribute_index_updated(
        self, segment_id: int, state: AttributeIndexRecord, chunk: ChunkRecord, through_seq: int
    ) -> PendingOperation:
        """Record an uploaded index batch (result: whether it applied; False: garbage)."""
        self._start(change=False)
        seg = self._pending_by_id(segment_id)
        op = Operation(
            attribute_index_updated=AttributeIndexUpdated(
                segment_id=segment_id,
                root_offset=state.root_offset,
                root_length=state.root_length,
                length=state.length,
                start=state.start,
                chunk=chunk,
                through_seq=through_seq,
            )
        )
        # Reserved: it lets memory and the journal shed attribute values.
        ticket = self._submit((op.SerializeToString(),), reserved=True)
        applied: list[bool] = []

        def apply(seq: int) -> None:
            dropped = self._table.apply_attribute_index(seg, state, chunk, through_seq)
            applied.append(chunk not in dropped)
            if dropped and self.storage is not None:
                self.storage.on_dropped(seg, dropped, deleted=False)
            self._evict(seg)

        pending = self._track(ticket, None, apply, seg)
        pending.storage = True
        pending.internal = True
        return pending._with_result(lambda: applied[0])

    def prepare_storage_sealed(self, segment_id: int) -> PendingOperation:
        """Mark a sealed segment whose bytes are all in Tier 2 as sealed there too."""
        self._start(change=False)
        seg = self._pending_by_id(segment_id)
        op = Operation(storage_sealed=StorageSealed(segment_id=segment_id))
        ticket = self._submit((op.SerializeToString(),), reserved=True)
        pending = self._track(ticket, None, lambda seq: self._table.apply_storage_sealed(seg), seg)
        pending.storage = True
        pending.internal = True
        return pending

    def segment_by_id(self, segment_id: int) -> Segment | None:
        """The committed segment with this id, if it is live."""
        seg = self._table.by_id.get(segment_id)
        return seg if seg is not None and seg.durable else None

    def segments(self) -> Sequence[Segment]:
        """Every committed live segment (for the storage writer and GC)."""
        return list(self._table.committed())

    def committed_snapshot(self) -> ContainerSnapshot:
        """The committed view of every segment (Tier-2 metadata snapshots)."""
        return self._table.committed_snapshot()

    async def flush(self, name: str = "", within: float | None = None, retry: bool = False) -> None:
        """Flush one segment (or all, for "") to Tier 2 and wait until it is there.

        ``within`` and ``retry`` as for `StorageListener.flush`.
        """
        if self.storage is None:
            raise Unavailable("Tier 2 is not running in this process")
        ids = [self._committed(name).id] if name else None
        await self.storage.flush(ids, within, retry)

    # -- convenience: prepare and wait -------------------------------------------

    def _signal_pinned_freed(self) -> None:
        self._pinned_freed.set()
        self._pinned_freed = trio.Event()

    def _pinned_room(self, nbytes: int) -> bool:
        index = self.read_index
        return index.store.pinned_room(nbytes, self._pending_pinned + index.pinned_bytes)

    async def wait_for_capacity(self, nbytes: int, reserved: bool = False) -> None:
        """Wait until the journal and the cache can take ``nbytes``; else Overloaded.

        Unflushed append data is pinned (in its journal file or in the
        cache) until it is in Tier 2; when it reaches its share of the cache
        budget, appends wait for room
        (truncation, deletion, or a flush) and after ``overload_timeout`` are
        refused: memory and disk stay bounded. While the journal's disk is
        full, changes wait too, unless ``reserved`` (deletions and
        truncations, which free space).
        """
        journal = self._journal
        if journal.has_space(nbytes, reserved) and self._pinned_room(nbytes):
            return
        if journal.short_of_space:
            self._maintenance.set()  # a checkpoint may free space now
        with trio.move_on_after(self._cfg.overload_timeout):
            await journal.wait_for_space(nbytes, reserved)
            while not self._pinned_room(nbytes):
                await self._pinned_freed.wait()
            return
        if journal.short_of_space and not reserved:
            raise Overloaded(
                f"the journal disk is full; waited {self._cfg.overload_timeout:g}s for "
                "flushes to Tier 2 and checkpoints to free space"
            )
        if not self._pinned_room(nbytes):
            raise Overloaded(
                "unflushed data fills its share of the cache budget "
                f"(cache.budget x cache.pinned_share); waited {self._cfg.overload_timeout:g}s"
            )
        raise Overloaded(
            f"the journal has not caught up within {self._cfg.overload_timeout:g}s "
            "(container.overload_timeout)"
        )

    # -- reading -------------------------------------------------------------------

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

    async def create(
        self, name: str, attributes: Sequence[AttributeUpdate] = (), codec: Codec = Codec.RAW
    ) -> SegmentInfo:
        """Create a segment."""
        await self.wait_for_capacity(1024)
        info: SegmentInfo = await self.prepare_create(name, attributes, codec).wait()
        return info

    async def prepared(self, prepare: Callable[[], PendingOperation]) -> PendingOperation:
        """``prepare()``, after loading the attribute values it needs from the index."""
        while True:
            try:
                return prepare()
            except AttributesNotLoaded as e:
                await self.load_attributes(e.segment, e.ids)

    async def append(self, name: str, data: Buffer, **kwargs: Any) -> AppendResult:
        """Append; keyword arguments as in `prepare_append`."""
        await self.wait_for_capacity(len(data) + 1024)
        op = await self.prepared(lambda: self.prepare_append(name, data, **kwargs))
        result: AppendResult = await op.wait()
        return result

    async def seal(self, name: str) -> SegmentInfo:
        """Seal a segment."""
        await self.wait_for_capacity(64)
        info: SegmentInfo = await self.prepare_seal(name).wait()
        return info

    async def truncate(self, name: str, offset: int) -> SegmentInfo:
        """Truncate a segment at ``offset``."""
        await self.wait_for_capacity(64, reserved=True)
        info: SegmentInfo = await self.prepare_truncate(name, offset).wait()
        return info

    async def delete(self, name: str) -> None:
        """Delete a segment."""
        await self.wait_for_capacity(64, reserved=True)
        await self.prepare_delete(name).wait()

    async def update_attributes(self, name: str, updates: Sequence[AttributeUpdate]) -> SegmentInfo:
        """Update attributes."""
        await self.wait_for_capacity(64 + 40 * len(updates))
        op = await self.prepared(lambda: self.prepare_update_attributes(name, updates))
        info: SegmentInfo = await op.wait()
        return info

    async def create_stream(
        self,
        name: str,
        policy: Mapping[str, int | None] | None = None,
        codec: Codec = Codec.RAW,
    ) -> StreamInfo:
        """Create a stream (policies and codec as in `prepare_set_stream`)."""
        await self.wait_for_capacity(1024)
        info: StreamInfo = await self.prepare_set_stream(
            name, policy or {}, create=True, codec=codec
        ).wait()
        return info

    async def set_stream(self, name: str, policy: Mapping[str, int | None]) -> StreamInfo:
        """Change a stream's policies."""
        await self.wait_for_capacity(1024)
        info: StreamInfo = await self.prepare_set_stream(name, policy).wait()
        return info

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and its segments."""
        await self.wait_for_capacity(64, reserved=True)
        await self.prepare_delete_stream(name).wait()

    async def roll(self, name: str) -> StreamInfo:
        """Seal a stream's current segment now."""
        await self.wait_for_capacity(64)
        info: StreamInfo = await self.prepare_roll(name).wait()
        return info

    async def begin(self, parent: str, txn_timeout: float = 0.0) -> TransactionInfo:
        """Start a transaction on a segment or stream (aborted after ``txn_timeout`` s)."""
        await self.wait_for_capacity(1024)
        info: TransactionInfo = await self.prepare_begin(parent, txn_timeout).wait()
        return info

    async def commit(self, name: str) -> TransactionInfo:
        """Commit a transaction (merge it into its parent)."""
        await self.wait_for_capacity(1024)
        op = await self.prepared(lambda: self.prepare_commit(name))
        info: TransactionInfo = await op.wait()
        return info

    async def abort(self, name: str) -> None:
        """Abort a transaction."""
        await self.wait_for_capacity(64, reserved=True)
        await self.prepare_abort(name).wait()

    # -- settling: apply durable operations in order -----------------------------

    def _settle(self) -> None:
        q = self._inflight
        while q and (q[0].ticket is None or q[0].ticket.done):
            op = q.popleft()
            if op._deferred is not None:
                op.error = op._deferred()
                continue
            assert op.ticket is not None
            try:
                seq = op.ticket.result()
            except JournalRefused as e:
                op.error = Overloaded(str(e))
            except JournalClosed:
                op.error = Unavailable("the daemon is shutting down")
            except JournalError as e:
                op.error = Unavailable(str(e))
            else:
                if op._apply is not None:
                    self._table.seq = seq
                    op._apply(seq)
        if not q:
            self._pending_pinned = 0  # refused appends never reach apply
        if not q and self._dirty:
            # Nothing in flight: pending must equal committed. It already does
            # unless the journal refused operations; then undo their effects.
            for seg in self._dirty:
                if not seg.durable:
                    self._table.remove(seg)
                else:
                    seg.reset_pending()
            self._dirty.clear()
            for name, stream in list(self._table.streams.items()):
                if not stream.durable:
                    del self._table.streams[name]
                stream.p_deleted = False
        if self._journal.checkpoint_due() or self._journal.short_of_space:
            self._maintenance.set()

    def _file_of(self, seq: int) -> int:
        return self._journal.file_of(seq)

    # -- checkpoints and journal truncation --------------------------------------

    async def checkpoint(self, roll: bool = False) -> int:
        """Journal a checkpoint, then truncate the journal as far as possible.

        ``roll``: in a new journal file, so every older file may go (see
        `Journal.submit_checkpoint`).
        """
        await self._journal.wait_for_space(64 * len(self._table.by_name) + 1024, reserved=True)
        # The snapshot is the pending view, but chunk lists and storage
        # lengths change only when an operation is applied. A chunk added,
        # sealed in storage or truncated away that is still in flight would
        # sit before the checkpoint in the journal yet be missing from its
        # snapshot: recovery replays it, then loads the snapshot over it and
        # loses it (seen: a later chunk then "starts past the storage
        # length"). So no such operation may be in flight when it is taken.
        while True:
            storage_ops = [op for op in self._inflight if op.storage]
            if not storage_ops:
                break
            last = storage_ops[-1].ticket
            if last is not None:
                with suppress(JournalError):
                    await last.wait()
            self._settle()
        self._start(change=False)
        ticket = self._journal.submit_checkpoint(self._table.pending_snapshot(), roll)
        op = PendingOperation(self, ticket, None)
        op.internal = True
        self._inflight.append(op)
        await op.wait()
        seq = ticket.result()
        self.checkpoints += 1
        keep_from = self._table.oldest_needed_file()
        if self.storage is not None and self._journal.would_truncate(seq, keep_from):
            # Files about to go may hold the only durable copy of bytes that
            # Tier 2 acknowledged from its page cache (the embedded server).
            try:
                await self.storage.durability_barrier()
            except GatewayError as e:
                log.warning("not truncating the journal: %s", e)
                return seq
        deleted = await self._journal.truncate(seq, keep_from)
        if deleted:
            self.journal_files_truncated += deleted
            self._table.forget_files_before(self._journal.oldest_file())
        log.debug("checkpoint at %d; truncated %d journal file(s)", seq, deleted)
        return seq

    def _checkpoint_for_space(self) -> bool:
        """Whether the disk is full and a checkpoint in a new file would free journal files."""
        journal = self._journal
        return journal.short_of_space and journal.rolled_checkpoint_frees(
            self._table.oldest_needed_file()
        )

    async def run_maintenance(self) -> None:
        """Checkpoints and journal truncation, when due or when space runs short (a task)."""
        while True:
            await self._maintenance.wait()
            self._maintenance = trio.Event()
            if self._closing:
                return
            journal = self._journal
            # When space runs short, a checkpoint is due as soon as the
            # journal holds files of flushed data, however few operations
            # went by: it is the only way to give their space back.
            for_space = self._checkpoint_for_space()
            if for_space or journal.checkpoint_due():
                try:
                    await self.checkpoint(roll=for_space)
                except (GatewayError, OSError) as e:
                    log.warning("checkpoint failed: %s", e)

    def close(self) -> None:
        """Refuse new operations and stop `run_maintenance` (the node is stopping)."""
        self._closing = True
        self.storage = None
        self._maintenance.set()

    def statistics(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        return {
            "segments": self.segment_count,
            "inflight": len(self._inflight),
            "checkpoints": self.checkpoints,
            "journal_files_truncated": self.journal_files_truncated,
            "journal_files_in_use": len(self._table.file_usage),
            "streams": sum(1 for s in self._table.streams.values() if s.durable),
            "rolls": self.rolls,
            "transactions_open": sum(1 for s in self._table.committed() if s.hidden and not s.gone),
            "txn_begun": self.txn_begun,
            "txn_committed": self.txn_committed,
            "txn_aborted": self.txn_aborted,
            "txn_timed_out": self.txn_timed_out,
            "retention_deleted_segments": self.retention_deleted_segments,
            "retention_deleted_bytes": self.retention_deleted_bytes,
            "retention_truncated_bytes": self.retention_truncated_bytes,
        }
