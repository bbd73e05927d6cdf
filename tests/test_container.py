"""The segment container over a real journal: operations, errors, order, restarts."""

from __future__ import annotations

import itertools
import os
import pathlib
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from gateway.config import Config
from gateway.container import EVENT_COUNT, AttributeUpdate, Verb
from gateway.errors import (
    BadAttributeUpdate,
    BadOffset,
    ConditionalCheckFailed,
    InvalidName,
    LimitExceeded,
    Overloaded,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    TooLarge,
)
from gateway.journal.files import list_files
from gateway.node import open_node
from tests.helpers.container import DirectContainer

from .helpers.segments import journal_segments, make_config

A1 = b"\x01" * 16
A2 = b"\x02" * 16


@asynccontextmanager
async def container_at(config: Config) -> AsyncIterator[DirectContainer]:
    async with open_node(config, container_type=DirectContainer) as node:
        c = node.container
        yield c


@pytest.fixture
def config(tmp_path: pathlib.Path) -> Config:
    return make_config(tmp_path)


def assert_stored(config: Config, name: str, length: int, acked: list[tuple[int, bytes]]) -> None:
    """Every acknowledged append is in the journal at its offset, and nothing else."""
    data = journal_segments(config.journal_dir)[name]
    assert len(data) == length == sum(len(d) for _, d in acked)
    for off, d in acked:
        assert data[off : off + len(d)] == d


def upd(attr: bytes, verb: Verb, value: int, **kw: Any) -> AttributeUpdate:
    return AttributeUpdate(attr, verb, value, **kw)


async def test_basic_lifecycle(config: Config) -> None:
    async with container_at(config) as c:
        info = await c.create("scope/stream/0")
        assert (info.name, info.length, info.sealed, info.event_count) == (
            "scope/stream/0", 0, False, 0,
        )  # fmt: skip
        r1 = await c.append("scope/stream/0", b"hello ")
        r2 = await c.append("scope/stream/0", b"world")
        assert (r1.offset, r1.length, r2.offset, r2.length) == (0, 6, 6, 11)
        info = c.info("scope/stream/0")
        assert info.length == 11 and info.event_count == 2
        assert info.last_modified_ms >= info.created_at_ms
        await c.create("scope/stream/1")
        await c.create("other")
        assert [s.name for s in c.list("scope/")] == ["scope/stream/0", "scope/stream/1"]
        assert [s.name for s in c.list()] == ["other", "scope/stream/0", "scope/stream/1"]
        assert [s.name for s in c.list("", start_after="other", limit=1)] == ["scope/stream/0"]
        info = await c.truncate("scope/stream/0", 6)
        assert (info.start_offset, info.length) == (6, 11)
        info = await c.seal("scope/stream/0")
        assert info.sealed
        await c.delete("scope/stream/1")
        with pytest.raises(SegmentNotFound):
            c.info("scope/stream/1")
        # A deleted name can be created again, with a new id.
        again = await c.create("scope/stream/1")
        assert again.id > info.id
    assert journal_segments(config.journal_dir) == {
        "scope/stream/0": b"hello world",
        "scope/stream/1": b"",
        "other": b"",
    }


@pytest.mark.parametrize(
    "name",
    ["", "/a", "a/", "a//b", "a/./b", "..", "a/../b", "sp ace", "ü", "a" * 256,
     "/".join(["x"] * 17), "a\x00b", ("abcdefgh/" * 120)[:-1]],
)  # fmt: skip
async def test_invalid_names(config: Config, name: str) -> None:
    async with container_at(config) as c:
        with pytest.raises(InvalidName):
            await c.create(name)
        with pytest.raises((InvalidName, SegmentNotFound)):
            await c.append(name, b"x")


async def test_valid_name_limits(config: Config) -> None:
    async with container_at(config) as c:
        await c.create("/".join(["d"] * 16))
        await c.create("a" * 255)
        await c.create("A-z_0.9/..x/.hidden")


async def test_error_cases(config: Config) -> None:
    async with container_at(config) as c:
        with pytest.raises(SegmentNotFound):
            await c.append("nope", b"x")
        with pytest.raises(SegmentNotFound):
            await c.seal("nope")
        with pytest.raises(SegmentNotFound):
            await c.delete("nope")
        with pytest.raises(SegmentNotFound):
            c.info("nope")
        await c.create("s")
        with pytest.raises(SegmentExists):
            await c.create("s")
        await c.append("s", b"abc")
        with pytest.raises(BadOffset) as bad:
            await c.append("s", b"x", expected_offset=2)
        assert bad.value.expected_offset == 3
        await c.append("s", b"d", expected_offset=3)
        with pytest.raises(BadOffset):
            await c.truncate("s", 5)
        with pytest.raises(TooLarge):
            await c.append("s", bytes(512 * 1024 + 1))
        await c.seal("s")
        with pytest.raises(SegmentSealed):
            await c.append("s", b"x")
        with pytest.raises(SegmentSealed):
            await c.seal("s")
        with pytest.raises(SegmentSealed):
            await c.update_attributes("s", [upd(A1, Verb.REPLACE, 1)])
        # Truncating and deleting sealed segments is allowed.
        await c.truncate("s", 2)
        await c.delete("s")
        assert c.list() == []


async def test_validation_order_is_pravegas(config: Config) -> None:
    """deleted -> sealed -> attribute conditions -> expected offset."""
    async with container_at(config) as c:
        await c.create("s")
        await c.append("s", b"abc", attribute_updates=[upd(A1, Verb.REPLACE, 5)])
        failing_attr = [upd(A1, Verb.REPLACE_IF_EQUALS, 9, compare_value=4)]
        with pytest.raises(ConditionalCheckFailed):
            await c.append("s", b"x", expected_offset=99, attribute_updates=failing_attr)
        await c.seal("s")
        with pytest.raises(SegmentSealed):
            await c.append("s", b"x", expected_offset=99, attribute_updates=failing_attr)
        d = c.prepare_delete("s")
        with pytest.raises(SegmentNotFound):
            c.prepare_append("s", b"x", expected_offset=99)
        await d.wait()


async def test_attribute_verbs(config: Config) -> None:
    async with container_at(config) as c:
        await c.create("s", [upd(A1, Verb.REPLACE, 10)])
        assert await c.get_attributes("s", [A1]) == {A1: 10}
        await c.update_attributes("s", [upd(A1, Verb.REPLACE_IF_GREATER, 11)])
        with pytest.raises(ConditionalCheckFailed, match="not less than 11"):
            await c.update_attributes("s", [upd(A1, Verb.REPLACE_IF_GREATER, 11)])
        await c.update_attributes("s", [upd(A1, Verb.REPLACE_IF_EQUALS, 20, compare_value=11)])
        with pytest.raises(ConditionalCheckFailed, match="expected 11"):
            await c.update_attributes("s", [upd(A1, Verb.REPLACE_IF_EQUALS, 30, compare_value=11)])
        # "only if absent"
        await c.update_attributes("s", [upd(A2, Verb.REPLACE_IF_EQUALS, 1, expect_absent=True)])
        with pytest.raises(ConditionalCheckFailed, match="expected no value"):
            await c.update_attributes("s", [upd(A2, Verb.REPLACE_IF_EQUALS, 2, expect_absent=True)])
        await c.update_attributes("s", [upd(A2, Verb.ACCUMULATE, 5), upd(A2, Verb.ACCUMULATE, 5)])
        assert await c.get_attributes("s", [A1, A2]) == {A1: 20, A2: 11}
        # A failing update in a batch changes nothing, not even the others.
        with pytest.raises(ConditionalCheckFailed):
            await c.update_attributes(
                "s",
                [upd(A1, Verb.REPLACE, 99), upd(A2, Verb.REPLACE_IF_EQUALS, 0, compare_value=0)],
            )
        assert await c.get_attributes("s", [A1, A2]) == {A1: 20, A2: 11}
        with pytest.raises(BadAttributeUpdate, match="16 bytes"):
            await c.update_attributes("s", [upd(b"short", Verb.REPLACE, 1)])
        with pytest.raises(BadAttributeUpdate, match="core attribute"):
            await c.update_attributes("s", [upd(EVENT_COUNT, Verb.REPLACE, 1)])
        with pytest.raises(BadAttributeUpdate, match="overflow"):
            await c.update_attributes("s", [upd(A1, Verb.ACCUMULATE, 2**63 - 1)])
        # A conditional append that fails appends nothing.
        with pytest.raises(ConditionalCheckFailed):
            await c.append("s", b"x", attribute_updates=[upd(A1, Verb.REPLACE_IF_GREATER, 1)])
        assert c.info("s").length == 0
        all_attrs = await c.get_attributes("s")
        assert all_attrs[A1] == 20 and EVENT_COUNT not in all_attrs


async def test_exactly_once_writer(config: Config) -> None:
    writer = uuid.uuid4().bytes
    async with container_at(config) as c:
        await c.create("s")
        await c.append("s", b"e1e2", writer_id=writer, event_number=2, previous_event_number=0,
                       event_count=2)  # fmt: skip
        await c.append("s", b"e3", writer_id=writer, event_number=3, previous_event_number=2)
        # A retry of the second append is a duplicate: refused, nothing changes.
        with pytest.raises(ConditionalCheckFailed) as dup:
            await c.append("s", b"e3", writer_id=writer, event_number=3, previous_event_number=2)
        assert dup.value.last_event_number == 3
        info = c.info("s")
        assert (info.length, info.event_count) == (6, 3)
        assert await c.get_attributes("s", [writer]) == {writer: 3}
        with pytest.raises(BadAttributeUpdate, match="must be greater"):
            await c.append("s", b"x", writer_id=writer, event_number=3, previous_event_number=3)


async def test_limits(tmp_path: pathlib.Path) -> None:
    config = make_config(tmp_path, container={"max_segments": 3, "max_attributes": 4})
    async with container_at(config) as c:
        for i in range(3):
            await c.create(f"s{i}")
        with pytest.raises(LimitExceeded, match="max_segments"):
            await c.create("s3")
        # event count + 3 client attributes = 4
        await c.append("s0", b"x", attribute_updates=[
            upd(bytes([9, i]) * 8, Verb.REPLACE, i) for i in range(3)
        ])  # fmt: skip
        with pytest.raises(LimitExceeded, match="more than 4 attributes"):
            await c.update_attributes("s0", [upd(A1, Verb.REPLACE, 1)])
        await c.delete("s2")
        await c.create("s3")


async def test_pipelined_appends_with_a_seal_in_the_middle(config: Config) -> None:
    async with container_at(config) as c:
        await c.create("s")
        before = [c.prepare_append("s", bytes([i]) * 10) for i in range(20)]
        seal = c.prepare_seal("s")
        with pytest.raises(SegmentSealed):
            c.prepare_append("s", b"late")
        results = [await p.wait() for p in before]
        assert [r.offset for r in results] == [i * 10 for i in range(20)]
        assert (await seal.wait()).sealed
        assert c.info("s").length == 200


async def test_concurrent_appends_never_interleave(config: Config) -> None:
    payloads = {k: random.Random(k).randbytes(random.Random(k).randint(1, 5000)) for k in range(64)}
    got: dict[int, int] = {}
    async with container_at(config) as c:
        await c.create("s")

        async def one(k: int) -> None:
            got[k] = (await c.append("s", payloads[k])).offset

        async with trio.open_nursery() as nursery:
            for k in payloads:
                nursery.start_soon(one, k)
        length = c.info("s").length
    data = journal_segments(config.journal_dir)["s"]
    assert len(data) == length == sum(map(len, payloads.values()))
    for k, off in got.items():
        assert data[off : off + len(payloads[k])] == payloads[k]


async def snapshot_state(c: DirectContainer) -> dict[str, Any]:
    return {s.name: (s, await c.get_attributes(s.name)) for s in c.list()}


async def test_restart_keeps_metadata_through_checkpoints_and_truncation(
    tmp_path: pathlib.Path,
) -> None:
    config = make_config(tmp_path, journal={"checkpoint_every_frames": 20})
    rng = random.Random(7)
    async with container_at(config) as c:
        for round_ in range(6):
            for i in range(8):
                name = f"r{round_}/s{i}"
                await c.create(name, [upd(A1, Verb.REPLACE, round_)])
                for _ in range(rng.randint(1, 6)):
                    await c.append(name, rng.randbytes(rng.randint(1, 60_000)),
                                   attribute_updates=[upd(A2, Verb.ACCUMULATE, 1)])  # fmt: skip
                if i % 3 == 0:
                    await c.seal(name)
                if i % 4 == 1:
                    await c.truncate(name, c.info(name).length // 2)
            # Deleting old rounds frees their journal data for truncation.
            if round_ >= 2:
                for i in range(8):
                    await c.delete(f"r{round_ - 2}/s{i}")
        await c.checkpoint()
        before = await snapshot_state(c)
        stats = c.statistics()
    assert stats["checkpoints"] >= 3
    assert stats["journal_files_truncated"] >= 1, "the journal was never truncated"
    assert list_files(config.journal_dir)[0].first_sequence > 1
    async with container_at(config) as c:
        after = await snapshot_state(c)
    assert after == before
    # And once more, without a checkpoint at the end (kill-like: replay the tail).
    async with container_at(config) as c:
        await c.append("r5/s1", b"tail")
        before = await snapshot_state(c)
    async with container_at(config) as c:
        assert await snapshot_state(c) == before


@pytest.mark.expect_errors("journal refused client operations")
async def test_disk_full_refuses_and_resumes_without_holes(small_tmpfs: pathlib.Path) -> None:
    config = make_config(small_tmpfs, container={"overload_timeout": 0.5})
    filler = small_tmpfs / "filler"
    acked: list[tuple[int, bytes]] = []
    async with container_at(config) as c:
        await c.create("s")
        st = os.statvfs(small_tmpfs)
        filler.write_bytes(bytes(st.f_bavail * st.f_frsize - 700 * 1024))
        refused = 0

        async def one(i: int) -> None:
            nonlocal refused
            data = random.Random(i).randbytes(20_000)
            try:
                r = await c.append("s", data)
            except Overloaded as e:
                assert "disk is full" in str(e)
                refused += 1
            else:
                acked.append((r.offset, data))

        for burst in range(10):
            async with trio.open_nursery() as nursery:
                for i in range(burst * 10, burst * 10 + 10):
                    nursery.start_soon(one, i)
        assert refused > 0
        filler.unlink()
        for i in range(100, 110):
            await one(i)
        length = c.info("s").length
    assert_stored(config, "s", length, acked)


async def test_slow_journal_delays_then_refuses_with_overloaded(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(
        tmp_path,
        journal={"max_pending_bytes": "256 KiB", "max_group_bytes": "64 KiB",
                 "max_frame_bytes": "64 KiB", "max_operation_bytes": "128 KiB"},
        container={"max_append_bytes": "64 KiB", "overload_timeout": 0.05},
    )  # fmt: skip
    real = os.fdatasync

    def slow(fd: int) -> None:
        import time

        time.sleep(0.05)  # a slow disk: the pause is the subject
        real(fd)

    acked: list[tuple[int, bytes]] = []
    overloaded = 0
    async with container_at(config) as c:
        await c.create("s")
        monkeypatch.setattr(os, "fdatasync", slow)

        async def one(i: int) -> None:
            nonlocal overloaded
            data = random.Random(i).randbytes(30_000)
            try:
                r = await c.append("s", data)
            except Overloaded as e:
                assert "overload_timeout" in str(e)
                overloaded += 1
            else:
                acked.append((r.offset, data))

        async with trio.open_nursery() as nursery:
            for i in range(60):
                nursery.start_soon(one, i)
        monkeypatch.undo()
        assert overloaded > 0, "a slow journal must turn into Overloaded"
        assert acked, "some appends must get through"
        length = c.info("s").length
    assert_stored(config, "s", length, acked)


async def test_event_index_is_sparse_true_and_survives_restart(tmp_path: pathlib.Path) -> None:
    from gateway.container.table import EVENT_INDEX_SPACING

    rng = random.Random(12)
    boundaries = []
    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        await c.create("e")
        offset = 0
        for _ in range(400):
            size = rng.choice([10, 1000, 30_000, 200_000, 400_000])
            boundaries.append(offset)
            await c.append("e", b"x" * size)
            offset += size
        index = list(c.segment_by_id(c.info("e").id).event_index)  # type: ignore[union-attr]
        await c.checkpoint()
        await c.append("e", b"tail")
        index_after = list(c.segment_by_id(c.info("e").id).event_index)  # type: ignore[union-attr]
    assert index[0] == 0 and set(index) <= set(boundaries)
    assert all(b - a >= EVENT_INDEX_SPACING for a, b in itertools.pairwise(index))
    # Sparse but not too sparse: a gap never exceeds the spacing plus one append.
    assert all(b - a <= EVENT_INDEX_SPACING + 400_000 for a, b in itertools.pairwise(index))
    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        seg = c.segment_by_id(c.info("e").id)
        assert seg is not None and seg.event_index == index_after
        cut = index[len(index) // 2] + 5
        await c.truncate("e", cut)
        assert seg.event_index and seg.event_index[0] >= cut
        # The first append starting after the cut is indexed too (its bytes
        # are cached), so readers start there rather than up to a MiB on.
        first = min(b for b in boundaries if b >= cut)
        assert seg.event_index == [first, *(i for i in index_after if i > first)]


async def test_checkpoint_includes_chunks_added_while_it_was_taken(tmp_path: pathlib.Path) -> None:
    """A chunk record in flight when a checkpoint is submitted must be in its snapshot.

    Otherwise recovery replays the record, loads the snapshot over it, and
    the next chunk "starts past the storage length" (seen in the bulk test).
    """
    from gateway.protocol.metadata_pb2 import ChunkRecord

    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        await c.create("s")
        await c.append("s", b"a" * 1000)
        await c.append("s", b"b" * 1000)
        seg_id = c.info("s").id
        first = c.prepare_chunk_added(
            seg_id, ChunkRecord(name="c1", start_offset=0, length=1000, epoch=1), False
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.checkpoint)  # submitted while `first` is in flight
            assert await first.wait() is True
        second = c.prepare_chunk_added(
            seg_id, ChunkRecord(name="c2", start_offset=1000, length=1000, epoch=1), False
        )
        assert await second.wait() is True
    async with open_node(make_config(tmp_path), container_type=DirectContainer) as node:
        c = node.container
        info = c.info("s")
        assert info.storage_length == 2000 and info.chunk_count == 2
