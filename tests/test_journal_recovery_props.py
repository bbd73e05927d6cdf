"""Property: recovery after damage anywhere in the last file.

Damage models a crash (the tail cut off, zeros or garbage over a range) or
corruption. The expected outcome follows from where the first changed byte
is: every frame that ends before it survives; if an intact frame of a *later*
write group lies after the damage, it is corruption and the open is refused.
"""

from __future__ import annotations

import pathlib
import random
import shutil
import tempfile

import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.config import KiB
from gateway.errors import JournalCorrupt
from gateway.journal import open_journal, replay_journal
from gateway.journal.files import list_files
from gateway.journal.format import encode_append
from gateway.journal.reader import FrameRecord, mapped, read_frames

from .conftest import small_journal_config

CFG = small_journal_config(max_frame_bytes=2 * KiB, max_group_bytes=16 * KiB)


async def _build(directory: pathlib.Path) -> None:
    async with open_journal(directory, CFG) as j:
        # Large operations first, so the damaged (last) file has a predecessor.
        for i in range(1000, 1012):
            await j.append_parts(encode_append(1, i, random.Random(i).randbytes(90 * KiB)))
        for burst in range(12):

            async def one(i: int) -> None:
                await j.append_parts(encode_append(1, i, random.Random(i).randbytes(700)))

            async with trio.open_nursery() as nursery:
                for i in range(burst * 10, burst * 10 + 10):
                    nursery.start_soon(one, i)


@pytest.fixture(scope="module")
def base_journal(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("base") / "journal"
    trio.run(_build, directory)
    return directory


def _frames(path: pathlib.Path) -> list[FrameRecord]:
    with mapped(path) as data:
        return [r for r in read_frames(data, path) if isinstance(r, FrameRecord)]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.floats(min_value=0.0, max_value=1.0),
    length=st.floats(min_value=0.0, max_value=1.0),
    mode=st.sampled_from(["truncate", "zeros", "garbage"]),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_recovery_after_damage(
    base_journal: pathlib.Path, start: float, length: float, mode: str, seed: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp) / "journal"
        shutil.copytree(base_journal, directory)
        path = list_files(directory)[-1].path
        frames = _frames(path)
        original = path.read_bytes()
        size = len(original)
        lo = int(start * size)
        hi = min(size, lo + 1 + int(length * (size - lo)))
        if mode == "truncate":
            damaged = original[:lo]
        elif mode == "zeros":
            damaged = original[:lo] + bytes(hi - lo) + original[hi:]
        else:
            garbage = random.Random(seed).randbytes(hi - lo)
            damaged = original[:lo] + garbage + original[hi:]
        path.write_bytes(damaged)

        changed = [i for i in range(min(len(original), len(damaged))) if original[i] != damaged[i]]
        first_changed = changed[0] if changed else min(len(damaged), len(original))
        if len(damaged) == len(original) and not changed:
            first_changed = size  # nothing changed at all
        last_changed = changed[-1] if changed else first_changed
        hit = next((f for f in frames if f.end_offset > first_changed), None)
        later_intact = [
            f
            for f in frames
            if hit is not None
            and f.offset > last_changed
            and f.end_offset <= len(damaged)
            and f.header.group_sequence != hit.header.group_sequence
        ]

        # Frames of the damaged group and of one more group may follow the
        # damage (never synced, so never acknowledged: the journal writes a
        # group while the previous one syncs); frames of a second later group
        # mean the damage hit synced data.
        later_groups = {f.header.group_sequence for f in later_intact}
        seen: list[int] = []
        if len(later_groups) > 1:
            with pytest.raises(JournalCorrupt) as info:
                replay_journal(directory, lambda s, _: seen.append(s))
            assert info.value.offset == hit.offset
            event("corruption")
            return
        result = replay_journal(directory, lambda s, _: seen.append(s), repair=True)
        event("torn tail" if result.torn else "clean end")
        survivors = [f for f in frames if f.end_offset <= first_changed]
        want_last = survivors[-1].header.end_sequence - 1 if survivors else path_first(path) - 1
        assert seen == list(range(1, want_last + 1))
        assert result.next_sequence == want_last + 1
        # After repair the journal reads clean and a writer can carry on.
        assert replay_journal(directory).torn is None
        trio.run(_append_one, directory, want_last + 2)


def path_first(path: pathlib.Path) -> int:
    return int(path.name.split(".")[0])


async def _append_one(directory: pathlib.Path, expected_seq: int) -> None:
    async with open_journal(directory, CFG) as j:
        assert await j.append_parts(encode_append(2, 0, b"more")) == expected_seq
