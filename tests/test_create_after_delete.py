"""A create of a name whose segment's deletion is still in flight (pipelined).

The create is journaled after the deletion, so by the time it applies the name
is free; until then the committed view still has the old segment, and if the
deletion is refused, the create (behind it in the journal) is refused too and
the name goes back to the old segment: never two live segments of one name.
"""

from __future__ import annotations

import pytest

from gateway.errors import JournalRefused, Overloaded, SegmentExists, SegmentNotFound
from gateway.journal.memory_journal import MemoryJournal
from tests.helpers.container import DirectContainer
from tests.test_container_unit import make, restart

pytestmark = pytest.mark.timeout(30)


def named(c: DirectContainer, name: str) -> list[int]:
    """Ids of the committed live segments named ``name``."""
    return [s.id for s in c.segments() if s.name == name]


async def test_create_behind_a_pending_delete_of_its_name_applies_after_it() -> None:
    journal = MemoryJournal()
    c = make(journal)
    old = await c.create("d/y")
    await c.append("d/y", b"old bytes")
    journal.hold()
    delete = c.prepare_delete("d/y")
    create = c.prepare_create("d/y")
    append = c.prepare_append("d/y", b"new")
    # Not durable yet: readers still see the old segment, once.
    assert c.info("d/y").id == old.id and c.info("d/y").length == 9
    assert [i.name for i in c.list("d/")] == ["d/y"]
    assert (await c.read("d/y", 0, 100)).data == b"old bytes"
    assert named(c, "d/y") == [old.id]
    with pytest.raises(SegmentExists):  # the pending create holds the name now
        c.prepare_create("d/y")
    journal.commit()
    await delete.wait()
    new = await create.wait()
    assert (await append.wait()).offset == 0
    assert new.id != old.id
    assert c.info("d/y").id == new.id and c.info("d/y").length == 3
    assert (await c.read("d/y", 0, 100)).data == b"new"
    assert named(c, "d/y") == [new.id]
    # A replay of the journal builds the same.
    assert [(s.id, s.length) for s in restart(journal)._table.committed()] == [(new.id, 3)]


async def test_a_refused_delete_refuses_the_create_behind_it_and_keeps_the_name() -> None:
    journal = MemoryJournal()
    c = make(journal)
    old = await c.create("y")
    await c.append("y", b"kept")
    journal.hold()
    ops = [c.prepare_delete("y"), c.prepare_create("y"), c.prepare_append("y", b"new")]
    ops += [c.prepare_delete("y"), c.prepare_create("y")]  # and once more
    journal.refuse_pending(JournalRefused("the disk is full"))
    for op in ops:
        with pytest.raises(Overloaded):
            await op.wait()
    assert c.info("y").id == old.id and c.info("y").length == 4
    assert named(c, "y") == [old.id]
    assert [i.id for i in c.list()] == [old.id]
    with pytest.raises(SegmentExists):
        await c.create("y")
    assert (await c.append("y", b"!")).offset == 4
    await c.delete("y")
    with pytest.raises(SegmentNotFound):
        c.info("y")
    await c.create("y")
    assert named(c, "y") != [old.id] and len(named(c, "y")) == 1


async def test_delete_create_delete_create_pipelined_leaves_the_last() -> None:
    journal = MemoryJournal()
    c = make(journal)
    await c.create("y")
    journal.hold()
    ops = [c.prepare_delete("y"), c.prepare_create("y"), c.prepare_append("y", b"second")]
    ops += [c.prepare_delete("y"), c.prepare_create("y"), c.prepare_append("y", b"third")]
    journal.commit()
    for op in ops:
        await op.wait()
    assert c.info("y").length == 5 and (await c.read("y", 0, 10)).data == b"third"
    assert len(named(c, "y")) == 1 and c.segment_count == 1
    assert c._table.replaced == {}
