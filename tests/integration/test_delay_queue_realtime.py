"""DelayQueue on the real clock: many threads, and lateness that stays small.

Every test checks properties only: never early, due order, nothing lost or
duplicated, delivered by a generous deadline. How fast and how late is the
benchmark's business (``bench/inprocess.py``): a loaded CI machine is not a
benchmark. Waits poll up to a deadline instead of sleeping.
"""

from __future__ import annotations

import asyncio
import io
import random
import re
import threading

import pytest

from delayq import AsyncDelayQueue, DelayedItem, DelayQueue, QueueClosed
from delayq.cli.experiments import retry
from delayq.clock import SYSTEM_CLOCK, SystemClock
from tests._util import wait_until

PRODUCERS = 8
CONSUMERS = 8
PER_PRODUCER = 250


def consume(
    queue: DelayQueue[DelayedItem[tuple[int, int]]],
    taken: list[tuple[float, float, tuple[int, int]]],
) -> None:
    """Take until closed, recording (deadline, time taken, value)."""
    monotonic = SYSTEM_CLOCK.monotonic
    while True:
        try:
            item = queue.take()
        except QueueClosed:
            return
        taken.append((item.deadline, monotonic(), item.value))


def run_threads(
    queue: DelayQueue[DelayedItem[tuple[int, int]]],
    produce: list[threading.Thread],
    *,
    consumers_after_producers: bool = False,
) -> list[list[tuple[float, float, tuple[int, int]]]]:
    per_consumer: list[list[tuple[float, float, tuple[int, int]]]] = [[] for _ in range(CONSUMERS)]
    consumers = [
        threading.Thread(target=consume, args=(queue, per_consumer[i]), daemon=True)
        for i in range(CONSUMERS)
    ]
    if consumers_after_producers:
        for t in produce:
            t.start()
        for t in produce:
            t.join(60)
        for t in consumers:
            t.start()
    else:
        for t in consumers + produce:
            t.start()
        for t in produce:
            t.join(60)
    total = PRODUCERS * PER_PRODUCER
    assert wait_until(lambda: sum(map(len, per_consumer)) >= total, timeout=60)
    queue.close()
    for t in consumers:
        t.join(30)
        assert not t.is_alive()
    return per_consumer


def check_nothing_lost_duplicated_or_early(
    per_consumer: list[list[tuple[float, float, tuple[int, int]]]],
) -> None:
    values = [v for taken in per_consumer for _, _, v in taken]
    assert len(values) == len(set(values)), "an item was taken twice"
    expected = {(p, i) for p in range(PRODUCERS) for i in range(PER_PRODUCER)}
    assert set(values) == expected, "an item was lost"
    for taken in per_consumer:
        for deadline, at, value in taken:
            assert at >= deadline, f"{value} came out {deadline - at:.6f}s early"


def test_eight_producers_and_eight_consumers_see_due_order_and_lose_nothing() -> None:
    queue: DelayQueue[DelayedItem[tuple[int, int]]] = DelayQueue()
    # The consumers start once every put has returned, so each take pops the
    # minimum of what is left of the full set: each consumer's deadlines must
    # then be non-decreasing, however slow the puts were.
    base = SYSTEM_CLOCK.monotonic() + 0.3

    def produce(p: int) -> None:
        rng = random.Random(p)
        for i in range(PER_PRODUCER):
            queue.put_at((p, i), base + rng.randrange(0, 200) / 1000)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    per_consumer = run_threads(queue, producers, consumers_after_producers=True)
    check_nothing_lost_duplicated_or_early(per_consumer)
    for taken in per_consumer:
        deadlines = [d for d, _, _ in taken]
        assert deadlines == sorted(deadlines), "a consumer got items out of due order"


def test_producers_and_consumers_interleaved_lose_nothing_and_are_never_early() -> None:
    queue: DelayQueue[DelayedItem[tuple[int, int]]] = DelayQueue()

    def produce(p: int) -> None:
        rng = random.Random(100 + p)
        for i in range(PER_PRODUCER):
            queue.put_after((p, i), rng.choice([-0.001, 0, 0.001, 0.005, 0.02]))

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    check_nothing_lost_duplicated_or_early(run_threads(queue, producers))


@pytest.mark.slow
def test_four_consumers_get_every_item_once_and_never_early() -> None:
    queue: DelayQueue[DelayedItem[int]] = DelayQueue()
    late: list[float] = []
    lock = threading.Lock()

    def consumer() -> None:
        while True:
            try:
                item = queue.take()
            except QueueClosed:
                return
            now = SYSTEM_CLOCK.monotonic()
            with lock:
                late.append(now - item.deadline)

    threads = [threading.Thread(target=consumer, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    count = 400
    for i in range(count):
        queue.put_after(i, rng.uniform(0.05, 0.8))
    assert wait_until(lambda: len(late) == count, timeout=60)
    queue.close()
    for t in threads:
        t.join(5)
    assert len(late) == count
    assert min(late) >= 0


class SignallingClock(SystemClock):
    """The real clock, flagging when a thread starts a timed wait."""

    def __init__(self) -> None:
        self.timed_wait = threading.Event()

    def wait(self, condition: threading.Condition, timeout: float | None) -> bool:
        if timeout is not None:
            self.timed_wait.set()
        return super().wait(condition, timeout)


@pytest.mark.slow
def test_an_earlier_item_is_delivered_on_time_while_a_consumer_waits_for_a_late_one() -> None:
    clock = SignallingClock()
    queue: DelayQueue[DelayedItem[str]] = DelayQueue(clock=clock)
    got: list[tuple[str, float]] = []

    def consumer() -> None:
        item = queue.take()
        got.append((item.value, clock.monotonic() - item.deadline))

    queue.put_after("late", 30)
    thread = threading.Thread(target=consumer, daemon=True)
    thread.start()
    assert clock.timed_wait.wait(5), "the consumer never waited for 'late'"
    queue.put_after("early", 0.05)
    assert wait_until(lambda: bool(got), timeout=20)  # well before "late", due in 30 s
    name, lateness = got[0]
    assert name == "early"
    assert lateness >= 0
    queue.close()


@pytest.mark.slow
def test_async_delay_queue_delivers_every_item_never_early() -> None:
    async def body() -> list[float]:
        queue: AsyncDelayQueue[DelayedItem[int]] = AsyncDelayQueue()
        rng = random.Random(3)
        for i in range(200):
            queue.put_after(i, rng.uniform(0.02, 0.5))
        late: list[float] = []
        all_taken = asyncio.Event()

        async def consumer() -> None:
            loop = asyncio.get_running_loop()
            while True:
                try:
                    item = await queue.take()
                except QueueClosed:
                    return
                late.append(loop.time() - item.deadline)
                if len(late) == 200:
                    all_taken.set()

        consumers = [asyncio.create_task(consumer()) for _ in range(4)]
        await asyncio.wait_for(all_taken.wait(), 60)
        queue.close()
        await asyncio.gather(*consumers)
        return late

    late = asyncio.run(body())
    assert len(late) == 200
    assert min(late) >= 0  # loop.time() is time.monotonic


@pytest.mark.slow
def test_retry_experiment_prints_the_seed_timeline_with_measured_offsets() -> None:
    out = io.StringIO()
    retry.run(out)
    text = out.getvalue()
    offsets = [int(m) for m in re.findall(r"\+\s*(\d+)ms\s+attempt loan-9001#\d", text)]
    assert len(offsets) == 3
    # Never early (each printed offset is rounded to the ms); how late is the
    # benchmark's business: the exact timeline is checked on a fake clock
    # (tests/unit/test_retry_experiment.py).
    assert offsets[1] >= offsets[0] + 49
    assert offsets[2] >= offsets[1] + 99
    assert "loan-9001#2 -> succeeded" in text
    assert "queue length at the end = 0" in text
