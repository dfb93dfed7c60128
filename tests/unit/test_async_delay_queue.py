"""AsyncDelayQueue with a FakeClock: same semantics as DelayQueue, for one event loop."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from delayq import AsyncDelayQueue, DelayedItem, InvalidDelay, InvalidOption, QueueClosed
from delayq.testing import FakeClock

START = 1_000.0


def run(body: Callable[[FakeClock], Awaitable[Any]]) -> Any:
    clock = FakeClock()
    return asyncio.run(asyncio.wait_for(body(clock), 10))


async def settle(predicate: Callable[[], bool]) -> None:
    """Let other tasks run until ``predicate`` holds (no real sleeping)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def values(items: list[DelayedItem[str]]) -> list[str]:
    return [i.value for i in items]


def test_items_come_out_in_deadline_order_and_ties_fifo() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        for name, delay in [("c", 3), ("a", 1), ("b1", 2), ("b2", 2), ("b3", 2)]:
            q.put_after(name, delay)
        clock.advance(5)
        assert values([await q.take() for _ in range(5)]) == ["a", "b1", "b2", "b3", "c"]

    run(body)


def test_take_waits_until_the_head_is_due() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("x", 5)
        task = asyncio.create_task(q.take())
        await settle(lambda: clock.waiters() == 1)
        assert clock.next_deadline() == START + 5
        clock.advance(4.5)
        await asyncio.sleep(0)
        assert not task.done()
        clock.advance(0.5)
        assert (await task).value == "x"

    run(body)


def test_only_one_task_waits_timed_and_it_hands_off() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("first", 1)
        q.put_after("second", 2)
        tasks = [asyncio.create_task(q.take()) for _ in range(3)]
        await settle(lambda: clock.waiters() == 1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert clock.waiters() == 1  # the followers wait untimed
        clock.advance(1)
        await settle(lambda: sum(t.done() for t in tasks) == 1)
        await settle(lambda: clock.next_deadline() == START + 2)
        assert clock.waiters() == 1
        clock.advance(1)
        await settle(lambda: sum(t.done() for t in tasks) == 2)
        q.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert sorted(r.value for r in results if isinstance(r, DelayedItem)) == [
            "first",
            "second",
        ]
        assert sum(isinstance(r, QueueClosed) for r in results) == 1

    run(body)


def test_an_earlier_item_wakes_the_waiting_leader_at_once() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("late", 10)
        task = asyncio.create_task(q.take())
        await settle(lambda: clock.next_deadline() == START + 10)
        q.put_after("early", 1)
        await settle(lambda: clock.next_deadline() == START + 1)
        clock.advance(1)
        assert (await task).value == "early"
        assert values(q.to_list()) == ["late"]

    run(body)


def test_get_with_timeout_returns_none_when_nothing_becomes_due() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("later", 10)
        task = asyncio.create_task(q.get(timeout=2))
        await settle(lambda: clock.next_deadline() == START + 2)
        clock.advance(2)
        assert await task is None
        assert len(q) == 1

    run(body)


def test_get_with_timeout_returns_an_item_put_meanwhile() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        task = asyncio.create_task(q.get(timeout=5))
        await settle(lambda: clock.waiters() == 1)
        q.put_after("now", 0)
        assert (await task).value == "now"

    run(body)


def test_get_without_timeout_waits_like_take() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("x", 3)
        task = asyncio.create_task(q.get())
        await settle(lambda: clock.waiters() == 1)
        clock.advance(3)
        assert (await task).value == "x"

    run(body)


def test_a_cancelled_leader_lets_another_task_lead() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("x", 5)
        leader = asyncio.create_task(q.take())
        await settle(lambda: clock.waiters() == 1)
        follower = asyncio.create_task(q.take())
        for _ in range(20):
            await asyncio.sleep(0)
        leader.cancel()
        await asyncio.gather(leader, return_exceptions=True)
        await settle(lambda: clock.next_deadline() == START + 5)
        clock.advance(5)
        assert (await follower).value == "x"

    run(body)


def test_close_wakes_waiting_tasks_with_queue_closed_after_due_items() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("far", 100)
        tasks = [asyncio.create_task(q.take()) for _ in range(2)]
        tasks.append(asyncio.create_task(q.get(timeout=50)))
        await settle(lambda: clock.waiters() == 2)
        q.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, QueueClosed) for r in results)
        with pytest.raises(QueueClosed):
            q.put_after("x", 1)
        assert q.closed
        assert values(q.to_list()) == ["far"]

    run(body)


def test_due_items_are_still_delivered_after_close() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        q.put_after("due", -1)
        q.put_after("future", 1)
        q.close()
        assert (await q.take()).value == "due"
        with pytest.raises(QueueClosed):
            await q.take()
        with pytest.raises(QueueClosed):
            q.poll()

    run(body)


def test_poll_peek_remove_drain_and_clear() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        assert q.poll() is None
        assert q.peek() is None
        assert q.next_deadline() is None
        a = q.put_after("a", 1)
        b = q.put_after("b", 2)
        q.put_after("c", 3)
        q.offer(DelayedItem("d", START + 4))
        assert q.peek() == a
        assert q.next_deadline() == START + 1
        assert q.poll() is None
        assert q.remove(b) is True
        assert q.remove(b) is False
        clock.advance(3)
        sink: list[DelayedItem[str]] = []
        assert q.drain_to(sink, max_items=1) == 1
        assert q.drain_to(sink.append) == 1
        assert values(sink) == ["a", "c"]
        assert values(list(q)) == ["d"]
        assert "len=1" in repr(q)
        q.clear()
        assert len(q) == 0

    run(body)


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1"])
def test_bad_delays_and_timeouts_raise_invalid_delay(bad: object) -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[DelayedItem[str]] = AsyncDelayQueue(clock=clock)
        with pytest.raises(InvalidDelay):
            q.put_after("x", bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidDelay):
            await q.get(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidOption):
            q.drain_to([], max_items=-1)

    run(body)


def test_key_function_gives_the_deadline() -> None:
    async def body(clock: FakeClock) -> None:
        q: AsyncDelayQueue[tuple[str, float]] = AsyncDelayQueue(clock=clock, key=lambda t: t[1])
        q.put(("b", START + 2))
        q.put(("a", START + 1))
        clock.advance(2)
        assert [q.poll(), q.poll()] == [("a", START + 1), ("b", START + 2)]

    run(body)
