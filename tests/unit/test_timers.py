"""One behavioural suite, run against every in-process Timer (hashed wheel, hierarchical
wheel, DelayQueue), on a FakeClock: the driver threads are real, time is not."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from delayq import (
    DelayQueueTimer,
    HashedWheelTimer,
    InvalidDelay,
    QueueClosed,
    QueueFull,
    Timer,
    TimerHandle,
    TimingWheel,
)
from delayq.testing import FakeClock
from tests._util import wait_until

START = 100.0
TIMERS: dict[str, Callable[..., Any]] = {
    "hashed_wheel": lambda **kw: HashedWheelTimer(tick=0.01, slots=8, **kw),
    "timing_wheel": TimingWheel,
    "delay_queue": DelayQueueTimer,
}


class Harness:
    """A timer on a FakeClock with a one-thread executor (FIFO), and helpers to drive it."""

    def __init__(self, kind: str, **options: Any) -> None:
        self.clock = FakeClock(monotonic_start=START)
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.timer: Any = TIMERS[kind](clock=self.clock, executor=self.executor, **options)
        self.fired: list[tuple[str, float]] = []

    def record(self, name: str) -> Callable[[], None]:
        def callback() -> None:
            self.fired.append((name, self.clock.monotonic()))

        return callback

    def names(self) -> list[str]:
        return [name for name, _ in self.fired]

    def settle(self) -> None:
        """Wait until the driver has handed over everything due and sleeps, then drain."""
        timer, clock = self.timer, self.clock

        def idle() -> bool:
            if timer._in_flight:
                return False
            if timer.pending() == 0:
                return True
            deadline = clock.next_deadline()
            return deadline is not None and deadline > clock.monotonic()

        assert wait_until(idle, timeout=10)
        self.executor.submit(lambda: None).result(timeout=10)

    def advance_to(self, when: float) -> None:
        self.settle()
        self.clock.advance_to(when)
        self.settle()

    def close(self) -> None:
        self.timer.stop()
        self.executor.shutdown(wait=True)


@pytest.fixture(params=sorted(TIMERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def h(kind: str) -> Iterator[Harness]:
    harness = Harness(kind)
    yield harness
    harness.close()


def test_every_timer_implements_the_timer_protocol(h: Harness) -> None:
    assert isinstance(h.timer, Timer)


def test_callbacks_fire_in_deadline_order(h: Harness) -> None:
    h.timer.schedule_after(0.3, h.record("c"))
    h.timer.schedule_after(0.1, h.record("a"))
    h.timer.schedule_after(0.2, h.record("b"))
    h.advance_to(START + 1)
    assert h.names() == ["a", "b", "c"]


def test_equal_deadlines_fire_in_scheduling_order(h: Harness) -> None:
    for name in "abcdef":
        h.timer.schedule_at(START + 0.05, h.record(name))
    h.advance_to(START + 0.5)
    assert h.names() == list("abcdef")


def test_a_burst_of_due_callbacks_runs_completely_in_order_and_each_failure_alone(
    h: Harness,
) -> None:
    def fail() -> None:
        raise ValueError("boom")

    for i in range(150):
        h.timer.schedule_at(START + 0.05, fail if i % 40 == 7 else h.record(str(i)))
    h.advance_to(START + 0.5)
    assert h.names() == [str(i) for i in range(150) if i % 40 != 7]


def test_a_callback_never_runs_before_its_deadline(h: Harness) -> None:
    handle = h.timer.schedule_after(0.05, h.record("x"))
    h.advance_to(handle.deadline - 0.0001)
    assert h.fired == []
    assert handle.pending
    h.advance_to(handle.deadline)
    assert h.names() == ["x"]
    assert h.fired[0][1] >= handle.deadline


def test_many_random_deadlines_fire_late_by_at_most_a_tick_and_never_early(h: Harness) -> None:
    rng = random.Random(7)
    handles = {
        f"t{i}": h.timer.schedule_after(rng.uniform(0, 0.5), h.record(f"t{i}")) for i in range(60)
    }
    now = START
    while now < START + 0.6:
        now += rng.uniform(0.001, 0.03)
        h.advance_to(now)
        fired = set(h.names())
        for name, handle in handles.items():
            if name in fired:
                assert handle.deadline <= now
            elif handle.deadline <= now - 0.0101:  # the widest tick under test is 10 ms
                pytest.fail(f"{name} due at {handle.deadline} did not fire by {now}")
    assert all(at >= handles[name].deadline for name, at in h.fired)
    assert len(h.fired) == 60


def test_handles_report_their_deadline_and_callback(h: Harness) -> None:
    callback = h.record("x")
    handle = h.timer.schedule_at(START + 2.5, callback, 1, 2)
    assert isinstance(handle, TimerHandle)
    assert handle.deadline == START + 2.5
    assert handle.callback is callback
    assert handle.args == (1, 2)
    assert "pending" in repr(handle)


def test_args_are_passed_to_the_callback(h: Harness) -> None:
    got: list[tuple[int, str]] = []
    h.timer.schedule_after(0.01, lambda a, b: got.append((a, b)), 1, "two")
    h.advance_to(START + 0.1)
    assert got == [(1, "two")]


def test_cancel_before_expiry_returns_true_and_the_callback_never_runs(h: Harness) -> None:
    handle = h.timer.schedule_after(0.05, h.record("x"))
    keep = h.timer.schedule_after(0.06, h.record("y"))
    assert h.timer.pending() == 2
    assert handle.cancel() is True
    assert handle.cancelled
    assert h.timer.pending() == 1
    assert handle.cancel() is False
    h.advance_to(START + 1)
    assert h.names() == ["y"]
    assert keep.expired


def test_cancel_after_expiry_returns_false(h: Harness) -> None:
    handle = h.timer.schedule_after(0.05, h.record("x"))
    h.advance_to(START + 0.1)
    assert h.names() == ["x"]
    assert handle.expired
    assert handle.cancel() is False
    assert not handle.cancelled


def test_cancel_at_expiry_returns_false_exactly_when_the_callback_runs(h: Harness) -> None:
    results: list[bool] = []
    later = None

    def cancel_other() -> None:
        assert later is not None
        results.append(later.cancel())

    h.timer.schedule_at(START + 0.05, cancel_other)
    later = h.timer.schedule_at(START + 0.05, h.record("later"))
    h.advance_to(START + 0.1)
    assert len(results) == 1
    assert results[0] is (h.names() != ["later"])
    assert results[0] is False  # both were due together: already handed over


def test_a_callback_can_schedule_another(h: Harness) -> None:
    def first() -> None:
        h.fired.append(("first", h.clock.monotonic()))
        h.timer.schedule_after(0.2, h.record("second"))

    h.timer.schedule_after(0.1, first)
    h.advance_to(START + 0.15)
    assert h.names() == ["first"]
    h.advance_to(START + 0.4)
    assert h.names() == ["first", "second"]
    assert h.fired[1][1] >= h.fired[0][1] + 0.2


def test_a_raising_callback_does_not_stop_the_timer(kind: str) -> None:
    errors: list[tuple[TimerHandle, Exception]] = []
    h = Harness(kind, on_error=lambda handle, exc: errors.append((handle, exc)))
    try:
        bad = h.timer.schedule_after(0.1, lambda: 1 / 0)
        h.timer.schedule_after(0.2, h.record("after"))
        h.advance_to(START + 0.5)
        assert h.names() == ["after"]
        assert [(handle, type(exc)) for handle, exc in errors] == [(bad, ZeroDivisionError)]
        h.timer.schedule_after(0.1, h.record("still"))
        h.advance_to(START + 1)
        assert h.names() == ["after", "still"]
    finally:
        h.close()


def test_a_raising_callback_is_logged_by_default(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="delayq.timers"):
        h.timer.schedule_after(0.01, broken)
        h.advance_to(START + 0.1)
    assert any("broken" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_negative_delay_is_due_now(h: Harness) -> None:
    h.timer.schedule_after(-5, h.record("now"))
    h.timer.schedule_at(START - 1, h.record("past"))
    h.settle()
    assert h.names() == ["now", "past"]


def test_an_earlier_schedule_wakes_the_sleeping_driver(h: Harness) -> None:
    h.timer.schedule_after(3600, h.record("late"))
    h.settle()
    early = h.timer.schedule_after(0.05, h.record("early"))

    def driver_sleeps_until_early() -> bool:
        deadline = h.clock.next_deadline()
        return deadline is not None and deadline <= early.deadline + 0.01

    assert wait_until(driver_sleeps_until_early, timeout=10)
    h.clock.advance(0.1)
    h.settle()
    assert h.names() == ["early"]


def test_invalid_times_are_rejected_at_the_call(h: Harness) -> None:
    for bad in (float("nan"), float("inf"), "1", True, None):
        with pytest.raises(InvalidDelay):
            h.timer.schedule_after(bad, h.record("x"))
        with pytest.raises(InvalidDelay):
            h.timer.schedule_at(bad, h.record("x"))
    with pytest.raises(TypeError, match="callable"):
        h.timer.schedule_after(1, "not callable")
    assert h.timer.pending() == 0


def test_integer_times_are_accepted(h: Harness) -> None:
    handle = h.timer.schedule_at(int(START) + 1, h.record("x"))
    assert handle.deadline == START + 1.0
    h.advance_to(START + 1)
    assert h.names() == ["x"]


def test_max_pending_raises_queue_full_until_one_is_cancelled(kind: str) -> None:
    h = Harness(kind, max_pending=2)
    try:
        first = h.timer.schedule_after(1, h.record("a"))
        h.timer.schedule_after(2, h.record("b"))
        with pytest.raises(QueueFull, match="max_pending=2"):
            h.timer.schedule_after(3, h.record("c"))
        assert first.cancel()
        h.timer.schedule_after(3, h.record("c"))
        assert h.timer.pending() == 2
    finally:
        h.close()


def test_stop_returns_the_handles_that_never_fired_in_deadline_order(h: Harness) -> None:
    h.timer.schedule_after(0.01, h.record("fired"))
    b = h.timer.schedule_after(20, h.record("b"))
    a = h.timer.schedule_after(10, h.record("a"))
    cancelled = h.timer.schedule_after(5, h.record("c"))
    cancelled.cancel()
    h.advance_to(START + 1)
    dropped = h.timer.stop()
    assert dropped == [a, b]
    assert not a.pending and not a.cancelled and not a.expired
    assert a.cancel() is False
    assert h.timer.closed
    assert h.timer.pending() == 0
    assert h.timer.stop() == []
    with pytest.raises(QueueClosed):
        h.timer.schedule_after(1, h.record("x"))
    h.clock.advance(100)
    h.executor.submit(lambda: None).result(timeout=10)
    assert h.names() == ["fired"]


def test_the_context_manager_stops_the_timer(kind: str) -> None:
    clock = FakeClock(monotonic_start=START)
    with TIMERS[kind](clock=clock) as timer:
        timer.schedule_after(10, print)
    assert timer.closed
    assert timer.pending() == 0


def test_callbacks_run_on_the_default_pool_never_on_the_driver_thread(kind: str) -> None:
    clock = FakeClock(monotonic_start=START)
    threads: list[threading.Thread] = []
    with TIMERS[kind](clock=clock) as timer:
        timer.schedule_after(-1, lambda: threads.append(threading.current_thread()))
        assert wait_until(lambda: len(threads) == 1, timeout=10)
        assert threads[0] is not timer._thread
        assert threads[0] is not threading.current_thread()


def test_stop_from_inside_a_callback_does_not_deadlock(kind: str) -> None:
    clock = FakeClock(monotonic_start=START)
    timer = TIMERS[kind](clock=clock)
    dropped: list[list[TimerHandle]] = []
    timer.schedule_after(60, print)
    timer.schedule_after(-1, lambda: dropped.append(timer.stop()))
    assert wait_until(lambda: len(dropped) == 1, timeout=10)
    assert len(dropped[0]) == 1
    assert timer.closed


def test_the_delay_queue_timer_drops_cancelled_entries_once_they_outnumber_live_ones() -> None:
    h = Harness("delay_queue")
    try:
        handles = [h.timer.schedule_after(1 + i / 1000, h.record(f"t{i}")) for i in range(3000)]
        for handle in handles[500:]:
            assert handle.cancel()
        assert h.timer.pending() == 500
        assert len(h.timer._queue) < 3000  # rebuilt from the live handles
        h.advance_to(START + 5)
        assert h.names() == [f"t{i}" for i in range(500)]
    finally:
        h.close()


@pytest.mark.parametrize("kind", ["hashed_wheel", "timing_wheel"])
def test_time_passing_between_the_drivers_clock_read_and_its_wait_does_not_delay_it(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(kind)
    core_type = type(h.timer._core)
    original = core_type.advance
    jumps: list[float] = []

    def advance_then_time_passes(self: Any, now: float) -> list[TimerHandle]:
        due = original(self, now)
        if jumps:  # the test advances the clock after the driver read it, before it waits
            h.clock.advance(jumps.pop())
        return due

    monkeypatch.setattr(core_type, "advance", advance_then_time_passes)
    try:
        h.timer.schedule_at(START + 1.0, h.record("x"))
        assert h.clock.wait_for_waiters(1)
        wake_at = h.clock.next_deadline()
        assert wake_at is not None and wake_at < START + 1.0  # a tick, or the upper bucket
        jumps.append(2.0)
        h.clock.advance_to(wake_at)  # it wakes with nothing due, then 2 s pass
        # Its next wait ends at an absolute time that has passed: it must not sleep on.
        assert wait_until(lambda: h.names() == ["x"], timeout=10)
    finally:
        h.close()
