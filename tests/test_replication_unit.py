"""The replication layer's pieces in process, no daemons: the replica store, the
journal's group reader, the ensemble record and the replica handlers' access rules.

Frames are real journal frames (`encode_group`, or a journal opened with
`open_journal`); what is checked is what a recovery would get back: the bytes
of whole write groups, the sequences a log answers, and error codes.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from gateway.client.client import Client, open_client
from gateway.config import JournalConfig, KiB
from gateway.errors import (
    BadRequest,
    Overloaded,
    ReplicaFenced,
    ReplicaGap,
    Unauthorized,
    Unavailable,
)
from gateway.journal import open_journal
from gateway.journal.files import list_files
from gateway.journal.format import HEADER_SIZE, encode_append, encode_group, operation_prefix
from gateway.journal.reader import FrameRecord, mapped, read_frames, read_groups
from gateway.node import open_node
from gateway.protocol import wire_pb2 as wire
from gateway.replication.ensemble import ENSEMBLE_FORMAT, Ensemble
from gateway.replication.store import ReplicaStore, epoch_dir_name
from gateway.server import Server
from gateway.tier2.untrusted import BadRecord
from tests.helpers.container import DirectContainer
from tests.helpers.segments import make_config

pytestmark = pytest.mark.timeout(60)

ConfigFactory = Callable[..., JournalConfig]

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = "n1"
OTHER = "n3"
#: Operations per group and bytes per operation of the groups `group` builds:
#: with 8 KiB frames a group is two frames.
OPS = 4
OP_BYTES = 3000


def payload(n: int, size: int = OP_BYTES) -> bytes:
    """Deterministic bytes for operation n."""
    return random.Random(n).randbytes(size)


def group(
    first: int, count: int = OPS, epoch: int = 1, size: int = OP_BYTES, frame: int = 8 * KiB
) -> bytes:
    """One write group of ``count`` appends from sequence ``first``, as the journal frames it."""
    parts: list[Any] = []
    ends: list[int] = []
    sizes: list[int] = []
    for k in range(count):
        head, data = encode_append(1, first + k, payload(first + k, size))
        n = len(head) + len(data)
        prefix = operation_prefix(n)
        parts += [prefix, head, data]
        ends.append(len(parts))
        sizes.append(len(prefix) + n)
    buffers, total, _ = encode_group(parts, ends, sizes, first, epoch, frame)
    out = b"".join(bytes(b) for b in buffers)
    assert len(out) == total
    return out


def frames_in(data: bytes) -> list[FrameRecord]:
    """The valid frames of ``data``, in order."""
    return [r for r in read_frames(data, pathlib.Path("-")) if isinstance(r, FrameRecord)]


@asynccontextmanager
async def opened(directory: pathlib.Path, cfg: JournalConfig) -> AsyncIterator[ReplicaStore]:
    """A replica store on ``directory`` with its committer running (node n2)."""
    store = ReplicaStore("n2", directory, cfg)
    await trio.to_thread.run_sync(store.open)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        try:
            yield store
        finally:
            nursery.cancel_scope.cancel()


async def write(
    store: ReplicaStore, first: int, frames: bytes, *, source: str = SRC, epoch: int = 1, **kw: Any
) -> int:
    """One replica write, waited for: the log's durable next sequence."""
    return await store.wait(store.submit(source, epoch, first, frames, **kw))


async def read_all(store: ReplicaStore, source: str = SRC, epoch: int = 1) -> tuple[int, bytes]:
    """(start, every frame) of a log, read in pieces as a recovery does."""
    held = [rl for rl in store.holdings(source) if rl.epoch == epoch]
    if not held:
        return 0, b""
    start = at = held[0].start
    out = b""
    while True:
        frames, nxt, end = await store.read(source, epoch, at, 20 * KiB)
        out += frames
        if end:
            return start, out
        assert nxt > at, "a read made no progress"
        at = nxt


def held(store: ReplicaStore, source: str = SRC) -> list[tuple[int, int, int]]:
    """(epoch, start, next) of each log held for ``source``."""
    return [(rl.epoch, rl.start, rl.next) for rl in store.holdings(source)]


def log_dir(root: pathlib.Path, source: str = SRC, epoch: int = 1) -> pathlib.Path:
    return root / source / epoch_dir_name(epoch)


async def fill(
    store: ReplicaStore, first: int, groups: int, *, start: bool = True, epoch: int = 1
) -> tuple[int, list[tuple[int, bytes]]]:
    """Write ``groups`` groups one after the other: (the next sequence, [(first, frames)])."""
    written = []
    seq = first
    for k in range(groups):
        g = group(seq, epoch=epoch)
        assert await write(store, seq, g, epoch=epoch, start=start and k == 0) == seq + OPS
        written.append((seq, g))
        seq += OPS
    return seq, written


def joined(written: list[tuple[int, bytes]], since: int = 0) -> bytes:
    return b"".join(g for first, g in written if first >= since)


# -- the replica store: writes, reads, gaps --------------------------------------------


async def test_writes_in_order_read_back_byte_for_byte_whole_groups(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 1, 6)
        assert held(store) == [(1, 1, end)]
        assert await read_all(store) == (1, joined(written))
        # From a group's start: that group and the rest.
        frames, nxt, done = await store.read(SRC, 1, 9, 0)
        assert (frames, nxt, done) == (joined(written, 9), end, True)
        # A small max_bytes still gives one whole group (two frames), never part of one.
        frames, nxt, done = await store.read(SRC, 1, 5, 1)
        assert (frames, nxt, done) == (written[1][1], 9, False)
        assert len(frames_in(frames)) == 2
        # Room for one and a half groups: one group.
        frames, nxt, done = await store.read(SRC, 1, 5, len(written[1][1]) * 3 // 2)
        assert (frames, nxt) == (written[1][1], 9)
        # Past the end: nothing, and the end.
        assert await store.read(SRC, 1, end, 0) == (b"", end, True)
        assert await store.read(SRC, 1, end + 100, 0) == (b"", end + 100, True)
        # A log not held reads as empty.
        assert await store.read(SRC, 7, 1, 0) == (b"", 1, True)
    # Durable: the same after reopening, and the files are a journal replaying the same.
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, 1, end)]
        assert await read_all(store) == (1, joined(written))
        # And the log goes on where it was.
        g = group(end)
        assert await write(store, end, g) == end + OPS
        assert await read_all(store) == (1, joined(written) + g)


async def test_read_before_the_start_is_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with opened(tmp_path, journal_config()) as store:
        _, written = await fill(store, 101, 2)
        with pytest.raises(BadRequest, match="starts at 101"):
            await store.read(SRC, 1, 100, 0)
        assert await read_all(store) == (101, joined(written))


async def test_pipelined_writes_committed_in_one_batch(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    # The replicator pipelines writes on one connection, and the handler
    # submits them in arrival order: several can reach the committer at once.
    async with opened(tmp_path, journal_config()) as store:
        g1, g2, g3 = group(1), group(5), group(9)
        w1 = store.submit(SRC, 1, 1, g1, start=True)
        w2 = store.submit(SRC, 1, 5, g2)
        w3 = store.submit(SRC, 1, 9, g3)
        answers: list[int | str] = []
        for w in (w1, w2, w3):
            try:
                answers.append(await store.wait(w))
            except ReplicaGap as e:
                answers.append(f"gap: {e}")
        assert answers == [5, 9, 13]
        assert await read_all(store) == (1, g1 + g2 + g3)


async def test_a_write_out_of_order_is_a_gap_naming_the_expected_sequence(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with opened(tmp_path, journal_config()) as store:
        end, written = await fill(store, 1, 2)
        assert end == 9
        for first in (13, 5, 1):  # ahead, a repeat, the very start
            with pytest.raises(ReplicaGap) as e:
                await write(store, first, group(first))
            assert e.value.expected_offset == 9
        # A log this node does not hold (another epoch): expected 0.
        with pytest.raises(ReplicaGap) as e:
            await write(store, 9, group(9, epoch=2), epoch=2)
        assert e.value.expected_offset == 0
        assert held(store) == [(1, 1, 9)]
        assert await read_all(store) == (1, joined(written))
        # The right sequence is still taken.
        assert await write(store, 9, group(9)) == 13
        assert statistics_refused(store) == 4


def statistics_refused(store: ReplicaStore) -> int:
    return store.statistics().refused


async def test_start_begins_the_log_anew(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        await fill(store, 1, 3)
        g = group(50)
        assert await write(store, 50, g, start=True) == 54
        assert held(store) == [(1, 50, 54)]
        assert await read_all(store) == (50, g)
        # The old sequences are not readable any more, and not writable.
        with pytest.raises(BadRequest, match="starts at 50"):
            await store.read(SRC, 1, 1, 0)
        with pytest.raises(ReplicaGap) as e:
            await write(store, 13, group(13))
        assert e.value.expected_offset == 54
    assert [f.first_sequence for f in list_files(log_dir(tmp_path))] == [50]
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, 50, 54)]
        assert await read_all(store) == (50, g)


async def test_caught_up_is_durable_and_a_start_resets_it(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    # A recovery installs only a caught-up log: the flag must mean it.
    cfg = journal_config()

    def caught_up(store: ReplicaStore) -> list[bool]:
        return [rl.caught_up for rl in store.holdings(SRC)]

    async with opened(tmp_path, cfg) as store:
        await fill(store, 1, 2)
        assert caught_up(store) == [False]
        # A refused write does not make the log caught up.
        with pytest.raises(ReplicaGap):
            await write(store, 13, group(13), caught_up=True)
        assert caught_up(store) == [False]
        assert await write(store, 9, group(9), caught_up=True) == 13
        assert caught_up(store) == [True]
    async with opened(tmp_path, cfg) as store:
        assert caught_up(store) == [True]
        assert await write(store, 40, group(40), start=True) == 44
        assert caught_up(store) == [False]
    async with opened(tmp_path, cfg) as store:
        assert caught_up(store) == [False]
        assert held(store) == [(1, 40, 44)]


@pytest.mark.parametrize("source", ["", "a/b", "../n1", "x" * 129, "nœud"])
async def test_bad_sources_and_epochs_are_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, source: str
) -> None:
    async with opened(tmp_path / "replicas", journal_config()) as store:
        with pytest.raises(BadRequest):
            store.submit(source, 1, 1, group(1), start=True)
        with pytest.raises(BadRequest):
            await store.fence(source, 2)
        with pytest.raises(BadRequest):
            store.submit(SRC, 0, 1, group(1), start=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replicas"]
    assert list((tmp_path / "replicas").iterdir()) == []


@pytest.mark.parametrize("source", [".", "..", "n1\n"])
async def test_sources_that_are_not_node_ids_are_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, source: str
) -> None:
    async with opened(tmp_path / "replicas", journal_config()) as store:
        with pytest.raises(BadRequest):
            await store.fence(source, 2)
        with pytest.raises(BadRequest):
            await write(store, 1, group(1), source=source, start=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replicas"]


# -- fencing -----------------------------------------------------------------------------


async def test_fence_refuses_older_epochs_durably_and_never_goes_down(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        _, written = await fill(store, 1, 2)
        assert store.fenced_below(SRC) == 0
        assert await store.fence(SRC, 3) == 3
        with pytest.raises(ReplicaFenced):
            await write(store, 9, group(9))
        with pytest.raises(ReplicaFenced):
            await write(store, 9, group(9, epoch=2), epoch=2, start=True)
        # A lower fence leaves it where it is.
        assert await store.fence(SRC, 2) == 3
        assert store.fenced_below(SRC) == 3
        # The fenced epoch's log is still served (a recovery reads it).
        assert await read_all(store) == (1, joined(written))
        # The fence's epoch itself is written, and another source is not fenced.
        assert await write(store, 20, group(20, epoch=3), epoch=3, start=True) == 24
        assert await write(store, 1, group(1), source=OTHER, start=True) == 5
    async with opened(tmp_path, cfg) as store:
        assert store.fenced_below(SRC) == 3
        assert store.fenced_below(OTHER) == 0
        with pytest.raises(ReplicaFenced):
            await write(store, 9, group(9))
        assert await store.fence(SRC, 1) == 3
        assert await read_all(store) == (1, joined(written))
        assert await read_all(store, epoch=3) == (20, group(20, epoch=3))
    async with opened(tmp_path, cfg) as store:
        assert store.fenced_below(SRC) == 3
        assert store.statistics().sources[SRC][2] == 3


class SlowFence:
    """Holds the store's durable fence write until released (the fsync of a busy disk)."""

    def __init__(self, store: ReplicaStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._real = store._write_fence
        monkeypatch.setattr(store, "_write_fence", self._write)

    def _write(self, source: str) -> None:
        self.entered.set()
        self.release.wait(20)
        self._real(source)

    async def wait_entered(self) -> None:
        assert await trio.to_thread.run_sync(self.entered.wait, 20)


async def test_concurrent_fences_keep_the_highest(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        slow = SlowFence(store, monkeypatch)
        got: dict[int, int] = {}

        async def fence(epoch: int) -> None:
            got[epoch] = await store.fence(SRC, epoch)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fence, 5)
            await slow.wait_entered()
            nursery.start_soon(fence, 3)
            await trio.testing.wait_all_tasks_blocked()
            slow.release.set()
        assert store.fenced_below(SRC) == 5
        assert got == {5: 5, 3: 5}
    async with opened(tmp_path, cfg) as store:
        assert store.fenced_below(SRC) == 5


async def test_no_write_is_acknowledged_beyond_what_a_fence_answered(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with opened(tmp_path, journal_config()) as store:
        await fill(store, 1, 1)
        slow = SlowFence(store, monkeypatch)
        real_commit = store._commit

        def slow_commit(batch: Any) -> None:
            time.sleep(0.3)  # a disk busy with the fence's fsync too
            real_commit(batch)

        monkeypatch.setattr(store, "_commit", slow_commit)
        answered: list[tuple[int, int, int]] = []

        async def recovery() -> None:
            # What the replica_fence handler answers: the fence, then the holdings.
            assert await store.fence(SRC, 2) == 2
            answered.extend(held(store))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(recovery)
            await slow.wait_entered()
            acked: int | None = None
            try:
                # The zombie's write, just in time (refused at once once the
                # fence is in force, or later by the committer).
                w = store.submit(SRC, 1, 5, group(5))
            except ReplicaFenced:
                slow.release.set()
            else:
                await trio.testing.wait_all_tasks_blocked()
                slow.release.set()
                try:
                    acked = await store.wait(w)
                except ReplicaFenced:
                    acked = None
        assert answered, "the fence did not answer"
        if acked is not None:
            assert acked <= answered[0][2], (
                f"write acknowledged up to {acked} after the fence answered {answered}"
            )


# -- truncation, dropped epochs --------------------------------------------------------


async def test_truncate_before_deletes_only_files_wholly_before_it(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config(file_size=64 * KiB, preallocate_step=16 * KiB)
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 1, 20)
        firsts = [f.first_sequence for f in list_files(log_dir(tmp_path))]
        assert len(firsts) >= 4, f"the log did not roll: {firsts}"
        # Inside the third file: the first two go, the third stays.
        inside = firsts[2] + OPS
        assert inside < firsts[3]
        assert await write(store, end, b"", truncate_before=inside) == end
        assert [f.first_sequence for f in list_files(log_dir(tmp_path))] == firsts[2:]
        assert held(store) == [(1, firsts[2], end)]
        assert await read_all(store) == (firsts[2], joined(written, firsts[2]))
        with pytest.raises(BadRequest):
            await store.read(SRC, 1, 1, 0)
        # Exactly at a file's start: the files before it go, it stays.
        assert await write(store, end, b"", truncate_before=firsts[3]) == end
        assert [f.first_sequence for f in list_files(log_dir(tmp_path))] == firsts[3:]
        # Beyond the end: the last file (the one being written) stays.
        g = group(end)
        assert await write(store, end, g, truncate_before=end + 1000) == end + OPS
        remaining = [f.first_sequence for f in list_files(log_dir(tmp_path))]
        assert len(remaining) == 1 and remaining[0] in (firsts[-1], end)
        last = remaining[0]
        assert await read_all(store) == (last, joined(written, last) + g)
        # A truncation naming a log this node does not hold creates none.
        assert await write(store, 1, b"", epoch=9, truncate_before=5) == 0
        assert held(store) == [(1, last, end + OPS)]
        assert not log_dir(tmp_path, epoch=9).exists()
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, last, end + OPS)]
        assert await read_all(store) == (last, joined(written, last) + g)
        assert store.statistics().sources[SRC][1] == len(joined(written, last) + g)


async def test_drop_before_drops_older_epochs_of_that_source_only(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        await fill(store, 1, 2, epoch=1)
        await fill(store, 9, 2, epoch=2)
        _, newest = await fill(store, 17, 1, epoch=3)
        _, others = await fill_other(store)
        assert [e for e, _, _ in held(store)] == [1, 2, 3]
        # Not while this node's own epoch-3 log is not caught up: the older
        # ones are what it could serve a down owner's tail from.
        assert await write(store, 21, b"", epoch=3, drop_before=3) == 21
        assert [e for e, _, _ in held(store)] == [1, 2, 3]
        assert await write(store, 21, b"", epoch=3, drop_before=3, caught_up=True) == 21
        assert held(store) == [(3, 17, 21)]
        assert not log_dir(tmp_path, epoch=1).exists()
        assert not log_dir(tmp_path, epoch=2).exists()
        assert await store.read(SRC, 2, 9, 0) == (b"", 9, True)
        assert await read_all(store, epoch=3) == (17, joined(newest))
        assert held(store, OTHER) == [(1, 1, 9)]
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(3, 17, 21)]
        assert await read_all(store, OTHER) == (1, joined(others))


def last_header(g: bytes) -> bytes:
    """The header bytes of a group's last frame, as the source's journal holds them."""
    last = frames_in(g)[-1]
    return g[last.offset : last.offset + HEADER_SIZE]


async def test_a_seeded_start_takes_the_older_log_below_the_seed(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    """A new epoch's log begins with the older log's frames (files linked, not sent again)."""
    cfg = journal_config(file_size=64 * KiB, preallocate_step=16 * KiB)
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 1, 20)
        old_files = list_files(log_dir(tmp_path))
        assert len(old_files) >= 4, "the log did not roll"
        # The seed ends inside a file, at the end of group 12 (of 20): the
        # older log holds more than the new epoch takes.
        upto = 1 + 13 * OPS
        hdr = last_header(dict(written)[upto - OPS])
        g = group(upto, epoch=2)
        got = await write(store, upto, g, epoch=2, start=True, truncate_before=1,
                          seed_epoch=1, seed_header=hdr)  # fmt: skip
        assert got == upto + OPS
        assert held(store) == [(1, 1, end), (2, 1, upto + OPS)]
        expected = joined([w for w in written if w[0] < upto]) + g
        assert await read_all(store, epoch=2) == (1, expected)
        assert await read_all(store, epoch=1) == (1, joined(written)), "the older log changed"
        # Files wholly below the seed are the same files (no copy).
        new_files = list_files(log_dir(tmp_path, epoch=2))
        below = [f for f in old_files if f.path.name in {n.path.name for n in new_files}]
        linked = [
            f for f in below if os.stat(f.path).st_ino
            == os.stat(log_dir(tmp_path, epoch=2) / f.path.name).st_ino
        ]  # fmt: skip
        assert len(linked) == len(below) - 1 >= 2, (below, linked)
        # The older epoch dropped: the new log keeps every frame.
        assert await write(store, upto + OPS, b"", epoch=2, drop_before=2, caught_up=True) == (
            upto + OPS
        )
        assert held(store) == [(2, 1, upto + OPS)]
        assert not log_dir(tmp_path, epoch=1).exists()
        assert await read_all(store, epoch=2) == (1, expected)
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(2, 1, upto + OPS)]
        assert await read_all(store, epoch=2) == (1, expected)


async def test_a_seed_that_does_not_match_is_refused_and_starts_nothing(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config(file_size=64 * KiB, preallocate_step=16 * KiB)
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 5, 10)
        groups = dict(written)
        upto = 5 + 6 * OPS
        good = last_header(groups[upto - OPS])
        wrong_crc = good[:-1] + bytes([good[-1] ^ 1])
        mid_group = frames_in(groups[upto - OPS])[0]  # a group is two frames here
        cases: list[tuple[str, int, dict[str, Any]]] = [
            ("another header", upto, {"seed_header": wrong_crc}),
            ("another group's header", upto, {"seed_header": last_header(groups[5])}),
            ("inside a group", mid_group.header.end_sequence,
             {"seed_header": groups[upto - OPS][:HEADER_SIZE]}),
            ("past the older log", end + OPS, {"seed_header": good}),
            ("an older log starting after the source's oldest file", upto,
             {"seed_header": good, "truncate_before": 1}),
            ("an epoch not held", upto, {"seed_header": good, "seed_epoch": 7}),
        ]  # fmt: skip
        for what, at, kw in cases:
            args: dict[str, Any] = {"truncate_before": 5, "seed_epoch": 1, **kw}
            with pytest.raises(ReplicaGap):
                await write(store, at, group(at, epoch=9), epoch=9, start=True, **args)
            assert held(store) == [(1, 5, end)], what
            assert not log_dir(tmp_path, epoch=9).exists(), what
        # A seed needs a start of a later epoch.
        with pytest.raises(BadRequest):
            store.submit(SRC, 9, upto, group(upto, epoch=9), seed_epoch=1, seed_header=good)
        with pytest.raises(BadRequest):
            store.submit(SRC, 1, upto, group(upto), start=True, seed_epoch=1, seed_header=good)
        # The same seed, right: taken.
        got = await write(store, upto, group(upto, epoch=9), epoch=9, start=True,
                          truncate_before=5, seed_epoch=1, seed_header=good)  # fmt: skip
        assert got == upto + OPS


async def fill_other(store: ReplicaStore) -> tuple[int, list[tuple[int, bytes]]]:
    written = []
    for first in (1, 5):
        g = group(first)
        await write(store, first, g, source=OTHER, start=first == 1)
        written.append((first, g))
    return 9, written


# -- reopening: torn tails, corruption --------------------------------------------------


def last_wal(directory: pathlib.Path) -> pathlib.Path:
    return list_files(directory)[-1].path


def file_frames(path: pathlib.Path) -> list[FrameRecord]:
    with mapped(path) as data:
        return [r for r in read_frames(data, path) if isinstance(r, FrameRecord)]


@pytest.mark.parametrize("where", ["header", "payload"])
async def test_reopening_after_a_torn_tail_keeps_the_valid_prefix(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, where: str
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 1, 5)
    path = last_wal(log_dir(tmp_path))
    # The last group (two frames) torn in its first frame.
    first_of_last = next(r for r in file_frames(path) if r.header.group_sequence == end - OPS)
    cut = HEADER_SIZE // 2 if where == "header" else HEADER_SIZE + 100
    os.truncate(path, first_of_last.offset + cut)
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, 1, end - OPS)]
        assert await read_all(store) == (1, joined(written[:-1]))
        # The source resends the torn group; the log goes on.
        assert await write(store, end - OPS, written[-1][1]) == end
        assert await read_all(store) == (1, joined(written))
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, 1, end)]
        assert await read_all(store) == (1, joined(written))


@pytest.mark.expect_errors("replicas: dropping the log of node n1 epoch 1")
async def test_a_corrupt_log_is_dropped_on_open_not_served(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        await fill(store, 1, 4)
        _, others = await fill_other(store)
    path = last_wal(log_dir(tmp_path))
    frames = file_frames(path)
    # A bad frame in the second group, with valid frames of later groups after it.
    victim = next(r for r in frames if r.header.group_sequence == 5)
    with path.open("r+b") as f:
        f.seek(victim.offset + HEADER_SIZE + 10)
        f.write(b"\xde\xad\xbe\xef")
    async with opened(tmp_path, cfg) as store:
        assert held(store) == []
        assert await store.read(SRC, 1, 1, 0) == (b"", 1, True)
        assert not log_dir(tmp_path).exists()
        with pytest.raises(ReplicaGap) as e:
            await write(store, 17, group(17))
        assert e.value.expected_offset == 0
        # Other logs are untouched, and the source can start again.
        assert await read_all(store, OTHER) == (1, joined(others))
        assert await write(store, 17, group(17), start=True) == 21
        assert await read_all(store) == (17, group(17))


def bad_crc(g: bytes) -> bytes:
    b = bytearray(g)
    b[HEADER_SIZE + 20] ^= 0xFF
    return bytes(b)


MALFORMED: dict[str, Callable[[int], bytes]] = {
    "bad_crc": lambda first: bad_crc(group(first)),
    "bad_crc_in_second_frame": lambda first: group(first)[:-30] + b"\0" * 30,
    "epoch_above_the_log": lambda first: group(first, epoch=2),
    "gap_inside": lambda first: group(first) + group(first + OPS + 1),
    "repeat_inside": lambda first: group(first) + group(first),
    "wrong_first_sequence": lambda first: group(first + 1),
    "half_a_frame": lambda first: group(first)[: HEADER_SIZE + 100],
    "trailing_zeros": lambda first: group(first) + bytes(HEADER_SIZE),
    "garbage": lambda first: b"not a frame at all" * 10,
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
async def test_malformed_frames_are_refused_and_change_nothing(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, kind: str
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 1, 2)
        with pytest.raises(BadRequest) as e:
            await write(store, end, MALFORMED[kind](end))
        assert not isinstance(e.value, ReplicaGap)
        assert held(store) == [(1, 1, end)]
        assert await read_all(store) == (1, joined(written))
        g = group(end)
        assert await write(store, end, g) == end + OPS
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, 1, end + OPS)]
        assert await read_all(store) == (1, joined(written) + g)


async def test_older_epochs_frames_are_taken_in_a_catch_up(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    # A log of epoch 3 starts at the journal's oldest file, written in epoch 2.
    async with opened(tmp_path, journal_config()) as store:
        old, new = group(1, epoch=2), group(5, epoch=3)
        assert await write(store, 1, old, epoch=3, start=True) == 5
        assert await write(store, 5, new, epoch=3) == 9
        assert await read_all(store, epoch=3) == (1, old + new)


async def test_a_malformed_start_changes_nothing(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with opened(tmp_path, journal_config()) as store:
        end, written = await fill(store, 1, 2)
        with pytest.raises(BadRequest):
            await write(store, 50, bad_crc(group(50)), start=True)
        assert held(store) == [(1, 1, end)]
        assert await read_all(store) == (1, joined(written))


class FailingSync:
    """``os.fdatasync`` failing with EIO on the calls numbered in ``failing`` (from 1)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failing: set[int]) -> None:
        self.calls = 0
        self._failing = failing
        self._real = os.fdatasync
        monkeypatch.setattr(os, "fdatasync", self)

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls in self._failing:
            raise OSError(errno.EIO, "Input/output error")
        self._real(fd)


async def answers(store: ReplicaStore, writes: list[Any]) -> list[int | None]:
    """Each write's durable next sequence, or None when it was refused (Overloaded)."""
    out: list[int | None] = []
    for w in writes:
        try:
            out.append(await store.wait(w))
        except Overloaded:
            out.append(None)
    return out


@pytest.mark.expect_errors("replicas: fdatasync of")
async def test_a_failed_fdatasync_drops_the_log_and_the_source_starts_it_again(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = journal_config()
    async with opened(tmp_path, cfg) as store:
        end, _ = await fill(store, 1, 3)
        FailingSync(monkeypatch, {1})
        with pytest.raises(Overloaded, match="fdatasync"):
            await write(store, end, group(end))
        monkeypatch.undo()
        # The file's state is unknown: nothing of the log is served any more.
        assert held(store) == []
        assert await store.read(SRC, 1, 1, 0) == (b"", 1, True)
        with pytest.raises(ReplicaGap) as e:
            await write(store, end, group(end))
        assert e.value.expected_offset == 0
        # The source starts it again (from its oldest file); that is durable.
        _, written = await fill(store, 1, 4)
    async with opened(tmp_path, cfg) as store:
        assert held(store) == [(1, 1, 17)]
        assert await read_all(store) == (1, joined(written))


@pytest.mark.expect_errors("replicas: fdatasync of", "replicas: writing node n1 epoch 1")
async def test_a_failed_fdatasync_before_a_roll_acknowledges_nothing_it_covered(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = journal_config(file_size=64 * KiB, preallocate_step=16 * KiB)
    async with opened(tmp_path, cfg) as store:
        end, written = await fill(store, 1, 3)
        # One batch: two groups fit in the file, the third rolls it (synced first).
        sync = FailingSync(monkeypatch, {1})
        batch = [store.submit(SRC, 1, end + k * OPS, group(end + k * OPS)) for k in range(3)]
        got = await answers(store, batch)
        monkeypatch.undo()
        assert sync.calls >= 1
        # The log is dropped whole (the source starts it again), or at most rolled once.
        assert not log_dir(tmp_path).exists() or len(list_files(log_dir(tmp_path))) <= 2
        assert got[:2] == [None, None], f"acknowledged after a failed fdatasync: {got}"
        # Whatever is still held is served as it was acknowledged.
        if held(store):
            assert await read_all(store) == (1, joined(written))


# -- a full disk -------------------------------------------------------------------------


async def test_a_full_disk_refuses_with_overloaded_then_resumes(
    small_tmpfs: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config(file_size=256 * KiB, preallocate_step=64 * KiB)
    root = small_tmpfs / "replicas"
    filler = small_tmpfs / "filler"
    async with opened(root, cfg) as store:
        seq, written = await fill(store, 1, 1)
        st = os.statvfs(small_tmpfs)
        with filler.open("wb") as f:
            f.write(bytes(st.f_bavail * st.f_frsize - 300 * KiB))
        refused = 0
        for _ in range(100):
            g = group(seq)
            try:
                assert await write(store, seq, g) == seq + OPS
            except Overloaded as e:
                assert "disk full" in str(e)
                refused += 1
                break
            written.append((seq, g))
            seq += OPS
        assert refused, "the disk never filled up"
        # What was acknowledged is intact, and nothing else is held.
        assert held(store) == [(1, 1, seq)]
        assert await read_all(store) == (1, joined(written))
        # Still full: still refused, at the same place.
        with pytest.raises(Overloaded):
            await write(store, seq, group(seq))
        filler.unlink()
        for _ in range(3):
            g = group(seq)
            assert await write(store, seq, g) == seq + OPS
            written.append((seq, g))
            seq += OPS
        assert await read_all(store) == (1, joined(written))
    async with opened(root, cfg) as store:
        assert held(store) == [(1, 1, seq)]
        assert await read_all(store) == (1, joined(written))


# -- read_groups on a real journal ----------------------------------------------------


async def real_journal(directory: pathlib.Path, cfg: JournalConfig) -> int:
    """A journal of several files and multi-frame groups; its next sequence."""
    async with open_journal(directory, cfg) as j:

        async def one(i: int) -> None:
            await j.append_parts(encode_append(1, i, payload(i, 2500 + 97 * (i % 7))))

        for batch in range(12):
            async with trio.open_nursery() as nursery:
                for i in range(batch * 8, batch * 8 + 8):
                    nursery.start_soon(one, i)
        return j.next_sequence


#: (files as (first sequence, path), next sequence, groups as (first, end, frames)).
RealJournal = tuple[list[tuple[int, pathlib.Path]], int, list[tuple[int, int, bytes]]]


def groups_of(directory: pathlib.Path) -> list[tuple[int, int, bytes]]:
    """(first sequence, end, frames) of every write group in the journal, in order."""
    out: list[tuple[int, int, bytes]] = []
    for jf in list_files(directory):
        with mapped(jf.path) as data:
            for r in read_frames(data, jf.path):
                if not isinstance(r, FrameRecord):
                    break
                raw = bytes(data[r.offset : r.end_offset])
                if out and out[-1][0] == r.header.group_sequence:
                    first, _, frames = out[-1]
                    out[-1] = (first, r.header.end_sequence, frames + raw)
                else:
                    assert r.header.group_sequence == r.header.first_sequence
                    out.append((r.header.first_sequence, r.header.end_sequence, raw))
    return out


@pytest.fixture
async def journal(tmp_path: pathlib.Path, journal_config: ConfigFactory) -> RealJournal:
    """(files, next sequence, groups) of a real journal rolled over several files."""
    cfg = journal_config(
        file_size=64 * KiB, preallocate_step=16 * KiB, max_frame_bytes=6 * KiB,
        max_group_bytes=24 * KiB,
    )  # fmt: skip
    directory = tmp_path / "journal"
    nxt = await real_journal(directory, cfg)
    files = [(f.first_sequence, f.path) for f in list_files(directory)]
    groups = groups_of(directory)
    assert len(files) >= 3, "the journal did not roll"
    assert any(len(frames_in(g)) > 1 for _, _, g in groups), "no group of several frames"
    assert groups[-1][1] == nxt
    return files, nxt, groups


def span(groups: list[tuple[int, int, bytes]], first: int, end: int) -> bytes:
    return b"".join(g for a, b, g in groups if a >= first and b <= end)


async def test_read_groups_reads_whole_groups_across_files(
    journal: RealJournal,
) -> None:
    files, nxt, groups = journal
    first = groups[0][0]
    assert read_groups(files, first, nxt, 1 << 30) == (span(groups, first, nxt), nxt, True)
    # From any group, in any file.
    for a, _, _ in groups[1:]:
        assert read_groups(files, a, nxt, 1 << 30) == (span(groups, a, nxt), nxt, True)


@pytest.mark.parametrize("max_bytes", [1, 5000, 20 * KiB, 64 * KiB])
async def test_read_groups_respects_max_bytes_with_at_least_one_group(
    journal: RealJournal,
    max_bytes: int,
) -> None:
    files, nxt, groups = journal
    starts = [a for a, _, _ in groups]
    at, out = groups[0][0], b""
    while True:
        frames, after, end = read_groups(files, at, nxt, max_bytes)
        assert after in starts or after == nxt, f"stopped inside a group at {after}"
        assert frames == span(groups, at, after)
        k = starts.index(at)
        taken = starts.index(after) - k if after < nxt else len(starts) - k
        assert taken >= 1, "not even one group"
        if taken > 1:
            assert len(frames) <= max_bytes
        if after < nxt:
            # Not one group less than fits.
            assert len(frames) + len(groups[k + taken][2]) > max_bytes
        out += frames
        if end:
            break
        at = after
    assert after == nxt
    assert out == span(groups, groups[0][0], nxt)


async def test_read_groups_stops_at_the_limit(
    journal: RealJournal,
) -> None:
    files, nxt, groups = journal
    for limit_index in (1, len(groups) // 2, len(groups) - 1):
        limit = groups[limit_index][0]
        frames, after, end = read_groups(files, groups[0][0], limit, 1 << 30)
        assert (frames, after, end) == (span(groups, groups[0][0], limit), limit, True)
    # From the limit itself: nothing, and the end.
    assert read_groups(files, nxt, nxt, 1 << 30) == (b"", nxt, True)


async def test_read_groups_ends_early_at_a_missing_file(
    journal: RealJournal,
) -> None:
    files, nxt, groups = journal
    second = files[1][0]
    files[1][1].unlink()
    frames, after, end = read_groups(files, groups[0][0], nxt, 1 << 30)
    assert (frames, after, end) == (span(groups, groups[0][0], second), second, False)
    # Reading from inside the missing file gives nothing, not the next file's frames.
    assert read_groups(files, second, nxt, 1 << 30) == (b"", second, False)


# A child process: a journal file whose frames end on a page boundary, with
# preallocated zeros after them, is sealed (cut to its data, as the journal
# and the replica store do when they roll) while read_groups reads it, as the
# replicator's catch-up and a replica read do from another thread.
_SEALED_WHILE_READ = """
import contextlib, os, pathlib, sys
from gateway.journal import reader
from gateway.journal.format import encode_append, encode_group, operation_prefix

def frame(size):
    head, data = encode_append(1, 0, bytes(size))
    n = len(head) + len(data)
    prefix = operation_prefix(n)
    buffers, total, _ = encode_group([prefix, head, data], [3], [len(prefix) + n], 1, 1, 1 << 20)
    return b"".join(bytes(b) for b in buffers)

size = 4000
while len(frame(size)) != 4096:
    size += 4096 - len(frame(size))
path = pathlib.Path(sys.argv[1]) / "00000000000000000001.wal"
path.write_bytes(frame(size) + bytes(60 * 1024))  # the preallocated space
real = reader.mapped

@contextlib.contextmanager
def sealed_meanwhile(p):
    with real(p) as data:
        os.truncate(p, 4096)  # the writer rolls to its next file meanwhile
        yield data

reader.mapped = sealed_meanwhile
frames, nxt, end = reader.read_groups([(1, path)], 1, 100, 1 << 20)
print(len(frames), nxt, end)
"""


def test_read_groups_survives_a_file_sealed_while_it_reads(tmp_path: pathlib.Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _SEALED_WHILE_READ, str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, f"the reader died: exit {r.returncode} {r.stderr[-500:]}"
    assert r.stdout.split() == ["4096", "2", "False"]


async def test_read_groups_reads_what_the_store_holds_as_the_journal_wrote_it(
    tmp_path: pathlib.Path,
    journal: RealJournal,
    journal_config: ConfigFactory,
) -> None:
    # A real journal's groups replicated one by one are read back identically.
    _, nxt, groups = journal
    async with opened(tmp_path / "replicas", journal_config()) as store:
        for k, (a, b, g) in enumerate(groups):
            assert await write(store, a, g, start=k == 0) == b
        assert await read_all(store) == (groups[0][0], span(groups, groups[0][0], nxt))


# -- the ensemble record -----------------------------------------------------------------


def record(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": ENSEMBLE_FORMAT, "node": "n1", "epoch": 7, "members": ["n2", "n3"],
        "write_quorum": 3, "ack_quorum": 2, "changed_at_ms": 1234,
    }  # fmt: skip
    for k, v in changes.items():
        if v is _DELETE:
            del doc[k]
        else:
            doc[k] = v
    return doc


_DELETE = object()

BAD_RECORDS: dict[str, bytes] = {
    "not_json": b"{not json",
    "not_utf8": b"\xff\xfe{",
    "a_list": b"[1, 2]",
    "a_string": b'"n1"',
    "format_2": json.dumps(record(format=2)).encode(),
    "format_string": json.dumps(record(format="1")).encode(),
    "format_missing": json.dumps(record(format=_DELETE)).encode(),
    "other_node": json.dumps(record(node="n9")).encode(),
    "node_not_string": json.dumps(record(node=1)).encode(),
    "node_missing": json.dumps(record(node=_DELETE)).encode(),
    "other_epoch": json.dumps(record(epoch=8)).encode(),
    "epoch_zero": json.dumps(record(epoch=0)).encode(),
    "epoch_bool": json.dumps(record(epoch=True)).encode(),
    "epoch_float": json.dumps(record(epoch=7.0)).encode(),
    "members_missing": json.dumps(record(members=_DELETE)).encode(),
    "members_string": json.dumps(record(members="n2,n3")).encode(),
    "members_dict": json.dumps(record(members={"n2": 1})).encode(),
    "members_too_many": json.dumps(record(members=[f"m{i}" for i in range(65)])).encode(),
    "member_itself": json.dumps(record(members=["n2", "n1"])).encode(),
    "member_int": json.dumps(record(members=["n2", 3])).encode(),
    "member_empty": json.dumps(record(members=[""])).encode(),
    "member_null": json.dumps(record(members=[None])).encode(),
    "member_too_long": json.dumps(record(members=["x" * 129])).encode(),
    "write_quorum_zero": json.dumps(record(write_quorum=0)).encode(),
    "write_quorum_65": json.dumps(record(write_quorum=65)).encode(),
    "write_quorum_missing": json.dumps(record(write_quorum=_DELETE)).encode(),
    "ack_quorum_zero": json.dumps(record(ack_quorum=0)).encode(),
    "ack_above_write": json.dumps(record(ack_quorum=4)).encode(),
    "ack_quorum_string": json.dumps(record(ack_quorum="2")).encode(),
    "changed_at_negative": json.dumps(record(changed_at_ms=-1)).encode(),
    "changed_at_missing": json.dumps(record(changed_at_ms=_DELETE)).encode(),
}


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
def test_ensemble_decode_refuses_malformed_records(kind: str) -> None:
    with pytest.raises(BadRecord):
        Ensemble.decode(BAD_RECORDS[kind], "n1", 7)


def test_ensemble_decode_reads_a_good_record() -> None:
    e = Ensemble.decode(json.dumps(record()).encode(), "n1", 7)
    assert e == Ensemble("n1", 7, ("n2", "n3"), 3, 2, 1234)
    # No members (every one dropped) is a record too.
    assert Ensemble.decode(json.dumps(record(members=[])).encode(), "n1", 7).members == ()


def test_ensemble_round_trip() -> None:
    e = Ensemble("node-a", 12, ("node-b", "node-c", "node-d"), 4, 3, 1700000000000)
    assert Ensemble.decode(e.encode(), "node-a", 12) == e
    # Without a time, encode stamps one.
    stamped = Ensemble.decode(Ensemble("a", 1, ("b",), 2, 2).encode(), "a", 1)
    assert stamped.changed_at_ms > 1_600_000_000_000
    assert stamped.members == ("b",)


def test_ensemble_decode_refuses_a_member_named_twice() -> None:
    with pytest.raises(BadRecord):
        Ensemble.decode(json.dumps(record(members=["n2", "n2"])).encode(), "n1", 7)


def brute_needed(members: int, ack_quorum: int) -> int:
    """The fewest answers that surely include a member holding a group acknowledged by
    ``ack_quorum`` copies (the source's own counts as one), whatever members hold it."""
    holders = ack_quorum - 1
    for k in range(1, members + 1):
        # The worst case: the k answering members are all non-holders.
        if members - holders < k:
            return k
    return members + 1  # no number of answers is sure


@pytest.mark.parametrize(
    ("members", "ack_quorum"),
    [(2, 2), (2, 3), (3, 2), (3, 3), (3, 4), (4, 3), (4, 5), (1, 2), (6, 4)],
)
def test_needed_answers(members: int, ack_quorum: int) -> None:
    e = Ensemble("n0", 1, tuple(f"m{i}" for i in range(members)), members + 1, ack_quorum)
    assert e.needed_answers() == brute_needed(members, ack_quorum)
    assert 1 <= e.needed_answers() <= members


@pytest.mark.parametrize("members", [1, 2, 4])
def test_needed_answers_with_asynchronous_replicas_can_be_met(members: int) -> None:
    e = Ensemble("n0", 1, tuple(f"m{i}" for i in range(members)), members + 1, 1)
    assert e.needed_answers() <= members


# -- the replica handlers' access rules (a real server in process) ----------------------


@asynccontextmanager
async def replica_server(
    tmp_path: pathlib.Path, store: ReplicaStore | None, current_epochs: dict[str, int]
) -> AsyncIterator[str]:
    """Node n2's protocol server holding ``store``; its address.

    A source's epoch is current (Tier 2's answer before a log starts) when it
    is ``current_epochs[source]``.
    """

    async def epoch_current(source: str, epoch: int) -> bool:
        return current_epochs.get(source) == epoch

    config = make_config(tmp_path / "node")
    async with open_node(config, container_type=DirectContainer) as node:
        server = Server(
            node.container, config.server, config.container.max_append_bytes, node="n2",
            replicas=store, epoch_current=epoch_current,
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(server.serve)
            host, port = addresses[0]
            try:
                yield f"{host}:{port}"
            finally:
                nursery.cancel_scope.cancel()


def node_name(node: str) -> str:
    return f"segment-gateway-node/{node}"


async def replica_write(client: Client, first: int, frames: bytes, **kw: Any) -> int:
    r = await client._call(
        replica_write=wire.ReplicaWriteRequest(first_sequence=first, frames=frames, **kw)
    )
    return r.replica_write.next_sequence


async def test_replica_requests_are_for_the_cluster_s_nodes_only(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with (
        opened(tmp_path / "replicas", journal_config()) as store,
        replica_server(tmp_path, store, {SRC: 1}) as address,
    ):
        for name in ("segment-gateway-client/1.0", "segment-gateway-nodes/n1", "n1", ""):
            async with open_client(address, client_name=name) as c:
                with pytest.raises(Unauthorized):
                    await replica_write(c, 1, group(1), source=SRC, epoch=1, start=True)
                with pytest.raises(Unauthorized):
                    await c._call(replica_fence=wire.ReplicaFenceRequest(source=SRC, epoch=5))
                with pytest.raises(Unauthorized):
                    await c._call(
                        replica_read=wire.ReplicaReadRequest(source=SRC, epoch=1, from_sequence=1)
                    )
        assert held(store) == []
        assert store.fenced_below(SRC) == 0
        assert not (tmp_path / "replicas" / SRC).exists()


async def test_a_node_writes_only_its_own_journal(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with (
        opened(tmp_path / "replicas", journal_config()) as store,
        replica_server(tmp_path, store, {SRC: 1, "n2": 1, OTHER: 1}) as address,
    ):
        g1, g2 = group(1), group(5)
        async with open_client(address, client_name=node_name(OTHER)) as c3:
            with pytest.raises(Unauthorized, match="may not write"):
                await replica_write(c3, 1, g1, source=SRC, epoch=1, start=True)
            assert held(store) == []
        async with open_client(address, client_name=node_name(SRC)) as c1:
            assert await replica_write(c1, 1, g1, source=SRC, epoch=1, start=True) == 5
            assert await replica_write(c1, 5, g2, source=SRC, epoch=1) == 9
            with pytest.raises(ReplicaGap) as e:
                await replica_write(c1, 13, group(13), source=SRC, epoch=1)
            assert e.value.expected_offset == 9
        async with open_client(address, client_name=node_name(OTHER)) as c3:
            # Another node may not add to n1's log either, once it exists.
            with pytest.raises(Unauthorized):
                await replica_write(c3, 9, group(9), source=SRC, epoch=1)
            # But any node of the cluster reads it (a recovery) and fences it.
            r = await c3._call(
                replica_read=wire.ReplicaReadRequest(source=SRC, epoch=1, from_sequence=1)
            )
            assert (r.replica_frames.frames, r.replica_frames.next_sequence) == (g1 + g2, 9)
            assert r.replica_frames.end
            h = await c3._call(replica_fence=wire.ReplicaFenceRequest(source=SRC, epoch=2))
            assert h.replica_holdings.fenced_below == 2
            assert [(i.epoch, i.start, i.next) for i in h.replica_holdings.logs] == [(1, 1, 9)]
        async with open_client(address, client_name=node_name("n2")) as c2:
            # This node's own journal is not kept among its replicas.
            with pytest.raises(BadRequest):
                await replica_write(c2, 1, g1, source="n2", epoch=1, start=True)
        async with open_client(address, client_name=node_name(SRC)) as c1:
            with pytest.raises(ReplicaFenced):
                await replica_write(c1, 9, group(9), source=SRC, epoch=1)
        assert held(store) == [(1, 1, 9)]
        assert held(store, "n2") == []


async def test_a_log_starts_only_for_the_source_s_current_epoch(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with (
        opened(tmp_path / "replicas", journal_config()) as store,
        replica_server(tmp_path, store, {SRC: 4}) as address,
        open_client(address, client_name=node_name(SRC)) as c1,
    ):
        # A process taken over (Tier 2 says epoch 4) cannot begin a log: it is fenced.
        with pytest.raises(ReplicaFenced):
            await replica_write(c1, 1, group(1, epoch=3), source=SRC, epoch=3, start=True)
        assert store.fenced_below(SRC) == 4
        assert held(store) == []
        g = group(1, epoch=4)
        assert await replica_write(c1, 1, g, source=SRC, epoch=4, start=True) == 5
        assert await read_all(store, epoch=4) == (1, g)


async def test_a_node_without_replicas_says_so(tmp_path: pathlib.Path) -> None:
    async with (
        replica_server(tmp_path, None, {}) as address,
        open_client(address, client_name=node_name(SRC)) as c1,
    ):
        with pytest.raises(Unavailable, match="keeps no replicas"):
            await replica_write(c1, 1, group(1), source=SRC, epoch=1, start=True)
