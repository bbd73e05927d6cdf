"""A recovery's copy of the chosen replica log, in process (no daemons).

A container hosted on another node's host (a takeover, a drain) copies what
the host's own disk holds of the log first and reads only the rest from the
member with the longest log, several reads in flight
(`gateway.replication.recovery`). What is checked is the journal installed:
its frames byte for byte against a copy read wholly from the member, where
it starts, and which bytes went over the protocol.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import pytest
import trio

from gateway.client.client import Client, open_client
from gateway.config import Config, JournalConfig, KiB
from gateway.errors import Unavailable
from gateway.journal.files import list_files
from gateway.journal.reader import read_groups
from gateway.protocol import wire_pb2 as wire
from gateway.replication import recovery
from gateway.replication.recovery import LocalReplicas, _install, _local_log, _read_remote
from gateway.replication.store import ReplicaStore
from tests.helpers.segments import make_config
from tests.test_replication_unit import SRC, group, node_name, opened, replica_server, write

pytestmark = pytest.mark.timeout(60)

ConfigFactory = Callable[..., JournalConfig]
#: The member whose log is read over the protocol, and the host this runs on.
MEMBER = "n2"
HOST = "n3"
EPOCH = 1
FENCE = 2


def groups_from(first: int, count: int, seed: int = 0) -> list[tuple[int, bytes]]:
    """``count`` write groups from ``first`` of varying sizes: [(first sequence, frames)]."""
    rng = random.Random(seed)
    out = []
    seq = first
    for _ in range(count):
        ops = rng.randint(1, 6)
        out.append((seq, group(seq, ops, size=rng.randint(200, 6000))))
        seq += ops
    return out


async def hold(
    store: ReplicaStore, groups: list[tuple[int, bytes]], truncate_before: int = 0
) -> None:
    """``groups`` as the store's log of SRC's epoch 1 (then truncated, if asked)."""
    for k, (first, frames) in enumerate(groups):
        await write(store, first, frames, start=k == 0)
    if truncate_before:
        await write(store, 0, b"", truncate_before=truncate_before)


def info_of(store: ReplicaStore) -> wire.ReplicaLogInfo:
    (rl,) = store.holdings(SRC)
    return wire.ReplicaLogInfo(epoch=rl.epoch, start=rl.start, next=rl.next, caught_up=True)


def installed(config: Config, first: int, end: int) -> bytes:
    """The installed journal's frames of operations [first, end), which must all be there."""
    files = [(f.first_sequence, f.path) for f in list_files(config.journal_dir)]
    frames, nxt, reached = read_groups(files, first, end, 1 << 30)
    assert (nxt, reached) == (end, True), f"the journal holds {first}..{nxt}, not ..{end}"
    return frames


class Recorder:
    """Connects to the member, and notes every replica read sent."""

    def __init__(self) -> None:
        self.connects = 0
        self.reads: list[int] = []

    @asynccontextmanager
    async def connect(self, address: str) -> AsyncIterator[Client]:
        self.connects += 1
        async with open_client(address, client_name=node_name(HOST)) as c:
            yield c


@asynccontextmanager
async def cluster(
    tmp_path: pathlib.Path,
    journal_config: ConfigFactory,
    remote: list[tuple[int, bytes]],
    local: list[tuple[int, bytes]] | None,
    *,
    remote_truncate: int = 0,
    local_truncate: int = 0,
) -> AsyncIterator[tuple[str, wire.ReplicaLogInfo, dict[str, wire.ReplicaHoldings], Recorder]]:
    """The member's store behind a real server, and the host's store on disk (closed
    again: a fenced log does not change); (address, the member's log, the fence's
    answers, the recorder)."""
    cfg = journal_config(file_size=48 * KiB, preallocate_step=16 * KiB)
    answers = {}
    if local is not None:
        async with opened(tmp_path / "host" / "replicas", cfg) as host:
            await hold(host, local, local_truncate)
            logs = [
                wire.ReplicaLogInfo(epoch=rl.epoch, start=rl.start, next=rl.next, caught_up=True)
                for rl in host.holdings(SRC)
            ]
            answers[HOST] = wire.ReplicaHoldings(node=HOST, fenced_below=FENCE, logs=logs)
    recorder = Recorder()
    async with (
        opened(tmp_path / "member" / "replicas", cfg) as member,
        replica_server(tmp_path / "member", member, {SRC: EPOCH}) as address,
    ):
        await hold(member, remote, remote_truncate)
        info = info_of(member)
        answers[MEMBER] = wire.ReplicaHoldings(node=MEMBER, fenced_below=FENCE, logs=[info])
        real_read = member.read

        async def read(
            source: str, epoch: int, first: int, max_bytes: int
        ) -> tuple[bytes, int, bool]:
            recorder.reads.append(first)
            return await real_read(source, epoch, first, max_bytes)

        member.read = read  # type: ignore[method-assign]
        yield address, info, answers, recorder


async def install(
    tmp_path: pathlib.Path,
    name: str,
    address: str,
    info: wire.ReplicaLogInfo,
    answers: dict[str, wire.ReplicaHoldings],
    recorder: Recorder,
    with_local: bool = True,
) -> tuple[Config, recovery._Copied]:
    config = make_config(tmp_path / name)
    local = LocalReplicas(HOST, tmp_path / "host" / "replicas") if with_local else None
    chosen = _local_log(local, answers, SRC, info)
    copied = await _install(config, recorder.connect, MEMBER, address, SRC, info, FENCE, chosen)
    return config, copied


def size(groups: list[tuple[int, bytes]], first: int = 0, end: int = 1 << 62) -> int:
    return sum(len(g) for a, g in groups if first <= a < end)


async def test_a_shorter_local_log_is_copied_and_only_the_rest_read(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    remote = groups_from(1, 60)
    cut = remote[25][0]
    local = [g for g in remote if g[0] < cut]
    async with cluster(tmp_path, journal_config, remote, local) as (address, info, answers, rec):
        pure_config, pure = await install(tmp_path, "pure", address, info, answers, rec, False)
        assert rec.reads[0] == info.start and pure.local_bytes == 0
        rec.reads.clear()
        config, copied = await install(tmp_path, "local", address, info, answers, rec)
    assert rec.reads and min(rec.reads) == cut, "read what the host has from the member"
    assert copied.start == info.start == 1
    assert (copied.local_bytes, copied.remote_bytes) == (size(remote, end=cut), size(remote, cut))
    assert pure.remote_bytes == size(remote)
    assert installed(config, 1, info.next) == installed(pure_config, 1, info.next)
    assert installed(config, 1, info.next) == b"".join(g for _, g in remote)


async def test_a_local_log_as_long_as_the_member_s_reads_nothing_over_the_network(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    remote = groups_from(1, 40)
    async with cluster(tmp_path, journal_config, remote, remote) as (address, info, answers, rec):
        config, copied = await install(tmp_path, "local", address, info, answers, rec)
    assert rec.reads == [] and rec.connects == 0
    assert (copied.local_bytes, copied.remote_bytes, copied.start) == (size(remote), 0, 1)
    assert installed(config, 1, info.next) == b"".join(g for _, g in remote)


async def test_whole_files_of_the_local_log_are_linked_and_never_written_through(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    # The files between the first and the last are hard links to the host's
    # (the fenced epoch never changes); the last is a copy, since the journal
    # appends to it -- here the fence's epoch, and then the new process's writes.
    remote = groups_from(1, 80)
    async with cluster(tmp_path, journal_config, remote, remote) as (address, info, answers, rec):
        host_dir = tmp_path / "host" / "replicas" / SRC / "e00000000000000000001"
        before = {f.path.name: f.path.read_bytes() for f in list_files(host_dir)}
        config, copied = await install(tmp_path, "local", address, info, answers, rec)
        host_files = list_files(host_dir)
        assert {f.path.name: f.path.read_bytes() for f in host_files} == before
    assert len(host_files) >= 4
    host_inodes = {f.path.stat().st_ino for f in host_files}
    installed_files = list_files(config.journal_dir)
    linked = [f for f in installed_files if f.path.stat().st_ino in host_inodes]
    assert 2 <= len(linked) < len(host_files), [f.path.name for f in installed_files]
    assert installed_files[-1] not in linked
    assert copied.local_bytes == size(remote) and rec.reads == []
    assert installed(config, 1, info.next) == b"".join(g for _, g in remote)


async def test_a_longer_local_log_is_copied_only_as_far_as_the_chosen_one(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    # Not an ensemble member's (or not answered): what it holds past the
    # chosen log's end is not installed.
    local = groups_from(1, 40)
    remote = local[:30]
    async with cluster(tmp_path, journal_config, remote, local) as (address, info, answers, rec):
        config, copied = await install(tmp_path, "local", address, info, answers, rec)
    assert rec.reads == [] and rec.connects == 0
    assert copied.local_bytes == size(remote)
    assert installed(config, 1, info.next) == b"".join(g for _, g in remote)
    files = [(f.first_sequence, f.path) for f in list_files(config.journal_dir)]
    # Only the fence's epoch follows: nothing of the host's longer log.
    everything = read_groups(files, 1, 1 << 62, 1 << 30)[0]
    assert size(remote) < len(everything) < size(remote) + 1024


async def test_a_local_log_truncated_further_starts_the_journal_later(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    remote = groups_from(1, 60)
    cut = remote[20][0]
    local = [g for g in remote if g[0] < remote[40][0]]
    async with cluster(tmp_path, journal_config, remote, local, local_truncate=cut) as (
        address, info, answers, rec,
    ):  # fmt: skip
        start = answers[HOST].logs[0].start
        assert 1 < start <= cut, "the host's log was not truncated"
        pure_config, _ = await install(tmp_path, "pure", address, info, answers, rec, False)
        rec.reads.clear()
        config, copied = await install(tmp_path, "local", address, info, answers, rec)
    assert copied.start == start
    assert min(rec.reads) == remote[40][0]
    assert copied.local_bytes == size(remote, start, remote[40][0])
    assert installed(config, start, info.next) == installed(pure_config, start, info.next)
    assert list_files(config.journal_dir)[0].first_sequence == start


@pytest.mark.parametrize("damage", ["missing file", "bad frame"])
async def test_a_local_log_that_cannot_be_read_whole_is_read_from_the_member(
    tmp_path: pathlib.Path,
    journal_config: ConfigFactory,
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    remote = groups_from(1, 60)
    local = remote[:45]
    async with cluster(tmp_path, journal_config, remote, local) as (address, info, answers, rec):
        files = list_files(tmp_path / "host" / "replicas" / SRC / "e00000000000000000001")
        assert len(files) >= 3
        if damage == "missing file":
            files[1].path.unlink()
        else:
            with files[1].path.open("r+b") as f:
                f.seek(200)
                byte = f.read(1)
                f.seek(200)
                f.write(bytes([byte[0] ^ 0xFF]))
        with caplog.at_level(logging.WARNING, logger="gateway.replication.recovery"):
            config, copied = await install(tmp_path, "local", address, info, answers, rec)
    assert "cannot be read whole" in caplog.text
    assert (copied.start, copied.local_bytes, copied.remote_bytes) == (1, 0, size(remote))
    assert rec.reads[-1] == 1, "everything read again from the member"
    assert installed(config, 1, info.next) == b"".join(g for _, g in remote)


async def test_no_local_replicas_reads_everything_from_the_member(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    remote = groups_from(1, 30)
    async with cluster(tmp_path, journal_config, remote, None) as (address, info, answers, rec):
        # The host answered the fence but holds nothing of this epoch.
        answers[HOST] = wire.ReplicaHoldings(node=HOST, fenced_below=FENCE)
        config, copied = await install(tmp_path, "local", address, info, answers, rec)
    assert (copied.local_bytes, copied.remote_bytes) == (0, size(remote))
    assert installed(config, 1, info.next) == b"".join(g for _, g in remote)


# -- the remote read -----------------------------------------------------------------


class FakeMember:
    """A member answering replica reads from a log's files as the store does, in the
    order they were sent (as a connection does); notes how many were in flight."""

    def __init__(self, files: list[tuple[int, pathlib.Path]], start: int, nxt: int) -> None:
        self.files, self.log_start, self.next = files, start, nxt
        self.in_flight = 0
        self.most_in_flight = 0
        self.reads: list[int] = []
        self.answered: list[trio.Event] = []

    async def start(self, build: Callable[[int], Sequence[bytes]]) -> FakeMember.Answer:
        (raw,) = build(len(self.reads) + 1)
        r = wire.Request.FromString(raw).replica_read
        self.reads.append(r.from_sequence)
        self.answered.append(trio.Event())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return FakeMember.Answer(self, len(self.reads) - 1, r.from_sequence, r.max_bytes)

    class Answer:
        def __init__(self, member: FakeMember, index: int, first: int, max_bytes: int) -> None:
            self.member, self.index, self.first, self.max_bytes = member, index, first, max_bytes

        async def wait(self) -> wire.Response:
            m = self.member
            if self.index:
                await m.answered[self.index - 1].wait()  # answered in order
            await trio.sleep(0.001)
            m.answered[self.index].set()
            m.in_flight -= 1
            if self.first >= m.next:
                frames, nxt, end = b"", self.first, True
            else:
                assert self.first >= m.log_start
                frames, nxt, end = read_groups(m.files, self.first, m.next, self.max_bytes)
            return wire.Response(
                replica_frames=wire.ReplicaFrames(frames=frames, next_sequence=nxt, end=end)
            )


async def member_log(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, groups: list[tuple[int, bytes]]
) -> tuple[list[tuple[int, pathlib.Path]], wire.ReplicaLogInfo]:
    async with opened(tmp_path / "member", journal_config(file_size=48 * KiB)) as store:
        await hold(store, groups)
        (rl,) = store.holdings(SRC)
        return list(rl.files), info_of(store)


def read_back(directory: pathlib.Path, first: int, end: int) -> bytes:
    """The frames [first, end) of the journal files in ``directory``, all there."""
    files = [(f.first_sequence, f.path) for f in list_files(directory)]
    assert files and files[0][0] == first
    frames, nxt, _ = read_groups(files, first, end, 1 << 30)
    assert nxt == end
    return frames


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("max_bytes", [6 * KiB, 20 * KiB, 64 * KiB])
async def test_the_remote_read_writes_every_frame_once_in_order(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, seed: int, max_bytes: int
) -> None:
    # Groups of very different sizes, some larger than an answer.
    groups = groups_from(1, 120, seed)
    files, info = await member_log(tmp_path, journal_config, groups)
    for at in (1, groups[37][0]):
        member = FakeMember(files, info.start, info.next)
        out = tmp_path / f"out-{at}"
        out.mkdir()
        written, requests = await _read_remote(member, SRC, EPOCH, at, info.next, out, max_bytes)
        expected = b"".join(g for a, g in groups if a >= at)
        assert read_back(out, at, info.next) == expected
        assert sum(f.path.stat().st_size for f in list_files(out)) == len(expected)
        assert written == len(expected) and requests == len(member.reads) > 1
        assert member.most_in_flight == 1


async def test_a_member_log_that_ends_early_is_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    groups = groups_from(1, 50)
    files, info = await member_log(tmp_path, journal_config, groups)
    # The member said it holds more than it has.
    member = FakeMember(files, info.start, info.next)
    with pytest.raises(Unavailable, match=f"stopped at {info.next}, not {info.next + 100}"):
        await _read_remote(member, SRC, EPOCH, 1, info.next + 100, tmp_path, 20 * KiB)


async def test_an_answer_that_skips_operations_is_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    groups = groups_from(1, 60)
    files, info = await member_log(tmp_path, journal_config, groups)

    class Skipping(FakeMember):
        async def start(self, build: Callable[[int], Sequence[bytes]]) -> FakeMember.Answer:
            answer = await super().start(build)
            if len(self.reads) == 3:
                answer.first = groups[50][0]
            return answer

    member = Skipping(files, info.start, info.next)
    with pytest.raises(Unavailable, match="missing"):
        await _read_remote(member, SRC, EPOCH, 1, info.next, tmp_path, 6 * KiB)


# -- reading a log in pieces (what a member does for each replica read) ----------------


async def test_a_log_read_in_pieces_reads_each_frame_about_once(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = groups_from(1, 200)
    async with opened(tmp_path / "member", journal_config(file_size=64 * 1024 * KiB)) as store:
        await hold(store, groups)
        (rl,) = store.holdings(SRC)
        files, nxt = list(rl.files), rl.next
    assert len(files) == 1
    read_bytes = 0
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        nonlocal read_bytes
        data = real_pread(fd, n, offset)
        read_bytes += len(data)
        return data

    monkeypatch.setattr(os, "pread", pread)
    at, out = 1, b""
    while at < nxt:
        frames, at, _ = read_groups(files, at, nxt, 20 * KiB)
        out += frames
    assert out == b"".join(g for _, g in groups)
    # Each answer reads the group after its end too (the next answer begins
    # with it), not the whole file before it again.
    assert read_bytes < 3 * len(out), f"{read_bytes} bytes read for a {len(out)}-byte log"
