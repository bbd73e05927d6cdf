"""The cluster's records in Tier 2, on the in-memory and filesystem bindings (no daemons).

Registry records, name claims and epoch fences: each a few small objects,
checked here for what a node relies on -- exactly one winner of a race,
names free again after a release, a fenced epoch refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Any

import pytest
import trio

from gateway.cluster.claims import NameClaims, claim_key
from gateway.cluster.fence import (
    EpochClaim,
    EpochTaken,
    FenceTimes,
    NodeFenced,
    NodeRunsElsewhere,
    current_epoch,
    read_claim,
    register_epoch,
)
from gateway.cluster.lease import Lease, LeaseLost, claim_epoch
from gateway.cluster.registry import (
    DOWN,
    STOPPED,
    UP,
    Liveness,
    NodeRecord,
    now_ms,
    read_registry,
    write_record,
    write_stopped,
)
from gateway.cluster.remote import MountIds, RemoteNode
from gateway.container.attributes import EVENT_COUNT
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
    MetadataSnapshot,
    SegmentRecord,
    StreamRecord,
)
from gateway.storage.filesystem import FileStorage
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from gateway.storage.object_keys import snapshot_key
from gateway.tier2.snapshots import build_snapshot
from gateway.tier2.untrusted import BadRecord, Rejections
from tests.helpers.wait import async_wait_for


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
    await write_stopped(layer, rec, 4, 0)
    (n1,) = [r for r in await read_registry(layer) if r.id == "n1"]
    assert n1.state == STOPPED and Liveness(15.0).state(n1) == STOPPED


def _doc(**changes: Any) -> bytes:
    doc: dict[str, Any] = {
        "format": 1, "id": "n1", "advertise": "10.0.0.1:9410", "epoch": 3, "version": "1",
        "started_at_ms": 1, "heartbeat_at_ms": 2, "state": "up", "segments": 0,
        "unflushed_bytes": 0, "host": "h", "pid": 7,
    }  # fmt: skip
    doc.update(changes)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (_doc(epoch="5"), "field 'epoch' is str '5', not an integer"),
        (_doc(epoch=5.0), "field 'epoch' is float"),
        (_doc(epoch=True), "field 'epoch' is bool"),
        (_doc(epoch=-1), "field 'epoch' is -1, outside"),
        (_doc(epoch=1 << 70), "outside"),
        (_doc(epoch=...), "field 'epoch' is missing"),
        (_doc(advertise="nowhere"), "field 'advertise'"),
        (_doc(advertise=["x"]), "field 'advertise' is list"),
        (_doc(state="dancing"), "field 'state' is 'dancing'"),
        (_doc(id="n2"), "is not the node its key names"),
        (_doc(format=2), "record format 2"),
        (_doc(pid="7"), "field 'pid'"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b"", "not JSON"),
    ],
)
def test_a_malformed_node_record_is_refused_naming_the_field(data: bytes, why: str) -> None:
    with pytest.raises(BadRecord) as e:
        NodeRecord.decode(data, key_node="n1")
    assert why in str(e.value)


async def test_bad_records_are_skipped_and_reported_once_per_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    await write_record(layer, NodeRecord("good", "h:1", 1, "1", 1, 1, UP), deadline=1.0)
    await layer.write("_cluster/nodes/n1.json", _doc(epoch="5"), {})
    await layer.write("_cluster/nodes/odd", b"x", {})
    rejections = Rejections()
    for _ in range(5):
        records = await read_registry(layer, rejections=rejections)
        assert [r.id for r in records] == ["good"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one per bad object, not one per read
    assert "_cluster/nodes/n1.json" in warnings[0] or "_cluster/nodes/n1.json" in warnings[1]
    assert rejections.total == {"node record": 2} and rejections.bad_now() == {"node record": 2}
    # A new version of the bad object is news; a repaired one is forgotten.
    await layer.write("_cluster/nodes/n1.json", _doc(epoch="6", host="other-host"), {})
    await read_registry(layer, rejections=rejections)
    assert rejections.total == {"node record": 3}
    await layer.write("_cluster/nodes/n1.json", _doc(), {})
    await layer.delete("_cluster/nodes/odd")
    assert [r.id for r in await read_registry(layer, rejections=rejections)] == ["good", "n1"]
    assert rejections.bad_now() == {}


async def test_a_record_rewritten_between_listing_and_read_is_read_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A heartbeat that lands between the listing and the read makes a longer record:
    it is read whole (the new version), not cut to the listed size and refused."""
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    rec = NodeRecord("n1", "h:1", 1, "1", 1, 1, UP, unflushed_bytes=9)
    await write_record(layer, rec, deadline=1.0)
    listed = layer.list

    async def list_then_beat(prefix: str, **kwargs: Any) -> Any:
        objects = await listed(prefix, **kwargs)
        newer = dataclasses.replace(rec, heartbeat_at_ms=2, unflushed_bytes=123456789)
        await write_record(layer, newer, deadline=1.0)
        return objects

    layer.list = list_then_beat  # type: ignore[method-assign]
    rejections = Rejections()
    (got,) = await read_registry(layer, rejections=rejections)
    assert got.heartbeat_at_ms == 2 and got.unflushed_bytes == 123456789
    assert rejections.total == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_liveness_is_by_the_readers_clock() -> None:
    now = [100.0]
    live = Liveness(3.0, clock=lambda: now[0])
    future = NodeRecord("f", "h:1", 1, "1", 1, now_ms() + 3_600_000, UP)
    live.observe(future)
    assert live.state(future) == UP  # placed as fresh at first sight...
    now[0] += 3.5
    live.observe(future)  # ...but a heartbeat that never changes goes stale
    assert live.state(future) == DOWN
    beating = dataclasses.replace(future, heartbeat_at_ms=future.heartbeat_at_ms + 1)
    live.observe(beating)
    assert live.state(beating) == UP and live.age(beating) == 0.0
    old = NodeRecord("o", "h:1", 1, "1", 1, now_ms() - 60_000, UP)
    live.observe(old)
    assert live.state(old) == DOWN and live.age(old) >= 59


def test_a_record_watched_while_the_registry_was_unreadable_proves_nothing() -> None:
    """An S3 outage stops every heartbeat at once: watching starts again after it."""
    now = [100.0]
    live = Liveness(3.0, clock=lambda: now[0])
    silent = NodeRecord("s", "h:1", 1, "1", 1, now_ms(), UP)
    live.observe(silent)
    now[0] += 2.0
    live.blinded()  # this node's own registry read failed here
    now[0] += 2.5
    live.observe(silent)  # read again after the outage: unchanged
    assert live.watched(silent) == 2.5, "counted from the failed read, not the first sight"
    assert live.age(silent) == 4.5  # the state shown stays by the heartbeat's age
    now[0] += 1.0
    assert live.watched(silent) == 3.5
    # A read in progress for longer than slow_read while Tier 2 requests are
    # retried: blind now, and after it; slow with no retry (a busy node): not.
    retries = [0]
    live.retries = lambda: retries[0]
    live.read_started()
    now[0] += 2.0
    assert live.watched(silent) == 5.5
    live.read_done(ok=True)
    assert live.watched(silent) == 5.5
    live.read_started()
    now[0] += 0.5
    retries[0] += 3
    assert live.watched(silent) == 6.0  # retried, but not held up for long yet
    now[0] += 1.0
    assert live.watched(silent) == 0.0
    live.read_done(ok=True)
    assert live.watched(silent) == 0.0
    now[0] += 3.0
    assert live.watched(silent) == 3.0
    live.read_started()
    live.read_done(ok=False)  # a failed read, however quick
    assert live.watched(silent) == 0.0


async def test_a_higher_epoch_fences_a_node_id(layer: ChunkLayer) -> None:
    assert await current_epoch(layer, "n") == 0
    me = EpochClaim.mine("n", 3, "/var/lib/j", 10.0)
    await register_epoch(layer, "n", 3, me)
    await register_epoch(layer, "n", 3, me)  # our own retried registration
    with pytest.raises(EpochTaken, match=r"epoch 3 of node n was registered by another"):
        await register_epoch(layer, "n", 3, EpochClaim.mine("n", 3, "/copy/j", 10.0))
    await register_epoch(layer, "n", 5)  # the takeover
    assert await current_epoch(layer, "n") == 5
    with pytest.raises(NodeFenced, match=r"node n \(epoch 4\) has been taken over by epoch 5"):
        await register_epoch(layer, "n", 4)
    assert await current_epoch(layer, "other") == 0
    claim = await read_claim(layer, "n", 3)
    assert claim is not None and claim.nonce == me.nonce and claim.lease_ms == 10_000


def test_fence_times_trust_what_was_stored_before_the_fence() -> None:
    fences = FenceTimes({3: 100.0, 5: 200.0, 6: 300.0})
    assert fences.current == 6
    assert fences.trusted(3, 150.0) and fences.trusted(3, 200.0)
    assert not fences.trusted(3, 200.5)  # epoch 3 was fenced when 5 registered
    assert not fences.trusted(4, 201.0)  # an epoch that never registered: by the next
    assert fences.trusted(5, 299.0) and not fences.trusted(5, 301.0)
    assert fences.trusted(6, 10**9)  # the current one is never fenced


async def test_the_lease_holds_for_its_duration_after_a_confirmation() -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    now = [10.0]
    lease = Lease("n", 2, 5.0, clock=lambda: now[0])
    assert not lease.held()
    with pytest.raises(LeaseLost, match="not confirmed yet"):
        lease.check()
    await register_epoch(layer, "n", 2)
    await lease.renew(layer, deadline=1.0)
    assert lease.held() and lease.remaining() == 5.0
    now[0] += 4.9
    assert lease.held()
    now[0] += 0.2
    assert not lease.held()
    with pytest.raises(LeaseLost, match=r"cannot confirm in Tier 2 that it still holds epoch 2"):
        lease.check()
    assert lease.refused == 2
    await register_epoch(layer, "n", 3)  # taken over
    await lease.renew(layer, deadline=1.0)
    assert lease.fenced is not None and not lease.held()
    with pytest.raises(NodeFenced):
        lease.check()
    off = Lease("n", 1, 0.0)
    assert off.held() and not off.enabled


async def test_starting_beside_a_running_copy_is_refused(tmp_path: pathlib.Path) -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    kw: dict[str, Any] = {"lease": 0.3, "down_after": 1.0, "heartbeat_interval": 0.1}
    first = await claim_epoch(layer, "n", 1, str(tmp_path / "a"), **kw)
    assert first.held()
    # The same directory on this boot restarting (its lock proves the old
    # process gone): no waiting.
    started = trio.current_time()
    await claim_epoch(layer, "n", 2, str(tmp_path / "a"), **kw)
    assert trio.current_time() - started < 0.3
    # A copy started at the epoch already registered: refused.
    with pytest.raises(EpochTaken, match="is a copy of that node's"):
        await claim_epoch(layer, "n", 2, str(tmp_path / "copy"), **kw)
    # A copy at a new epoch while the original heartbeats: refused too.
    record = NodeRecord("n", "h:1", 2, "1", now_ms(), now_ms(), UP)
    await write_record(layer, record, deadline=1.0)

    async def beat() -> None:
        for i in range(40):
            await trio.sleep(0.05)
            beat_ = dataclasses.replace(record, heartbeat_at_ms=record.heartbeat_at_ms + i + 1)
            await write_record(layer, beat_, deadline=1.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        with pytest.raises(NodeRunsElsewhere, match="heartbeat in Tier 2 is still changing"):
            await claim_epoch(layer, "n", 3, str(tmp_path / "copy"), **kw)
    assert await current_epoch(layer, "n") == 2  # nothing registered, nobody fenced
    # Once it is silent for down_after it is taken for dead; its lease is waited out.
    started = trio.current_time()
    await claim_epoch(layer, "n", 3, str(tmp_path / "copy"), **kw)
    assert trio.current_time() - started >= 0.3 * 1.05 + 0.5


async def test_a_takeover_waits_out_the_old_lease_but_not_the_heartbeat(
    tmp_path: pathlib.Path,
) -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    kw: dict[str, Any] = {"down_after": 30.0, "heartbeat_interval": 0.1}
    await claim_epoch(layer, "n", 4, str(tmp_path / "old"), lease=0.4, **kw)
    now = now_ms()
    await write_record(layer, NodeRecord("n", "h:1", 4, "1", now, now, UP), deadline=1.0)
    started = trio.current_time()
    lease = await claim_epoch(layer, "n", 5, str(tmp_path / "new"), lease=2.0, takeover=True, **kw)
    waited = trio.current_time() - started
    assert 0.4 * 1.05 + 0.5 <= waited < 5  # the old process's lease, not down_after
    assert lease.held()
    claim = await read_claim(layer, "n", 5)
    assert claim is not None and claim.takeover and claim.lease_ms == 0


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

    def serves(self, kind: str) -> bool:
        return False  # a version from before the change feed: listings only


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


async def test_the_moment_the_owner_is_dropped_files_end_at_their_flushed_length() -> None:
    """Before (and without) any Tier-2 read: Tier 2 may be what is down."""

    class Unreachable(ChunkLayer):
        async def list(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("no Tier-2 read is needed to cut the view")

    node = RemoteNode("other", Unreachable(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    events = Events()
    node.watchers.append(events)
    owner = FakeOwner()
    r = owner.create("tail", length=100)
    r.storage_length = 60
    r.chunks.append(ChunkRecord(name="other/chunks/1/x", start_offset=0, length=60))
    owner.create("empty", length=30)
    client: Any = owner
    await node.refresh_live(client)
    node.attach(client, trio.CancelScope())
    assert {s.name: s.length for s in node.segments.values()} == {"tail": 100, "empty": 30}
    node.detach()
    assert {s.name: s.length for s in node.segments.values()} == {"tail": 60, "empty": 0}
    assert ("truncated", "tail") in events.seen and ("truncated", "empty") in events.seen
    tail = node.by_name("tail")
    assert tail is not None and tail.events_unknown and not node.tail_available
    assert await node.read(tail.view(), 60, 10) == b""  # the end of the file as shown


async def test_a_tail_read_whose_connection_goes_away_is_a_tail_unavailable() -> None:
    """The following ended (and closed its connection) while a read used it."""
    node = RemoteNode("other", ChunkLayer(MemoryStorage(), retry_deadline=1.0), None, MountIds())
    owner = FakeOwner()
    owner.create("tail", length=100)
    client: Any = owner
    await node.refresh_live(client)

    async def read(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionLost("127.0.0.1:1", "closed by the client")

    owner.read = read  # type: ignore[attr-defined]
    node.attach(client, trio.CancelScope())
    tail = node.by_name("tail")
    assert tail is not None
    attempts = (lambda: node.read(tail.view(), 10, 10), lambda: node.read_result(tail, 10, 10, 0))
    for attempt in attempts:
        node.attach(client, trio.CancelScope())
        with pytest.raises(GatewayError, match="only on node other, which does not answer"):
            await attempt()
        assert not node.tail_available
        seg = node.by_name("tail")
        assert seg is not None and seg.length == 0  # nothing of it is flushed


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


async def test_a_followers_view_trusts_only_usable_snapshots_stored_before_the_fence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = MemoryStorage()
    layer = ChunkLayer(storage, retry_deadline=1.0)
    node = RemoteNode("other", layer, None, MountIds())

    def snapshot(epoch: int, *names: str) -> bytes:
        container = ContainerSnapshot(version=SNAPSHOT_VERSION, next_segment_id=9)
        for i, name in enumerate(names, 1):
            chunk = ChunkRecord(name=f"other/chunks/{i}/x", start_offset=0, length=10)
            container.segments.append(
                SegmentRecord(id=i, name=name, length=10, storage_length=10, chunks=[chunk])
            )
        return build_snapshot(container, "other", epoch, 1).SerializeToString()

    await layer.write(snapshot_key("other", 1000, 2), snapshot(2, "good"), {})
    await register_epoch(layer, "other", 2)
    await node.refresh_proven(fence_epoch=2)
    assert [s.name for s in node.segments.values()] == ["good"]
    # Newer ones that cannot be used: garbage, a record breaking the
    # invariants, and one that says it is of another epoch than its key.
    await layer.write(snapshot_key("other", 3500, 2), b"\x08garbage", {})
    broken = SegmentRecord(id=5, name="bad/../x", length=1)
    doc = MetadataSnapshot.FromString(snapshot(2, "good", "also"))
    doc.container.segments.append(broken)
    await layer.write(snapshot_key("other", 3000, 2), doc.SerializeToString(), {})
    for _ in range(3):
        await node.refresh_proven(fence_epoch=2)
    assert sorted(s.name for s in node.segments.values()) == ["also", "good"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # once each, not at every refresh
    assert "does not decode" in warnings[0] and "component '..'" in warnings[1]
    # A takeover registers epoch 3; the fenced process (epoch 2) uploads after it.
    await trio.sleep(1.1)  # the fence must be stored in a later second than the upload
    await register_epoch(layer, "other", 3)
    await trio.sleep(1.1)
    await layer.write(snapshot_key("other", 4000, 2), snapshot(2, "zombie"), {})
    await node.refresh_proven(fence_epoch=3)
    assert "zombie" not in {s.name for s in node.segments.values()}
    assert node.rejections.bad_now()["snapshot"] == 2  # the garbage, the zombie's
    assert sorted(s.name for s in node.segments.values()) == ["also", "good"]


async def test_a_view_cut_to_its_flushed_length_does_not_claim_the_event_count() -> None:
    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    node = RemoteNode("other", layer, None, MountIds())
    owner = FakeOwner()
    rec = owner.create("s", length=100)
    rec.attributes.add(id=EVENT_COUNT, value=1000)
    await node.refresh_live(owner)  # type: ignore[arg-type]
    seg = node.by_name("s")
    assert seg is not None and seg.info().event_count == 1000
    await node.refresh_proven()  # the owner is gone: nothing of it is flushed
    seg = node.by_name("s")
    assert seg is not None and seg.length == 0 and seg.info().event_count == -1


async def test_an_unusable_version_of_a_known_record_keeps_the_node_as_it_was() -> None:
    """A node's record overwritten by something unusable (a hand edit, a newer
    version's format) does not make the node vanish or look down at once: the
    last good record stands, and ages like any record that stops changing."""
    from contextlib import asynccontextmanager

    from gateway.cluster.view import ClusterView
    from gateway.config import Config

    @asynccontextmanager
    async def unreachable(address: str) -> Any:
        raise ConnectionLost(address, "not in this test")
        yield

    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    view = ClusterView(Config(), layer, None, unreachable)
    beat = NodeRecord("n2", "127.0.0.1:1", 1, "1", 1, now_ms(), UP)
    await write_record(layer, beat, deadline=1.0)
    async with trio.open_nursery() as nursery:
        view._nursery = nursery
        await view._read_registry_once(1.0)
        assert view.state_of("n2") == UP
        await layer.write("_cluster/nodes/n2.json", _doc(id="n2", format=2), {})
        await view._read_registry_once(1.0)
        assert view.records["n2"] == beat and view.state_of("n2") == UP
        assert view.rejections.bad_now() == {"node record": 1}
        # Gone for good is gone.
        await layer.delete("_cluster/nodes/n2.json")
        await view._read_registry_once(1.0)
        assert "n2" not in view.records and view.state_of("n2") == DOWN
        nursery.cancel_scope.cancel()


async def test_a_drained_process_keeps_serving_until_the_claimant_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drain's claim (``announce``) is acted on once the claimant's process says it
    waits; a takeover's or handback's claim at once; an old claim without the field
    reads as not announcing."""
    from gateway.cluster import handover
    from gateway.cluster.failover import TakeoverClaim, claim_takeover

    layer = ChunkLayer(MemoryStorage(), retry_deadline=1.0)
    # Real time (storage calls run in threads, which a mock clock jumps over).
    monkeypatch.setattr(handover, "ANNOUNCE_WAIT", 2.0)
    claimed: list[tuple[str, float]] = []

    async def watch(node: str, epoch: int) -> None:
        await handover.watch_handover(
            layer,
            node,
            epoch,
            node,
            0.1,
            lambda by, _takeover: claimed.append((by, trio.current_time())),
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, "node-c", 1)
        await claim_takeover(layer, "node-c", 1, "node-b", announce=True)
        await trio.sleep(1.0)
        assert claimed == []  # the claimant's process has not said it waits
        await handover.announce_waiting(layer, "node-c", 1)
        announced = trio.current_time()
        await async_wait_for(lambda: bool(claimed), 2, "the drained process to stop")
        assert [by for by, _ in claimed] == ["node-b"]
        assert claimed[0][1] - announced < 1  # soon, not after ANNOUNCE_WAIT

        # A claim without announce (a handback) is acted on at the next look.
        nursery.start_soon(watch, "node-d", 1)
        await claim_takeover(layer, "node-d", 1, "node-b")
        await async_wait_for(lambda: len(claimed) == 2, 1, "the handed-back process to stop")

        # A claimant that never says it waits: stopped after ANNOUNCE_WAIT anyway.
        nursery.start_soon(watch, "node-e", 1)
        await claim_takeover(layer, "node-e", 1, "node-b", announce=True)
        start = trio.current_time()
        await async_wait_for(lambda: len(claimed) == 3, 6, "the drained process to stop anyway")
        assert claimed[2][1] - start >= handover.ANNOUNCE_WAIT

    old = json.dumps({"format": 1, "node": "n", "epoch": 3, "host": "h", "at_ms": 1,
                      "nonce": "x"}).encode()  # fmt: skip
    assert TakeoverClaim.decode(old).announce is False
