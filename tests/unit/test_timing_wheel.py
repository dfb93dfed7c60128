"""The pure hierarchical wheel, driven by explicit times; and both wheels against a heap model."""

from __future__ import annotations

import gc
import heapq
import math
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import (
    HashedWheel,
    HashedWheelTimer,
    HierarchicalWheel,
    InvalidOption,
    TimerHandle,
    TimingWheel,
)
from delayq.testing import FakeClock
from delayq.timers.base import COMPACT_MIN
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


def test_a_big_upper_bucket_moves_down_a_level_ahead_of_its_expiry_in_bounded_steps() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0, early_cascade=4)
    deadlines = [800.0 + 37 * i % 400 for i in range(10)]  # the level-2 bucket [800, 1200)
    handles = [wheel.schedule_at(d, noop) for d in deadlines]
    assert {wheel.level_of(h) for h in handles} == {2}
    assert wheel.next_early_cascade() == 400.0  # one bucket width (400 ticks) before it expires
    assert wheel.next_expiration() == 800.0
    assert wheel.advance(399.0) == []
    assert wheel.cascade_early(100) == 0  # not the level's next bucket yet
    assert wheel.advance(400.0) == []
    assert wheel.cascade_early(3) == 3  # bounded
    assert sorted(wheel.level_of(h) for h in handles) == [1, 1, 1] + [2] * 7
    assert wheel.cascade_early(100) == 7
    assert {wheel.level_of(h) for h in handles} == {1}  # into the level-1 ring's next turn
    assert wheel.cascade_early(100) == 0
    assert wheel.next_expiration() == 800.0  # the level-1 bucket [800, 820) now
    fired = [h for now in range(401, 1201, 7) for h in wheel.advance(float(now))]
    fired += wheel.advance(1200.0)
    assert fired == sorted(handles, key=lambda h: h.deadline)
    assert all(h.deadline <= 1200.0 for h in fired)


def test_small_upper_buckets_wait_for_their_expiry() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0, early_cascade=4)
    handles = [wheel.schedule_at(900.0 + i, noop) for i in range(3)]
    assert wheel.next_early_cascade() is None
    wheel.advance(500.0)
    assert wheel.cascade_early(100) == 0
    assert {wheel.level_of(h) for h in handles} == {2}


def test_a_bucket_emptied_early_can_be_cascaded_early_again() -> None:
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0, early_cascade=2)
    wheel.advance(500.0)
    first = [wheel.schedule_at(1100.0 + i, noop) for i in range(2)]  # level 2 [800, 1200)
    assert wheel.cascade_early(100) == 2
    again = [wheel.schedule_at(1150.0 + i, noop) for i in range(2)]  # back into that bucket
    assert {wheel.level_of(h) for h in again} == {2}
    assert wheel.cascade_early(100) == 2
    assert {wheel.level_of(h) for h in first + again} == {1}
    assert wheel.advance(1200.0) == first + again


def test_early_cascade_option_is_validated() -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(InvalidOption):
            HierarchicalWheel(early_cascade=bad)  # type: ignore[arg-type]
    wheel = HierarchicalWheel(tick=1.0, wheel_size=20, start=0.0, early_cascade=None)
    for i in range(300):
        wheel.schedule_at(900.0 + i, noop)
    assert wheel.next_early_cascade() is None


def test_the_timer_cascades_a_big_bucket_while_idle_before_it_expires() -> None:
    clock = FakeClock(monotonic_start=0.0)
    with TimingWheel(clock=clock, early_cascade=8) as timer:
        handles = [timer.schedule_at(0.8 + i / 100, noop) for i in range(30)]  # [800, 1200) ms
        core = timer._core

        def levels() -> set[int | None]:
            with timer._lock:
                return {core.level_of(h) for h in handles}

        assert levels() == {2}
        assert clock.wait_for_waiters(1)
        assert clock.next_deadline() == pytest.approx(0.4)  # wakes early for the cascade
        clock.advance(0.4)
        assert wait_until(lambda: levels() == {1}, timeout=10)  # before their bucket expires
        assert wait_until(lambda: clock.next_deadline() == pytest.approx(0.8), timeout=10)
        assert timer.pending() == 30


# -- both wheels against a heap model ------------------------------------------------

CORES: dict[str, Any] = {
    "hierarchical": lambda size: HierarchicalWheel(tick=1.0, wheel_size=size, start=0.0),
    "hierarchical_early": lambda size: HierarchicalWheel(
        tick=1.0, wheel_size=size, start=0.0, early_cascade=1
    ),
    "hashed": lambda size: HashedWheel(tick=1.0, slots=size, start=0.0),
}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.floats(-5.0, 3000.0, allow_nan=False)),
        st.tuples(st.just("schedule"), st.integers(0, 500).map(float)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("advance"), st.floats(0.0, 400.0, allow_nan=False)),
        st.tuples(st.just("cascade_early"), st.integers(1, 5).map(float)),
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
    now >= ceil(d); tasks fire in (deadline, scheduling order), whatever early
    cascading happened in between."""
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
        elif op == "cascade_early":
            wheel.cascade_early(int(value))  # moves tasks between buckets, never fires one
        elif op == "advance":
            now += value
            fired = [h.args[0] for h in wheel.advance(now)]
            due: list[int] = []
            while model and math.ceil(model[0][0]) <= now:
                _, seq = heapq.heappop(model)
                if seq not in cancelled:
                    due.append(seq)
            if core == "hierarchical_early":
                # Early cascading can reorder tasks due at the same tick (a known gap):
                # the same tasks, in deadline order.
                deadline = {seq: d for seq, d in enumerate(h.deadline for h in handles)}
                assert sorted(fired) == sorted(due)
                ticks = [math.ceil(deadline[s]) for s in fired]
                assert ticks == sorted(ticks)
            else:
                assert fired == due
        assert len(wheel) == sum(1 for _, s in model if s not in cancelled)


# -- flat buckets: lazy cancellation, compaction, no references between handles -----------
WHEELS = {k: v for k, v in CORES.items() if k != "hierarchical_early"}


@pytest.mark.parametrize("core", sorted(WHEELS))
def test_cancelled_handles_are_compacted_once_they_outnumber_pending_ones(core: str) -> None:
    wheel = WHEELS[core](8)
    count = 2 * COMPACT_MIN + 10
    handles = [wheel.schedule_at(1000.0 + i % 7, noop, i) for i in range(count)]
    keep = set(range(0, count, count // 10))
    for i, handle in enumerate(handles):
        if i not in keep:
            assert handle.cancel() is True
    assert len(wheel) == len(keep)
    assert wheel._held == count  # cancelled handles wait in their buckets (lazy)
    assert wheel.advance(1.0) == []  # an advance compacts: the cancelled outnumber the rest
    assert wheel._held == len(keep)
    fired = wheel.advance(2000.0)
    assert [h.args[0] for h in fired] == sorted(keep, key=lambda i: (1000.0 + i % 7, i))
    assert len(wheel) == 0


@pytest.mark.parametrize("core", sorted(WHEELS))
def test_a_few_cancelled_handles_wait_for_their_bucket_instead(core: str) -> None:
    wheel = WHEELS[core](8)
    handles = [wheel.schedule_at(50.0, noop, i) for i in range(10)]
    for handle in handles[::2]:
        handle.cancel()
    wheel.advance(1.0)
    assert wheel._held == 10
    assert [h.args[0] for h in wheel.advance(60.0)] == [1, 3, 5, 7, 9]
    assert wheel._held == 0


@pytest.mark.parametrize("core", sorted(WHEELS))
def test_max_pending_does_not_count_cancelled_handles_still_in_a_bucket(core: str) -> None:
    wheel = HierarchicalWheel if core == "hierarchical" else HashedWheel
    bounded = wheel(tick=1.0, start=0.0, max_pending=2)
    first = bounded.schedule_at(100.0, noop)
    bounded.schedule_at(100.0, noop)
    assert first.cancel() is True
    bounded.schedule_at(100.0, noop)  # room again, though the cancelled one was never passed
    assert len(bounded) == 2


@pytest.mark.parametrize("core", sorted(WHEELS))
def test_a_pending_handle_refers_to_no_other_handle(core: str) -> None:
    wheel = WHEELS[core](8)
    first = wheel.schedule_at(30.0, noop)
    second = wheel.schedule_at(30.0, noop, first)  # an argument may be one, of course
    assert not [r for r in gc.get_referents(first) if isinstance(r, TimerHandle)]
    assert [r for r in gc.get_referents(second) if isinstance(r, TimerHandle)] == []
    assert [r for r in gc.get_referents(*gc.get_referents(second)) if r is first] == [first]


@pytest.mark.parametrize("make", [TimingWheel, HashedWheelTimer])
def test_a_sleeping_timer_is_woken_to_compact_when_cancels_pile_up(make: Any) -> None:
    # COMPACT_MIN cancels next to 8 pending handles: the cancel that brings the
    # count to COMPACT_MIN (a power of two) wakes the driver, and its advance
    # compacts. The driver is asleep on the clock before the first cancel, so no
    # advance in the middle of the cancels compacts part of them (which left fewer
    # than COMPACT_MIN dead ones, too few to compact again).
    clock = FakeClock(monotonic_start=0.0)
    with make(clock=clock) as timer:
        handles = [timer.schedule_after(3600.0, noop) for _ in range(COMPACT_MIN + 8)]
        assert clock.wait_for_waiters(1, timeout=60)
        for handle in handles[8:]:
            handle.cancel()
        assert timer.pending() == 8
        core = timer._core

        def held() -> int:
            with timer._lock:
                return int(core._held)

        assert wait_until(lambda: held() == 8, timeout=60)
