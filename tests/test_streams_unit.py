"""Streams, rolling, retention and transactions in the segment container, in memory.

A controlled clock (``container.now_ms``) stands in for weeks going by; a
restart replays the same journal into a new container, so each test also
checks that recovery reaches the state the live run had.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from cache.memory_store import MemoryCache
from gateway.config import ContainerConfig, StreamsConfig
from gateway.container.replayer import Replayer
from gateway.container.streams import split_member
from gateway.container.table import SegmentTable
from gateway.errors import (
    BadRequest,
    ConditionalCheckFailed,
    InvalidName,
    JournalRefused,
    NotATransaction,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    TransactionAborted,
    TransactionCommitted,
    TransactionTimedOut,
    Unavailable,
)
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.codec import Codec
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.index import ReadIndex
from tests.helpers.container import DirectContainer

W = b"\x07" * 16
DAY = 86_400_000


class Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


def make(
    journal: MemoryJournal | None = None, streams: StreamsConfig | None = None
) -> tuple[DirectContainer, MemoryJournal, Clock]:
    journal = journal or MemoryJournal()
    table = SegmentTable(ReadIndex(MemoryCache()))
    if journal.committed:
        replayer = Replayer(table)
        journal.replay(replayer.replay)
        replayer.finish()
    c = DirectContainer(ContainerConfig(), table, journal, streams or StreamsConfig())
    clock = Clock()
    c.now_ms = clock
    return c, journal, clock


def restart(c: DirectContainer, journal: MemoryJournal) -> DirectContainer:
    c2, _, clock = make(journal, c.streams_config)
    clock.ms = c.now_ms()
    c2.now_ms = clock
    return c2


async def contents(c: DirectContainer, name: str) -> bytes:
    info = c.info(name)
    return (await c.read(name, 0, info.length, zeros_below_start=True)).data


async def stream_bytes(c: DirectContainer, stream: str) -> bytes:
    return b"".join([await contents(c, s.name) for s in c.stream_info(stream).segments])


async def test_a_stream_rolls_by_size_and_writers_address_the_stream() -> None:
    c, journal, _ = make()
    await c.create_stream("clicks", {"roll_size": 10})
    landed = [await c.append("clicks", b"%04d" % i) for i in range(8)]
    # 4-byte events, roll at 10 bytes: three per segment (12 bytes), then a new one.
    assert [r.segment for r in landed] == ["clicks/000000000001"] * 3 + [
        "clicks/000000000002"
    ] * 3 + ["clicks/000000000003"] * 2
    info = c.stream_info("clicks")
    assert [(s.name, s.length, s.sealed) for s in info.segments] == [
        ("clicks/000000000001", 12, True),
        ("clicks/000000000002", 12, True),
        ("clicks/000000000003", 8, False),
    ]
    assert info.next_number == 4 and info.roll_size == 10 and info.own == {"roll_size": 10}
    assert await stream_bytes(c, "clicks") == b"".join(b"%04d" % i for i in range(8))
    assert [s.name for s in c.list("clicks/")] == [s.name for s in info.segments]
    c2 = restart(c, journal)
    assert c2.stream_info("clicks") == info
    assert (await c2.append("clicks", b"more")).segment == "clicks/000000000003"


async def test_exactly_once_writers_go_on_across_a_roll() -> None:
    c, journal, _ = make()
    await c.create_stream("s", {"roll_size": 8})
    for n in range(1, 7):
        await c.append("s", b"e%03d" % n, writer_id=W, event_number=n, previous_event_number=n - 1)
    assert len(c.stream_info("s").segments) == 3
    # A writer that reconnects asks the stream for its last event number.
    assert (await c.get_attributes("s", [W])) == {W: 6}
    # A resend of event 6 is refused with the number stored; nothing lands twice.
    with pytest.raises(ConditionalCheckFailed) as e:
        await c.append("s", b"e006", writer_id=W, event_number=6, previous_event_number=5)
    assert e.value.last_event_number == 6  # type: ignore[attr-defined]
    c2 = restart(c, journal)
    await c2.append("s", b"e007", writer_id=W, event_number=7, previous_event_number=6)
    assert await stream_bytes(c2, "s") == b"".join(b"e%03d" % n for n in range(1, 8))


async def test_pipelined_appends_across_a_roll_keep_their_order() -> None:
    c, journal, _ = make()
    await c.create_stream("p", {"roll_size": 5})
    journal.hold()
    ops = [c.prepare_append("p", bytes([65 + i]) * 3) for i in range(6)]
    journal.commit()
    results = [await op.wait() for op in ops]
    assert [r.segment[-1] for r in results] == ["1", "1", "2", "2", "3", "3"]
    info = c.stream_info("p")
    assert [s.sealed for s in info.segments] == [True, True, False]
    assert await stream_bytes(c, "p") == b"AAABBBCCCDDDEEEFFF"


async def test_streams_refuse_bad_names_and_foreign_segments() -> None:
    c, _, _ = make()
    await c.create("plain")
    await c.create("dir/x")
    with pytest.raises(SegmentExists):
        await c.create_stream("plain")
    with pytest.raises(SegmentExists):
        await c.create_stream("dir")
    with pytest.raises(InvalidName):
        await c.create_stream("bad//name")
    await c.create_stream("st")
    with pytest.raises(SegmentExists):
        await c.create_stream("st")
    with pytest.raises(InvalidName):
        await c.create("st/000000000009")  # only the stream makes its segments
    with pytest.raises(InvalidName):
        await c.create(".txn/mine")
    with pytest.raises(BadRequest):
        await c.set_stream("st", {"roll_size": -1})
    with pytest.raises(BadRequest):
        await c.set_stream("st", {"colour": 1})
    with pytest.raises(SegmentNotFound):
        await c.set_stream("nope", {"roll_size": 1})


async def test_rolling_by_age_and_policy_defaults_and_overrides() -> None:
    c, journal, clock = make(streams=StreamsConfig(roll_age=3600.0, roll_size=1 << 30))
    await c.create_stream("a")
    await c.append("a", b"x")
    clock.ms += 3_599_000
    await c.enforce_streams()
    assert not c.stream_info("a").segments[0].sealed
    clock.ms += 1_000
    await c.enforce_streams()
    assert c.stream_info("a").segments[0].sealed
    await c.enforce_streams()  # nothing current: nothing to roll, no empty segments
    assert len(c.stream_info("a").segments) == 1
    assert (await c.append("a", b"y")).segment == "a/000000000002"
    # An override, then back to the default.
    info = await c.set_stream("a", {"roll_age_ms": 0})
    assert info.roll_age_ms == 0 and info.own == {"roll_age_ms": 0}
    clock.ms += 10 * 3_600_000
    await c.enforce_streams()
    assert not c.stream_info("a").segments[-1].sealed
    info = await c.set_stream("a", {"roll_age_ms": None})
    assert info.roll_age_ms == 3_600_000 and info.own == {}
    c2 = restart(c, journal)
    assert c2.stream_info("a").own == {}


async def test_retention_by_size_keeps_at_least_the_newest_bytes() -> None:
    c, journal, _ = make(streams=StreamsConfig(retain_unflushed=True))
    await c.create_stream("r", {"roll_size": 10, "retain_size": 25})
    for i in range(10):
        await c.append("r", b"%05d" % i)  # 5 bytes: two events per segment
    names = [s.name for s in c.stream_info("r").segments]
    assert len(names) == 5
    await c.enforce_streams()
    kept = c.stream_info("r").segments
    # 50 bytes in 10-byte segments, keep >= 25: the two oldest go (30 stay).
    assert [s.name for s in kept] == names[2:]
    assert sum(s.length for s in kept) == 30
    assert c.retention_deleted_segments == 2 and c.retention_deleted_bytes == 20
    with pytest.raises(SegmentNotFound):
        c.info(names[0])
    assert await stream_bytes(c, "r") == b"".join(b"%05d" % i for i in range(4, 10))
    # Numbers are never given twice, also after retention.
    c2 = restart(c, journal)
    assert c2.stream_info("r").next_number == 6
    assert [s.name for s in c2.stream_info("r").segments] == names[2:]


async def test_retention_by_age_and_its_unflushed_guard() -> None:
    c, _, clock = make()
    await c.create_stream("g", {"roll_size": 4, "retain_age_ms": DAY})
    for i in range(4):
        await c.append("g", b"%04d" % i)
        clock.ms += DAY // 2
    segs = c.stream_info("g").segments
    assert [s.sealed for s in segs] == [True, True, True, False]
    # Old enough, but not in Tier 2: retention waits for the storage writer.
    await c.enforce_streams()
    assert len(c.stream_info("g").segments) == 4
    # Pretend the storage writer flushed the first two.
    for s in segs[:2]:
        chunk = ChunkRecord(name=f"c{s.id}", start_offset=0, length=4, crc32c=0, epoch=1)
        await c.prepare_chunk_added(s.id, chunk, extends_last=False).wait()
    await c.enforce_streams()
    left = c.stream_info("g").segments
    # Segment 1 changed 2 days ago, 2 1.5 days ago: both past a day; 3 is not in Tier 2.
    assert [s.name for s in left] == [segs[2].name, segs[3].name]


async def test_retention_truncates_the_oldest_active_segment_at_an_event_boundary() -> None:
    c, _, _ = make(streams=StreamsConfig(retain_unflushed=True))
    await c.create_stream("t", {"roll_size": 0, "retain_size": 3 << 20})
    mib = 1 << 20
    for i in range(6):
        await c.append("t", bytes([i]) * mib)
    await c.enforce_streams()
    seg = c.stream_info("t").segments[0]
    assert seg.start_offset == 3 * mib and seg.length == 6 * mib
    assert c.retention_truncated_bytes == 3 * mib


async def test_a_transaction_commits_atomically_at_the_parents_end() -> None:
    c, journal, _ = make()
    await c.create("parent")
    await c.append("parent", b"before|")
    txn = await c.begin("parent")
    assert txn.name.startswith(".txn/") and txn.parent == "parent"
    await c.append(txn.name, b"t1,", writer_id=W, event_number=1, previous_event_number=0)
    await c.append(txn.name, b"t2", writer_id=W, event_number=2, previous_event_number=1)
    await c.append("parent", b"during|")
    # Hidden until committed: readers of the parent see none of it.
    assert [s.name for s in c.list()] == ["parent"]
    assert await contents(c, "parent") == b"before|during|"
    done = await c.commit(txn.name)
    assert (done.segment, done.offset, done.length) == ("parent", 14, 5)
    assert await contents(c, "parent") == b"before|during|t1,t2"
    info = c.info("parent")
    assert info.event_count == 4
    assert (await c.get_attributes("parent", [W])) == {W: 2}
    with pytest.raises(SegmentNotFound):
        c.info(txn.name)
    # A commit sent again (its answer was lost) gets the same answer, and
    # nothing lands twice.
    assert await c.commit(txn.name) == done
    await c.append("parent", b"|after")
    c2 = restart(c, journal)
    assert await contents(c2, "parent") == b"before|during|t1,t2|after"
    assert c2.info("parent").event_count == 5
    assert await c2.commit(txn.name) == done
    with pytest.raises(TransactionCommitted, match="committed into 'parent' at offset 14"):
        await c2.abort(txn.name)


async def test_transactions_on_a_stream_abort_and_timeout() -> None:
    c, journal, clock = make()
    await c.create_stream("s", {"roll_size": 8})
    t1 = await c.begin("s")
    t2 = await c.begin("s", txn_timeout=5.0)
    t3 = await c.begin("s")
    await c.append(t1.name, b"11111111")
    await c.append(t2.name, b"22")
    await c.append(t3.name, b"33")
    await c.append("s", b"direct")
    done = await c.commit(t1.name)
    assert done.segment == "s/000000000001" and done.offset == 6
    await c.abort(t3.name)
    with pytest.raises(SegmentNotFound):
        await c.append(t3.name, b"x")
    with pytest.raises(TransactionAborted):
        await c.commit(t3.name)
    await c.abort(t3.name)  # again: it is aborted, as asked
    clock.ms += 6_000
    await c.enforce_streams()
    assert c.txn_timed_out == 1
    with pytest.raises(TransactionTimedOut):
        await c.commit(t2.name)
    # The first segment is past its roll size now: the next commit rolls.
    t4 = await c.begin("s")
    await c.append(t4.name, b"44")
    assert (await c.commit(t4.name)).segment == "s/000000000002"
    assert await stream_bytes(c, "s") == b"direct1111111144"
    c2 = restart(c, journal)
    assert await stream_bytes(c2, "s") == b"direct1111111144"
    assert [s.name for s in c2.list()] == ["s/000000000001", "s/000000000002"]


async def test_commit_refuses_sealed_parents_and_non_transactions() -> None:
    c, _, _ = make()
    await c.create("p")
    await c.create_stream("s")
    txn = await c.begin("p")
    for name in ("p", "s", "absent"):
        with pytest.raises(NotATransaction, match=f"'{name}' is not a transaction"):
            await c.commit(name)
        with pytest.raises(NotATransaction):
            await c.abort(name)
    with pytest.raises(BadRequest):  # NotATransaction is one
        await c.commit("p")
    with pytest.raises(BadRequest):
        await c.begin(txn.name)
    await c.seal("p")
    with pytest.raises(SegmentSealed):
        await c.commit(txn.name)
    with pytest.raises(SegmentSealed):
        await c.begin("p")


async def test_a_merge_completes_in_tier2_by_re_referencing_the_chunks() -> None:
    c, journal, _ = make()
    await c.create("p")
    await c.append("p", b"0123")
    txn = await c.begin("p")
    await c.append(txn.name, b"abcdef")
    await c.commit(txn.name)
    p = c._table.by_name["p"]
    src = p.merges[0]
    # A checkpoint carries the pending merge; a restart from it reads the same.
    await c.checkpoint()
    c2 = restart(c, journal)
    assert await contents(c2, "p") == b"0123abcdef"
    assert c2._table.by_name["p"].merges[0].id == src.id
    # The storage writer's part, by hand: both flushed, then the merge completes.
    await c.prepare_chunk_added(
        src.id, ChunkRecord(name="src-chunk", start_offset=0, length=6, epoch=1), False
    ).wait()
    await c.prepare_chunk_added(
        p.id, ChunkRecord(name="p-chunk", start_offset=0, length=4, epoch=1), False
    ).wait()
    await c.prepare_merge_completed(p.id, src.id).wait()
    assert [(ch.name, ch.start_offset, ch.length) for ch in p.chunks] == [
        ("p-chunk", 0, 4),
        ("src-chunk", 4, 6),
    ]
    assert p.storage_length == 10 and not p.merges
    assert src.id not in c._table.by_id
    c3 = restart(c, journal)
    p3 = c3._table.by_name["p"]
    assert [ch.name for ch in p3.chunks] == ["p-chunk", "src-chunk"] and p3.storage_length == 10


async def test_deleting_a_target_takes_its_pending_merges_with_it() -> None:
    c, journal, _ = make()
    await c.create("p")
    txn = await c.begin("p")
    await c.append(txn.name, b"zz")
    await c.commit(txn.name)
    await c.delete("p")
    assert not c._table.by_id
    c2 = restart(c, journal)
    assert not c2._table.by_id


async def test_deleting_a_stream_deletes_its_segments() -> None:
    c, journal, _ = make()
    await c.create_stream("d", {"roll_size": 1})
    for _ in range(3):
        await c.append("d", b"ab")
    await c.delete_stream("d")
    assert c.list() == [] and c.list_streams() == []
    c2 = restart(c, journal)
    assert c2.list() == [] and c2.list_streams() == []
    # A stream of the same name starts afresh.
    await c2.create_stream("d")
    assert (await c2.append("d", b"x")).segment == "d/000000000001"


def test_member_names_sort_in_creation_order() -> None:
    names = [f"s/{n:012d}" for n in (1, 2, 10, 99, 100, 123456)]
    assert sorted(names) == names
    assert split_member("s/000000000010") == ("s", 10)
    assert split_member("s/10") is None and split_member("000000000001") is None


async def test_a_checkpoint_taken_while_a_merge_and_a_policy_change_are_in_flight() -> None:
    """The pending view carries neither merge links nor stream records: a checkpoint waits
    for them, or a restart from it would lose the merge (and read a hole) or the policy."""
    c, journal, _ = make()
    await c.create("p")
    await c.create_stream("s")
    txn = await c.begin("p")
    await c.append(txn.name, b"merged")
    async with trio.open_nursery() as nursery:
        journal.hold()
        commit = c.prepare_commit(txn.name)
        policy = c.prepare_set_stream("s", {"roll_size": 5})
        nursery.start_soon(c.checkpoint)
        await trio.testing.wait_all_tasks_blocked()
        journal.commit()
        await commit.wait()
        await policy.wait()
    c2 = restart(c, journal)
    assert await contents(c2, "p") == b"merged"
    assert c2.stream_info("s").roll_size == 5


async def test_the_deadline_holds_exactly_without_the_sweep() -> None:
    c, journal, clock = make()
    await c.create("p")
    on_time = await c.begin("p", txn_timeout=5.0)
    late = await c.begin("p", txn_timeout=5.0)
    await c.append(on_time.name, b"in")
    await c.append(late.name, b"out")
    assert late.deadline_ms == clock.ms + 5_000
    clock.ms = late.deadline_ms - 1
    await c.commit(on_time.name)
    clock.ms = late.deadline_ms  # at the deadline: too late (the sweep has not run)
    with pytest.raises(TransactionTimedOut, match="timed out"):
        await c.commit(late.name)
    assert c.txn_timed_out == 1
    with pytest.raises(SegmentNotFound):
        c.info(late.name)  # aborted by that commit
    with pytest.raises(TransactionTimedOut):
        await c.commit(late.name)
    await c.abort(late.name)  # it is aborted: an abort agrees
    assert await contents(c, "p") == b"in"
    c2 = restart(c, journal)
    with pytest.raises(TransactionTimedOut):
        await c2.commit(late.name)
    assert await contents(c2, "p") == b"in"


async def test_a_commit_sent_again_while_the_first_is_in_flight_gets_its_answer() -> None:
    c, _, _ = make()
    await c.create("p")
    txn = await c.begin("p")
    await c.append(txn.name, b"once")
    c._journal.hold()  # type: ignore[attr-defined]
    first = c.prepare_commit(txn.name)
    again = c.prepare_commit(txn.name)
    c._journal.commit()  # type: ignore[attr-defined]
    assert await again.wait() == await first.wait()
    assert await contents(c, "p") == b"once"
    # A commit whose merge the journal refuses leaves it open: the retry is told to retry.
    t2 = await c.begin("p")
    journal = c._journal
    journal.hold()  # type: ignore[attr-defined]
    c.prepare_commit(t2.name)
    again = c.prepare_commit(t2.name)
    journal.refuse_pending(JournalRefused("full"))  # type: ignore[attr-defined]
    with pytest.raises(Unavailable, match="did not end"):
        await again.wait()
    assert (await c.commit(t2.name)).segment == "p"


async def test_finished_transactions_are_remembered_within_bounds_and_checkpoints() -> None:
    c, journal, clock = make(streams=StreamsConfig(txn_outcomes=3, txn_outcome_age=60.0))
    await c.create("p")
    names = []
    for _ in range(4):
        t = await c.begin("p")
        await c.commit(t.name)  # empty: no data keeps the journal's files
        names.append(t.name)
    # Three are kept: the oldest is forgotten.
    with pytest.raises(SegmentNotFound):
        await c.commit(names[0])
    assert (await c.commit(names[3])).segment == "p"
    # An abort in flight while a checkpoint is taken is in the checkpoint.
    t = await c.begin("p")
    await c.append(t.name, b"x")
    async with trio.open_nursery() as nursery:
        journal.hold()
        abort = c.prepare_abort(t.name)
        nursery.start_soon(c.checkpoint, True)
        await trio.testing.wait_all_tasks_blocked()
        journal.commit()
        await abort.wait()
    assert journal.files[0] > 1  # the restart starts at the checkpoint
    c2 = restart(c, journal)
    with pytest.raises(TransactionAborted):
        await c2.commit(t.name)
    assert (await c2.commit(names[3])).offset == 0
    with pytest.raises(SegmentNotFound):
        await c2.commit(names[1])  # the abort pushed it out (three kept)
    # And for txn_outcome_age only.
    clock.ms += 60_000
    c2.now_ms = clock
    with pytest.raises(SegmentNotFound):
        await c2.commit(names[3])
    await c2.enforce_streams()
    assert c2.committed_snapshot().txn_outcomes == []


class StreamEvents:
    """A namespace watcher that records what it is told about streams."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_created(self, seg: object) -> None:
        pass

    def on_sealed(self, seg: object) -> None:
        pass

    def on_truncated(self, seg: object) -> None:
        pass

    def on_deleted(self, seg: object) -> None:
        pass

    def on_stream_created(self, name: str) -> None:
        self.seen.append(("created", name))

    def on_stream_deleted(self, name: str) -> None:
        self.seen.append(("deleted", name))


async def test_a_stream_takes_a_codec_when_created_and_its_segments_have_it() -> None:
    c, journal, _ = make()
    events = StreamEvents()
    c.watchers.append(events)
    await c.create_stream("logs", {"roll_size": 12}, codec=Codec.LINES)
    assert events.seen == [("created", "logs")]  # before any segment exists
    assert c.stream_info("logs").codec == "lines"
    # Raw appends that cut lines: the current segment ends at its last newline.
    await c.append("logs", b"one\ntwo\nthr")
    first = c.stream_info("logs").segments[0].name
    assert c._committed(first).codec is Codec.LINES
    assert c._committed(first).event_end == len(b"one\ntwo\n")
    await c.append("logs", b"ee\n")
    await c.append("logs", b"four\n")  # past the roll size: the next segment
    members = [m.name for m in c.stream_info("logs").segments]
    assert len(members) == 2
    assert [c._committed(m).codec for m in members] == [Codec.LINES] * 2
    # A transaction on the stream has its codec too.
    txn = await c.begin("logs")
    assert c._committed(txn.name).codec is Codec.LINES
    await c.abort(txn.name)
    # Journaled: a restart replays it; a policy change keeps it.
    c2 = restart(c, journal)
    assert c2.stream_info("logs").codec == "lines"
    await c2.set_stream("logs", {"roll_size": 100})
    await c2.roll("logs")
    await c2.append("logs", b"five\n")
    assert c2._committed(c2.stream_info("logs").segments[-1].name).codec is Codec.LINES
    # Checkpointed: a restart from a checkpoint has it.
    await c2.checkpoint(roll=True)
    c3 = restart(c2, journal)
    assert c3.stream_info("logs").codec == "lines"
    await c3.roll("logs")
    await c3.append("logs", b"six\n")
    assert c3._committed(c3.stream_info("logs").segments[-1].name).codec is Codec.LINES
    # Without a codec: raw, as before streams had codecs.
    await c.create_stream("plain")
    await c.append("plain", b"x")
    assert c.stream_info("plain").codec == "raw"
    assert c._committed(c.stream_info("plain").segments[0].name).codec is Codec.RAW
    await c.delete_stream("logs")
    assert events.seen == [("created", "logs"), ("created", "plain"), ("deleted", "logs")]
    assert c.stream_names() == ["plain"]
