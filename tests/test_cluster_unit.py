"""The cluster's records in Tier 2, on the in-memory and filesystem bindings (no daemons).

Registry records, name claims and epoch fences: each a few small objects,
checked here for what a node relies on -- exactly one winner of a race,
names free again after a release, a fenced epoch refused.
"""

from __future__ import annotations

import pathlib

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
from gateway.errors import SegmentExistsElsewhere, Tier2Error
from gateway.tier2.filesystem import FileStorage
from gateway.tier2.layer import ChunkLayer
from gateway.tier2.memory import MemoryStorage


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
