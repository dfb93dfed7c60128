"""SystemClock (briefly, with tiny real waits) and FakeClock (exactly, without real sleeps)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from delayq import SYSTEM_CLOCK, Clock, SystemClock
from delayq.testing import FakeClock


# -- SystemClock -------------------------------------------------------------------
def test_the_system_clock_is_a_clock_with_plausible_times() -> None:
    assert isinstance(SYSTEM_CLOCK, Clock)
    assert isinstance(FakeClock(), Clock)
    assert SYSTEM_CLOCK.time() > 1_600_000_000
    a = SYSTEM_CLOCK.monotonic()
    assert SYSTEM_CLOCK.monotonic() >= a
    assert repr(SystemClock()) == "SystemClock()"


def test_system_sleep_of_zero_or_less_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("delayq.clock._time.sleep", slept.append)
    SYSTEM_CLOCK.sleep(0)
    SYSTEM_CLOCK.sleep(-5)
    assert slept == []  # never handed to time.sleep (which raises on a negative time)
    SYSTEM_CLOCK.sleep(0.0001)
    assert slept == [0.0001]  # the patch is where a real sleep goes


def test_system_wait_with_no_time_left_returns_false_without_waiting() -> None:
    cond = threading.Condition()
    with cond:
        assert SYSTEM_CLOCK.wait(cond, 0) is False
        assert SYSTEM_CLOCK.wait(cond, -1) is False
        assert SYSTEM_CLOCK.wait(cond, 0.001) is False


def test_system_wait_returns_true_when_notified() -> None:
    cond = threading.Condition()
    waiting = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            waiting.set()
            result.append(SYSTEM_CLOCK.wait(cond, None))

    t = threading.Thread(target=waiter)
    t.start()
    assert waiting.wait(5)
    with cond:
        cond.notify()
    t.join(5)
    assert result == [True]


def test_system_wait_async_reports_set_and_timeout() -> None:
    async def body() -> None:
        event = asyncio.Event()
        assert await SYSTEM_CLOCK.wait_async(event, 0) is False
        assert await SYSTEM_CLOCK.wait_async(event, 0.001) is False
        asyncio.get_running_loop().call_soon(event.set)
        assert await SYSTEM_CLOCK.wait_async(event, None) is True
        assert await SYSTEM_CLOCK.wait_async(event, 5) is True
        await SYSTEM_CLOCK.sleep_async(-1)

    asyncio.run(body())


# -- FakeClock ----------------------------------------------------------------------------
def test_fake_time_moves_only_when_advanced_and_both_clocks_together() -> None:
    clock = FakeClock(start=100.0, monotonic_start=5.0)
    assert (clock.time(), clock.monotonic()) == (100.0, 5.0)
    clock.advance(2.5)
    assert (clock.time(), clock.monotonic()) == (102.5, 7.5)
    clock.advance_to(10.0)
    assert clock.monotonic() == 10.0
    clock.advance_to(3.0)  # never backwards
    assert clock.monotonic() == 10.0
    assert "monotonic=10.000000" in repr(clock)


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_fake_clock_refuses_to_go_backwards(bad: float) -> None:
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        FakeClock().advance(bad)


def test_fake_sleep_returns_when_the_clock_passes_its_deadline() -> None:
    clock = FakeClock()
    done = threading.Event()
    t = threading.Thread(target=lambda: (clock.sleep(3), done.set()))
    t.start()
    assert clock.wait_for_waiters(1)
    assert clock.next_deadline() == clock.monotonic() + 3
    clock.advance(2)
    assert not done.is_set()
    assert clock.waiters() == 1
    clock.advance(1)
    assert done.wait(5)
    t.join(5)
    assert clock.waiters() == 0
    assert clock.next_deadline() is None


def test_fake_wait_times_out_with_false_and_notify_gives_true() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    results: list[bool] = []

    def waiter() -> None:
        with cond:
            results.append(clock.wait(cond, 1.0))

    t = threading.Thread(target=waiter)
    t.start()
    assert clock.wait_for_waiters(1)
    clock.advance(1.0)
    t.join(5)
    t = threading.Thread(target=waiter)
    t.start()
    assert clock.wait_for_waiters(1)
    with cond:
        cond.notify()
    t.join(5)
    assert results == [False, True]
    with cond:
        assert clock.wait(cond, 0) is False


def test_wait_for_waiters_gives_up_after_its_timeout() -> None:
    assert FakeClock().wait_for_waiters(1, timeout=0.01) is False


def test_fake_async_waits_wake_when_the_clock_advances() -> None:
    async def body() -> None:
        clock = FakeClock()
        event = asyncio.Event()
        sleeper = asyncio.create_task(clock.sleep_async(2))
        waiter = asyncio.create_task(clock.wait_async(event, 5))
        while clock.waiters() < 2:
            await asyncio.sleep(0)
        clock.advance(2)
        await asyncio.wait_for(sleeper, 5)
        assert not waiter.done()
        clock.advance(3)
        assert await asyncio.wait_for(waiter, 5) is False
        event.set()
        assert await clock.wait_async(event, 1) is True
        assert await clock.wait_async(asyncio.Event(), 0) is False
        await clock.sleep_async(0)

    asyncio.run(body())


def test_fake_wait_async_returns_true_when_the_event_is_set_first() -> None:
    async def body() -> None:
        clock = FakeClock()
        event = asyncio.Event()
        waiter = asyncio.create_task(clock.wait_async(event, 10))
        while clock.waiters() < 1:
            await asyncio.sleep(0)
        event.set()
        assert await asyncio.wait_for(waiter, 5) is True
        assert clock.waiters() == 0
        untimed = asyncio.create_task(clock.wait_async(asyncio.Event(), None))
        await asyncio.sleep(0)
        assert clock.waiters() == 0  # no deadline registered
        untimed.cancel()

    asyncio.run(body())
