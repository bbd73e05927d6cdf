"""The cluster's records in Tier 2, on the in-memory and filesystem bindings (no daemons).

Registry records, name claims and epoch fences: each a few small objects,
checked here for what a node relies on -- exactly one winner of a race,
names free again after a release, a fenced epoch refused.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import pytest
import trio

from gateway.cluster.claims import NameClaims, claim_key
from gateway.cluster.fence import NodeFenced, current_epoch, register_epoch
from gateway.cluster.registry import (
    DOWN,
    STOPPED,
    UP,
    NodeRecord,
    read_registry,
    write_record,
    write_stopped,
)
from gateway.cluster.remote import MountIds, RemoteNode
from gateway.container.results import SegmentInfo
from gateway.container.segment import Segment
from gateway.container.table import SNAPSHOT_VERSION
from gateway.errors import (
    ConnectionLost,
    GatewayError,
    SegmentExistsElsewhere,
    SegmentNotFound,
    Tier2Error,
)
from gateway.protocol.metadata_pb2 import (
    ChunkRecord,
    ContainerSnapshot,
    SegmentRecord,
    StreamRecord,
)
from gateway.tier2.filesystem import FileStorage
from gateway.tier2.layer import ChunkLayer
from gateway.tier2.memory import MemoryStorage
from gateway.tier2.names import snapshot_key
from gateway.tier2.snapshots import build_snapshot


@pytest.fixture(params=["memory", "file"])
def layer(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> ChunkLayer:
    if request.param == "memory":
        return ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    return ChunkLayer(FileStorage(tmp_path / "tier2"), retry_deadline=1.0)


async def test_write_if_absent_creates_once(layer: ChunkLayer) -> None:
    assert await layer.write_if_absent("_cluster/x", b"first", {"node": "a"})
    assert not await layer.write_if_absent("_cluster/x", b"second", {"node": "b"})
    assert await layer.read("_cluster/x", 0, 100) == b"first"
    await layer.delete("_cluster/x")
    assert await layer.write_if_absent("_cluster/x", b"third", {})
    assert await layer.read("_cluster/x", 0, 100) == b"third"


async def test_racing_claims_have_exactly_one_winner(layer: ChunkLayer) -> None:
    nodes = [NameClaims(layer, f"n{i}", 1, address_of=lambda n: f"{n}:1") for i in range(5)]
    outcomes: dict[str, BaseException | None] = {}

    async def claim(c: NameClaims) -> None:
        try:
            await c.claim("a/contested")
            outcomes[c.node_id] = None
        except SegmentExistsElsewhere as e:
            outcomes[c.node_id] = e

    async with trio.open_nursery() as nursery:
        for c in nodes:
            nursery.start_soon(claim, c)
    winners = [n for n, e in outcomes.items() if e is None]
    assert len(winners) == 1
    for e in outcomes.values():
        if e is not None:
            assert isinstance(e, SegmentExistsElsewhere)
            assert e.owner == winners[0] and e.owner_address == f"{winners[0]}:1"
    # The winner's claim is its own to use again (a retried create).
    winner = next(c for c in nodes if c.node_id == winners[0])
    await winner.claim("a/contested")
    # Released, the name is anyone's.
    loser = next(c for c in nodes if c.node_id != winners[0])
    await loser.release("a/contested")  # not its claim: nothing happens
    assert await winner.owner("a/contested") == winner.node_id
    await winner.release("a/contested")
    assert await winner.owner("a/contested") is None
    await loser.claim("a/contested")
    assert await winner.owner("a/contested") == loser.node_id


async def test_claims_of_segments_from_before_claims(layer: ChunkLayer) -> None:
    # Two nodes made "shared" before names were claimed: the first to start keeps it.
    a, b = NameClaims(layer, "a", 1), NameClaims(layer, "b", 1)
    assert await a.claim_existing(["mine/1", "mine/2", "shared"]) == []
    assert await b.claim_existing(["theirs", "shared"]) == [("shared", "a")]
    assert await a.owner("mine/1") == "a" and await b.owner("theirs") == "b"
    keys = {o.key for o in await layer.list("_cluster/names/")}
    assert keys == {claim_key(n) for n in ("mine/1", "mine/2", "shared", "theirs")}


async def test_failed_release_is_retried(layer: ChunkLayer) -> None:
    claims = NameClaims(layer, "a", 1, deadline=0.2)
    await claims.claim("gone")
    storage = layer.storage
    if isinstance(storage, MemoryStorage):
        storage.fail_next(1, Tier2Error("injected"), ops={"read"})
        await claims.release("gone")
        assert claims.unreleased == {"gone"}
        await claims.retry_releases(lambda name: False)
    else:
        await claims.release("gone")
    assert claims.unreleased == set()
    assert await claims.owner("gone") is None


async def test_registry_records(layer: ChunkLayer) -> None:
    rec = NodeRecord("n1", "10.0.0.1:9410", 3, "0.1.0", 1000, 5000, UP, segments=4)
    await write_record(layer, rec, deadline=1.0)
    await write_record(layer, NodeRecord("n2", "h:2", 1, "0.1.0", 1, 1, UP), deadline=1.0)
    await layer.write("_cluster/nodes/bad.json", b"{not json", {})
    records = await read_registry(layer)
    assert [r.id for r in records] == ["n1", "n2"]
    assert records[0] == rec
    assert rec.state_at(5000 + 14_000, 15.0) == UP
    assert rec.state_at(5000 + 16_000, 15.0) == DOWN
    await write_stopped(layer, rec, 4, 0)
    (n1,) = [r for r in await read_registry(layer) if r.id == "n1"]
    assert n1.state_at(10**15, 15.0) == STOPPED


async def test_a_higher_epoch_fences_a_node_id(layer: ChunkLayer) -> None:
    assert await current_epoch(layer, "n") == 0
    await register_epoch(layer, "n", 3)
    await register_epoch(layer, "n", 3)  # a restart at the same epoch is not a takeover
    await register_epoch(layer, "n", 5)  # the takeover
    assert await current_epoch(layer, "n") == 5
    with pytest.raises(NodeFenced, match=r"node n \(epoch 4\) has been taken over by epoch 5"):
        await register_epoch(layer, "n", 4)
    assert await current_epoch(layer, "other") == 0


class FakeOwner:
    """Another node as `RemoteNode.refresh_live` sees it: a listing and records."""

    def __init__(self) -> None:
        self.records: dict[str, SegmentRecord] = {}
        self.next_id = 1
        #: Names of its streams.
        self.streams: list[str] = []

    def create(self, name: str, length: int = 0, sealed: bool = False) -> SegmentRecord:
        r = SegmentRecord(id=self.next_id, name=name, length=length, sealed=sealed)
        self.next_id += 1
        self.records[name] = r
        return r

    async def list(self, prefix: str = "", local_only: bool = False) -> list[SegmentInfo]:
        assert local_only
        return [Segment.from_record(r).info() for r in self.records.values()]

    async def record(self, name: str) -> SegmentRecord:
        if name not in self.records:
            raise SegmentNotFound(name)
        return self.records[name]

    async def stream_names(self) -> list[str]:
        return sorted(self.streams)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_created(self, seg: Segment) -> None:
        self.seen.append(("created", seg.name))

    def on_sealed(self, seg: Segment) -> None:
        self.seen.append(("sealed", seg.name))

    def on_truncated(self, seg: Segment) -> None:
        self.seen.append(("truncated", seg.name))

    def on_deleted(self, seg: Segment) -> None:
        self.seen.append(("deleted", seg.name))

    def on_stream_created(self, name: str) -> None:
        self.seen.append(("stream created", name))

    def on_stream_deleted(self, name: str) -> None:
        self.seen.append(("stream deleted", name))


async def test_a_remote_view_follows_churn_and_stays_bounded() -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    ids = MountIds()
    node = RemoteNode("other", layer, None, ids)
    events = Events()
    node.watchers.append(events)
    owner = FakeOwner()
    client: Any = owner
    keep = owner.create("keep", length=10)
    for round_ in range(50):
        for i in range(20):
            owner.create(f"churn/{round_}/{i}", length=i)
        await node.refresh_live(client)
        for i in range(20):
            del owner.records[f"churn/{round_}/{i}"]
        await node.refresh_live(client)
    assert [s.name for s in node.segments.values()] == ["keep"]
    assert len(ids._ids) == 1  # what a month of churn leaves behind: the live ones
    assert events.seen.count(("created", "keep")) == 1
    assert len([e for e in events.seen if e[0] == "created"]) == 1 + 50 * 20
    assert len([e for e in events.seen if e[0] == "deleted"]) == 50 * 20
    # A deleted name created again is a new file (a new id), never its old self.
    mount_id = node.by_name("keep").id  # type: ignore[union-attr]
    del owner.records["keep"]
    owner.create("keep", length=3)
    await node.refresh_live(client)
    again = node.by_name("keep")
    assert again is not None and again.id != mount_id and again.length == 3
    assert keep.id != owner.records["keep"].id


async def test_without_the_owner_files_end_at_their_flushed_length() -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    node = RemoteNode("other", layer, None, MountIds())
    events = Events()
    node.watchers.append(events)

    def record(rid: int, name: str, length: int, flushed: int, sealed: bool) -> SegmentRecord:
        chunks = [ChunkRecord(name=f"other/chunks/{rid}/x", start_offset=0, length=flushed)]
        return SegmentRecord(id=rid, name=name, length=length, storage_length=flushed,
                             sealed=sealed, sealed_in_storage=sealed and flushed == length,
                             chunks=chunks if flushed else [])  # fmt: skip

    container = ContainerSnapshot(
        version=SNAPSHOT_VERSION,
        next_segment_id=4,
        segments=[
            record(1, "whole", 100, 100, True),
            record(2, "tail", 100, 60, False),
            record(3, "sealed-not-flushed", 100, 40, True),
        ],
    )
    for epoch, at in ((2, 1000), (1, 5000)):  # the newer key of an older epoch: a zombie's
        snap = build_snapshot(container, "other", epoch, at)
        if epoch == 1:
            del snap.container.segments[:]
        key = snapshot_key("other", at, epoch)
        await layer.write(key, snap.SerializeToString(), {})
    await node.refresh_proven()
    got = {s.name: (s.length, s.sealed) for s in node.segments.values()}
    assert got == {"whole": (100, True), "tail": (60, False), "sealed-not-flushed": (40, False)}
    assert not node.tail_available
    tail = node.by_name("tail")
    assert tail is not None
    assert await node.read(tail.view(), 60, 10) == b""  # the end of the file as shown
    # A reader still holding the owner's longer view: refused at once, never a hang.
    with pytest.raises(GatewayError, match="only on node other, which does not answer"):
        await node.read(dataclasses.replace(tail.view(), length=100), 60, 10)


async def test_a_remote_view_shows_the_owners_streams_with_or_without_segments() -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    node = RemoteNode("other", layer, None, MountIds())
    events = Events()
    node.watchers.append(events)
    owner = FakeOwner()
    owner.streams = ["logs"]
    await node.refresh_live(owner)  # type: ignore[arg-type]
    assert node.streams == {"logs"} and events.seen == [("stream created", "logs")]
    owner.create("logs/000000000001", length=3)
    owner.streams.append("empty")
    await node.refresh_live(owner)  # type: ignore[arg-type]
    assert node.streams == {"logs", "empty"}
    owner.streams.remove("logs")
    del owner.records["logs/000000000001"]
    await node.refresh_live(owner)  # type: ignore[arg-type]
    assert node.streams == {"empty"}
    assert events.seen[-2:] == [("deleted", "logs/000000000001"), ("stream deleted", "logs")]
    # Without the owner: the streams its newest snapshot holds, and those already known.
    container = ContainerSnapshot(
        version=SNAPSHOT_VERSION, next_segment_id=1, streams=[StreamRecord(name="snapped")]
    )
    snap = build_snapshot(container, "other", 1, 1000)
    await layer.write(snapshot_key("other", 1000, 1), snap.SerializeToString(), {})
    await node.refresh_proven()
    assert node.streams == {"empty", "snapped"}
    assert events.seen[-1] == ("stream created", "snapped")


async def test_a_connection_lost_mid_refresh_is_raised_as_itself() -> None:
    # Not as an exception group: the follower catches GatewayError and falls
    # back to Tier 2 (a group would have ended the daemon).
    node = RemoteNode("other", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = FakeOwner()
    for i in range(3):
        owner.create(f"s{i}", length=i)

    async def lost(name: str) -> SegmentRecord:
        raise ConnectionLost("127.0.0.1:1", "reset by peer")

    owner.record = lost  # type: ignore[method-assign]
    with pytest.raises(ConnectionLost):
        await node.refresh_live(owner)  # type: ignore[arg-type]


async def test_claiming_older_segments_raises_a_tier2_failure_as_itself() -> None:
    storage = MemoryStorage()
    claims = NameClaims(ChunkLayer(storage, retry_deadline=0.1), "a", 1, deadline=0.1)
    storage.fail_next(1, Tier2Error("injected"), ops={"write"})
    with pytest.raises(Tier2Error, match="injected"):
        await claims.claim_existing(["x", "y"])
