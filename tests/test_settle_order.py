"""A journal group that fails while an earlier one is still waiting (found by bench/failover.py).

When replication stops while groups wait for their ack quorum, the journal
fails the groups not yet written at once (`Journal._fail_waiting`) while the
groups already handed to the quorum waits settle later, in order. So a later
operation's ticket can be done (failed) while an earlier one's is not. The
drain benchmark's drained node then exited 1 at its clean stop:
`prepare_chunk_added(...).wait()` called its result function although the
operation was never applied (IndexError in
gateway/container/storage_operations.py), and any other operation waited on
in that state would return a result although it failed.
"""

from __future__ import annotations

import pytest

from cache.memory_store import MemoryCache
from gateway.config import ContainerConfig
from gateway.container.table import SegmentTable
from gateway.errors import JournalClosed, Unavailable
from gateway.journal.memory_journal import MemoryJournal
from gateway.protocol.metadata_pb2 import ChunkRecord
from gateway.read.index import ReadIndex
from tests.helpers.container import DirectContainer


def _fail_last(journal: MemoryJournal) -> None:
    """Fail only the newest pending operation, as `_fail_waiting` fails later groups first."""
    ticket, _ = journal._pending.pop()
    ticket.error = JournalClosed()
    ticket._done.set()


async def test_a_chunk_record_failed_behind_a_waiting_group_raises_unavailable() -> None:
    journal = MemoryJournal()
    c = DirectContainer(ContainerConfig(), SegmentTable(ReadIndex(MemoryCache())), journal)
    await c.create("s")
    await c.append("s", b"a" * 100)
    journal.hold()
    earlier = c.prepare_append("s", b"b" * 10)  # waits for its quorum
    later = c.prepare_chunk_added(c.info("s").id, ChunkRecord(name="c0", length=100), False)
    _fail_last(journal)
    with pytest.raises(Unavailable):
        await later.wait()
    journal.refuse_pending(JournalClosed())
    with pytest.raises(Unavailable):
        await earlier.wait()


async def test_an_append_failed_behind_a_waiting_group_is_not_acknowledged() -> None:
    journal = MemoryJournal()
    c = DirectContainer(ContainerConfig(), SegmentTable(ReadIndex(MemoryCache())), journal)
    await c.create("s")
    journal.hold()
    earlier = c.prepare_append("s", b"a" * 10)
    later = c.prepare_append("s", b"b" * 10)
    _fail_last(journal)
    with pytest.raises(Unavailable):
        await later.wait()
    journal.refuse_pending(JournalClosed())
    with pytest.raises(Unavailable):
        await earlier.wait()
