"""Streams as the container runs them: records, rolls, retention, timed policy runs.

`gateway.container.streams` decides (when a segment rolls, what retention
removes); this part journals what was decided: it creates, changes and
deletes streams, routes an append to a stream's current segment (rolling it
or starting its successor as due), and runs the policies that depend on the
clock (`StreamPolicies.enforce`: roll by age, transaction timeouts,
retention) every ``streams.interval``.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Mapping
from functools import partial

import trio

from gateway.config import StreamsConfig
from gateway.container.attributes import CODEC, is_core
from gateway.container.operations import OperationQueue, PendingOperation
from gateway.container.results import POLICY_FIELDS, StreamInfo
from gateway.container.segment import Segment
from gateway.container.segment_names import check_creatable, validate_name
from gateway.container.streams import (
    Stream,
    is_hidden,
    plan_retention,
    roll_due_by_age,
    roll_due_by_size,
    segment_name,
    split_member,
)
from gateway.container.transactions import PrepareCreate, Start
from gateway.errors import BadRequest, GatewayError, InvalidName, SegmentExists, StreamNotFound
from gateway.protocol.codec import Codec
from gateway.protocol.journal_pb2 import DeleteStream, Operation, SetStream
from gateway.protocol.metadata_pb2 import StreamRecord

log = logging.getLogger(__name__)


class StreamPolicies:
    """Prepares the operations of streams and runs their policies over time."""

    def __init__(
        self,
        queue: OperationQueue,
        config: StreamsConfig,
        *,
        create: PrepareCreate,
        seal: Callable[[str], PendingOperation],
        delete: Callable[[str], PendingOperation],
        truncate: Callable[[str, int], PendingOperation],
        expire: Callable[[int, Start], None],
    ) -> None:
        self._queue = queue
        self._table = queue.table
        self.config = config
        self._create = create
        self._seal = seal
        self._delete = delete
        self._truncate = truncate
        self._expire = expire
        self.rolls = 0
        self.retention_deleted_segments = 0
        self.retention_deleted_bytes = 0
        self.retention_truncated_bytes = 0

    # -- routing appends -----------------------------------------------------------------

    def append_target(self, name: str) -> Segment:
        """The segment an append to ``name`` goes to: itself, or a stream's current one."""
        stream = self._table.streams.get(name)
        if stream is None or stream.p_deleted:
            return self._queue.pending(name)
        return self._current(stream)

    def stream_above(self, path: str) -> Stream | None:
        """The stream at ``path`` or at one of its parent directories, if any."""
        while path:
            stream = self._table.streams.get(path)
            if stream is not None and not stream.p_deleted:
                return stream
            path = path.rpartition("/")[0]
        return None

    def _current(self, stream: Stream) -> Segment:
        """The stream's current segment (pending view), rolling or starting it as due.

        Synchronous, like every prepare: the seal of the old segment, the
        create of its successor and the append that follows enter the
        journal in that order, so no event lands in a sealed segment and
        readers see the old segment's final length before the next event.
        """
        cur = stream.pending_current()
        if cur is not None and roll_due_by_size(cur, stream.policy(self.config)):
            self._roll(cur, "size")
            cur = None
        if cur is None:
            cur = self._start_successor(stream)
        return cur

    def _roll(self, seg: Segment, why: str) -> PendingOperation:
        """Seal a stream's current segment (its successor starts with the next append)."""
        op = self._seal(seg.name)
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
        self._create(name, values, attributes_from=last)
        return self._table.by_name[name]

    # -- stream records ----------------------------------------------------------------

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
        q = self._queue
        q.start()
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
            if self.stream_above(name.rpartition("/")[0]) is not None:
                raise InvalidName(name, "it is inside a stream")
            prefix = name + "/"
            if next(self._table.names_from(prefix), None) is not None:
                raise SegmentExists(f"{name} (segments exist below it)")
            base = StreamRecord(created_at_ms=q.now_ms(), next_number=1, codec=codec.number)
        elif stream is None:
            raise StreamNotFound(name)
        else:
            base = stream.record
        record = self._stream_record(name, policy, base)
        ticket = q.submit((Operation(set_stream=SetStream(stream=record)).SerializeToString(),))
        if create:
            # Pending: appends pipelined behind the create find the stream.
            self._table.streams[name] = Stream(
                StreamRecord(name=name, next_number=1, codec=codec.number)
            )

        def apply(seq: int) -> None:
            self._table.apply_set_stream(record)
            if create:
                for w in q.watchers:  # its directory shows before its first segment
                    w.on_stream_created(name)

        op = PendingOperation(q, ticket, None, apply)
        op.storage = True  # the pending view does not carry stream records
        q.inflight.append(op)
        return op._with_result(lambda: self.stream_info(name))

    def prepare_delete_stream(self, name: str) -> PendingOperation:
        """Delete a stream and every segment in it (result: None)."""
        q = self._queue
        q.start()
        stream = self._pending_stream(name)
        for seg in list(stream.members):
            if not seg.p_deleted:
                self._delete(seg.name)
        op = Operation(delete_stream=DeleteStream(name=name))
        ticket = q.submit((op.SerializeToString(),), reserved=True)
        stream.p_deleted = True

        def apply(seq: int) -> None:
            self._table.apply_delete_stream(name)
            for w in q.watchers:
                w.on_stream_deleted(name)

        pending = PendingOperation(q, ticket, None, apply)
        pending.storage = True  # the pending view does not carry stream records
        q.inflight.append(pending)
        return pending

    def prepare_roll(self, name: str) -> PendingOperation:
        """Seal a stream's current segment now (result: StreamInfo)."""
        q = self._queue
        q.start()
        stream = self._pending_stream(name)
        cur = stream.pending_current()
        op = PendingOperation(q, None, None) if cur is None else self._roll(cur, "asked")
        return op._with_result(lambda: self.stream_info(name))

    # -- the committed view -----------------------------------------------------------

    def stream_info(self, name: str) -> StreamInfo:
        """A stream's policies and segments (committed view)."""
        stream = self._table.streams.get(name)
        if stream is None or not stream.durable:
            validate_name(name)
            raise StreamNotFound(name)
        policy = stream.policy(self.config)
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

    # -- policies over time: rolling by age, transaction timeouts, retention ----------

    async def enforce(self) -> int:
        """Roll by age, abort timed-out transactions and apply retention once.

        Returns how many operations were started. Retention deletes a stream's
        oldest sealed segments and truncates its oldest remaining one as its
        policies say (`gateway.container.streams.plan_retention`), and says
        what it removed in the log and the counters.
        """
        q = self._queue
        q.settle()
        if q.closing or q.fenced is not None or q.journal.failed is not None:
            return 0
        now = q.now_ms()
        cfg = self.config
        ops: list[tuple[str, PendingOperation]] = []

        def start(what: str, prepare: Callable[[], PendingOperation]) -> None:
            try:
                ops.append((what, prepare()))
            except GatewayError as e:
                log.warning("%s: %s", what, e)

        self._expire(now, start)
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
                start(f"retention of {seg.name}", partial(self._delete, seg.name))
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
                start(f"retention of {seg.name}", partial(self._truncate, seg.name, offset))
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

    async def run(self) -> None:
        """`enforce` every ``streams.interval`` (a task)."""
        while not self._queue.closing:
            await trio.sleep(self.config.interval)
            await self.enforce()
