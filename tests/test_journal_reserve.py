"""The journal's disk reserve holds the checkpoint written to free a full disk.

That checkpoint holds every segment, so the container tells the journal its
estimated size (`Journal.estimate_checkpoints`), and the reserve follows it:
grown while there is room, short of space (client operations wait) while
there is not, and a checkpoint for space is written only when it frees more
than it costs.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

import pytest
import trio

from cache.memory_store import MemoryCache
from gateway.config import ContainerConfig, JournalConfig, KiB, MiB
from gateway.container.table import SegmentTable
from gateway.errors import JournalRefused
from gateway.journal import open_journal
from gateway.journal.format import encode_append
from gateway.journal.memory_journal import MemoryJournal
from gateway.journal.space import RESERVE_MARGIN
from gateway.read.index import ReadIndex
from tests.helpers.container import DirectContainer

pytestmark = pytest.mark.timeout(60)


async def wait_until(ok: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll ``ok()`` until true: the journal's keeper checks on a timer of its own."""
    with trio.fail_after(seconds):
        while not ok():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def test_the_reserve_grows_with_the_estimate_while_there_is_room(
    tmp_path: pathlib.Path, journal_config: Callable[..., JournalConfig]
) -> None:
    cfg = journal_config(reserve=256 * KiB)
    estimate = 0
    async with open_journal(tmp_path / "journal", cfg) as j:
        assert j.statistics().reserve_bytes == 256 * KiB
        j.estimate_checkpoints(lambda: estimate)
        estimate = 3 * MiB  # segments came: the keeper notices within a second
        await wait_until(lambda: j.statistics().reserve_bytes >= 3 * MiB)
        st = j.statistics()
        assert st.reserve_target == 3 * MiB + RESERVE_MARGIN
        assert st.reserve_bytes == st.reserve_target and not st.short_of_space
        await j.append_parts(encode_append(1, 0, b"x" * 100))
        estimate = 2 * MiB  # a few segments went: kept
        await trio.sleep(1.5)
        assert j.statistics().reserve_bytes == 3 * MiB + RESERVE_MARGIN
        estimate = 100 * KiB  # most went: given back, down to the floor (256 KiB)
        await wait_until(lambda: j.statistics().reserve_bytes < 3 * MiB)
        assert j.statistics().reserve_bytes == 256 * KiB
    # Kept on disk for the next start (a start on a full disk needs it).
    assert (tmp_path / "journal" / "RESERVE").stat().st_size == 256 * KiB


@pytest.mark.expect_errors("journal refused client operations")
async def test_no_room_for_the_reserve_a_checkpoint_needs_is_short_of_space(
    small_tmpfs: pathlib.Path, journal_config: Callable[..., JournalConfig]
) -> None:
    """A disk that cannot hold a checkpoint of every segment: clients wait, not the node."""
    cfg = journal_config(reserve=256 * KiB, file_size=1 * MiB, preallocate_step=256 * KiB)
    async with open_journal(small_tmpfs / "journal", cfg) as j:
        await j.append_parts(encode_append(1, 0, b"a" * 1000))
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        estimate = free + MiB  # more than the disk has left
        j.estimate_checkpoints(lambda: estimate)
        await wait_until(lambda: j.short_of_space)
        with pytest.raises(JournalRefused):
            j.submit(encode_append(1, 1000, b"b" * 1000), reserved=False)
        # Reserved operations (flush records, checkpoints) still go.
        await j.submit([b"reserved"], reserved=True).wait()
        estimate = 512 * KiB  # segments deleted: the reserve fits again
        await j.wait_room()
        assert not j.short_of_space
        await j.append_parts(encode_append(1, 1000, b"b" * 1000))


async def test_a_checkpoint_for_space_must_free_more_than_a_whole_one_costs(
    tmp_path: pathlib.Path, journal_config: Callable[..., JournalConfig]
) -> None:
    cfg = journal_config(file_size=64 * KiB, preallocate_step=64 * KiB)
    async with open_journal(tmp_path / "journal", cfg) as j:
        for i in range(40):  # ~300 KiB over several files
            await j.append_parts(encode_append(1, i * 8000, b"d" * 8000))
        files = sum(p.stat().st_size for _, p in j.files()[:-1])
        assert files > 200 * KiB
        j.estimate_checkpoints(lambda: 100 * KiB)
        assert j.rolled_checkpoint_frees(None)
        # A checkpoint of every segment would cost more than the files it frees:
        # written, it would leave the disk fuller than before.
        j.estimate_checkpoints(lambda: files)
        assert not j.rolled_checkpoint_frees(None)


def whole_bytes(c: DirectContainer) -> int:
    return len(c._table.pending_snapshot().SerializeToString())


async def test_the_container_estimates_a_whole_checkpoint_as_segments_come_and_go() -> None:
    journal = MemoryJournal()
    table = SegmentTable(ReadIndex(MemoryCache()))
    c = DirectContainer(ContainerConfig(checkpoint_min_segments=100), table, journal)

    def estimate() -> int:
        return journal.statistics().reserve_target

    for i in range(1000):
        await c.create(f"dir{i % 10}/segment-{i:05d}")
        await c.append(f"dir{i % 10}/segment-{i:05d}", b"e" * 10)
    # Before any checkpoint: an assumed record size, above the real one.
    assert whole_bytes(c) <= estimate() <= 4 * whole_bytes(c)
    # Rolling checkpoints (a share of 100): once a pass over every name is done,
    # its records measure the size of a whole one.
    for _ in range(12):
        await c.checkpoint()
    assert whole_bytes(c) <= estimate() <= 1.3 * whole_bytes(c), (estimate(), whole_bytes(c))
    # Segments come and go: the estimate follows at once, without a checkpoint.
    before = estimate()
    for i in range(500):
        await c.delete(f"dir{i % 10}/segment-{i:05d}")
    assert 0.4 * before <= estimate() <= 0.6 * before
    assert whole_bytes(c) <= estimate()
    # A whole checkpoint (for space) measures it again.
    await c.checkpoint(roll=True)
    assert whole_bytes(c) <= estimate() <= 1.3 * whole_bytes(c)
