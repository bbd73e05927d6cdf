"""Extended attributes in the attribute index, in-process over Tier 2 bindings.

The container and its storage writer run in the test's trio loop over the
in-memory binding (kept across restarts) or a real SeaweedFS bucket, with
``container.max_attributes`` tiny so that almost every value has to come
back from the index (prefetch) rather than from memory.
"""

from __future__ import annotations

import pathlib
import random
import shutil
import tempfile
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Config
from gateway.container.attributes import EVENT_COUNT, AttributeUpdate, Verb
from gateway.errors import BadAttributeUpdate, ConditionalCheckFailed, Overloaded
from gateway.node import open_node
from gateway.storage import object_keys as names
from gateway.storage.interface import ChunkStorage
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from gateway.tier2.storage_writer import StorageWriter
from tests.helpers.container import DirectContainer
from tests.helpers.inprocess import running
from tests.helpers.segments import make_config
from tests.helpers.wait import async_wait_for


def key(i: int) -> bytes:
    """An extended attribute id (a nonzero first byte: not a core id)."""
    return b"\x10" + i.to_bytes(15, "big")


def config_for(
    data_dir: pathlib.Path, max_attributes: int = 4, node_id: str = "node-1", **tier2: Any
) -> Config:
    values: dict[str, Any] = {
        "flush_size": "64 KiB",
        "flush_interval": "30s",
        "retry_deadline": "5s",
        "snapshot_interval": "0s",
        "gc_interval": "1h",
        "gc_grace": "0s",
    }
    values.update(tier2)
    return make_config(
        data_dir,
        tier2=values,
        cache={"budget": "64 MiB"},
        container={"max_attributes": max_attributes},
        node={"id": node_id},
    )


async def retrying(c: DirectContainer, fn: Any) -> Any:
    """Run ``fn()``; while memory is full of unindexed values (Overloaded), flush and retry.

    A stream member that is being rolled keeps its unindexed values until
    the roll (a background task) hands its writers to the successor: a flush
    has nothing to do meanwhile, so retries are spaced out, as a client's are.
    """
    deadline = trio.current_time() + 30
    while True:
        try:
            return await fn()
        except Overloaded:
            if trio.current_time() > deadline:
                raise AssertionError("still Overloaded after 30 s of flushes") from None
            await c.flush()
            await trio.sleep(0.01)


async def writer_append(c: DirectContainer, name: str, wid: bytes, previous: int) -> None:
    await retrying(
        c,
        lambda: c.append(
            name, b"e", writer_id=wid, event_number=previous + 1, previous_event_number=previous
        ),
    )


async def test_writer_ids_leave_memory_and_come_back_from_the_index(tmp_path: pathlib.Path) -> None:
    storage = MemoryStorage()
    config = config_for(tmp_path, max_attributes=16)
    n = 300
    async with running(config, storage) as (c, w):
        await c.create("s")
        for i in range(n):
            await writer_append(c, "s", key(i), 0)
        await c.flush()
        seg = c._committed("s")
        # Memory keeps at most max_attributes values; the rest are in the index.
        assert len(seg.attributes) <= 16 + 1 and not seg.attr_dirty
        assert seg.attr_index is not None and seg.attr_index.root_length
        assert w.attributes.batches >= 1
        objects = storage.list(names.attributes_prefix("node-1"))
        assert objects and {o.key for o in objects} >= {ch.name for ch in seg.attr_index.chunks}
    shutil.rmtree(config.cache_dir)  # cold: pages come from Tier 2 again
    async with running(config, storage) as (c, w):
        assert c.info("s").event_count == n
        # An old writer's retry is a duplicate, answered with its stored number.
        with pytest.raises(ConditionalCheckFailed) as e:
            await c.append("s", b"e", writer_id=key(7), event_number=1, previous_event_number=0)
        assert getattr(e.value, "last_event_number", None) == 1
        assert c.info("s").event_count == n
        await writer_append(c, "s", key(7), 1)
        got = await c.get_attributes("s", [key(i) for i in range(n)])
        assert got == {key(i): 2 if i == 7 else 1 for i in range(n)}
        assert w.attributes.tier2_page_reads > 0
        rows = await c.attribute_range("s")
        assert [k for k, _ in rows] == [EVENT_COUNT, *[key(i) for i in range(n)]]
        page = await c.attribute_range("s", key(100), 10)
        assert [k for k, _ in page] == [key(i) for i in range(100, 110)]
        assert await w.attributes.verify(c._committed("s").id, c._committed("s").attr_index) == []


async def test_a_duplicates_answer_survives_an_eviction(tmp_path: pathlib.Path) -> None:
    async with running(config_for(tmp_path, max_attributes=16), MemoryStorage()) as (c, _):
        await c.create("s")
        for i in range(20):
            await writer_append(c, "s", key(i), 0)
        await c.flush()
        await c.load_attributes("s", [key(3)])  # in memory, and in the index
        in_flight = [c.prepare_append("s", b"x") for _ in range(5)]
        dup = c.prepare_append("s", b"d", writer_id=key(3), event_number=1, previous_event_number=0)
        # What an index batch applied before the answer is built would do.
        c._committed("s").evict_attributes(0)
        with pytest.raises(ConditionalCheckFailed) as e:
            await dup.wait()
        assert getattr(e.value, "last_event_number", None) == 1
        for op in in_flight:
            await op.wait()


async def test_without_tier2_the_limit_still_refuses(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, container={"max_attributes": 4})
    async with open_node(config, container_type=DirectContainer) as node:
        c = node.container
        await c.create("s")
        for i in range(3):  # and the event count: 4
            await c.append("s", b"x", writer_id=key(i), event_number=1)
        with pytest.raises(Exception, match="more than 4 attributes"):
            await c.append("s", b"x", writer_id=key(9), event_number=1)


async def test_remove_and_core_attributes(tmp_path: pathlib.Path) -> None:
    async with running(config_for(tmp_path, max_attributes=8), MemoryStorage()) as (c, _):
        await c.create("s")
        await c.update_attributes("s", [AttributeUpdate(key(1), Verb.REPLACE, 5)])
        await c.flush()
        await c.update_attributes("s", [AttributeUpdate(key(1), Verb.REMOVE, 0)])
        assert await c.get_attributes("s", [key(1)]) == {}
        await c.flush()  # the removal reaches the index
        seg = c._committed("s")
        seg.evict_attributes(0)
        assert await c.get_attributes("s", [key(1)]) == {}
        # Removing what is absent is fine; a core attribute cannot be removed.
        await c.update_attributes("s", [AttributeUpdate(key(2), Verb.REMOVE, 0)])
        with pytest.raises(BadAttributeUpdate):
            await c.update_attributes("s", [AttributeUpdate(EVENT_COUNT, Verb.REMOVE, 0)])


async def test_stream_successor_takes_the_index_over(tmp_path: pathlib.Path) -> None:
    storage = MemoryStorage()
    config = config_for(tmp_path, max_attributes=8)
    async with running(config, storage) as (c, _):
        await c.create_stream("st", {"roll_size": 16})
        events = {}
        for rnd in range(3):
            for i in range(40):
                await writer_append(c, "st", key(i), rnd)
                events[key(i)] = rnd + 1
            await c.flush()
        stream = c._table.streams["st"]
        assert len(stream.members) > 2
        # Every sealed predecessor gave its writers to its successor.
        for seg in stream.members[:-1]:
            assert seg.attr_moved and seg.attr_index is None and not seg.attr_dirty
        assert await c.get_attributes("st", list(events)) == events
    async with running(config, storage) as (c, _):
        assert await c.get_attributes("st", list(events)) == events
        with pytest.raises(ConditionalCheckFailed):
            await c.append("st", b"e", writer_id=key(3), event_number=3, previous_event_number=2)


# -- a dict model, with restarts and cache wipes (hypothesis) ------------------------------

KEYS = 24
ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, KEYS - 1), st.integers(-(2**63), 2**63 - 1)),
        st.tuples(st.just("cas"), st.integers(0, KEYS - 1), st.booleans()),
        st.tuples(st.just("add"), st.integers(0, KEYS - 1), st.integers(-1000, 1000)),
        st.tuples(st.just("remove"), st.integers(0, KEYS - 1)),
        st.tuples(st.just("writer"), st.integers(0, KEYS - 1)),
        st.tuples(st.just("get"), st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=6)),
        st.tuples(st.just("range"), st.integers(0, KEYS), st.integers(0, 8)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("restart")),
        st.tuples(st.just("wipe")),
    ),
    min_size=1,
    max_size=40,
)


async def _run_model(config: Config, storage: ChunkStorage, script: list[tuple[Any, ...]]) -> None:
    model: dict[bytes, int] = {}
    stack: list[Any] = []

    async def start() -> tuple[DirectContainer, StorageWriter]:
        cm = running(config, storage)
        stack.append(cm)
        return await cm.__aenter__()

    async def stop() -> None:
        await stack.pop().__aexit__(None, None, None)

    c, w = await start()
    try:
        await c.create("m")
        for op in script:
            kind = op[0]
            if kind == "set":
                k = key(op[1])
                await retrying(
                    c, lambda: c.update_attributes("m", [AttributeUpdate(k, Verb.REPLACE, op[2])])
                )
                model[k] = op[2]
            elif kind == "cas":
                k = key(op[1])
                old = model.get(k)
                if op[2]:
                    u = AttributeUpdate(k, Verb.REPLACE_IF_EQUALS, 42, old or 0, old is None)
                    await retrying(c, lambda: c.update_attributes("m", [u]))
                    model[k] = 42
                else:
                    wrong = AttributeUpdate(
                        k, Verb.REPLACE_IF_EQUALS, 42, (old or 0) + 1, old is not None
                    )
                    with pytest.raises(ConditionalCheckFailed):
                        await retrying(c, lambda: c.update_attributes("m", [wrong]))
            elif kind == "add":
                k = key(op[1])
                new = model.get(k, 0) + op[2]
                if -(2**63) <= new < 2**63:
                    u = AttributeUpdate(k, Verb.ACCUMULATE, op[2])
                    await retrying(c, lambda: c.update_attributes("m", [u]))
                    model[k] = new
            elif kind == "remove":
                k = key(op[1])
                u = AttributeUpdate(k, Verb.REMOVE, 0)
                await retrying(c, lambda: c.update_attributes("m", [u]))
                model.pop(k, None)
            elif kind == "writer":
                k = key(op[1])
                previous = model.get(k, 0)
                if previous < 2**63 - 1:
                    await writer_append(c, "m", k, previous)
                    model[k] = previous + 1
            elif kind == "get":
                ks = [key(i) for i in op[1]]
                assert await c.get_attributes("m", ks) == {k: model[k] for k in ks if k in model}
            elif kind == "range":
                start_key = key(op[1])
                got = await c.attribute_range("m", start_key, op[2])
                want = sorted((k, v) for k, v in model.items() if k >= start_key)
                assert got == (want[: op[2]] if op[2] else want)
            elif kind == "flush":
                await c.flush()
            else:
                await stop()
                if kind == "wipe":
                    shutil.rmtree(config.cache_dir)
                c, w = await start()
        extended = [(k, v) for k, v in await c.attribute_range("m") if k[:15] != bytes(15)]
        assert extended == sorted(model.items())
        await c.flush()
        seg = c._committed("m")
        if seg.attr_index is not None and seg.attr_index.root_length:
            assert await w.attributes.verify(seg.id, seg.attr_index) == []
            assert await w.attributes.count(seg.id, seg.attr_index) == len(model)
    finally:
        while stack:
            await stop()


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=ops)
def test_attributes_match_a_dict_model_on_memory(script: list[tuple[Any, ...]]) -> None:
    storage = MemoryStorage(supports_append=False)
    with tempfile.TemporaryDirectory() as d:
        trio.run(_run_model, config_for(pathlib.Path(d)), storage, script)


@pytest.mark.slow
@pytest.mark.timeout(300)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=ops)
def test_attributes_match_a_dict_model_on_seaweedfs(
    s3_storage: ChunkStorage, script: list[tuple[Any, ...]]
) -> None:
    with tempfile.TemporaryDirectory() as d:
        # Each example its own node id: the bucket is shared by the examples.
        config = config_for(pathlib.Path(d), node_id=f"n{random.randrange(10**9)}")
        trio.run(_run_model, config, s3_storage, script)


async def test_recovery_from_tier2_finds_the_newest_index(tmp_path: pathlib.Path) -> None:
    from gateway.attrindex.store import AttributeIndexStore
    from gateway.recovery.rebuild import rebuild_metadata

    storage = MemoryStorage()
    config = config_for(tmp_path, max_attributes=64, snapshot_interval="1h")
    async with running(config, storage) as (c, w):
        await c.create("s")
        for i in range(300):
            await writer_append(c, "s", key(i), 0)
        await c.flush()
        await w.upload_snapshot()  # the snapshot names this index and its chunks
        old = c._committed("s").attr_index
        assert old is not None
        old_chunks = {ch.name for ch in old.chunks}
        # Many batches after the snapshot: progressive compaction moves the
        # head on and the chunks the snapshot names are deleted.
        for rnd in range(1, 6):
            for i in range(0, 300, 3):
                await writer_append(c, "s", key(i), rnd)
            await c.flush()
        seg = c._committed("s")
        assert seg.attr_index is not None
        assert not old_chunks & {ch.name for ch in seg.attr_index.chunks}
    layer = ChunkLayer(storage, max_concurrency=4)
    rebuilt = await rebuild_metadata(layer, "node-1")
    (record,) = rebuilt.container.segments
    index = record.attribute_index
    assert index.root_length and index.chunks
    store = AttributeIndexStore(layer, "node-1")
    assert await store.verify(record.id, index) == []
    got = dict(await store.range(record.id, index, b"", 0))
    assert got == {key(i): 6 if i % 3 == 0 else 1 for i in range(300)}
    assert not rebuilt.report.lost_attribute_indexes


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_recovery_of_a_stream_whose_index_moved_along(tmp_path: pathlib.Path) -> None:
    from gateway.attrindex.store import AttributeIndexStore
    from gateway.recovery.rebuild import rebuild_metadata

    storage = MemoryStorage()
    config = config_for(tmp_path, max_attributes=2048, snapshot_interval="1h")
    events: dict[bytes, int] = {}
    async with running(config, storage) as (c, w):
        await c.create_stream("st", {"roll_size": 10_000, "retain_size": 5})
        await writer_append(c, "st", key(0), 0)
        events[key(0)] = 1
        await c.flush()
        await w.upload_snapshot()  # before most of it: members come from chunks
        # 10,000 writers (an index of a dozen leaves) fill the first segment,
        # 64 at a time: one at a time, each append waits for its own fdatasync.
        pending = iter(range(1, 10_000))

        async def first_events() -> None:
            for i in pending:
                await writer_append(c, "st", key(i), 0)
                events[key(i)] = 1

        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(first_events)
        await c.flush()
        # ...the next one takes the index over and rewrites only a few pages.
        for i in range(10):
            await writer_append(c, "st", key(i), events[key(i)])
            events[key(i)] += 1
        await c.flush()
        await c.enforce_streams()  # retention deletes the first segment
        stream = c._table.streams["st"]
        assert [m.name for m in stream.members] == ["st/000000000002"]
    layer = ChunkLayer(storage, max_concurrency=4)
    rebuilt = await rebuild_metadata(layer, "node-1")
    members = sorted(
        (r for r in rebuilt.container.segments if r.name.startswith("st/")), key=lambda r: r.name
    )
    current = members[-1]
    assert current.attribute_index.root_length, rebuilt.report.summary()
    # Part of its index was written while earlier segments held it.
    holders = {names.parse_attribute_chunk_key(ch.name)[0] for ch in current.attribute_index.chunks}  # type: ignore[index]
    assert holders - {current.id}, holders
    store = AttributeIndexStore(layer, "node-1")
    assert await store.verify(current.id, current.attribute_index) == []
    got = dict(await store.range(current.id, current.attribute_index, b"", 0))
    # What the newest batch holds: every writer's value as of the last flush.
    assert got == events


async def test_a_reader_with_an_old_record_is_told_the_index_moved(tmp_path: pathlib.Path) -> None:
    from gateway.errors import IndexMoved
    from gateway.protocol.metadata_pb2 import AttributeIndexRecord

    storage = MemoryStorage()
    async with running(config_for(tmp_path, max_attributes=64), storage) as (c, w):
        await c.create("s")
        for i in range(40):
            await writer_append(c, "s", key(i), 0)
        await c.flush()
        seg = c._committed("s")
        old = AttributeIndexRecord()
        assert seg.attr_index is not None
        old.CopyFrom(seg.attr_index)
        # Batches after it move the head past its chunks; they get deleted.
        for rnd in range(1, 4):
            for i in range(40):
                await writer_append(c, "s", key(i), rnd)
            await c.flush()
        gone = {ch.name for ch in old.chunks} - {ch.name for ch in seg.attr_index.chunks}
        assert gone
        await async_wait_for(
            lambda: not {o.key for o in storage.list(names.attributes_prefix("node-1"))} & gone,
            10,
            "the old batches' chunks deleted",
        )
        w.attributes.pages.drop(seg.id)  # nothing parsed: the lookup must read
        with pytest.raises(IndexMoved):
            await w.attributes.lookup(seg.id, old, [key(1)])
        assert not {b[0] for b in c.read_index.store.blocks()} & gone  # nothing cached again
        # The container looks with the record as it is now.
        seg.evict_attributes(0)
        assert await c.get_attributes("s", [key(1)]) == {key(1): 4}


async def test_recovery_keeps_a_writer_event_number_indexed_after_the_snapshot(
    tmp_path: pathlib.Path,
) -> None:
    """A takeover must not take a writer's event number back to the newest snapshot's.

    The snapshot's record carries the writer's value not yet indexed then
    (5); a later flush indexed a newer one (9) in a batch the snapshot does
    not name. The rebuild takes that batch's tree, and the record's stale
    value must not hide it (the cluster torture's ``WriterFailed: the server
    has event 4340 stored ..., but event 4500 was acknowledged``).
    """
    from gateway.recovery.metadata_io import install
    from gateway.recovery.rebuild import rebuild_metadata

    storage = MemoryStorage()
    config = config_for(tmp_path / "old", max_attributes=64, snapshot_interval="1h")
    wid = key(1)
    async with running(config, storage) as (c, w):
        await c.create("s")
        await writer_append(c, "s", wid, 0)
        await c.flush()  # the index holds 1
        for n in range(1, 5):
            await writer_append(c, "s", wid, n)
        await w.upload_snapshot()  # its record: 5, not yet indexed
        assert wid in c._committed("s").attr_dirty
        for n in range(5, 9):
            await writer_append(c, "s", wid, n)
        await c.flush()  # data and a batch holding 9, after the snapshot
        assert not c._committed("s").attr_dirty
        assert await c.get_attributes("s", [wid]) == {wid: 9}
    layer = ChunkLayer(storage, max_concurrency=4)
    rebuilt = await rebuild_metadata(layer, "node-1")
    (record,) = rebuilt.container.segments
    assert record.length == 9  # the data came back
    new = config_for(tmp_path / "new", max_attributes=64, snapshot_interval="1h")
    await install(new, rebuilt.container, rebuilt.max_epoch + 1)
    async with running(new, storage) as (c, _):
        assert await c.get_attributes("s", [wid]) == {wid: 9}
        # The writer goes on from 9 (with 5 it would be refused, or resend).
        await writer_append(c, "s", wid, 9)


async def test_recovery_keeps_record_values_newer_than_a_batch_journaled_after_it(
    tmp_path: pathlib.Path,
) -> None:
    """The other order: a batch prepared before the snapshot, journaled after it.

    Its values (5) are older than the record's (9, changed while it was
    uploading): the record's value stays over the rebuilt index.
    """
    import threading

    from gateway.recovery.metadata_io import install
    from gateway.recovery.rebuild import rebuild_metadata

    uploading, go_on = threading.Event(), threading.Event()

    class Held(MemoryStorage):
        hold = False

        def write(self, key: str, data: Any, metadata: Any) -> None:
            if self.hold and names.is_attribute_chunk(key):
                uploading.set()
                assert go_on.wait(30)
            super().write(key, data, metadata)

    storage = Held()
    config = config_for(tmp_path / "old", max_attributes=64, snapshot_interval="1h")
    wid = key(1)
    async with running(config, storage) as (c, w):
        await c.create("s")
        await writer_append(c, "s", wid, 0)
        await c.flush()  # the index holds 1
        for n in range(1, 5):
            await writer_append(c, "s", wid, n)
        index = c._committed("s").attr_index
        assert index is not None
        before = index.length  # where the held batch starts
        storage.hold = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.flush)  # its batch holds 5
            await trio.to_thread.run_sync(uploading.wait)
            storage.hold = False
            for n in range(5, 9):
                await writer_append(c, "s", wid, n)
            await w.upload_snapshot()  # names the index before that batch; its record: 9
            go_on.set()
        seg = c._committed("s")
        assert wid in seg.attr_dirty  # 9 waits for the next batch, which never comes
        assert await c.get_attributes("s", [wid]) == {wid: 9}
    # One batch past the snapshot's index: the one that was uploading.
    offsets = [
        names.parse_attribute_chunk_key(o.key)[1]  # type: ignore[index]
        for o in storage.list(names.attributes_prefix("node-1"))
    ]
    assert offsets.count(before) == 1 and max(offsets) == before, (offsets, before)
    layer = ChunkLayer(storage, max_concurrency=4)
    rebuilt = await rebuild_metadata(layer, "node-1")
    new = config_for(tmp_path / "new", max_attributes=64, snapshot_interval="1h")
    await install(new, rebuilt.container, rebuilt.max_epoch + 1)
    async with running(new, storage) as (c, _):
        assert await c.get_attributes("s", [wid]) == {wid: 9}
