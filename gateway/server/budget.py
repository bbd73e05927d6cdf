"""The memory budget: bytes held by requests in flight, across all connections.

Every queued request is charged to its connection and to the server's
`MemoryBudget` -- its own bytes, a bound or estimate of its answer's (each
request kind says how large, `Handler.answer_bytes`) and a fixed ITEM_BYTES
for its bookkeeping (docs/SECURITY.md, "What a peer can do").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import trio

#: What every queued request costs besides its bytes: its parsed form, its
#: queue entry, the closures that answer it (a queued read took ~1 KiB).
ITEM_BYTES = 4 * 1024
#: Estimated memory per segment of a List answer (or of an exported
#: snapshot) while it is built and sent: SegmentInfo objects, protobuf
#: messages, the wire form (measured: ~850 bytes with 10-character names;
#: longer names take more).
LIST_ENTRY_BYTES = 1024


@dataclass(eq=False)
class _Waiter:
    nbytes: int
    event: trio.Event
    granted: bool = False


class MemoryBudget:
    """The bytes all connections together may hold (``server.max_memory``).

    Waiters are served first come, first served, so a large message is not
    starved by a stream of small ones. When nothing is held, one holder may
    take more than the limit: a single request larger than it still goes
    through, alone.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        #: The most ever held at once.
        self.peak = 0
        #: Waits that ended without room (memory_timeout).
        self.refusals = 0
        self._waiters: deque[_Waiter] = deque()

    def _fits(self, nbytes: int) -> bool:
        return self.used == 0 or self.used + nbytes <= self.limit

    def _take(self, nbytes: int) -> None:
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def take(self, nbytes: int) -> None:
        """Account for ``nbytes`` without waiting (small, already in memory)."""
        self._take(nbytes)

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit, and take them (nothing is taken if cancelled)."""
        if not self._waiters and self._fits(nbytes):
            self._take(nbytes)
            return
        waiter = _Waiter(nbytes, trio.Event())
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            self._abandon(waiter)
            raise

    async def acquire_within(self, nbytes: int, seconds: float) -> bool:
        """`acquire`, waiting at most ``seconds``; False (nothing taken) if they did not fit."""
        with trio.move_on_after(seconds):
            await self.acquire(nbytes)
            return True
        self.refusals += 1
        return False

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.granted:
            self.release(waiter.nbytes)
        else:
            self._waiters.remove(waiter)
            self._wake()  # the next waiter may fit now that this one left the head

    def release(self, nbytes: int) -> None:
        """Give back what `take` or `acquire` accounted for."""
        self.used -= nbytes
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0].nbytes):
            waiter = self._waiters.popleft()
            self._take(waiter.nbytes)
            waiter.granted = True
            waiter.event.set()

    def statistics(self) -> dict[str, int]:
        """Bytes held now and at most, the limit, waiters, refusals."""
        return {
            "used": self.used,
            "peak": self.peak,
            "limit": self.limit,
            "waiting": len(self._waiters),
            "refusals": self.refusals,
        }
