"""Rolling checkpoints (docs/FORMATS.md): each holds what changed and a share of
the rest, the journal is truncated only as far as a complete run of them, and a
replay from whatever the journal kept rebuilds exactly the committed view.

Memory journal and cache: random operations, flushes (chunk records, so that
journal files of flushed data may go), checkpoints with a share of three
segments, and restarts, each compared with the view before it.
"""

from __future__ import annotations

import pathlib
import random

import pytest

from cache.memory_store import MemoryCache
from gateway.config import ContainerConfig
from gateway.container.replayer import Replayer, replay_for_fsck
from gateway.container.table import SegmentTable
from gateway.errors import GatewayError
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.journal_pb2 import Operation
from gateway.protocol.metadata_pb2 import ChunkRecord, ContainerSnapshot, MetadataSnapshot
from gateway.read.index import ReadIndex
from gateway.recovery.metadata_io import install
from gateway.tier2.snapshots import SnapshotEncoder
from tests.helpers import bulk
from tests.helpers.container import DirectContainer
from tests.helpers.segments import make_config

SHARE = 3


def start(journal: MemoryJournal) -> DirectContainer:
    """A container over what the journal holds, replayed as at a start."""
    table = SegmentTable(ReadIndex(MemoryCache()))
    replayer = Replayer(table)
    journal.replay(replayer.replay)
    replayer.finish()
    config = ContainerConfig(checkpoint_min_segments=SHARE)
    return DirectContainer(config, table, journal)


def checkpoints(journal: MemoryJournal) -> list[ContainerSnapshot]:
    """The checkpoints the journal still holds, oldest first."""
    out: list[ContainerSnapshot] = []

    def see(seq: int, op: Operation) -> None:
        if op.WhichOneof("kind") == "checkpoint":
            out.append(ContainerSnapshot.FromString(op.checkpoint.snapshot))

    journal.replay(see)
    return out


def without_event_index(snap: ContainerSnapshot) -> ContainerSnapshot:
    """``snap`` without the records' event indexes, whose entries are valid but
    not the same after a replay: a truncation indexes the first event the
    cached appends show, and what is cached then differs (a sparse hint)."""
    out = ContainerSnapshot()
    out.CopyFrom(snap)
    for r in out.segments:
        assert all(r.start_offset <= e <= r.length for e in r.event_index)
        del r.event_index[:]
    return out


async def flush(c: DirectContainer, name: str, n: int) -> None:
    """Tier 2 takes the segment's bytes up to its length (a chunk record)."""
    info = c.info(name)
    if info.length > info.storage_length:
        chunk = ChunkRecord(
            name=f"c{n}", start_offset=info.storage_length, length=info.length - info.storage_length
        )
        await c.prepare_chunk_added(info.id, chunk, False).wait()


@pytest.mark.parametrize(
    ("seed", "txns", "limit"),
    [(1, False, 0), (2, False, 0), (3, False, 0), (4, True, 0), (5, True, 0), (6, False, 1500),
     (7, True, 4000), (8, False, 900)],
)  # fmt: skip
async def test_a_replay_from_rolling_checkpoints_rebuilds_the_committed_view(
    seed: int, txns: bool, limit: int
) -> None:
    """``txns``: also transactions, whose merged bytes never reach Tier 2 here
    (no storage writer completes the merge), so they hold the journal's files.
    ``limit``: the largest journal operation, so small that checkpoints, whole
    ones too, go in pieces."""
    rng = random.Random(seed)
    journal = MemoryJournal()
    if limit:
        journal.max_operation_bytes = limit
    c = start(journal)
    names: list[str] = []
    made = 0
    partial_starts = 0
    whole_in_pieces = 0
    cooled = 0
    for step in range(1500):
        r = rng.random()
        try:
            if r < 0.15 or not names:
                made += 1
                name = f"d{rng.randrange(4)}/s{made:04d}"
                await c.create(name)
                names.append(name)
            elif r < 0.55:
                await c.append(rng.choice(names), rng.randbytes(rng.randrange(1, 40)))
            elif r < 0.66:
                await c.seal(rng.choice(names))
            elif r < 0.68:
                name = rng.choice(names)
                await c.truncate(name, rng.randrange(c.info(name).length + 1))
            elif r < 0.74:
                name = names.pop(rng.randrange(len(names)))
                await c.delete(name)
            elif r < 0.78 and txns:
                txn = (await c.begin(rng.choice(names))).name
                await c.append(txn, b"txn")
                await c.commit(txn)
            elif r < 0.95:
                await flush(c, rng.choice(names), step)
            else:  # a sealed segment wholly in Tier 2 is sealed there too
                info = c.info(rng.choice(names))
                flushed = info.storage_length == info.length
                if info.sealed and flushed and not info.sealed_in_storage:
                    await c.prepare_storage_sealed(info.id).wait()
        except GatewayError:
            pass  # sealed, or a truncate below the start: refused, nothing changed
        if step % 37 == 0:  # idle segments go cold (as run_cooling does)
            await c.wait_settled()
            table = c._table
            cooled += table.cool(list(table.by_id.values()), set(), table.seq)
        if step % 40 == 0:
            journal.roll()
        if step % 60 == 0:  # the storage writer catches up now and then
            for name in names:
                await flush(c, name, step)
        if step % 5 == 0:
            await c.checkpoint(roll=step % 200 == 100)  # roll: a whole one
        if step % 300 == 299:
            await c.wait_settled()
            before = c.committed_snapshot()
            held = checkpoints(journal)
            partial_starts += bool(held) and held[0].partial
            whole_in_pieces += any(h.whole_pieces for h in held)
            c = start(journal)
            after = c.committed_snapshot()
            assert without_event_index(after) == without_event_index(before)
            for name in names:  # bytes not in Tier 2 (there is none here) read back
                info = c.info(name)
                at = max(info.start_offset, info.storage_length)
                got = (await c.read(name, at, info.length)).data
                assert len(got) == info.length - at
    # The journal was truncated, and replays began at a rolling checkpoint.
    assert journal.truncated_files > 0
    assert partial_starts > 0 or txns
    if limit:
        assert whole_in_pieces > 0
    assert cooled > 0


async def test_a_whole_checkpoint_too_large_for_one_operation_goes_in_pieces() -> None:
    journal = MemoryJournal()
    journal.max_operation_bytes = 4000
    c = start(journal)
    for i in range(300):
        await c.create(f"segment-with-a-long-name/{i:04d}")
    journal.roll()
    await c.checkpoint(roll=True)  # whole: it alone lets the older files go
    await c.checkpoint()
    held = checkpoints(journal)
    whole = [h for h in held if h.whole_pieces]
    assert len(whole) > 2 and [h.piece for h in whole] == list(range(1, len(whole) + 1))
    assert sum(len(h.segments) for h in whole) == 300
    before = c.committed_snapshot()
    assert start(journal).committed_snapshot() == before
    # Only some pieces in a journal (the first ones lost): no state from them.
    journal.files = [journal.files[-1]]


async def test_each_checkpoint_holds_what_changed_and_a_share_of_the_rest() -> None:
    journal = MemoryJournal()
    c = start(journal)
    for i in range(20):
        await c.create(f"s{i:02d}")
    await c.checkpoint()  # the first is whole: nothing is known before it
    await c.append("s07", b"x")
    await c.delete("s11")
    for _ in range(7):
        await c.checkpoint()
    held = checkpoints(journal)
    assert [s.partial for s in held] == [False] + [True] * 7
    first = held[1]
    assert sorted(r.name for r in first.segments) == ["s00", "s01", "s02", "s07"]
    assert list(first.deleted_ids) == [12]  # s11 has id 12
    # The shares go on in name order until the pass is done, then begin again.
    assert [r.name for r in held[2].segments] == ["s03", "s04", "s05"]
    shares = [sorted(r.name for r in h.segments) for h in held[1:]]
    covered = {n for share in shares[:7] for n in share}
    assert covered == {f"s{i:02d}" for i in range(20)} - {"s11"}
    # The checkpoint that ends the pass is complete from the one that began it.
    assert held[-1].complete_from > held[0].complete_from or held[-1].complete_from > 0


async def test_a_tier2_snapshot_reencodes_only_what_changed_and_equals_the_whole() -> None:
    """`SnapshotEncoder`: each snapshot decodes to exactly the committed view (records
    in any order), and encodes only the records changed since the previous one."""
    rng = random.Random(7)
    c = start(MemoryJournal())
    encoder = SnapshotEncoder()
    names: list[str] = []
    touched = 0
    for i in range(50):
        names.append(f"s{i:02d}")
        await c.create(names[-1])
    for round_ in range(6):
        encoded_before = encoder.encoded
        head, records = encoder.capture(c)
        data = SnapshotEncoder.encode(head, records, "node-1", 3, 1234)
        got = MetadataSnapshot.FromString(data)
        want = c.committed_snapshot()
        assert (got.node, got.epoch, got.created_at_ms) == ("node-1", 3, 1234)
        assert sorted(got.container.segments, key=lambda r: r.id) == sorted(
            want.segments, key=lambda r: r.id
        )
        assert got.container.next_segment_id == want.next_segment_id
        changed = encoder.encoded - encoded_before
        assert changed == (50 if round_ == 0 else touched)
        touched = 0
        for name in rng.sample(names, 5):
            await c.append(name, b"x")
            touched += 1
        victim = names.pop(rng.randrange(len(names)))
        await c.delete(victim)
        names.append(f"n{round_}")
        await c.create(names[-1])
        touched += 1


async def test_a_pass_that_ends_in_a_checkpoint_in_pieces_replays_whole() -> None:
    """The checkpoint that ends a pass is too large for one operation (everything
    changed): a replay that starts with the pass must take all its pieces, not
    stop at the first."""
    journal = MemoryJournal()
    journal.max_operation_bytes = 2400
    c = start(journal)
    names = [f"a-rather-long-segment-name/{i:03d}" for i in range(20)]
    for name in names:
        await c.create(name)
        await c.append(name, b"x" * 10)
        await flush(c, name, 0)
    await c.checkpoint(roll=True)  # whole
    journal.roll()  # the pass begins in a file of its own
    for _ in range(6):
        await c.checkpoint()
    for n, name in enumerate(names):
        await c.append(name, b"y" * 30)
        await flush(c, name, n + 1)
    await c.checkpoint()  # ends the pass, in pieces
    held = checkpoints(journal)
    assert held[0].partial and not held[0].whole_pieces  # the whole one went
    before = c.committed_snapshot()
    again = start(journal)
    assert without_event_index(again.committed_snapshot()) == without_event_index(before)
    assert {again.info(name).length for name in names} == {40}


async def test_an_import_of_many_segments_goes_in_pieces_and_replays_whole(
    tmp_path: pathlib.Path,
) -> None:
    """`install` (import-metadata, --recover-from-tier2) writes a large snapshot as
    a whole checkpoint in pieces into an empty journal, where it is all the
    state there is: the replay takes every piece."""
    config = make_config(
        tmp_path, journal={"max_operation_bytes": "256 KiB"}, container={"max_append_bytes": 4096}
    )
    chunk = ChunkRecord(name="node-1/chunks/1/x", start_offset=0, length=len(bulk.CHUNK))
    names = bulk.names(5000, "big", 500)
    snap = bulk.container(names, chunk, 50, "big")
    await install(config, snap, min_epoch=1)
    table = replay_for_fsck(config.journal_dir)
    assert sorted(s.name for s in table.by_id.values()) == sorted(names)
    assert sum(s.cold for s in table.by_id.values()) == 5000 - 50
