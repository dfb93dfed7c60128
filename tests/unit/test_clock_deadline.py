"""Clock.wait_until: the absolute-deadline wait cannot drift when the clock moves first."""

from __future__ import annotations

import threading

from delayq.clock import SYSTEM_CLOCK
from delayq.testing import FakeClock


def test_fake_wait_until_a_passed_deadline_returns_at_once() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    deadline = clock.monotonic() + 1.0
    clock.advance(2.0)
    with cond:
        assert clock.wait_until(cond, deadline) is False
    assert clock.waiters() == 0


def test_fake_wait_until_wakes_exactly_at_the_absolute_deadline() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    deadline = clock.monotonic() + 5.0
    clock.advance(3.0)  # moves before the waiter starts: it must still wake at +5, not +8
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            result.append(clock.wait_until(cond, deadline))

    t = threading.Thread(target=waiter)
    t.start()
    assert clock.wait_for_waiters(1)
    assert clock.next_deadline() == deadline
    clock.advance(2.0)
    t.join(5)
    assert result == [False]


def test_fake_wait_until_returns_true_when_notified_first() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            result.append(clock.wait_until(cond, clock.monotonic() + 10.0))

    t = threading.Thread(target=waiter)
    t.start()
    assert clock.wait_for_waiters(1)
    with cond:
        cond.notify_all()
    t.join(5)
    assert result == [True]
    assert clock.waiters() == 0


def test_system_wait_until_a_passed_deadline_does_not_block() -> None:
    cond = threading.Condition()
    with cond:
        assert SYSTEM_CLOCK.wait_until(cond, SYSTEM_CLOCK.monotonic() - 1.0) is False
