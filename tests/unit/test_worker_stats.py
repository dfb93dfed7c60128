"""The worker's fixed-size histogram: bounded memory, percentiles within the stated error."""

from __future__ import annotations

import math
import random
import sys

import pytest

from delayq.worker import percentile
from delayq.worker._stats import Histogram

BOUND = 2 ** (1 / 16)  # the documented error factor


def test_an_empty_histogram_answers_nan() -> None:
    assert math.isnan(Histogram().percentile(50))


@pytest.mark.parametrize("scale", [1e-2, 1.0, 30.0])  # samples within 10 us .. 12 h
def test_percentiles_are_within_the_error_bound_of_the_exact_ones(scale: float) -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(0, 1.5) * scale for _ in range(20_000)]
    assert min(samples) >= Histogram.LOW and max(samples) < Histogram.LOW * 2**Histogram.DOUBLINGS
    h = Histogram()
    for s in samples:
        h.add(s)
    for q in (1, 50, 90, 99, 99.9, 100):
        exact = percentile(samples, q)
        assert exact / BOUND <= h.percentile(q) <= exact * BOUND, q
    assert h.max == max(samples) and h.count == len(samples)


def test_values_below_the_range_answer_at_most_ten_microseconds() -> None:
    h = Histogram()
    for v in (0.0, -0.5, 3e-6):
        h.add(v)
    assert 0.0 <= h.percentile(99) <= Histogram.LOW


def test_values_above_the_range_answer_the_maximum() -> None:
    h = Histogram()
    h.add(1e9)
    h.add(2e9)
    assert h.percentile(100) == 2e9


def test_memory_does_not_grow_with_the_samples() -> None:
    h = Histogram()
    h.add(1.0)
    size = sys.getsizeof(h._counts)
    for i in range(100_000):
        h.add(i * 1e-3)
    assert sys.getsizeof(h._counts) == size
    assert len(h._counts) == Histogram.PER_DOUBLING * Histogram.DOUBLINGS + 2
