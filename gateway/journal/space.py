"""The journal's disk-space reserve, and what it does while short of space.

A full disk must not wedge the node: the only way out is to flush to Tier 2,
record that, checkpoint and delete files, and all of those need journal
space. So operations are submitted either as *client* operations or as
*reserved* ones (Tier-2 progress, checkpoints, deletions: the operations
that free space). The journal keeps a `ReserveFile` of disk space that only
groups made of reserved operations may take when the disk is full. From the
first refusal (or the first use of the reserve) until the reserve is whole
again and there is room for a preallocation step, the journal is *short of
space*: client operations wait (`Journal.wait_for_space`) or are refused at
once (`Journal.submit`), reserved ones go on, and a background task
(`SpaceKeeper.keep`) retries the refill.

The way out of a full disk is a checkpoint written into a new file, and that
one holds every segment (a normal checkpoint may hold a share of them): the
reserve holds one such checkpoint, as its owner estimates it
(`SpaceKeeper.checkpoint_estimate`), and grows with it while there is room.
"""

from __future__ import annotations

import logging
import os
import pathlib
import time
from collections.abc import Callable

import trio

from gateway.config import JournalConfig
from gateway.errors import JournalError
from gateway.journal.files import JournalFile, ReserveFile

__all__ = [
    "REFUSAL_LOG_SECONDS",
    "RESERVE_CHECK_SECONDS",
    "RESERVE_RETRY_SECONDS",
    "SpaceKeeper",
    "auto_reserve",
]

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
#: How often a journal short of space tries to make its reserve whole again.
RESERVE_RETRY_SECONDS = 0.2
#: How often a journal with room checks that its reserve still holds a whole
#: checkpoint (segments come and go), and grows it if not.
RESERVE_CHECK_SECONDS = 1.0
#: Margin of the reserve beyond the checkpoint it must hold (the flush records
#: written meanwhile, a frame header per piece).
RESERVE_MARGIN = 64 * KiB
#: Refusals while short of space are logged once, then at most this often.
REFUSAL_LOG_SECONDS = 60.0


def auto_reserve(directory: pathlib.Path) -> int:
    """``journal.reserve = 0``: 1/16 of the file system, within [256 KiB, 16 MiB]."""
    st = os.statvfs(directory)
    size = st.f_blocks * st.f_frsize // 16
    return max(256 * KiB, min(16 * MiB, size - size % 4096))


class SpaceKeeper:
    """One journal's reserve file and its short-of-space state (see the module docstring).

    Lives in the trio thread except where a method says "worker thread";
    those run under the journal's file limiter.
    """

    def __init__(self, directory: pathlib.Path, config: JournalConfig) -> None:
        self.directory = directory
        self._cfg = config
        #: Disk space for reserved operations; opened by `open`.
        self.reserve: ReserveFile | None = None
        self._reserve_base = config.reserve
        #: The size of the last checkpoint submitted (the reserve holds two of them).
        self.last_checkpoint_bytes = 0
        #: The bytes of a checkpoint of every segment now, as the journal's owner
        #: estimates it (`Journal.estimate_checkpoints`); the reserve holds one.
        self.checkpoint_estimate: Callable[[], int] = lambda: 0
        #: Set on the first refusal or use of the reserve, cleared by `keep`.
        self.short_of_space = False
        #: Set while not short of space; a new event each time space runs short.
        self.space_restored = trio.Event()
        self.space_restored.set()
        #: Wakes `keep` at once (files deleted: room again, perhaps).
        self.poke = trio.Event()
        #: Set by the committer thread when a group took space from the reserve.
        self.used_reserve = False
        #: How many times a group was refused without failing the journal
        #: (disk full). Each refusal also refused everything queued then.
        self.refusals = 0
        self._refusal_logged = -float("inf")
        self._refusals_unlogged = 0

    def roll_bytes(self) -> int:
        """What the checkpoint that frees a full disk may take: one of every segment, and
        at least twice the last checkpoint, with a margin."""
        return max(2 * self.last_checkpoint_bytes, self.checkpoint_estimate()) + RESERVE_MARGIN

    def target(self) -> int:
        """Bytes the reserve should hold: the configured floor, and `roll_bytes`."""
        return max(self._reserve_base, self.roll_bytes())

    def open(self) -> bool:
        """Open the reserve; whether it is whole, or could be made so (worker thread)."""
        if not self._reserve_base:
            self._reserve_base = auto_reserve(self.directory)
        self.reserve = ReserveFile(self.directory)
        if self.reserve.grow_to(self.target()):
            return True
        log.warning(
            "journal: the disk is full; %d of %d reserve bytes held (%s): client operations "
            "wait until flushes and checkpoints make room",
            self.reserve.size,
            self.target(),
            self.reserve.path,
        )
        return False

    def release(self, nbytes: int) -> None:
        """Give ``nbytes`` of the reserve to a reserved group (committer thread)."""
        assert self.reserve is not None
        self.reserve.release(nbytes)
        self.used_reserve = True

    def become_short(self) -> None:
        """Client operations now wait until `keep` finds room again."""
        if not self.short_of_space:
            self.short_of_space = True
            self.space_restored = trio.Event()
        self.poke.set()

    def note_refusal(self, e: JournalError | None) -> None:
        """Log a refusal: the first at once, then a count at most every REFUSAL_LOG_SECONDS."""
        now = time.monotonic()
        self._refusals_unlogged += 1
        if now - self._refusal_logged < REFUSAL_LOG_SECONDS:
            return
        what = f": {e}" if e is not None else ""
        if self._refusal_logged == -float("inf"):
            log.error(
                "journal refused client operations%s; they wait and are refused until "
                "flushes to Tier 2 and checkpoints free space (the reserve keeps room for those)",
                what,
            )
        else:
            log.warning(
                "journal: still short of space: %d refusal(s) in the last %.0fs%s",
                self._refusals_unlogged,
                now - self._refusal_logged,
                what,
            )
        self._refusal_logged = now
        self._refusals_unlogged = 0

    def has_room(self, active: JournalFile | None) -> bool:
        """Make the reserve whole; then is there room for client groups? (worker thread)

        ``active``: the journal's active file, whose preallocated room counts.
        """
        if self.reserve is None:
            return True
        if not self.reserve.grow_to(self.target()):
            return False
        if active is not None and active.allocated - active.size >= self._cfg.max_group_bytes:
            return True
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize >= self._cfg.preallocate_step

    async def keep(
        self,
        running: Callable[[], bool],
        has_room: Callable[[], bool],
        limiter: trio.CapacityLimiter,
    ) -> None:
        """While short of space, retry the refill; when it works, let clients in again.
        With room, keep the reserve at its target as that grows.

        Runs while ``running()``; ``has_room`` is `has_room` of the journal's
        active file, run in a worker thread under ``limiter``.
        """
        while running():
            if not self.short_of_space:
                with trio.move_on_after(RESERVE_CHECK_SECONDS):
                    await self.poke.wait()
                self.poke = trio.Event()
                if not self.short_of_space and running():
                    await self._keep_whole(limiter)
                continue
            try:
                room = await trio.to_thread.run_sync(has_room, limiter=limiter)
            except OSError as e:
                log.warning("journal: cannot grow the reserve %s: %s", self.reserve, e)
                room = False
            if room and self.short_of_space:
                self.short_of_space = False
                self.space_restored.set()
                log.info(
                    "journal: room again (%d refusal(s) meanwhile); client operations resume",
                    self.refusals,
                )
                self._refusal_logged = -float("inf")
                self._refusals_unlogged = 0
                continue
            with trio.move_on_after(RESERVE_RETRY_SECONDS):
                await self.poke.wait()
            self.poke = trio.Event()

    async def _keep_whole(self, limiter: trio.CapacityLimiter) -> None:
        """Grow the reserve to its target if that rose (short of space if there is no
        room); give most of it back if the target fell to less than half."""
        reserve = self.reserve
        if reserve is None:
            return
        target, size = self.target(), reserve.size
        if size > 2 * target:  # segments went
            await trio.to_thread.run_sync(reserve.release, size - target, limiter=limiter)
            return
        if size >= target:
            return
        try:
            grown = await trio.to_thread.run_sync(reserve.grow_to, target, limiter=limiter)
        except OSError as e:
            log.warning("journal: cannot grow the reserve %s: %s", reserve.path, e)
            grown = False
        if not grown:
            log.warning(
                "journal: no room to grow the reserve to %d bytes (a checkpoint of every "
                "segment, which frees a full disk); client operations wait until there is",
                target,
            )
            self.become_short()

    def wake_all(self) -> None:
        """The journal is closing: waiters for room and `keep` see it."""
        self.space_restored.set()
        self.poke.set()  # `keep` ends

    def close(self) -> None:
        """Close the reserve file (it stays on disk for the next run)."""
        if self.reserve is not None:
            self.reserve.close()
