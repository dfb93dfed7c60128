"""The pure hierarchical wheel, driven by explicit times; and both wheels against a heap model."""

from __future__ import annotations

import heapq
import math
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import HashedWheel, HierarchicalWheel, InvalidOption, TimerHandle, TimingWheel
from delayq.testing import FakeClock
from tests._util import wait_until


def noop() -> None:
    pass


def test_overflow_levels_are_created_only_when_needed() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0)
    assert wheel.levels == 1
    wheel.schedule_at(19.0, noop)
    assert wheel.levels == 1
    wheel.schedule_at(25.0, noop)
    assert wheel.levels == 2
    wheel.schedule_at(20.0**3 + 1, noop)
    assert wheel.levels == 4


def test_a_higher_level_task_moves_down_when_its_bucket_expires() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0)
    handle = wheel.schedule_at(425.0, noop)
    assert wheel.level_of(handle) == 2
    assert wheel.next_expiration() == 400.0  # the level-2 bucket [400, 800)
    assert wheel.advance(400.0) == []
    assert wheel.level_of(handle) == 1  # re-inserted into the 20-tick bucket [420, 440)
    assert wheel.next_expiration() == 420.0
    assert wheel.advance(420.0) == []
    assert wheel.level_of(handle) == 0
    assert wheel.next_expiration() == 425.0
    assert wheel.advance(424.999) == []
    assert wheel.advance(425.0) == [handle]
    assert handle.expired


def test_the_driver_sleeps_until_the_next_non_empty_bucket() -> None:
    wheel = HierarchicalWheel(tick=0.001, wheel_size=20, start=0.0)
    assert wheel.next_expiration() is None
    wheel.schedule_at(0.0155, noop)
    wheel.schedule_at(3.0, noop)
    assert wheel.next_expiration() == pytest.approx(0.016)  # no empty ticks before it


def test_a_bucket_emptied_by_cancel_is_skipped() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0)
    early = wheel.schedule_at(5.0, noop)
    wheel.schedule_at(9.0, noop)
    assert wheel.next_expiration() == 5.0
    assert early.cancel() is True
    assert wheel.next_expiration() == 9.0
    assert len(wheel) == 1


def test_equal_deadlines_stay_fifo_across_re_insertion() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0)
    first = wheel.schedule_at(22.0, noop)  # beyond level 0: goes to level 1
    wheel.advance(5.0)
    second = wheel.schedule_at(22.0, noop)  # now within level 0
    assert wheel.level_of(first) == 1
    assert wheel.level_of(second) == 0
    assert wheel.advance(30.0) == [first, second]


def test_delays_of_years_need_a_few_levels_and_fire_on_time() -> None:
    wheel = HierarchicalWheel(tick=0.001, wheel_size=20, start=0.0)
    five_years = 5 * 365 * 24 * 3600.0
    handle = wheel.schedule_at(five_years, noop)
    assert wheel.levels <= 10
    now = 0.0
    while now < five_years:
        now = min(five_years, now + 86400.0 * 200)
        fired = wheel.advance(now)
        assert fired == ([handle] if now == five_years else [])


def test_memory_grows_with_pending_tasks_not_with_the_span() -> None:
    wheel = HierarchicalWheel(tick=0.001, wheel_size=20, start=0.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = [wheel.schedule_at(10.0**i, noop) for i in range(10)]  # 1 s .. 31 years
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(handles) == 10
    assert used < 64_000  # a dozen levels of 20 buckets, not one bucket per millisecond


def test_past_deadlines_fire_at_the_next_advance() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=4, start=0.0)
    wheel.advance(50.0)
    handle = wheel.schedule_at(-3.0, noop)
    assert wheel.level_of(handle) == -1
    assert wheel.next_expiration() == 50.0
    assert wheel.advance(50.0) == [handle]


def test_clear_returns_every_pending_handle_in_order() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=4, start=0.0)
    c = wheel.schedule_at(1000.0, noop)
    a = wheel.schedule_at(1.0, noop)
    b = wheel.schedule_at(30.0, noop)
    assert wheel.clear() == [a, b, c]
    assert wheel.next_expiration() is None
    assert wheel.advance(2000.0) == []


@pytest.mark.parametrize(
    "options", [{"tick": 0.0}, {"tick": float("nan")}, {"wheel_size": 1}, {"wheel_size": True}]
)
def test_bad_options_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(InvalidOption):
        HierarchicalWheel(**options)  # type: ignore[arg-type]


def test_the_timer_sleeps_until_the_head_bucket_and_wakes_for_an_earlier_one() -> None:
    clock = FakeClock(monotonic_start=0.0)
    with TimingWheel(clock=clock) as timer:
        timer.schedule_after(5.0, noop)
        assert clock.wait_for_waiters(1)
        assert clock.next_deadline() == pytest.approx(4.8)  # the 400 ms bucket holding 5 s
        timer.schedule_after(0.0105, noop)
        assert wait_until(lambda: clock.next_deadline() == pytest.approx(0.011), timeout=10)
        assert timer.levels == 3
        assert repr(timer).startswith("<TimingWheel running tick=0.001 wheel_size=20")


# -- both wheels against a heap model ------------------------------------------------

CORES: dict[str, Any] = {
    "hierarchical": lambda size: HierarchicalWheel(tick=1.0, wheel_size=size, start=0.0),
    "hashed": lambda size: HashedWheel(tick=1.0, slots=size, start=0.0),
}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.floats(-5.0, 3000.0, allow_nan=False)),
        st.tuples(st.just("schedule"), st.integers(0, 500).map(float)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("advance"), st.floats(0.0, 400.0, allow_nan=False)),
    ),
    max_size=80,
)


@pytest.mark.parametrize("core", sorted(CORES))
@settings(max_examples=150, deadline=None)
@given(size=st.integers(2, 8), ops=operations)
def test_fired_tasks_and_their_order_match_a_heap_model(
    core: str, size: int, ops: list[tuple[str, float]]
) -> None:
    """With tick 1.0 from 0.0, a task due at d fires at the first advance(now) with
    now >= ceil(d); tasks fire in (deadline, scheduling order)."""
    wheel = CORES[core](size)
    handles: list[TimerHandle] = []
    model: list[tuple[float, int]] = []  # heap of (deadline, seq)
    cancelled: set[int] = set()
    now = 0.0
    for op, value in ops:
        if op == "schedule":
            seq = len(handles)
            handles.append(wheel.schedule_at(value, noop, seq))
            heapq.heappush(model, (value, seq))
        elif op == "cancel" and handles:
            seq = int(value) % len(handles)
            expected = handles[seq].pending
            assert handles[seq].cancel() is expected
            if expected:
                cancelled.add(seq)
        elif op == "advance":
            now += value
            fired = [h.args[0] for h in wheel.advance(now)]
            due: list[int] = []
            while model and math.ceil(model[0][0]) <= now:
                _, seq = heapq.heappop(model)
                if seq not in cancelled:
                    due.append(seq)
            assert fired == due
        assert len(wheel) == sum(1 for _, s in model if s not in cancelled)
