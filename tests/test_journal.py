"""The journal: group commit, rolling, restarts, checkpoints, truncation, failures."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import random
import shutil
import subprocess
from collections.abc import Callable

import pytest
import trio
import trio.lowlevel

from gateway.config import JournalConfig, KiB, MiB
from gateway.errors import (
    JournalClosed,
    JournalCorrupt,
    JournalFailed,
    JournalFull,
    JournalLocked,
    JournalRefused,
    OperationTooLarge,
)
from gateway.journal import Journal, open_journal, replay_journal
from gateway.journal.files import list_files
from gateway.journal.format import HEADER_SIZE, decode_header, encode_append
from gateway.journal.reader import FrameRecord, mapped, read_frames
from gateway.protocol.journal_pb2 import Operation

ConfigFactory = Callable[..., JournalConfig]


def payload(n: int, size: int) -> bytes:
    """Deterministic bytes for operation n."""
    return random.Random(n).randbytes(size)


def replayed(directory: pathlib.Path) -> list[tuple[int, Operation]]:
    """Every operation in the journal, read without changing it."""
    ops: list[tuple[int, Operation]] = []
    replay_journal(directory, lambda seq, op: ops.append((seq, op)))
    return ops


def appends(ops: list[tuple[int, Operation]]) -> dict[int, tuple[int, bytes]]:
    """seq -> (append offset, data) for the Append operations."""
    return {
        seq: (op.append.offset, op.append.data)
        for seq, op in ops
        if op.WhichOneof("kind") == "append"
    }


async def test_round_trip_across_rolls_and_restarts(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    acked: dict[int, tuple[int, bytes]] = {}
    n = 0
    for restart in range(4):
        seen: list[tuple[int, Operation]] = []
        async with open_journal(tmp_path, cfg, lambda s, o: seen.append((s, o))) as j:
            assert j.epoch == restart + 1
            # Everything acknowledged before is replayed, byte for byte.
            assert {s: v for s, v in appends(seen).items()} == acked

            async def writer(k: int, count: int) -> None:
                nonlocal n
                for _ in range(count):
                    i = n
                    n += 1
                    data = payload(i, random.randint(0, 40_000))
                    seq = await j.append_parts(encode_append(1, i, data))
                    acked[seq] = (i, data)

            async with trio.open_nursery() as nursery:
                for k in range(8):
                    nursery.start_soon(writer, k, 25)
    ops = replayed(tmp_path)
    seqs = [s for s, _ in ops]
    assert seqs == list(range(1, len(seqs) + 1)), "sequence numbers have gaps"
    assert appends(ops) == acked
    kinds = [op.WhichOneof("kind") for _, op in ops]
    assert kinds.count("epoch_started") == 4
    epochs = [op.epoch_started.epoch for _, op in ops if op.WhichOneof("kind") == "epoch_started"]
    assert epochs == [1, 2, 3, 4]
    assert len(list_files(tmp_path)) > 4, "expected file rolls at 1 MiB"


async def test_group_commit_shares_frames_and_syncs(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with open_journal(tmp_path, journal_config(max_frame_bytes=1 * MiB)) as j:
        seqs: list[int] = []

        async def one(i: int) -> None:
            seqs.append(await j.append_parts(encode_append(2, i, b"e" * 100)))

        before = j.statistics()
        async with trio.open_nursery() as nursery:
            for i in range(500):
                nursery.start_soon(one, i)
        after = j.statistics()
    assert sorted(seqs) == list(range(seqs and min(seqs), min(seqs) + 500))
    groups = after.groups - before.groups
    assert after.operations - before.operations == 500
    assert groups < 50, f"500 concurrent appends took {groups} fdatasyncs"


async def test_frames_respect_size_limit_and_groups_never_span_files(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config(max_frame_bytes=8 * KiB, max_group_bytes=200 * KiB)
    async with open_journal(tmp_path, cfg) as j:

        async def one(i: int) -> None:
            await j.append_parts(encode_append(1, i, payload(i, random.choice([10, 3000, 20_000]))))

        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(one, i)
    files = list_files(tmp_path)
    assert len(files) >= 2
    for jf in files:
        with mapped(jf.path) as data:
            frames = [r for r in read_frames(data, jf.path) if isinstance(r, FrameRecord)]
        assert frames[0].header.first_sequence == jf.first_sequence
        assert frames[0].header.group_sequence == jf.first_sequence, "a group spans files"
        for r in frames:
            assert r.header.payload_length <= 8 * KiB or r.header.operation_count == 1


async def test_checkpoint_and_truncate(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    async with open_journal(tmp_path, cfg) as j:
        for i in range(150):
            await j.append_parts(encode_append(1, i, payload(i, 20_000)))
        assert len(list_files(tmp_path)) >= 3
        with pytest.raises(ValueError, match="no checkpoint"):
            await j.truncate(5)
        cp = await j.checkpoint(b"snapshot-1")
        assert j.statistics().last_checkpoint == cp
        assert j.statistics().frames_since_checkpoint == 0
        after = []
        for i in range(150, 160):
            after.append(await j.append_parts(encode_append(1, i, payload(i, 1000))))
        deleted = await j.truncate(cp)
        assert deleted >= 2
        remaining = list_files(tmp_path)
        assert remaining[0].first_sequence <= cp
        assert j.statistics().files == len(remaining)
    ops = replayed(tmp_path)
    seqs = [s for s, _ in ops]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert seqs[0] <= cp
    cps = [(s, op.checkpoint.snapshot) for s, op in ops if op.WhichOneof("kind") == "checkpoint"]
    assert cps == [(cp, b"snapshot-1")]
    got = appends(ops)
    for s, i in zip(after, range(150, 160), strict=True):
        assert got[s] == (i, payload(i, 1000))

    # Recovery reports the checkpoint; truncating again after reopening works.
    async with open_journal(tmp_path, cfg) as j:
        assert j.statistics().last_checkpoint == cp
        assert await j.truncate(cp) == 0


async def test_checkpoint_due(tmp_path: pathlib.Path, journal_config: ConfigFactory) -> None:
    async with open_journal(tmp_path, journal_config(checkpoint_every_frames=5)) as j:
        assert not j.checkpoint_due()
        for i in range(5):
            await j.append_parts(encode_append(1, i, b"x"))
        assert j.checkpoint_due()
        await j.checkpoint(b"s")
        assert not j.checkpoint_due()


async def test_second_opener_is_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with open_journal(tmp_path, journal_config()):
        with pytest.raises(JournalLocked, match=f"pid {os.getpid()}"):
            async with open_journal(tmp_path, journal_config()):
                pass
    # Released on close.
    async with open_journal(tmp_path, journal_config()) as j:
        assert j.epoch == 2


async def test_lock_from_another_process(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            f"""
import fcntl, os, sys, time
fd = os.open({str(tmp_path / "LOCK")!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"%d" % os.getpid())
print("locked", flush=True)
time.sleep(60)
""",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(JournalLocked, match=f"pid {holder.pid}"):
            async with open_journal(tmp_path, journal_config()):
                pass
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    async with open_journal(tmp_path, journal_config()):
        pass  # the kernel dropped the dead holder's lock


async def test_oversize_operation_is_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with open_journal(tmp_path, journal_config(max_operation_bytes=64 * KiB)) as j:
        seq = await j.append_parts(encode_append(1, 0, b"ok"))
        with pytest.raises(OperationTooLarge, match="exceeds the limit of 65536"):
            await j.append_parts(encode_append(1, 2, bytes(64 * KiB)))
        assert await j.append_parts(encode_append(1, 2, b"next")) == seq + 1
    assert [v for v in appends(replayed(tmp_path)).values()] == [(0, b"ok"), (2, b"next")]


async def test_backpressure_bounds_pending_bytes(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        import time

        time.sleep(0.01)  # a slow disk: the pause is the subject
        real(fd)

    cfg = journal_config(max_pending_bytes=256 * KiB, max_group_bytes=64 * KiB)
    async with open_journal(tmp_path, cfg) as j:
        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        peak = 0
        done = trio.Event()

        async def monitor() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, j.statistics().pending_bytes)
                await trio.sleep(0.001)

        async def writer(k: int) -> None:
            for i in range(20):
                await j.append_parts(encode_append(k, i, bytes(10_000)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor)
            async with trio.open_nursery() as writers:
                for k in range(64):
                    writers.start_soon(writer, k)
            done.set()
        assert 0 < peak <= 256 * KiB
    assert len(appends(replayed(tmp_path))) == 64 * 20


async def test_the_next_group_is_written_while_one_syncs_but_no_further(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing overlaps the previous group's fdatasync; never more than two groups unsynced."""
    import threading

    real = os.fdatasync
    entered = threading.Event()
    release = threading.Event()

    def held(fd: int) -> None:
        entered.set()
        assert release.wait(30)
        real(fd)

    async with open_journal(tmp_path, journal_config()) as j:
        groups = j.statistics().groups
        monkeypatch.setattr(os, "fdatasync", held)
        results: dict[int, int] = {}

        async def one(i: int) -> None:
            results[i] = await j.append_parts(encode_append(1, i, payload(i, 500)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            assert await trio.to_thread.run_sync(entered.wait, 30)  # group 1 syncing
            nursery.start_soon(one, 1)
            # Group 2 is written meanwhile (in a worker thread: polled, with a deadline).
            with trio.fail_after(30):
                while j.statistics().groups < groups + 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.start_soon(one, 2)
            await trio.sleep(0.3)
            # Group 3 waits for group 1's sync; nothing is acknowledged yet.
            assert j.statistics().groups == groups + 2 and not results
            release.set()
        assert results[0] < results[1] < results[2]
    got = appends(replayed(tmp_path))
    assert [got[results[i]] for i in range(3)] == [(i, payload(i, 500)) for i in range(3)]


@pytest.mark.expect_errors("journal failed and accepts no more appends")
async def test_fdatasync_failure_is_fatal_and_loses_nothing_acked(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    acked: dict[int, tuple[int, bytes]] = {}
    failures: list[BaseException] = []
    async with open_journal(tmp_path, journal_config()) as j:
        for i in range(50):
            acked[await j.append_parts(encode_append(1, i, payload(i, 500)))] = (i, payload(i, 500))

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)

        async def one(i: int) -> None:
            try:
                await j.append_parts(encode_append(1, i, payload(i, 500)))
            except JournalFailed as e:
                failures.append(e)

        async with trio.open_nursery() as nursery:
            for i in range(50, 80):
                nursery.start_soon(one, i)
        assert len(failures) == 30, "every pending append must fail"
        assert "Input/output error" in str(failures[0])
        assert j.failed is not None
        assert j.statistics().failed is not None
        with pytest.raises(JournalFailed):
            await j.append_parts(encode_append(1, 99, b"late"))
        monkeypatch.undo()
    # Restart: everything acknowledged is there, in order.
    got = appends(replayed(tmp_path))
    for seq, value in acked.items():
        assert got[seq] == value
    async with open_journal(tmp_path, journal_config()) as j:
        seq = await j.append_parts(encode_append(1, 100, b"after restart"))
        assert seq > max(acked)


async def test_append_after_close_is_refused(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with open_journal(tmp_path, journal_config()) as j:
        pass
    with pytest.raises(JournalClosed):
        await j.append_parts(encode_append(1, 0, b"x"))


async def test_close_drains_queued_appends(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    results: list[int] = []
    async with open_journal(tmp_path, journal_config()) as j, trio.open_nursery() as nursery:

        async def one(i: int) -> None:
            results.append(await j.append_parts(encode_append(1, i, b"q" * 100)))

        for i in range(100):
            nursery.start_soon(one, i)
        await trio.lowlevel.checkpoint()  # let them queue, then leave the journal's scope
    assert len(results) == 100
    assert len(appends(replayed(tmp_path))) == 100


async def wait_for_room(j: Journal) -> None:
    """The journal notices that space came back within its retry interval."""
    with trio.fail_after(5):
        await j.wait_room()


@pytest.mark.expect_errors("journal refused client operations")
async def test_disk_full_refuses_then_resumes(
    small_tmpfs: pathlib.Path, journal_config: ConfigFactory
) -> None:
    journal_dir = small_tmpfs / "journal"
    filler = small_tmpfs / "filler"
    cfg = journal_config(file_size=1 * MiB, preallocate_step=256 * KiB)
    acked: dict[int, tuple[int, bytes]] = {}
    async with open_journal(journal_dir, cfg) as j:
        with filler.open("wb") as f:
            # Leave only a little room.
            st = os.statvfs(small_tmpfs)
            f.write(bytes(st.f_bavail * st.f_frsize - 600 * KiB))
        full_errors = 0
        for i in range(400):
            data = payload(i, 8000)
            try:
                acked[await j.append_parts(encode_append(1, i, data))] = (i, data)
            except JournalRefused as e:
                full_errors += 1
                assert "Nothing was written" in str(e)
        assert full_errors > 0, "the disk never filled up"
        assert j.failed is None, "disk full must not be fatal"
        assert j.short_of_space
        filler.unlink()
        await wait_for_room(j)
        # Space is back: appends work again, numbered on without a gap.
        for i in range(400, 420):
            data = payload(i, 8000)
            acked[await j.append_parts(encode_append(1, i, data))] = (i, data)
    ops = replayed(journal_dir)
    seqs = [s for s, _ in ops]
    assert seqs == list(range(1, len(seqs) + 1))
    assert appends(ops) == acked


# -- torn tails and corruption (after BookKeeper's journal tests) ---------------


async def make_journal(
    directory: pathlib.Path, cfg: JournalConfig, count: int, size: int = 3000
) -> dict[int, tuple[int, bytes]]:
    acked = {}
    async with open_journal(directory, cfg) as j:
        for i in range(count):
            data = payload(i, size)
            acked[await j.append_parts(encode_append(1, i, data))] = (i, data)
    return acked


def frames_of(path: pathlib.Path) -> list[FrameRecord]:
    with mapped(path) as data:
        return [r for r in read_frames(data, path) if isinstance(r, FrameRecord)]


def corrupt(path: pathlib.Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def last_file(directory: pathlib.Path) -> pathlib.Path:
    return list_files(directory)[-1].path


async def expect_recovers_to(
    directory: pathlib.Path,
    cfg: JournalConfig,
    acked: dict[int, tuple[int, bytes]],
    lost_from: int,
) -> None:
    """Opening cuts the tail: exactly the ops before sequence ``lost_from`` remain."""
    async with open_journal(directory, cfg) as j:
        # The new epoch's first operation takes the first free number.
        assert j.next_sequence == lost_from + 1
        new_seq = await j.append_parts(encode_append(9, 0, b"after recovery"))
    ops = replayed(directory)
    seqs = [s for s, _ in ops]
    assert seqs == list(range(1, len(seqs) + 1)), "gap after recovery"
    got = appends(ops)
    assert {s: v for s, v in got.items() if s < lost_from} == {
        s: v for s, v in acked.items() if s < lost_from
    }
    assert got[new_seq] == (0, b"after recovery")
    assert not any(lost_from <= s < new_seq - 1 for s in got), "torn operations came back"
    # A second open finds nothing to repair.
    assert replay_journal(directory).torn is None


@pytest.mark.parametrize(
    "damage",
    ["zero_length", "garbage_payload", "half_frame", "half_header", "zeros_over_frame"],
)
async def test_torn_last_frame(
    tmp_path: pathlib.Path, journal_config: ConfigFactory, damage: str
) -> None:
    cfg = journal_config()
    acked = await make_journal(tmp_path, cfg, 40)
    path = last_file(tmp_path)
    last = frames_of(path)[-1]
    h = last.header
    if damage == "zero_length":
        corrupt(path, last.offset + 8, bytes(4))
    elif damage == "garbage_payload":
        corrupt(path, last.offset + HEADER_SIZE + 10, b"\xde\xad\xbe\xef" * 8)
    elif damage == "half_frame":
        os.truncate(path, last.offset + HEADER_SIZE + h.payload_length // 2)
    elif damage == "half_header":
        os.truncate(path, last.offset + HEADER_SIZE // 2)
    elif damage == "zeros_over_frame":
        corrupt(path, last.offset, bytes(h.frame_length))
    result = replay_journal(tmp_path)
    assert result.torn is not None or damage == "zeros_over_frame"
    await expect_recovers_to(tmp_path, cfg, acked, h.first_sequence)


async def test_empty_and_header_only_files(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    acked = await make_journal(tmp_path, cfg, 10)
    nxt = max(acked) + 1
    # An empty file (crash right after creating it) is dropped.
    (tmp_path / f"{nxt:020d}.wal").write_bytes(b"")
    await expect_recovers_to(tmp_path, cfg, acked, nxt)

    # A file holding only a header (crash during its first group) is torn.
    acked = {s: v for s, v in appends(replayed(tmp_path)).items()}
    nxt = replay_journal(tmp_path).next_sequence
    header = frames_of(last_file(tmp_path))[-1]
    with mapped(header.path) as data:
        raw = bytes(data[header.offset : header.offset + HEADER_SIZE])
    h = decode_header(raw)
    fake = bytearray(raw)
    fake[16:24] = nxt.to_bytes(8, "little")
    fake[24:32] = nxt.to_bytes(8, "little")
    (tmp_path / f"{nxt:020d}.wal").write_bytes(bytes(fake))
    assert h.payload_length > 0
    result = replay_journal(tmp_path)
    assert result.torn is not None
    await expect_recovers_to(tmp_path, cfg, acked, nxt)
    assert not (tmp_path / f"{nxt:020d}.wal").exists() or frames_of(tmp_path / f"{nxt:020d}.wal")


async def test_torn_group_with_valid_frames_after_the_bad_one(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    """Pages of the last group reach the disk in any order: valid frames of the
    same group after a bad one are still an unacknowledged torn write."""
    cfg = journal_config(max_frame_bytes=4 * KiB, max_group_bytes=1 * MiB)
    acked = await make_journal(tmp_path, cfg, 5)
    async with open_journal(tmp_path, cfg) as j:

        async def one(i: int) -> None:
            await j.append_parts(encode_append(1, i, payload(i, 3000)))

        async with trio.open_nursery() as nursery:
            for i in range(100, 140):
                nursery.start_soon(one, i)
    frames = frames_of(last_file(tmp_path))
    groups: dict[int, list[FrameRecord]] = {}
    for r in frames:
        groups.setdefault(r.header.group_sequence, []).append(r)
    big = max(groups.values(), key=len)
    assert len(big) >= 3, "expected a multi-frame group"
    # Make the big group the last one written by dropping everything after it.
    os.truncate(big[-1].path, big[-1].end_offset)
    acked = {s: v for s, v in appends(replayed(tmp_path)).items()}
    victim = big[1]
    corrupt(victim.path, victim.offset + HEADER_SIZE + 5, b"\xff\xfe\xfd")
    result = replay_journal(tmp_path)
    assert result.torn is not None and result.torn.offset == victim.offset
    await expect_recovers_to(tmp_path, cfg, acked, victim.header.first_sequence)


async def test_corruption_in_the_middle_refuses_to_open(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    await make_journal(tmp_path, cfg, 40)
    path = last_file(tmp_path)
    frames = frames_of(path)
    victim = frames[len(frames) // 2]
    corrupt(path, victim.offset + HEADER_SIZE + 3, b"\x00\x01\x02\x03")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix == ".wal"}
    with pytest.raises(JournalCorrupt) as info:
        async with open_journal(tmp_path, cfg):
            pass
    e = info.value
    assert e.path == str(path)
    assert e.offset == victim.offset
    assert "CRC32C mismatch" in str(e) and "fsck" in str(e)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix == ".wal"}
    assert before == after, "a refused open must not change the journal"


async def test_bad_frame_then_later_file_is_corruption(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    await make_journal(tmp_path, cfg, 200, size=20_000)
    files = list_files(tmp_path)
    assert len(files) >= 3
    victim = frames_of(files[0].path)[-1]
    corrupt(victim.path, victim.offset + HEADER_SIZE + 1, b"\xaa\xbb")
    with pytest.raises(JournalCorrupt) as info:
        replay_journal(tmp_path)
    assert info.value.path == str(files[0].path)
    assert "written after it" in info.value.reason


async def test_missing_middle_file_is_corruption(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    cfg = journal_config()
    await make_journal(tmp_path, cfg, 200, size=20_000)
    files = list_files(tmp_path)
    assert len(files) >= 3
    files[1].path.unlink()
    with pytest.raises(JournalCorrupt, match="sequence gap"):
        replay_journal(tmp_path)


def test_recover_empty_directory(tmp_path: pathlib.Path) -> None:
    r = replay_journal(tmp_path)
    assert (r.next_sequence, r.max_epoch, r.frames) == (1, 0, 0)


async def test_copy_of_journal_reopens_identically(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    """Replay is deterministic: a copy yields exactly the same operations."""
    cfg = journal_config()
    src = tmp_path / "a"
    await make_journal(src, cfg, 30)
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    assert [(s, o.SerializeToString()) for s, o in replayed(src)] == [
        (s, o.SerializeToString()) for s, o in replayed(dst)
    ]


# -- the owner-facing API: submit order, refusals, files, bounded truncation ---


async def test_submit_keeps_order_and_tickets_report_sequences(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with open_journal(tmp_path, journal_config()) as j:
        tickets = [j.submit(encode_append(1, i, bytes([i % 256]) * 50)) for i in range(300)]
        assert not tickets[-1].done
        seqs = [await t.wait() for t in reversed(tickets)][::-1]
        assert seqs == list(range(seqs[0], seqs[0] + 300))
        assert all(t.done for t in tickets)
        assert j.file_of(seqs[-1]) == list_files(tmp_path)[-1].first_sequence
    ops = appends(replayed(tmp_path))
    assert [ops[s][0] for s in seqs] == list(range(300))


@pytest.mark.expect_errors("journal refused client operations")
async def test_refused_group_refuses_everything_queued_behind_it(
    small_tmpfs: pathlib.Path, journal_config: ConfigFactory
) -> None:
    journal_dir = small_tmpfs / "journal"
    cfg = journal_config(max_group_bytes=64 * KiB, max_frame_bytes=16 * KiB)
    async with open_journal(journal_dir, cfg) as j:
        st = os.statvfs(small_tmpfs)
        (small_tmpfs / "filler").write_bytes(bytes(st.f_bavail * st.f_frsize - 300 * KiB))
        tickets = [j.submit(encode_append(1, i, bytes(30_000))) for i in range(40)]
        outcome = []
        for t in tickets:
            try:
                outcome.append(await t.wait())
            except JournalFull:
                outcome.append(None)
        refused = outcome.index(None)
        assert refused > 0, "expected some groups to fit"
        assert all(o is None for o in outcome[refused:]), "a later group landed after a refusal"
        assert j.refusals >= 1
        (small_tmpfs / "filler").unlink()
        await wait_for_room(j)
        seq = await j.append_parts(encode_append(1, 999, b"after"))
        assert seq == outcome[refused - 1] + 1, "sequence numbers must not skip"


async def test_truncate_keeps_files_still_needed(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    async with open_journal(tmp_path, journal_config()) as j:
        for i in range(120):
            await j.append_parts(encode_append(1, i, bytes(25_000)))
        files = list_files(tmp_path)
        assert len(files) >= 3
        cp = await j.checkpoint(b"s")
        keep = files[1].first_sequence + 1  # something in the second file is needed
        assert await j.truncate(cp, keep_from=keep) == 1
        assert list_files(tmp_path)[0] == files[1]
        assert j.oldest_file() == files[1].first_sequence
        assert await j.truncate(cp) >= 1


@pytest.mark.expect_errors("journal refused client operations")
async def test_no_file_descriptor_for_a_new_file_is_a_refusal_not_a_failure(
    tmp_path: pathlib.Path, journal_config: ConfigFactory
) -> None:
    """EMFILE opening the next journal file (peers took every descriptor) refuses the
    group; the journal goes on once descriptors are free again (issue 14, item 3)."""
    import resource

    cfg = journal_config(file_size=1 * MiB, preallocate_step=256 * KiB)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with open_journal(tmp_path, cfg) as j:
        await j.append_parts(encode_append(1, 0, bytes(100)))
        hogs: list[int] = []
        try:
            # Take every descriptor under a low limit, as 1,100 idle connections did.
            used = len(os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (used + 16, hard))
            with contextlib.suppress(OSError):
                while True:
                    hogs.append(os.dup(0))
            refused = 0
            for i in range(1, 40):  # 30 KiB each: the 1 MiB file rolls
                try:
                    await j.append_parts(encode_append(1, i, bytes(30 * KiB)))
                except JournalRefused as e:
                    refused += 1
                    assert "Too many open files" in str(e), e
                    break
            assert refused, "the journal never needed a new file"
            assert j.failed is None, "running out of descriptors must not be fatal"
        finally:
            for fd in hogs:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await wait_for_room(j)
        seq = await j.append_parts(encode_append(1, 99, b"after"))
        assert seq > 0
    assert appends(replayed(tmp_path))[seq] == (99, b"after")
