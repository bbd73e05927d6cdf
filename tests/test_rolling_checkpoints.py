"""Rolling checkpoints (docs/FORMATS.md): each holds what changed and a share of
the rest, the journal is truncated only as far as a complete run of them, and a
replay from whatever the journal kept rebuilds exactly the committed view.

Memory journal and cache: random operations, flushes (chunk records, so that
journal files of flushed data may go), checkpoints with a share of three
segments, and restarts, each compared with the view before it.
"""

from __future__ import annotations

import random

import pytest

from cache.memory_store import MemoryCache
from gateway.config import ContainerConfig
from gateway.container.replayer import Replayer
from gateway.container.table import SegmentTable
from gateway.errors import GatewayError
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.journal_pb2 import Operation
from gateway.protocol.metadata_pb2 import ChunkRecord, ContainerSnapshot
from gateway.read.index import ReadIndex
from tests.helpers.container import DirectContainer

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


async def flush(c: DirectContainer, name: str, n: int) -> None:
    """Tier 2 takes the segment's bytes up to its length (a chunk record)."""
    info = c.info(name)
    if info.length > info.storage_length:
        chunk = ChunkRecord(
            name=f"c{n}", start_offset=info.storage_length, length=info.length - info.storage_length
        )
        await c.prepare_chunk_added(info.id, chunk, False).wait()


@pytest.mark.parametrize(
    ("seed", "txns"), [(1, False), (2, False), (3, False), (4, True), (5, True)]
)
async def test_a_replay_from_rolling_checkpoints_rebuilds_the_committed_view(
    seed: int, txns: bool
) -> None:
    """``txns``: also transactions, whose merged bytes never reach Tier 2 here
    (no storage writer completes the merge), so they hold the journal's files."""
    rng = random.Random(seed)
    journal = MemoryJournal()
    c = start(journal)
    names: list[str] = []
    made = 0
    partial_starts = 0
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
            elif r < 0.62:
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
            else:
                await flush(c, rng.choice(names), step)
        except GatewayError:
            pass  # sealed, or a truncate below the start: refused, nothing changed
        if step % 40 == 0:
            journal.roll()
        if step % 60 == 0:  # the storage writer catches up now and then
            for name in names:
                await flush(c, name, step)
        if step % 5 == 0:
            await c.checkpoint()
        if step % 300 == 299:
            await c.wait_settled()
            before = c.committed_snapshot()
            held = checkpoints(journal)
            partial_starts += bool(held) and held[0].partial
            c = start(journal)
            after = c.committed_snapshot()
            assert after == before
            for name in names:  # bytes not in Tier 2 (there is none here) read back
                info = c.info(name)
                at = max(info.start_offset, info.storage_length)
                got = (await c.read(name, at, info.length)).data
                assert len(got) == info.length - at
    # The journal was truncated, and replays began at a rolling checkpoint.
    assert journal.truncated_files > 0
    assert partial_starts > 0 or txns


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
