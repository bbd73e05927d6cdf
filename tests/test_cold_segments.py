"""Cold segments: a segment sealed and wholly in Tier 2 keeps only its record
until used (issue 33: a node with a million sleeping segments).

Memory journal and cache: segments loaded from a checkpoint of sealed, flushed
records start cold; reading any field warms one; every change warms it
first; idle ones cool again; what the checkpoints and the Tier-2 snapshots
hold does not depend on which are cold. And the memory a cold one takes.
"""

from __future__ import annotations

import gc

from gateway.container.segment import EAGER, Segment, chunks_of
from gateway.journal.memory_journal import MemoryJournal
from gateway.node import give_back_memory
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.tier2.snapshots import SnapshotEncoder
from tests.helpers import bulk
from tests.helpers.container import DirectContainer
from tests.test_rolling_checkpoints import start


def installed(n: int, active: int = 0) -> tuple[DirectContainer, MemoryJournal]:
    """A container over a journal whose first checkpoint holds ``n`` bulk segments."""
    journal = MemoryJournal()
    chunk = ChunkRecord(name="node-1/chunks/1/x", start_offset=0, length=len(bulk.CHUNK))
    snap = bulk.container(bulk.names(n, "big", n // 10), chunk, active, "big")
    journal.submit_checkpoint(snap.SerializeToString())
    return start(journal), journal


def lazy_fields_set(seg: Segment) -> list[str]:
    out = []
    for name in Segment.__slots__:
        if name in EAGER:
            continue
        try:
            object.__getattribute__(seg, name)
        except AttributeError:
            continue
        out.append(name)
    return out


async def test_sealed_flushed_segments_load_cold_and_warm_when_read() -> None:
    c, _ = installed(100, active=10)
    table = c._table
    segs = list(table.by_id.values())
    assert sum(s.cold for s in segs) == 90 and not any(s.cold for s in segs[90:])
    seg = segs[0]
    assert seg.cold and lazy_fields_set(seg) == []
    assert [ch.name for ch in chunks_of(seg)] == ["node-1/chunks/1/x"] and seg.cold
    info = c.info(seg.name)  # reads fields: warm
    assert not seg.cold and info.length == len(bulk.CHUNK) and info.sealed
    assert info.event_count == bulk.CHUNK.count(b"\n")
    # Cooled again when idle, and whole again when it changes.
    assert table.cool([seg], set(), table.seq) == 1 and seg.cold
    await c.truncate(seg.name, 100)
    assert not seg.cold and c.info(seg.name).start_offset == 100
    # A deleted cold segment is gone, its record with it.
    victim = segs[1]
    await c.delete(victim.name)
    assert victim.id not in table.by_id
    assert c.segment_count == 99


async def test_checkpoints_and_snapshots_are_the_same_whichever_segments_are_cold() -> None:
    c, journal = installed(200, active=20)
    table = c._table
    await c.truncate(next(iter(table.by_id.values())).name, 50)
    warm_view = None
    for cold in (False, True):
        if cold:
            table.cool(list(table.by_id.values()), set(), table.seq)
            assert sum(s.cold for s in table.by_id.values()) == 180
        else:
            for s in table.by_id.values():
                s.warm()
        snapshot = c.committed_snapshot()
        encoder = SnapshotEncoder()
        _, records = encoder.capture(c)
        assert sorted(records) == sorted(r.SerializeToString() for r in snapshot.segments)
        if warm_view is None:
            warm_view = snapshot
        assert snapshot == warm_view
        await c.checkpoint(roll=True)
        again = start(journal)
        assert again.committed_snapshot() == warm_view


def test_a_cold_segment_takes_a_few_hundred_bytes() -> None:
    """Measured in process (freed memory given back first): a cold segment and its
    places in the table, against ~1,500 bytes for a warm one."""
    n = 50_000
    journal = MemoryJournal()
    chunk = ChunkRecord(name="node-1/chunks/1/" + "0" * 60, start_offset=0, length=1000)
    snap = bulk.container(bulk.names(n, "big", n // 10), chunk, 0, "big")
    journal.submit_checkpoint(snap.SerializeToString())
    del snap
    base = _rss()
    c = start(journal)
    each = (_rss() - base) / n
    assert sum(s.cold for s in c._table.by_id.values()) == n
    assert each < 900, f"{each:.0f} bytes a cold segment"
    for s in c._table.by_id.values():
        s.warm()
    assert (_rss() - base) / n > 2 * each  # what cooling saves


def _rss() -> int:
    gc.collect()
    give_back_memory()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
