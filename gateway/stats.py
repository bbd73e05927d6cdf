"""A tiny fixed-bucket histogram that components keep, whether metrics are served or not.

Components record latencies and sizes here (one bisect and two additions,
no lock: each histogram has one writer); `gateway.metrics` exports them as
Prometheus histograms at scrape time, and tests read them directly.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence

#: Seconds: 100 us .. 60 s (appends, fdatasync, S3 requests).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Bytes: 1 KiB .. 64 MiB (journal groups).
SIZE_BUCKETS = tuple(float(1024 * 4**i) for i in range(9))


class Histogram:
    """Counts of observations at or below each bucket's upper bound, and their sum."""

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        #: counts[i]: observations in (buckets[i-1], buckets[i]]; the last is +Inf.
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it), Prometheus style, +Inf last."""
        out, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out

    def quantile(self, q: float) -> float:
        """An upper bound of the ``q`` quantile (the bucket it falls in)."""
        target, seen = q * self.count, 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            seen += n
            if seen >= target and seen:
                return bound
        return float("inf")


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
