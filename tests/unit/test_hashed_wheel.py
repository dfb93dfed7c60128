"""The pure hashed wheel, driven by explicit times: slots, rounds, absolute ticks."""

from __future__ import annotations

import random

import pytest

from delayq import HashedWheel, HashedWheelTimer, InvalidOption, QueueFull
from delayq.testing import FakeClock


def noop() -> None:
    pass


def test_slots_match_the_seed_table() -> None:
    # Seed 000: 50 ms ticks, 8 slots, six delays scheduled at t0.
    wheel = HashedWheel(tick=0.05, slots=8, start=0.0)
    delays = [0.030, 0.070, 0.120, 0.260, 0.380, 0.430]
    handles = [wheel.schedule_at(d, noop) for d in delays]
    assert [wheel.slot_of(h) for h in handles] == [1, 2, 3, 6, 0, 1]


def test_rounds_count_the_visits_before_firing() -> None:
    wheel = HashedWheel(tick=1.0, slots=8, start=0.0)
    handle = wheel.schedule_at(20.0, noop)  # due tick 20, slot 4
    assert wheel.slot_of(handle) == 4
    assert wheel.rounds_of(handle) == 2
    assert wheel.advance(4.0) == []
    assert wheel.rounds_of(handle) == 1
    assert wheel.advance(12.0) == []
    assert wheel.rounds_of(handle) == 0
    assert wheel.advance(19.99) == []
    assert wheel.advance(20.0) == [handle]


def test_a_deadline_between_ticks_fires_at_the_next_tick_never_before() -> None:
    wheel = HashedWheel(tick=1.0, slots=4, start=0.0)
    handle = wheel.schedule_at(2.5, noop)
    assert wheel.advance(2.999) == []
    assert wheel.advance(3.0) == [handle]
    assert handle.expired


def test_ticks_are_absolute_so_late_advances_do_not_shift_later_deadlines() -> None:
    wheel = HashedWheel(tick=0.05, slots=8, start=10.0)
    a = wheel.schedule_at(10.12, noop)
    b = wheel.schedule_at(10.30, noop)
    assert wheel.advance(10.17) == [a]  # the driver woke 20 ms late
    assert wheel.next_expiration() == pytest.approx(10.20)
    assert wheel.advance(10.2999) == []
    assert wheel.advance(10.30) == [b]


def test_a_gap_longer_than_a_turn_fires_exactly_what_tick_by_tick_would() -> None:
    rng = random.Random(3)
    deadlines = [rng.uniform(0, 300) for _ in range(500)]
    jump = HashedWheel(tick=1.0, slots=16, start=0.0)
    step = HashedWheel(tick=1.0, slots=16, start=0.0)
    for d in deadlines:
        jump.schedule_at(d, noop)
        step.schedule_at(d, noop)
    for until in (37.5, 150.0, 151.0, 299.0, 400.0):
        fired_jump = [h.deadline for h in jump.advance(until)]
        fired_step: list[float] = []
        while step.current_tick < int(until):
            fired_step += [h.deadline for h in step.advance(step.current_tick + 1.0)]
        assert fired_jump == sorted(fired_step)
        assert all(d <= until for d in fired_jump)
        assert len(jump) == len(step) == sum(d > int(until) for d in deadlines)


def test_cancel_unlinks_at_once() -> None:
    wheel = HashedWheel(tick=1.0, slots=4, start=0.0)
    handle = wheel.schedule_at(100.0, noop)
    other = wheel.schedule_at(100.0, noop)
    assert len(wheel) == 2
    assert handle.cancel() is True
    assert len(wheel) == 1
    assert wheel.slot_of(handle) is None
    assert wheel.advance(100.0) == [other]


def test_an_empty_wheel_does_not_tick() -> None:
    wheel = HashedWheel(tick=0.001, slots=8, start=0.0)
    assert wheel.next_expiration() is None
    assert wheel.advance(3600.0) == []
    assert wheel.current_tick == 3_600_000
    handle = wheel.schedule_at(3600.0105, noop)
    assert wheel.next_expiration() == pytest.approx(3600.001)
    assert wheel.advance(3600.011) == [handle]


def test_a_past_deadline_is_due_at_the_next_advance() -> None:
    wheel = HashedWheel(tick=1.0, slots=4, start=0.0)
    wheel.advance(10.0)
    handle = wheel.schedule_at(3.0, noop)
    assert wheel.slot_of(handle) == -1
    assert wheel.next_expiration() == 10.0
    assert wheel.advance(10.0) == [handle]


def test_clear_returns_pending_handles_marked_dropped() -> None:
    wheel = HashedWheel(tick=1.0, slots=4, start=0.0)
    b = wheel.schedule_at(9.0, noop)
    a = wheel.schedule_at(2.0, noop)
    assert wheel.clear() == [a, b]
    assert len(wheel) == 0
    assert a.cancel() is False
    assert wheel.advance(20.0) == []


def test_max_pending_counts_pending_handles_only() -> None:
    wheel = HashedWheel(tick=1.0, slots=4, start=0.0, max_pending=1)
    wheel.schedule_at(1.0, noop)
    with pytest.raises(QueueFull):
        wheel.schedule_at(2.0, noop)
    wheel.advance(1.0)
    wheel.schedule_at(2.0, noop)


@pytest.mark.parametrize(
    "options",
    [{"tick": 0}, {"tick": -1.0}, {"tick": "1"}, {"slots": 0}, {"slots": 2.0}, {"max_pending": 0}],
)
def test_bad_options_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(InvalidOption):
        HashedWheel(**options)  # type: ignore[arg-type]


def test_the_timer_wakes_on_absolute_tick_boundaries() -> None:
    clock = FakeClock(monotonic_start=50.0)
    with HashedWheelTimer(tick=0.05, slots=8, clock=clock) as timer:
        timer.schedule_after(0.12, noop)
        assert clock.wait_for_waiters(1)
        assert clock.next_deadline() == pytest.approx(50.05)
        clock.advance(0.07)  # wake 20 ms after the boundary
        assert clock.wait_for_waiters(1)
        assert clock.next_deadline() == pytest.approx(50.10)
        assert repr(timer).startswith("<HashedWheelTimer running tick=0.05 slots=8")
