"""The three timers on the real clock: never early, cancelled ones never run.

How late they run is the benchmark's business (``bench/timers.py``); here a
loaded CI machine only has to deliver every callback by a generous deadline.
"""

from __future__ import annotations

import io
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from delayq import SYSTEM_CLOCK, DelayQueueTimer, HashedWheelTimer, TimingWheel
from delayq.cli.experiments import precision
from tests._util import wait_until

pytestmark = pytest.mark.slow

# (factory, tick in seconds)
TIMERS: dict[str, tuple[Callable[[], Any], float]] = {
    "hashed_wheel": (lambda: HashedWheelTimer(tick=0.01, slots=64), 0.01),
    "timing_wheel": (TimingWheel, 0.001),
    "delay_queue": (DelayQueueTimer, 0.0),
}


@pytest.mark.parametrize("kind", sorted(TIMERS))
def test_real_time_callbacks_are_never_early_and_cancelled_ones_never_run(kind: str) -> None:
    make = TIMERS[kind][0]
    rng = random.Random(11)
    lock = threading.Lock()
    ran: dict[int, float] = {}

    def fired(index: int) -> None:
        with lock:
            ran[index] = SYSTEM_CLOCK.monotonic()

    with make() as timer:
        handles = [timer.schedule_after(rng.uniform(0, 0.3), fired, i) for i in range(40)]
        cancelled = handles[::5]
        for handle in cancelled:
            assert handle.cancel()
        assert wait_until(lambda: len(ran) == 32, timeout=30)
        assert timer.pending() == 0
    for index, at in ran.items():
        assert at >= handles[index].deadline, f"callback {index} ran early"
    assert not set(range(0, 40, 5)) & set(ran)


def test_precision_experiment_reproduces_the_seed_table() -> None:
    out = io.StringIO()
    precision.run(out)
    text = out.getvalue()
    assert text.count("mean error") == 3
    assert "hashed wheel (50 ms tick, 8 slots)" in text
    for delay in precision.DELAYS_MS:
        assert f"planned +{delay:3d}" in text


def test_on_the_real_clock_neither_the_wheel_nor_the_heap_runs_early() -> None:
    wheel = precision.measure(lambda: HashedWheelTimer(tick=0.05, slots=8))
    heap = precision.measure(DelayQueueTimer)
    # Never before the deadline; how late is the benchmark's business (the
    # wheel's quantisation is checked exactly on a fake clock:
    # tests/unit/test_precision_experiment.py).
    assert all(a >= d for a, d in zip(heap, precision.DELAYS_MS, strict=True))
    assert all(a >= d for a, d in zip(wheel, precision.DELAYS_MS, strict=True))
