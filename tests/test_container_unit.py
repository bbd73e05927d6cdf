"""The segment container on a journal and a cache in memory: no disk, no RocksDB.

What the container itself decides -- offsets, validation order, pipelining,
what a refused journal group undoes, checkpoints and how far they let the
journal go, the pinned-bytes bound -- tested at memory speed. The same
behaviour over the real journal and cache is in tests/test_container.py.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from cache.memory_store import MemoryCache
from gateway.config import ContainerConfig
from gateway.container import AttributeUpdate, Verb
from gateway.container.replayer import Replayer
from gateway.container.table import SegmentTable
from gateway.errors import (
    BadOffset,
    ConditionalCheckFailed,
    JournalRefused,
    Overloaded,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    Unavailable,
)
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.index import ReadIndex
from tests.helpers.container import DirectContainer

W = b"\x07" * 16


def make(
    journal: MemoryJournal | None = None,
    store: MemoryCache | None = None,
    config: ContainerConfig | None = None,
) -> DirectContainer:
    table = SegmentTable(ReadIndex(store or MemoryCache()))
    return DirectContainer(config or ContainerConfig(), table, journal or MemoryJournal())


def restart(journal: MemoryJournal) -> DirectContainer:
    """A new container over what the journal holds, replayed as at a start."""
    table = SegmentTable(ReadIndex(MemoryCache()))
    replayer = Replayer(table)
    journal.replay(replayer.replay)
    replayer.finish()
    return DirectContainer(ContainerConfig(), table, journal)


async def test_appends_get_consecutive_offsets_and_read_back() -> None:
    c = make()
    await c.create("a/b")
    r1 = await c.append("a/b", b"hello ")
    r2 = await c.append("a/b", b"world")
    assert (r1.offset, r1.length, r2.offset, r2.length) == (0, 6, 6, 11)
    got = await c.read("a/b", 0, 100)
    assert got.data == b"hello world" and got.length == 11 and not got.sealed
    info = await c.seal("a/b")
    assert info.sealed and info.length == 11 and info.event_count == 2
    with pytest.raises(SegmentSealed):
        await c.append("a/b", b"!")
    with pytest.raises(SegmentExists):
        await c.create("a/b")
    assert (await c.read("a/b", 6, 100)).end_of_segment


async def test_pipelined_appends_validate_against_the_pending_view() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("s")
    journal.hold()
    ops = [c.prepare_append("s", bytes([i]) * 10) for i in range(3)]
    # Offsets follow the pending view; the committed one has not moved.
    assert [op.result.offset for op in ops] == [0, 10, 20]
    assert c.info("s").length == 0
    with pytest.raises(BadOffset) as e:
        c.prepare_append("s", b"x", expected_offset=10)
    assert e.value.expected_offset == 30
    journal.commit()
    results = [await op.wait() for op in ops]
    assert [r.length for r in results] == [10, 20, 30]
    assert c.info("s").length == 30
    assert (await c.read("s", 0, 30)).data == b"\x00" * 10 + b"\x01" * 10 + b"\x02" * 10


async def test_a_refused_group_undoes_its_pending_effects() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("kept")
    await c.append("kept", b"abc")
    journal.hold()
    create = c.prepare_create("new")
    append = c.prepare_append("kept", b"def")
    journal.refuse_pending(JournalRefused("the disk is full"))
    for op in (create, append):
        with pytest.raises(Overloaded):
            await op.wait()
    # Nothing refused is visible, and the pending view is the committed one again.
    with pytest.raises(SegmentNotFound):
        c.info("new")
    assert c.info("kept").length == 3
    assert (await c.append("kept", b"xyz")).offset == 3
    await c.create("new")


async def test_a_failed_journal_makes_the_container_unavailable() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("s")
    journal.failed = JournalRefused("fdatasync failed")
    with pytest.raises(Unavailable, match="fdatasync failed"):
        await c.append("s", b"x")


async def test_writer_condition_failure_reports_the_committed_event_number() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("s")
    await c.append("s", b"1", writer_id=W, event_number=1, previous_event_number=0)
    journal.hold()
    ok = c.prepare_append("s", b"2", writer_id=W, event_number=2, previous_event_number=1)
    # Validated against the pending view: the writer's event 2 is pending.
    stale = c.prepare_append("s", b"x", writer_id=W, event_number=2, previous_event_number=1)
    journal.commit()
    await ok.wait()
    with pytest.raises(ConditionalCheckFailed) as e:
        await stale.wait()
    assert e.value.last_event_number == 2
    assert (await c.read("s", 0, 10)).data == b"12"


async def test_attribute_updates_apply_in_order() -> None:
    c = make()
    await c.create("s", [AttributeUpdate(W, Verb.REPLACE, 5)])
    await c.update_attributes("s", [AttributeUpdate(W, Verb.ACCUMULATE, 3)])
    assert (await c.get_attributes("s", [W])) == {W: 8}
    with pytest.raises(ConditionalCheckFailed):
        await c.update_attributes("s", [AttributeUpdate(W, Verb.REPLACE_IF_EQUALS, 9, 1)])
    assert (await c.get_attributes("s", [W])) == {W: 8}


async def test_truncate_and_delete() -> None:
    store = MemoryCache()
    c = make(store=store)
    await c.create("s")
    await c.append("s", b"a" * 10)
    await c.append("s", b"b" * 10)
    await c.truncate("s", 10)
    with pytest.raises(SegmentTruncated):
        await c.read("s", 5, 10)
    got = await c.read("s", 5, 10, zeros_below_start=True)
    assert got.data == b"\x00" * 5 + b"b" * 5
    await c.read_index.wait_written()
    assert store.pinned_bytes == 10  # the first append's bytes are gone
    await c.delete("s")
    with pytest.raises(SegmentNotFound):
        await c.read("s", 10, 1)
    assert store.pinned_bytes == 0 and c.segment_count == 0


async def test_a_replay_rebuilds_the_same_committed_view() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("one")
    await c.create("two")
    await c.append("one", b"first")
    await c.append("two", b"second")
    await c.seal("one")
    await c.truncate("two", 3)
    await c.delete("two")
    await c.create("three", [AttributeUpdate(W, Verb.REPLACE, 1)])
    await c.append("three", b"x" * 100)
    before = c.committed_snapshot()
    again = restart(journal)
    assert again.committed_snapshot() == before
    assert (await again.read("one", 0, 10)).data == b"first"
    assert (await again.read("three", 0, 200)).data == b"x" * 100
    assert (await again.create("four")).id == 4  # ids are never reused


async def test_a_checkpoint_lets_the_journal_drop_files_of_flushed_data() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("s")
    await c.append("s", b"a" * 100)
    journal.roll()
    await c.append("s", b"b" * 100)
    # The first file holds bytes not in Tier 2 yet: it must stay.
    await c.checkpoint()
    assert journal.files[0] == 1
    # Tier 2 takes [0, 100): the first file's bytes are no longer needed.
    chunk = ChunkRecord(name="c0", start_offset=0, length=100)
    assert await c.prepare_chunk_added(c.info("s").id, chunk, False).wait()
    await c.checkpoint()
    assert journal.files[0] > 1 and journal.truncated_files == 1
    # A restart from what is left still has every byte and the chunk.
    again = restart(journal)
    assert again.info("s").storage_length == 100 and again.info("s").length == 200
    assert (await again.read("s", 100, 100)).data == b"b" * 100


async def test_pinned_bytes_past_their_share_are_refused_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = MemoryCache(budget=1000, pinned_share=0.5)
    c = make(store=store, config=ContainerConfig(overload_timeout=5.0))
    await c.create("s")
    await c.append("s", b"x" * 400)
    await c.read_index.wait_written()
    started = trio.current_time()
    with pytest.raises(Overloaded, match="cache budget"):
        await c.append("s", b"y" * 200)
    assert trio.current_time() - started == pytest.approx(5.0)
    # Freeing the bytes (here: truncation) lets appends in again.
    await c.truncate("s", 400)
    await c.read_index.wait_written()
    assert (await c.append("s", b"y" * 200)).offset == 400


async def test_a_waiting_append_goes_in_once_bytes_are_freed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = MemoryCache(budget=1000, pinned_share=0.5)
    c = make(store=store, config=ContainerConfig(overload_timeout=60.0))
    await c.create("s")
    await c.append("s", b"x" * 400)
    await c.read_index.wait_written()
    results = []
    async with trio.open_nursery() as nursery:

        async def appender() -> None:
            results.append(await c.append("s", b"y" * 200))

        nursery.start_soon(appender)
        await trio.testing.wait_all_tasks_blocked()
        assert not results  # waiting for room
        await c.truncate("s", 400)
    assert results[0].offset == 400


async def test_a_listing_page_is_a_range_of_names_in_order() -> None:
    """``list`` by prefix and ``start_after`` returns the committed names in order,
    page by page, whatever order they were created in (the table keeps them sorted),
    and never a transaction's segment."""
    c = make()
    names = [f"p/{i:03d}" for i in range(50)] + ["p", "p0", "o/x", "q/y", "p/"]
    for name in reversed(names):
        if name != "p/":  # not a valid segment name; stands for a prefix below
            await c.create(name)
    txn = (await c.begin("p/010")).name
    assert c.info(txn).name == txn  # it exists, and is never listed
    assert [i.name for i in c.list()] == sorted(n for n in names if n != "p/")
    assert [i.name for i in c.list("p/")] == [f"p/{i:03d}" for i in range(50)]
    pages: list[str] = []
    after = ""
    while True:
        page = [i.name for i in c.list("p/", start_after=after, limit=7)]
        if not page:
            break
        pages += page
        after = page[-1]
    assert pages == [f"p/{i:03d}" for i in range(50)]
    # start_after below, equal to and inside the prefix; and past it.
    assert [i.name for i in c.list("p/", start_after="a", limit=2)] == ["p/000", "p/001"]
    assert [i.name for i in c.list("p", start_after="p", limit=2)] == ["p/000", "p/001"]
    assert [i.name for i in c.list("p/", start_after="p/048")] == ["p/049"]
    assert c.list("p/", start_after="p/049") == [] and c.list("p/", start_after="z") == []
    assert [i.name for i in c.list("p", limit=1)] == ["p"]


async def test_changes_since_a_sequence_name_what_changed_and_what_went() -> None:
    """``changed_since`` walks back from the newest change: segments whose committed
    view changed after the sequence (each once, at its last change) and the ids and
    names deleted after it; the live count follows creates, deletes and merges."""
    c = make()
    table = c._table
    for name in ("a", "b", "c", "d"):
        await c.create(name)
    assert c.segment_count == 4
    mark = table.seq
    assert table.changed_since(mark) == ([], [])
    await c.append("b", b"x")
    await c.append("c", b"y")
    await c.append("b", b"z")
    await c.delete("d")
    got = table.changed_since(mark)
    assert got is not None
    changed, deleted = got
    assert [s.name for s in changed] == ["b", "c"]  # newest first, b once
    assert [name for _, name in deleted] == ["d"]
    assert c.segment_count == 3
    txn = (await c.begin("a")).name
    await c.append(txn, b"t")
    mark = table.seq
    await c.commit(txn)
    await c.wait_settled()
    got = table.changed_since(mark)
    assert got is not None
    assert "a" in [s.name for s in got[0]]
    # The merged transaction stays until its Tier-2 merge completes (none here).
    assert c.segment_count == sum(1 for s in table.by_id.values() if s.durable) == 4
    # A replay loads whole at its checkpoint: older cursors are refused.
    table.changes_floor = table.seq
    assert table.changed_since(mark) is None


async def test_the_counts_metrics_read_follow_creates_seals_deletes_and_a_replay() -> None:
    journal = MemoryJournal()
    c = make(journal)
    for name in ("a", "b", "c"):
        await c.create(name)
    await c.seal("a")
    await c.seal("b")
    await c.delete("b")
    txn = (await c.begin("c")).name
    assert (c.segment_count, c.sealed_count) == (3, 1)  # a, c and the transaction
    assert c.statistics()["transactions_open"] == 1
    await c.append(txn, b"t")
    await c.commit(txn)  # sealed, merged: still here until its Tier-2 merge
    assert c.statistics()["transactions_open"] == 0
    want = (c.segment_count, c.sealed_count)
    again = restart(journal)
    assert (again.segment_count, again.sealed_count) == want == (3, 2)
