"""The worker's statistics: counters and fixed-size histograms, never a list of samples.

A :class:`Histogram` has log-spaced buckets from 10 µs to about 12 hours, so
its memory is fixed (a list of ints) whatever the number of samples, adding
a sample is O(1), and a percentile is read in O(buckets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNTERS", "Histogram", "WorkerStats", "percentile"]

_log = math.log

COUNTERS = ("claimed", "succeeded", "retried", "dead", "skipped", "returned", "stale", "errors")
"""The outcome counters of :class:`WorkerStats` (``errors`` counts failed recordings)."""


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100, nearest rank) of ``samples``; NaN when empty."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class Histogram:
    """Counts of non-negative values (seconds) in log-spaced buckets.

    Bucket ``i >= 1`` holds values in ``[LOW * R**(i-1), LOW * R**i)`` with
    ``R = 2**(1/8)`` (8 buckets per doubling) up to ``LOW * 2**32`` (about 11.9
    hours); bucket 0 holds everything below ``LOW`` (10 µs, negatives
    included), the last bucket everything above the range. The exact minimum
    and maximum are kept too.

    Error bound of :meth:`percentile`: it returns the geometric middle of the
    bucket holding the nearest-rank sample, clamped to the observed
    ``[min, max]``, so for values inside the range the answer is within a
    factor ``2**(1/16)`` (about 4.4%) of the exact nearest-rank percentile;
    below 10 µs it is at most 10 µs off; above the range it is the maximum.

    Not thread-safe: the worker guards it with its in-flight table's lock.
    """

    LOW = 1e-5
    PER_DOUBLING = 8
    DOUBLINGS = 32
    _SCALE = PER_DOUBLING / math.log(2)
    _TOP = PER_DOUBLING * DOUBLINGS + 1  # the overflow bucket

    __slots__ = ("_counts", "count", "max", "min", "total")

    def __init__(self) -> None:
        self._counts = [0] * (self._TOP + 1)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        """Count one value (seconds). Called twice per job: kept to a few operations."""
        if value < self.LOW:
            i = 0
        else:
            i = int(_log(value / self.LOW) * self._SCALE) + 1
            if i > self._TOP:  # noqa: PLR1730
                i = self._TOP
        self._counts[i] += 1
        self.count += 1
        self.total += value
        # Comparisons, not min()/max(): a builtin call costs more on this path.
        if value < self.min:  # noqa: PLR1730
            self.min = value
        if value > self.max:  # noqa: PLR1730
            self.max = value

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100, nearest rank; see the class's error bound)."""
        if not self.count:
            return math.nan
        rank = min(self.count, max(1, math.ceil(q / 100 * self.count)))
        seen = 0
        for i, n in enumerate(self._counts):
            seen += n
            if seen >= rank:
                return min(self.max, max(self.min, self._middle(i)))
        return self.max  # not reached: the counts add up to self.count

    def _middle(self, i: int) -> float:
        if i == 0:
            return self.LOW / 2
        if i == self._TOP:
            return self.max
        return self.LOW * 2 ** ((i - 0.5) / self.PER_DOUBLING)


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counters since the worker started, lateness and handler-duration percentiles (seconds).

    ``lateness`` is claim time minus due time, ``start_lateness`` handler start
    minus due time (a wait in prefetch for a slot included).

    Percentiles come from fixed-size histograms: within about 4.4% of the
    exact value (see :class:`Histogram`); maxima are exact. ``timeouts``
    counts handlers that ran past their timeout; ``abandoned`` those of them
    still running right now (sync threads, cancelled coroutines that go on);
    ``loop_blocked`` how often a handler blocked the asyncio loop for a second
    or more; ``prefetched`` the claims held ready for a free slot right now.
    """

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    skipped: int = 0
    returned: int = 0
    stale: int = 0
    errors: int = 0
    timeouts: int = 0
    abandoned: int = 0
    loop_blocked: int = 0
    in_flight: int = 0
    prefetched: int = 0
    lateness_p50: float = math.nan
    lateness_p99: float = math.nan
    lateness_max: float = math.nan
    start_lateness_p50: float = math.nan
    start_lateness_p99: float = math.nan
    start_lateness_max: float = math.nan
    duration_p50: float = math.nan
    duration_p99: float = math.nan
    duration_max: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class StatsBook:
    """The counters and histograms behind :class:`WorkerStats` (guarded by the caller)."""

    __slots__ = ("counts", "duration", "lateness", "loop_blocked", "start_lateness", "timeouts")

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.lateness = Histogram()
        self.start_lateness = Histogram()
        self.duration = Histogram()
        self.timeouts = 0
        self.loop_blocked = 0

    def snapshot(self, *, in_flight: int, prefetched: int, abandoned: int = 0) -> WorkerStats:
        late, dur, start = self.lateness, self.duration, self.start_lateness
        return WorkerStats(
            **self.counts,
            timeouts=self.timeouts,
            abandoned=abandoned,
            loop_blocked=self.loop_blocked,
            in_flight=in_flight,
            prefetched=prefetched,
            lateness_p50=late.percentile(50),
            lateness_p99=late.percentile(99),
            lateness_max=late.max if late.count else math.nan,
            start_lateness_p50=start.percentile(50),
            start_lateness_p99=start.percentile(99),
            start_lateness_max=start.max if start.count else math.nan,
            duration_p50=dur.percentile(50),
            duration_p99=dur.percentile(99),
            duration_max=dur.max if dur.count else math.nan,
        )
