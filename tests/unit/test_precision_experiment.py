"""The precision experiment on a fake clock: the wheel quantises, the heap does not."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import pytest

from delayq import DelayQueueTimer, HashedWheelTimer
from delayq.cli.experiments import precision
from delayq.testing import FakeClock
from delayq.timers.base import Timer, TimerHandle


class Counted:
    """A timer that counts the callbacks it ran (they may run on another thread)."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.cond = threading.Condition()
        self.scheduled: list[float] = []
        self.ran = 0

    def schedule_at(self, deadline: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        def call(*a: Any) -> None:
            fn(*a)
            with self.cond:
                self.ran += 1
                self.cond.notify_all()

        with self.cond:
            self.scheduled.append(deadline)
            self.cond.notify_all()
        return self.timer.schedule_at(deadline, call, *args)

    def wait_for_ran(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.ran >= count, timeout=60)

    def __enter__(self) -> Counted:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.timer.stop()


def measure_on(clock: FakeClock, timer: Timer) -> list[float]:
    """``precision.measure`` on ``clock``: once all six delays are scheduled, move the
    clock to each deadline the timer waits for, then wait for the callbacks due by then."""
    counted = Counted(timer)
    result: list[list[float]] = []
    runner = threading.Thread(
        target=lambda: result.append(
            precision.measure(lambda: counted, clock=clock, timeout=600.0)  # type: ignore[arg-type,return-value]
        )
    )
    runner.start()
    with counted.cond:
        assert counted.cond.wait_for(lambda: len(counted.scheduled) == 6, timeout=60)
    while True:
        with counted.cond:
            if counted.ran == 6:
                break
        assert clock.wait_for_waiters(1, timeout=60)
        deadline = clock.next_deadline()
        assert deadline is not None
        clock.advance_to(deadline)
        counted.wait_for_ran(sum(d <= clock.monotonic() for d in counted.scheduled))
    runner.join(60)
    return result[0]


def test_the_hashed_wheel_runs_each_delay_at_the_next_50ms_boundary() -> None:
    clock = FakeClock(monotonic_start=0.0)
    actual = measure_on(clock, HashedWheelTimer(tick=0.05, slots=8, clock=clock))
    errors = [a - d for a, d in zip(actual, precision.DELAYS_MS, strict=True)]
    # 30, 70, 120, 260, 380, 430 ms wait for 50, 100, 150, 300, 400, 450 ms.
    assert errors == pytest.approx([20, 30, 30, 40, 20, 20], abs=1e-6)


def test_the_heap_runs_each_delay_at_its_deadline() -> None:
    clock = FakeClock(monotonic_start=0.0)
    actual = measure_on(clock, DelayQueueTimer(clock=clock))
    assert actual == pytest.approx(list(precision.DELAYS_MS), abs=1e-6)
