"""Rebuilding metadata from Tier 2 alone (`gateway.recovery.rebuild`), object by object.

Each test lays out the objects a node would have left in Tier 2 -- metadata
snapshots and chunk objects with their user metadata -- in the in-memory
binding, and checks what the rebuild makes of them. The last tests install
the result as an empty node's journal. The daemon-level tests (a real node
killed and rebuilt, on SeaweedFS) are in tests/test_recovery.py.
"""

from __future__ import annotations

import pathlib
import random
import uuid

import crc32c
import pytest

from gateway.errors import NodeNotEmpty, NothingToRecover, SnapshotInvalid
from gateway.journal.files import list_files
from gateway.node import open_node
from gateway.protocol.metadata_pb2 import (
    AttributeValue,
    ChunkRecord,
    ContainerSnapshot,
    MetadataSnapshot,
    SegmentRecord,
    StreamRecord,
)
from gateway.recovery import metadata_io
from gateway.recovery.rebuild import Rebuilt, rebuild, rebuild_metadata
from gateway.storage import object_keys as names
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from tests.helpers.container import DirectContainer

from .helpers.segments import make_config

NODE = "n1"
DATA = random.Random(3).randbytes(4096)


class Tier2:
    """A node's Tier 2 in memory, filled by hand."""

    def __init__(self, supports_append: bool = False) -> None:
        self.storage = MemoryStorage(supports_append=supports_append)
        self.layer = ChunkLayer(self.storage, retry_deadline=1.0)

    def chunk(
        self,
        segment_id: int,
        name: str,
        start: int,
        length: int,
        epoch: int,
        *,
        metadata: dict[str, str] | None = None,
        key: str | None = None,
    ) -> ChunkRecord:
        """Upload a chunk holding DATA[start:start+length] (the segment's bytes)."""
        key = key or names.chunk_key(NODE, segment_id, start, epoch)
        data = DATA[start : start + length]
        crc = crc32c.crc32c(data)
        md = names.chunk_metadata(name, start, length, crc, epoch)
        if metadata is not None:
            md = metadata
        self.storage.write(key, data, md)
        return ChunkRecord(name=key, start_offset=start, length=length, crc32c=crc, epoch=epoch)

    def snapshot(self, epoch: int, next_id: int, *segments: SegmentRecord, at_ms: int = 1) -> None:
        snap = MetadataSnapshot(
            version=1,
            node=NODE,
            epoch=epoch,
            created_at_ms=at_ms,
            container=ContainerSnapshot(version=1, next_segment_id=next_id, segments=segments),
        )
        data = snap.SerializeToString()
        self.storage.write(
            names.snapshot_key(NODE, at_ms, epoch), data, {"crc32c": f"{crc32c.crc32c(data):08x}"}
        )

    async def recover(self) -> Rebuilt:
        return await rebuild_metadata(self.layer, NODE)


def segment(segment_id: int, name: str, *chunks: ChunkRecord, **fields: object) -> SegmentRecord:
    """A snapshot record whose storage length is the end of ``chunks``."""
    end = max((c.start_offset + c.length for c in chunks), default=0)
    base: dict[str, object] = {"length": end, "storage_length": end}
    base.update(fields)
    return SegmentRecord(id=segment_id, name=name, chunks=chunks, **base)  # type: ignore[arg-type]


def by_name(rebuilt: Rebuilt) -> dict[str, SegmentRecord]:
    return {s.name: s for s in rebuilt.container.segments}


def spans(rec: SegmentRecord) -> list[tuple[int, int, int]]:
    return [(c.start_offset, c.start_offset + c.length, c.epoch) for c in rec.chunks]


def ignored(rebuilt: Rebuilt) -> dict[str, str]:
    return dict(rebuilt.report.ignored_chunks)


async def test_without_a_snapshot_segments_come_back_from_chunk_metadata() -> None:
    t2 = Tier2()
    t2.chunk(1, "a/x", 0, 100, 1)
    t2.chunk(1, "a/x", 100, 50, 2)
    t2.chunk(4, "b", 0, 10, 2)
    rebuilt = await t2.recover()
    segs = by_name(rebuilt)
    assert set(segs) == {"a/x", "b"}
    a = segs["a/x"]
    assert (a.id, a.start_offset, a.length, a.storage_length) == (1, 0, 150, 150)
    assert spans(a) == [(0, 100, 1), (100, 150, 2)]
    assert list(a.event_index) == [0] and not a.sealed and not a.attributes
    assert rebuilt.container.next_segment_id == 5
    assert rebuilt.max_epoch == 2
    assert sorted(rebuilt.report.new_segments) == ["a/x", "b"]


async def test_snapshot_plus_newer_chunks() -> None:
    t2 = Tier2()
    a0 = t2.chunk(1, "a", 0, 100, 3)
    s0 = t2.chunk(2, "sealed", 0, 40, 3)
    attrs = [AttributeValue(id=bytes(15) + b"\x01", value=7)]
    t2.snapshot(
        3,
        3,
        segment(1, "a", a0, length=130, attributes=attrs, event_index=[0, 60]),
        segment(2, "sealed", s0, sealed=True, sealed_in_storage=True),
    )
    t2.chunk(1, "a", 100, 80, 3)  # flushed after the snapshot
    t2.chunk(1, "a", 180, 20, 5)  # ...and by a later epoch
    t2.chunk(3, "new", 0, 30, 5)  # created after the snapshot
    rebuilt = await t2.recover()
    segs = by_name(rebuilt)
    a = segs["a"]
    assert spans(a) == [(0, 100, 3), (100, 180, 3), (180, 200, 5)]
    assert (a.length, a.storage_length) == (200, 200)
    assert list(a.attributes) == attrs and list(a.event_index) == [0, 60]
    assert segs["sealed"].sealed and segs["sealed"].sealed_in_storage
    assert segs["new"].length == 30 and segs["new"].id == 3
    assert rebuilt.report.new_segments == ["new"]
    assert rebuilt.report.extended == {"a": 100, "new": 30}
    assert rebuilt.report.snapshot_key.endswith(".e3.snapshot")
    assert rebuilt.container.next_segment_id == 4 and rebuilt.max_epoch == 5


async def test_length_past_the_last_chunk_is_lost_and_reported() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 1)
    t2.snapshot(1, 2, segment(1, "a", c, length=150, event_index=[0, 120]))
    rebuilt = await t2.recover()
    a = by_name(rebuilt)["a"]
    assert (a.length, a.storage_length) == (100, 100)
    assert list(a.event_index) == [0]  # 120 is past the end now
    assert rebuilt.report.lost_bytes == {"a": 50}
    assert any("LOST 50 byte(s)" in line for line in rebuilt.report.summary())


async def test_crashed_epochs_orphan_loses_to_the_next_epochs_chain() -> None:
    """Epoch 5 uploaded [100, 250) and died before journaling it; epoch 6
    uploaded [100, 200) and [200, 400). The newest epoch's chain wins."""
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 4)
    t2.snapshot(4, 2, segment(1, "a", c))
    orphan = t2.chunk(1, "a", 100, 150, 5)
    t2.chunk(1, "a", 100, 100, 6)
    t2.chunk(1, "a", 200, 200, 6)
    rebuilt = await t2.recover()
    assert spans(by_name(rebuilt)["a"]) == [(0, 100, 4), (100, 200, 6), (200, 400, 6)]
    assert "overlaps" in ignored(rebuilt)[orphan.name]


async def test_gaps_stale_epochs_and_bad_metadata_are_ignored() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 2)
    t2.snapshot(2, 2, segment(1, "a", c))
    t2.chunk(1, "a", 100, 50, 7)
    stale = t2.chunk(1, "a", 150, 50, 3)  # older than the chunk before it
    gap = t2.chunk(1, "a", 300, 10, 7)
    md = names.chunk_metadata("a", 999, 5, 0, 7)
    bad = t2.chunk(1, "a", 400, 5, 7, metadata=md)  # offset disagrees with the key
    none = t2.chunk(1, "a", 500, 5, 7, metadata={})
    rebuilt = await t2.recover()
    assert spans(by_name(rebuilt)["a"]) == [(0, 100, 2), (100, 150, 7)]
    why = ignored(rebuilt)
    assert "stale" in why[stale.name]
    assert "after a gap at 150" in why[gap.name]
    assert "disagrees with its key" in why[bad.name]
    assert "lacks" in why[none.name]


async def test_chunks_truncated_or_deleted_after_the_snapshot() -> None:
    t2 = Tier2()
    t1 = t2.chunk(1, "trunc", 0, 100, 1)
    t2b = t2.chunk(1, "trunc", 100, 100, 1)
    d1 = t2.chunk(2, "deleted", 0, 100, 1)
    h1 = t2.chunk(3, "holed", 0, 100, 1)
    h2 = t2.chunk(3, "holed", 100, 100, 1)
    h3 = t2.chunk(3, "holed", 200, 100, 1)
    t2.snapshot(
        1,
        4,
        segment(1, "trunc", t1, t2b, start_offset=50, event_index=[50, 120]),
        segment(2, "deleted", d1),
        segment(3, "holed", h1, h2, h3),
    )
    for gone in (t1, d1, h2):
        t2.storage.delete(gone.name)
    rebuilt = await t2.recover()
    segs = by_name(rebuilt)
    trunc = segs["trunc"]
    assert (trunc.start_offset, trunc.length) == (100, 200)
    assert list(trunc.event_index) == [120]
    assert rebuilt.report.raised_start == {"trunc": 100}
    assert "deleted" not in segs
    assert [n for n, _ in rebuilt.report.dropped] == ["deleted"]
    holed = segs["holed"]
    assert spans(holed) == [(0, 100, 1)] and holed.length == 100
    assert rebuilt.report.lost_bytes == {"holed": 200}
    assert set(rebuilt.report.missing_chunks) == {t1.name, d1.name, h2.name}
    assert "after a hole" in ignored(rebuilt)[h3.name]


async def test_deleted_before_the_snapshot_and_older_garbage_are_not_looked_at() -> None:
    t2 = Tier2()
    c = t2.chunk(2, "live", 0, 100, 4)
    t2.chunk(1, "deleted-long-ago", 0, 100, 4)  # id 1 < next id, not in the snapshot
    t2.chunk(2, "live", 100, 100, 3)  # an orphan of an epoch before the snapshot
    t2.snapshot(4, 3, segment(2, "live", c))
    rebuilt = await t2.recover()
    assert set(by_name(rebuilt)) == {"live"}
    assert by_name(rebuilt)["live"].length == 100
    assert rebuilt.report.chunks_skipped == 2 and rebuilt.report.chunks_examined == 0
    assert t2.storage.calls["stat"] == 1  # the snapshot's own


async def test_a_grown_last_chunk_counts_on_bindings_that_append() -> None:
    t2 = Tier2(supports_append=True)
    c = t2.chunk(1, "a", 0, 100, 2)
    t2.snapshot(2, 2, segment(1, "a", c))
    grown = t2.chunk(1, "a", 0, 160, 2, key=c.name)  # same object, appended to since
    rebuilt = await t2.recover()
    a = by_name(rebuilt)["a"]
    assert a.length == 160 and list(a.chunks) == [grown]
    assert rebuilt.report.extended == {"a": 60}


async def test_a_name_taken_twice_goes_to_the_later_segment() -> None:
    t2 = Tier2()
    old = t2.chunk(1, "x", 0, 100, 1)
    t2.snapshot(1, 2, segment(1, "x", old))
    t2.chunk(2, "x", 0, 10, 1)  # "x" deleted and created again; old chunks not yet deleted
    rebuilt = await t2.recover()
    assert [(s.id, s.name) for s in rebuilt.container.segments] == [(2, "x")]
    assert rebuilt.report.dropped and "created later" in rebuilt.report.dropped[0][1]


async def test_a_corrupt_newest_snapshot_falls_back_to_the_one_before() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 1)
    t2.snapshot(1, 2, segment(1, "a", c), at_ms=1)
    key = names.snapshot_key(NODE, 2, 1)
    t2.storage.write(key, b"garbage", {"crc32c": "00000000"})
    rebuilt = await t2.recover()
    assert rebuilt.report.snapshot_key == names.snapshot_key(NODE, 1, 1)
    assert rebuilt.report.bad_snapshots[0][0] == key
    assert by_name(rebuilt)["a"].length == 100


async def test_max_epoch_includes_snapshot_keys() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 1)
    t2.snapshot(1, 2, segment(1, "a", c))
    t2.storage.write(names.snapshot_key(NODE, 9, 12), b"bad", {})
    assert (await t2.recover()).max_epoch == 12


async def test_nothing_in_tier2_is_an_error() -> None:
    t2 = Tier2()
    t2.storage.write(f"other-node/chunks/1/{0:020d}.e1.{uuid.uuid4().hex}", b"x", {})
    with pytest.raises(NothingToRecover, match="no usable metadata snapshot and no chunk"):
        await t2.recover()


async def test_without_replay_newer_chunks_stay_out() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 1)
    snap = MetadataSnapshot(
        version=1,
        node=NODE,
        epoch=1,
        container=ContainerSnapshot(
            version=1, next_segment_id=2, segments=[segment(1, "a", c, length=300)]
        ),
    )
    t2.chunk(1, "a", 100, 100, 2)
    rebuilt = await rebuild(t2.layer, NODE, snap, replay_chunks=False)
    a = by_name(rebuilt)["a"]
    assert a.length == 100 and rebuilt.report.lost_bytes == {"a": 200}
    assert rebuilt.max_epoch == 2  # never reuse an epoch some chunk carries


async def test_a_sealed_segment_takes_no_chunk_past_its_length() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "s", 0, 100, 1)
    t2.snapshot(1, 2, segment(1, "s", c, sealed=True, sealed_in_storage=True))
    past = t2.chunk(1, "s", 100, 10, 1)
    rebuilt = await t2.recover()
    s = by_name(rebuilt)["s"]
    assert s.length == 100 and s.sealed and s.sealed_in_storage
    assert "past the sealed length 100" in ignored(rebuilt)[past.name]


# -- installing the result as an empty node's first checkpoint ----------------------


async def test_install_starts_an_empty_node_above_the_epochs_seen(tmp_path: pathlib.Path) -> None:
    t2 = Tier2()
    c = t2.chunk(1, "a", 0, 100, 6)
    t2.snapshot(6, 2, segment(1, "a", c, length=120))
    rebuilt = await t2.recover()
    config = make_config(tmp_path)
    # A staging directory left by an import that crashed is never used.
    leftover = config.journal_dir / metadata_io.STAGING
    leftover.mkdir(parents=True)
    (leftover / "00000000000000000001.wal").write_bytes(b"junk")
    epoch = await metadata_io.install(config, rebuilt.container, rebuilt.max_epoch + 1)
    assert epoch == 7 and not leftover.exists()
    assert [f.first_sequence for f in list_files(config.journal_dir)] == [1]
    async with open_node(config, container_type=DirectContainer) as node:
        container = node.container
        assert container.journal is not None and container.journal.epoch == 8
        (seg,) = container.segments()
        assert (seg.name, seg.length, seg.storage_length, len(seg.chunks)) == ("a", 100, 100, 1)
    with pytest.raises(NodeNotEmpty):
        await metadata_io.install(config, rebuilt.container, 1)


def test_snapshot_files_decode_as_protobuf_or_json() -> None:
    snap = MetadataSnapshot(
        version=1,
        node=NODE,
        epoch=3,
        container=ContainerSnapshot(
            version=1,
            next_segment_id=2,
            segments=[SegmentRecord(id=1, name="a", attributes=[AttributeValue(id=b"\x10" * 16)])],
        ),
    )
    assert metadata_io.decode(metadata_io.encode(snap), "f") == snap
    assert metadata_io.decode(metadata_io.encode(snap, as_json=True), "f") == snap
    with pytest.raises(SnapshotInvalid, match="does not decode"):
        metadata_io.decode(b"{nope", "f")
    snap.version = 2
    with pytest.raises(SnapshotInvalid, match="version 2 is unknown"):
        metadata_io.decode(metadata_io.encode(snap), "f")


async def test_a_merge_not_yet_done_in_tier2_survives_a_rebuild_where_it_fits() -> None:
    """A committed transaction whose chunks are still its own: the target's chunks end at
    the merge offset, and its length counts the merged bytes, read from the source."""
    t2 = Tier2()
    p = t2.chunk(1, "p", 0, 100, 1)
    q = t2.chunk(3, "q", 0, 100, 1)
    src = t2.chunk(2, ".txn/aa", 0, 50, 1)
    src2 = t2.chunk(4, ".txn/bb", 0, 30, 1)
    merged = {"sealed": True, "sealed_in_storage": True, "txn_parent": "p"}
    t2.snapshot(
        1,
        5,
        segment(1, "p", p, length=150),
        segment(2, ".txn/aa", src, merged_into=1, merge_offset=100, **merged),
        # q lost bytes below its merge offset (its chunks end at 100, the merge is at 120).
        segment(3, "q", q, length=150, storage_length=120),
        segment(4, ".txn/bb", src2, merged_into=3, merge_offset=120, **merged),
    )
    rebuilt = await t2.recover()
    segs = by_name(rebuilt)
    assert (segs["p"].length, segs["p"].storage_length) == (150, 100)
    assert (segs[".txn/aa"].merged_into, segs[".txn/aa"].merge_offset) == (1, 100)
    assert (segs["q"].length, segs["q"].storage_length) == (100, 100)
    assert segs[".txn/bb"].merged_into == 0  # left uncommitted, to commit again or abort
    assert [name for name, _ in rebuilt.report.dropped] == [".txn/bb"]


async def test_streams_survive_a_rebuild() -> None:
    t2 = Tier2()
    c = t2.chunk(1, "s/000000000001", 0, 10, 1)
    snap = MetadataSnapshot(
        version=1,
        node=NODE,
        epoch=1,
        created_at_ms=1,
        container=ContainerSnapshot(
            version=1,
            next_segment_id=2,
            segments=[segment(1, "s/000000000001", c)],
            streams=[StreamRecord(name="s", roll_size=10, next_number=2)],
        ),
    )
    data = snap.SerializeToString()
    t2.storage.write(names.snapshot_key(NODE, 1, 1), data, {"crc32c": f"{crc32c.crc32c(data):08x}"})
    rebuilt = await t2.recover()
    (stream,) = rebuilt.container.streams
    assert (stream.name, stream.roll_size, stream.next_number) == ("s", 10, 2)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("length", "-5", "length '-5' is not a decimal number"),
        ("length", "1e3", "is not a decimal number"),
        ("crc32c", "zz", "crc32c 'zz' is not 8 hex digits"),
        ("epoch", "٣", "is not a decimal number"),  # a digit, but not ASCII
        ("segment", "../escape", "component '..' is not allowed"),
        ("offset", "9" * 30, "is not a decimal number"),
    ],
)
async def test_malformed_chunk_metadata_is_ignored_saying_why(
    field: str, value: str, why: str
) -> None:
    t2 = Tier2()
    good = t2.chunk(1, "a", 0, 100, 2)
    md = names.chunk_metadata("b", 0, 50, crc32c.crc32c(DATA[:50]), 2)
    md[field] = value
    bad = t2.chunk(2, "b", 0, 50, 2, metadata=md)
    rebuilt = await t2.recover()  # never an exception: the rest comes back
    assert spans(by_name(rebuilt)["a"]) == [(0, 100, 2)] and good.name
    assert "b" not in by_name(rebuilt)
    assert why in ignored(rebuilt)[bad.name]
