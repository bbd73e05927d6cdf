"""Tier-2 metadata snapshots as a whole one and cumulative deltas of it (issue 33:
a node of a million sleeping segments must not upload them all each minute).

The encoder (memory journal): base + newest delta decodes to exactly the
committed view. The storage writer over a filesystem binding: which uploads
are deltas, what is kept, and every reader -- recovery's `newest_snapshot`,
`rebuild_metadata`, another node's proven view -- reading base + delta, and
falling back past a bad or untrusted delta.
"""

from __future__ import annotations

import pathlib
import random

import pytest

from gateway.cluster.remote import MountIds, RemoteNode
from gateway.container.table import KEEP_DELETIONS
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.metadata_pb2 import ContainerSnapshot, MetadataSnapshot
from gateway.recovery.rebuild import RebuildReport, rebuild_metadata
from gateway.storage import object_keys as names
from gateway.storage.filesystem import FileStorage
from gateway.storage.layer import ChunkLayer
from gateway.tier2.snapshot_store import newest_snapshot
from gateway.tier2.snapshots import SnapshotEncoder, apply_delta, check_delta
from tests.helpers.inprocess import running
from tests.helpers.wait import async_wait_for
from tests.test_rolling_checkpoints import flush, start
from tests.test_tier2_writer import tier2_config

pytestmark = pytest.mark.timeout(60)


def view(snap: ContainerSnapshot) -> tuple[object, ...]:
    """What a reader gets of a container snapshot (records in any order)."""
    return (
        sorted(r.SerializeToString() for r in snap.segments),
        sorted(s.name for s in snap.streams),
        snap.next_segment_id,
        snap.partial,
        list(snap.deleted_ids),
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_whole_snapshot_and_its_newest_delta_are_the_committed_view(seed: int) -> None:
    rng = random.Random(seed)
    c = start(MemoryJournal())
    live = [f"s{i:03d}" for i in range(200)]
    for n, name in enumerate(live):
        await c.create(name)
        await c.append(name, b"x" * 10)
        await flush(c, name, n)
        if n % 2:
            await c.seal(name)
    encoder = SnapshotEncoder()
    assert encoder.capture_delta(c) is None  # no base yet
    head, records = encoder.capture(c)
    base_bytes = SnapshotEncoder.encode(head, records, "node-1", 3, 1000)
    base = MetadataSnapshot.FromString(base_bytes)
    encoder.based("node-1/meta/base", c.applied_seq, len(base_bytes))
    deltas = 0
    for round_ in range(8):
        for name in rng.sample(live, 3):
            await c.append(name, b"y") if not c.info(name).sealed else await c.truncate(name, 2)
        victim = live.pop(rng.randrange(len(live)))
        await c.delete(victim)
        live.append(f"n{round_}")
        await c.create(live[-1])
        await c.create_stream(f"stream{round_}", {})
        found = encoder.capture_delta(c)
        if found is None:
            break  # past DELTA_SHARE: a whole one is due
        deltas += 1
        at_ms = 2000 + round_
        data = SnapshotEncoder.encode(*found, "node-1", 3, at_ms, "node-1/meta/base", deltas)
        delta = MetadataSnapshot.FromString(data)
        check_delta(delta, "node-1/meta/base", base, "the delta")
        # Cumulative: the changed records since the base, not since the last delta.
        assert len(delta.container.segments) <= 4 * (round_ + 1)
        assert delta.container.deleted_ids
        merged = apply_delta(base, delta)
        assert view(merged.container) == view(c.committed_snapshot())
        assert (merged.delta_of, merged.created_at_ms) == ("", 2000 + round_)
    assert deltas >= 4
    # Another base's delta, or a whole snapshot, is not a delta of this base.
    with pytest.raises(Exception, match="not a delta of"):
        check_delta(delta, "node-1/meta/other", base, "the delta")
    with pytest.raises(Exception, match="it is not a delta"):
        check_delta(base, "node-1/meta/base", base, "the base")


async def test_no_delta_once_the_change_log_no_longer_reaches_the_base() -> None:
    c = start(MemoryJournal())
    for i in range(10):
        await c.create(f"s{i}")
    encoder = SnapshotEncoder()
    encoder.capture(c)
    encoder.based("k", c.applied_seq, 1 << 30)
    await c.append("s1", b"x")
    assert encoder.capture_delta(c) is not None
    c._table.changes_floor = c.applied_seq  # as after KEEP_DELETIONS deletions
    assert KEEP_DELETIONS and encoder.capture_delta(c) is None


async def test_the_writer_uploads_deltas_keeps_few_and_readers_use_the_newest(
    tmp_path: pathlib.Path,
) -> None:
    storage = FileStorage(tmp_path / "tier2")
    layer = ChunkLayer(storage, retry_deadline=1.0)
    # One snapshot after the first flush, by itself; the rest are asked for.
    config = tier2_config(tmp_path, snapshots_kept=2, snapshot_interval="1h")
    async with running(config, storage) as (c, writer):
        for i in range(100):
            await c.create(f"s{i:03d}")
            await c.append(f"s{i:03d}", b"x" * 100)
        await c.flush("")
        await async_wait_for(lambda: writer.housekeeping.snapshots == 1, 10, "the first")
        (first,) = [o.key for o in storage.list(names.meta_prefix("node-1"))]
        base = await writer.upload_snapshot(whole=True)
        assert names.parse_snapshot_key(base) is not None
        keys = []
        for i in range(4):
            await c.append(f"s{i:03d}", b"more")
            await c.flush("")
            keys.append(await writer.upload_snapshot())
        assert keys == [names.delta_key(base, n) for n in range(1, 5)]
        assert writer.housekeeping.snapshot_uploads["delta"] == 4
        stored = sorted(o.key for o in storage.list(names.meta_prefix("node-1")))
        assert stored == sorted([first, base, keys[2], keys[3]])  # the two newest deltas
        report = RebuildReport()
        found = await newest_snapshot(layer, "node-1", report)
        assert found is not None and found[0] == keys[3] and not report.bad_snapshots
        assert view(found[1].container) == view(c.committed_snapshot())
        # The newest delta unreadable: the one before it, and the reason said.
        storage.write(keys[3], b"not a snapshot", {})
        report = RebuildReport()
        found = await newest_snapshot(layer, "node-1", report)
        assert found is not None and found[0] == keys[2]
        assert [k for k, _ in report.bad_snapshots] == [keys[3]]
        assert found[1].container.segments  # the base's records with the delta's
        lengths = {r.name: r.length for r in found[1].container.segments}
        assert lengths["s000"] == lengths["s002"] == 104 and lengths["s003"] == 100
        # Deltas that stopped paying for themselves: a whole one again, and the
        # deltas of a base no longer kept go with it.
        for i in range(60):
            await c.append(f"s{i:03d}", b"much more")
        await c.flush("")
        again = await writer.upload_snapshot()
        assert names.parse_snapshot_key(again) is not None
        nothing = await writer.upload_snapshot()  # nothing changed: a delta of nothing
        assert nothing == names.delta_key(again, 1)
        stored = sorted(o.key for o in storage.list(names.meta_prefix("node-1")))
        assert stored == sorted([base, keys[2], keys[3], again, nothing])  # two whole ones kept
        for i in range(60, 100):
            await c.append(f"s{i:03d}", b"much more")
        await c.flush("")
        newest = await writer.upload_snapshot()
        assert names.parse_snapshot_key(newest) is not None
        stored = sorted(o.key for o in storage.list(names.meta_prefix("node-1")))
        assert stored == sorted([again, nothing, newest])  # the oldest base went with its deltas
        want = c.committed_snapshot()
    # Disaster recovery from Tier 2 alone reads the whole one and its delta.
    rebuilt = await rebuild_metadata(layer, "node-1")
    got = {r.name: r.length for r in rebuilt.container.segments}
    assert got == {r.name: r.length for r in want.segments}


async def test_another_nodes_proven_view_reads_base_and_newest_delta(
    tmp_path: pathlib.Path,
) -> None:
    storage = FileStorage(tmp_path / "tier2")
    layer = ChunkLayer(storage, retry_deadline=1.0)
    async with running(tier2_config(tmp_path, snapshot_interval="1h"), storage) as (c, writer):
        for i in range(50):
            await c.create(f"s{i:02d}")
            await c.append(f"s{i:02d}", b"x" * 10)
        await c.flush("")
        await async_wait_for(lambda: writer.housekeeping.snapshots == 1, 10, "the first")
        await writer.upload_snapshot(whole=True)
        follower = RemoteNode("node-1", layer, None, MountIds())
        await follower.refresh_proven()
        assert len(follower.segments) == 50
        await c.append("s07", b"y" * 5)
        await c.delete("s08")
        await c.flush("")
        delta = await writer.upload_snapshot()
        assert names.parse_delta_key(delta) is not None
        await follower.refresh_proven()
        seg = follower.by_name("s07")
        assert seg is not None and seg.length == 15
        fresh = RemoteNode("node-1", layer, None, MountIds())
        await fresh.refresh_proven()  # (one that knew s08 keeps what it knew)
        assert fresh.by_name("s08") is None and len(fresh.segments) == 49
        # A delta that does not decode is skipped and said once; the base stands.
        await c.append("s09", b"z")
        await c.flush("")
        bad = await writer.upload_snapshot()
        storage.write(bad, b"\xff" * 10, {})
        await follower.refresh_proven()
        assert follower.rejections.bad_now() == {"snapshot": 1}
        seg = follower.by_name("s07")
        assert seg is not None and seg.length == 15  # the delta before it
