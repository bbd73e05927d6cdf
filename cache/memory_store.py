"""The cache's pinned key space in memory, for unit tests of the read index and up.

`MemoryCache` keeps appended bytes in a dict, as `cache.CacheStore` keeps
them in RocksDB, and bounds them the same way: `pinned_room` says no once
the pinned bytes would pass ``budget * pinned_share`` (unless none are
pinned, as there).
"""

from __future__ import annotations

from gateway.buffers import Buffer


class MemoryCache:
    """Appended bytes by (segment id, offset), bounded by a budget."""

    def __init__(self, budget: int = 1 << 30, pinned_share: float = 0.5) -> None:
        self.budget = budget
        self.pinned_share = pinned_share
        self.appends: dict[tuple[int, int], bytes] = {}
        self.pinned_bytes = 0

    def put_append(self, segment_id: int, offset: int, data: Buffer) -> None:
        """Keep (pin) the bytes of one append."""
        self.appends[(segment_id, offset)] = bytes(data)
        self.pinned_bytes += len(data)

    def get_append(self, segment_id: int, offset: int) -> bytes | None:
        """The bytes of the append at ``offset``, if kept."""
        return self.appends.get((segment_id, offset))

    def unpin_appends(self, segment_id: int, below: int) -> int:
        """Drop the appends that end at or below ``below``; the bytes dropped."""
        doomed = [
            k for k, v in self.appends.items() if k[0] == segment_id and k[1] + len(v) <= below
        ]
        return self._drop(doomed)

    def drop_segment(self, segment_id: int) -> int:
        """Drop every append of the segment; the bytes dropped."""
        return self._drop([k for k in self.appends if k[0] == segment_id])

    def pinned_room(self, nbytes: int, held: int = 0) -> bool:
        """Whether ``nbytes`` more stay within the pinned share of the budget.

        ``held`` counts as pinned too. Also True when nothing is pinned (as
        `cache.CacheStore.pinned_room`), so one append larger than the share
        can still go through.
        """
        pinned = self.pinned_bytes + held
        return pinned == 0 or pinned + nbytes <= self.budget * self.pinned_share

    def _drop(self, keys: list[tuple[int, int]]) -> int:
        freed = sum(len(self.appends.pop(k)) for k in keys)
        self.pinned_bytes -= freed
        return freed
