"""fsck's ``name-claims`` check: claims of this node's names without a segment.

On the filesystem binding (objects aged with ``os.utime``): orphan claims
are found, released with ``--repair`` once older than ``tier2.gc_grace``,
young ones and those of creates in flight are kept; other nodes' claims and
those of live names are left alone. Then one daemon on SeaweedFS: a claim
left behind by a deletion is reported, released by ``--repair``, and fsck
finds nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from gateway.client.sync import SyncClient
from gateway.cluster.claims import NameClaims, claim_key, read_claim, release_orphan
from gateway.config import Tier2Config
from gateway.errors import SegmentExists
from gateway.fsck.checks import CheckRun, Options, Target, check_name_claims
from gateway.fsck.report import CheckDone, Event, Finding
from gateway.protocol.metadata_pb2 import ContainerSnapshot, SegmentRecord, StreamRecord
from gateway.storage.filesystem import FileStorage
from gateway.storage.layer import ChunkLayer
from tests.helpers.daemon import Daemon, run_cli

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedS3
    from gateway.storage.s3 import S3Storage

pytestmark = pytest.mark.timeout(60)

NODE = "n1"
HOUR = 3600.0


@pytest.fixture
def tier2(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "tier2"


@pytest.fixture
def layer(tier2: pathlib.Path) -> ChunkLayer:
    return ChunkLayer(FileStorage(tier2), retry_deadline=1.0)


def age(tier2: pathlib.Path, name: str, seconds: float) -> None:
    """Make the claim on ``name`` ``seconds`` old."""
    t = time.time() - seconds
    os.utime(tier2 / claim_key(name), (t, t))


def claim_exists(tier2: pathlib.Path, name: str) -> bool:
    return (tier2 / claim_key(name)).exists()


def target(
    layer: ChunkLayer,
    segments: list[str],
    streams: list[str] = [],  # noqa: B006 -- never changed
    *,
    online: bool = False,
    guard: NameClaims | None = None,
) -> Target:
    snap = ContainerSnapshot(
        segments=[SegmentRecord(name=n) for n in segments],
        streams=[StreamRecord(name=n) for n in streams],
    )
    return Target(
        online=online,
        node=NODE,
        tier2=Tier2Config(url="file:///unused", gc_grace=HOUR, retry_deadline=1.0),
        snapshot=lambda: snap,
        read_index=None,
        layer=layer,
        store=None,
        chunks_now=dict,
        name_claims=guard,
    )


async def check(t: Target, repair: bool = False) -> tuple[list[Finding], CheckDone]:
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    await check_name_claims(t, CheckRun("name-claims", sink, Options(repair=repair)))
    done = events.pop()
    assert isinstance(done, CheckDone) and not done.skipped, done
    assert all(isinstance(e, Finding) for e in events)
    return [e for e in events if isinstance(e, Finding)], done


async def test_orphan_claims_are_found_and_only_old_ones_released(
    layer: ChunkLayer, tier2: pathlib.Path
) -> None:
    mine = NameClaims(layer, NODE, 3)
    other = NameClaims(layer, "n2", 1)
    for name in ("live/a", "clicks", "gone/old", "gone/young"):
        await mine.claim(name)
    await other.claim("theirs")
    for name in ("live/a", "clicks", "gone/old", "theirs"):
        age(tier2, name, 2 * HOUR)
    t = target(layer, ["live/a", ".txn/n1/00ff"], ["clicks"])

    found, done = await check(t)
    assert [(f.segment, f.problem, f.repaired) for f in found] == [
        ("gone/old", True, False),
        ("gone/young", True, False),
    ]
    assert "between a deletion and its release" in found[0].message
    assert "5 name claim(s) listed: 2 of names here, 2 other(s) of this node, 1 of other" in (
        done.detail
    )

    found, _ = await check(t, repair=True)
    assert [(f.segment, f.repaired, f.action) for f in found] == [
        ("gone/old", True, "released"),
        ("gone/young", False, found[1].action),
    ]
    assert "kept: younger than tier2.gc_grace" in found[1].action
    assert "in flight" in found[1].action
    assert not claim_exists(tier2, "gone/old")
    for name in ("live/a", "clicks", "gone/young", "theirs"):
        assert claim_exists(tier2, name), name
    assert await other.owner("theirs") == "n2"

    # Older than the grace, the young one goes too; then fsck finds nothing.
    age(tier2, "gone/young", 2 * HOUR)
    found, _ = await check(t, repair=True)
    assert [(f.segment, f.repaired) for f in found] == [("gone/young", True)]
    assert (await check(t, repair=True))[0] == []
    # The released names are free for any node again.
    await other.claim("gone/old")
    assert await mine.owner("gone/old") == "n2"


async def test_a_claim_of_a_newer_format_is_left_alone_even_by_repair(
    layer: ChunkLayer, tier2: pathlib.Path
) -> None:
    """A newer version's claim naming this node: a note, never a problem or a release;
    and its name is still held for creates."""
    key = claim_key("gone/future")
    body = {"format": 99, "name": "gone/future", "node": NODE, "epoch": 1}
    await layer.write(key, json.dumps(body).encode(), {})
    age(tier2, "gone/future", 2 * HOUR)
    found, _ = await check(target(layer, []), repair=True)
    assert [(f.problem, f.repaired) for f in found] == [(False, False)], found
    assert "format 99, newer than this version's 1" in found[0].message
    assert "left alone" in found[0].message
    assert claim_exists(tier2, "gone/future")
    assert await NameClaims(layer, "n2", 1).owner("gone/future") == NODE


async def test_online_young_claims_and_creates_in_flight_are_notes_and_kept(
    layer: ChunkLayer, tier2: pathlib.Path
) -> None:
    guard = NameClaims(layer, NODE, 3)
    await guard.claim("young")
    await guard.claim("creating", hold=True)  # not settled: its create is in flight
    age(tier2, "creating", 2 * HOUR)  # an old claim reused by a new create
    t = target(layer, [], online=True, guard=guard)
    found, _ = await check(t, repair=True)
    assert [(f.segment, f.problem) for f in found] == [("creating", False), ("young", False)]
    assert all("in flight" in f.message for f in found)
    assert claim_exists(tier2, "creating") and claim_exists(tier2, "young")
    guard.settle("creating")  # ... and it failed: now an orphan
    found, _ = await check(t, repair=True)
    assert [(f.segment, f.problem, f.repaired) for f in found] == [
        ("creating", True, True),
        ("young", False, False),
    ]
    assert not claim_exists(tier2, "creating")


async def test_a_claim_that_changed_or_came_alive_is_not_released(
    layer: ChunkLayer, tier2: pathlib.Path
) -> None:
    mine = NameClaims(layer, NODE, 3)
    await mine.claim("x")
    info = (await layer.list(claim_key("x")))[0]
    seen = await read_claim(layer, info.key, info.mtime, 1.0)
    assert seen is not None and seen.node == NODE and seen.name == "x"
    assert await release_orphan(layer, seen, lambda n: n == "x") == (
        "the name is a segment or stream now"
    )
    # Released and claimed again by a later epoch of the node: not the claim read.
    await layer.delete(claim_key("x"))
    await NameClaims(layer, NODE, 4).claim("x")
    assert await release_orphan(layer, seen, lambda n: False) == "it changed since it was read"
    assert claim_exists(tier2, "x")
    body = json.loads((tier2 / claim_key("x")).read_bytes())
    assert body["epoch"] == 4


async def test_a_release_keeps_a_claim_that_a_pipelined_create_holds(layer: ChunkLayer) -> None:
    """Delete then create of one name, pipelined: the create claims before the
    deletion's release runs; the release must leave that claim alone."""
    claims = NameClaims(layer, NODE, 3)
    await claims.claim("again", hold=True)
    claims.settle("again")  # created, then deleted ...
    await claims.claim("again", hold=True)  # ... and created again before the release ran
    await claims.release("again")
    assert await claims.owner("again") == NODE
    assert claims.unreleased == {"again"}  # decided once the create is answered
    claims.settle("again")
    await claims.retry_releases(lambda name: True)  # it was created: the claim is its
    assert await claims.owner("again") == NODE and claims.unreleased == set()
    # The same, but the create failed: released then.
    await claims.claim("again", hold=True)
    await claims.release("again")
    claims.settle("again")
    await claims.retry_releases(lambda name: False)
    assert await claims.owner("again") is None and claims.unreleased == set()


async def test_against_a_snapshot_nothing_is_released(
    layer: ChunkLayer, tier2: pathlib.Path
) -> None:
    """The journal is corrupt: the newest Tier-2 snapshot's names are all fsck knows."""
    mine = NameClaims(layer, NODE, 3)
    for name in ("before", "after"):
        await mine.claim(name)
    age(tier2, "before", 3 * HOUR)
    age(tier2, "after", 2 * HOUR)
    t = target(layer, [])
    t.basis, t.basis_time = "snapshot n1/meta/x", time.time() - 2.5 * HOUR
    found, done = await check(t, repair=True)
    assert [(f.segment, f.problem, f.repaired) for f in found] == [
        ("after", False, False),  # claimed after the snapshot: the journal may name it
        ("before", True, False),
    ]
    assert "not released: the journal is corrupt" in found[1].action
    assert done.detail.endswith(", per snapshot n1/meta/x")
    assert claim_exists(tier2, "before") and claim_exists(tier2, "after")


async def test_embedded_tier2_claims_nothing_and_the_check_says_so(layer: ChunkLayer) -> None:
    t = target(layer, [])
    t.tier2 = Tier2Config(url="embedded")
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    await check_name_claims(t, CheckRun("name-claims", sink, Options()))
    (done,) = events
    assert isinstance(done, CheckDone) and "embedded" in done.skipped


# -- a daemon on SeaweedFS ------------------------------------------------------------


def daemon_config(data_dir: pathlib.Path, bucket: str, endpoint: str, grace: str) -> str:
    return (
        f'[node]\nid = "{NODE}"\ndata_dir = "{data_dir}"\n'
        f'[tier2]\nurl = "s3://{bucket}/claims"\nendpoint_url = "{endpoint}"\n'
        f'gc_grace = "{grace}"\ngc_interval = "1h"\nsnapshot_interval = "0s"\n'
    )


def fsck(daemon: Daemon, env: dict[str, str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    r = run_cli("--config", str(daemon.config_path), "fsck", "--json", *args, timeout=120, env=env)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines and "summary" in lines[-1], (r.returncode, r.stdout, r.stderr)
    return r.returncode, [f for f in lines[:-1] if f["check"] == "name-claims"]


@pytest.fixture
def s3_env(seaweedfs: EmbeddedS3) -> Iterator[dict[str, str]]:
    yield {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_claim_left_by_a_deletion_is_released_by_fsck_repair(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage, s3_env: dict[str, str]
) -> None:
    data_dir = tmp_path / "node"
    key = f"claims/{claim_key('sensors/gone')}"

    def start(grace: str) -> Daemon:
        config = daemon_config(data_dir, s3_storage.bucket, seaweedfs.endpoint_url, grace)
        daemon = Daemon(data_dir, config, env=s3_env)
        daemon.start()
        return daemon

    daemon = start("1h")
    try:
        with SyncClient(daemon.address) as c:
            c.create("sensors/kept")
            c.create("sensors/gone")
            body = s3_storage.read(key, 0, 1 << 16)
            c.delete("sensors/gone")
            assert claim_exists_s3(s3_storage, key) is False
            # The node died between the deletion and the release: the claim is back.
            s3_storage.write(key, body, {"node": NODE})
            with pytest.raises(SegmentExists):
                c.create("sensors/kept")
        # Young: a create may be in flight; a note, and it stays.
        code, found = fsck(daemon, s3_env, "--repair", "--connect", daemon.address)
        assert code == 0, found
        (note,) = found
        assert note["severity"] == "note" and "in flight" in note["message"]
        assert note["segment"] == "sensors/gone"
        assert claim_exists_s3(s3_storage, key)
        assert daemon.stop() == 0, daemon.log()

        # tier2.gc_grace 0 s: the claim is old enough to go.
        daemon = start("0s")
        code, found = fsck(daemon, s3_env, "--connect", daemon.address)
        assert code == 2, found
        (problem,) = found
        assert problem["severity"] == "problem" and problem["segment"] == "sensors/gone"
        assert problem["key"] == key.removeprefix("claims/") and not problem["repaired"]
        code, found = fsck(daemon, s3_env, "--repair", "--connect", daemon.address)
        assert code == 1, found
        assert [f["action"] for f in found] == ["released"]
        assert not claim_exists_s3(s3_storage, key)
        code, found = fsck(daemon, s3_env, "--connect", daemon.address)
        assert (code, found) == (0, [])
        # The name is free again; the live segment's claim stayed.
        with SyncClient(daemon.address) as c:
            c.create("sensors/gone")
            with pytest.raises(SegmentExists):
                c.create("sensors/kept")
            c.delete("sensors/gone")
        assert daemon.stop() == 0, daemon.log()

        # Offline (the daemon stopped) the same, with the journal's metadata.
        s3_storage.write(key, body, {"node": NODE})
        code, found = fsck(daemon, s3_env)
        assert code == 2 and [f["segment"] for f in found] == ["sensors/gone"], found
        code, found = fsck(daemon, s3_env, "--repair")
        assert code == 1 and [f["action"] for f in found] == ["released"], found
        assert not claim_exists_s3(s3_storage, key)
        assert claim_exists_s3(s3_storage, f"claims/{claim_key('sensors/kept')}")
        code, found = fsck(daemon, s3_env)
        assert (code, found) == (0, [])
    finally:
        daemon.kill()


def claim_exists_s3(storage: S3Storage, key: str) -> bool:
    return any(o.key == key for o in storage.list(key))
