"""DelayQueue with a FakeClock: ordering, ties, timeouts, remove, drain, close, leader hand-off.

No test sleeps for real: consumer threads block on the FakeClock and the test
advances it once they are asleep (``wait_for_waiters`` / ``RecordingClock``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from delayq import Delayed, DelayedItem, DelayQueue, InvalidDelay, InvalidOption, QueueClosed
from delayq.testing import FakeClock
from tests._util import wait_until

START = 1_000.0  # FakeClock's default monotonic start


class RecordingClock(FakeClock):
    """A FakeClock that also counts threads waiting untimed, to observe leader/follower."""

    def __init__(self) -> None:
        super().__init__()
        self._untimed = 0
        self._untimed_changed = threading.Condition()

    def wait(self, condition: threading.Condition, timeout: float | None) -> bool:
        if timeout is not None:
            return super().wait(condition, timeout)
        with self._untimed_changed:
            self._untimed += 1
            self._untimed_changed.notify_all()
        try:
            return super().wait(condition, None)
        finally:
            with self._untimed_changed:
                self._untimed -= 1
                self._untimed_changed.notify_all()

    def untimed(self) -> int:
        with self._untimed_changed:
            return self._untimed

    def wait_for_untimed(self, count: int, timeout: float = 10.0) -> bool:
        with self._untimed_changed:
            return self._untimed_changed.wait_for(lambda: self._untimed >= count, timeout)


@dataclass(frozen=True)
class Task:
    name: str
    deadline: float


class Consumer:
    """A thread running ``fn`` once and keeping its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> Any:
        assert self.done.wait(10), "consumer did not finish"
        self.thread.join(10)
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


@pytest.fixture
def queue(clock: RecordingClock) -> Iterator[DelayQueue[DelayedItem[str]]]:
    q: DelayQueue[DelayedItem[str]] = DelayQueue(clock=clock)
    yield q
    q.close()


def values(items: list[DelayedItem[str]]) -> list[str]:
    return [i.value for i in items]


# -- ordering and ties ------------------------------------------------------
def test_items_come_out_in_deadline_order_not_put_order(queue, clock) -> None:
    for name, delay in [("c", 3), ("a", 1), ("d", 4), ("b", 2)]:
        queue.put_after(name, delay)
    clock.advance(10)
    assert values([queue.take() for _ in range(4)]) == ["a", "b", "c", "d"]


def test_items_with_equal_deadlines_come_out_in_put_order(queue, clock) -> None:
    for i in range(50):
        queue.put_at(f"t{i}", START + 1)
    queue.put_at("early", START + 0.5)
    clock.advance(1)
    assert values([queue.take() for _ in range(51)]) == ["early"] + [f"t{i}" for i in range(50)]


def test_poll_returns_nothing_before_the_deadline_and_the_item_at_it(queue, clock) -> None:
    queue.put_after("x", 2)
    assert queue.poll() is None
    clock.advance(1.999)
    assert queue.poll() is None
    clock.advance(0.001)
    assert queue.poll() == DelayedItem("x", START + 2)
    assert len(queue) == 0


def test_negative_delay_means_already_due(queue) -> None:
    item = queue.put_after("late", -5)
    assert item.deadline == START - 5
    assert queue.poll() == item


def test_put_accepts_any_object_with_a_deadline(clock) -> None:
    q: DelayQueue[Task] = DelayQueue(clock=clock)
    q.put(Task("b", START + 2))
    assert q.offer(Task("a", START + 1)) is True
    clock.advance(2)
    assert [q.take().name for _ in range(2)] == ["a", "b"]
    assert isinstance(Task("x", 1.0), Delayed)


def test_key_function_gives_the_deadline(clock) -> None:
    q: DelayQueue[tuple[str, float]] = DelayQueue(clock=clock, key=lambda t: t[1])
    q.put(("late", START + 5))
    q.put(("soon", START + 1))
    assert q.peek() == ("soon", START + 1)
    assert q.next_deadline() == START + 1


def test_integer_deadlines_are_accepted(clock) -> None:
    q: DelayQueue[Task] = DelayQueue(clock=clock)
    q.put(Task("int", 1001))  # type: ignore[arg-type]
    assert q.next_deadline() == 1001.0


# -- bad input ----------------------------------------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, True, "5", None, [1]])
def test_put_after_rejects_a_delay_that_is_not_a_finite_number(queue, bad) -> None:
    with pytest.raises(InvalidDelay) as info:
        queue.put_after("x", bad)
    assert repr(bad) in str(info.value)
    assert len(queue) == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, False, "soon"])
def test_put_rejects_an_item_whose_deadline_is_not_a_finite_number(clock, bad) -> None:
    q: DelayQueue[Task] = DelayQueue(clock=clock)
    with pytest.raises(InvalidDelay, match="deadline"):
        q.put(Task("x", bad))
    with pytest.raises(InvalidDelay):
        q.put_at("x", bad)  # type: ignore[misc]
    assert len(q) == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1"])
def test_poll_rejects_a_timeout_that_is_not_a_finite_number(queue, bad) -> None:
    with pytest.raises(InvalidDelay, match="timeout"):
        queue.poll(bad)


# -- blocking take and poll ---------------------------------------------------
def test_take_blocks_until_the_head_is_due(queue, clock) -> None:
    queue.put_after("x", 5)
    consumer = Consumer(queue.take)
    assert clock.wait_for_waiters(1)
    assert clock.next_deadline() == START + 5
    clock.advance(4.9)
    assert not consumer.done.is_set()
    clock.advance(0.1)
    assert consumer.join().value == "x"


def test_take_on_an_empty_queue_waits_untimed_until_a_put(queue, clock) -> None:
    consumer = Consumer(queue.take)
    assert clock.wait_for_untimed(1)
    assert clock.waiters() == 0  # no timed wait: nothing to wait for
    queue.put_after("now", 0)
    assert consumer.join().value == "now"


def test_poll_with_timeout_returns_none_when_nothing_becomes_due(queue, clock) -> None:
    queue.put_after("later", 10)
    consumer = Consumer(lambda: queue.poll(2))
    assert clock.wait_for_waiters(1)
    clock.advance(2)
    assert consumer.join() is None
    assert len(queue) == 1


def test_poll_with_timeout_returns_an_item_due_within_the_timeout(queue, clock) -> None:
    queue.put_after("soon", 1)
    consumer = Consumer(lambda: queue.poll(5))
    assert wait_until(lambda: clock.next_deadline() == START + 1)
    clock.advance(1)
    assert consumer.join().value == "soon"


def test_poll_with_timeout_on_an_empty_queue_gets_an_item_put_meanwhile(queue, clock) -> None:
    consumer = Consumer(lambda: queue.poll(5))
    assert clock.wait_for_waiters(1)
    queue.put_after("now", 0)
    assert consumer.join().value == "now"


def test_poll_with_zero_or_negative_timeout_never_waits(queue) -> None:
    queue.put_after("later", 1)
    assert queue.poll(0) is None
    assert queue.poll(-1) is None


# -- leader / follower ------------------------------------------------------------
def test_only_one_consumer_waits_timed_the_others_untimed(queue, clock) -> None:
    queue.put_after("x", 5)
    consumers = [Consumer(queue.take) for _ in range(3)]
    assert clock.wait_for_waiters(1)
    assert clock.wait_for_untimed(2)
    assert clock.waiters() == 1
    assert clock.next_deadline() == START + 5
    clock.advance(5)
    queue.close()
    results = []
    for c in consumers:
        c.done.wait(10)
        results.append(c.result if c.error is None else type(c.error))
    assert sorted(map(str, results)) == sorted(
        map(str, [DelayedItem("x", START + 5), QueueClosed, QueueClosed])
    )


def test_leader_hands_off_to_a_follower_when_its_wait_times_out(queue, clock) -> None:
    queue.put_after("first", 1)
    queue.put_after("second", 2)
    a, b = Consumer(queue.take), Consumer(queue.take)
    assert clock.wait_for_waiters(1)
    assert clock.wait_for_untimed(1)
    clock.advance(1)  # the leader takes "first" and signals the follower
    assert wait_until(lambda: clock.next_deadline() == START + 2)
    assert clock.waiters() == 1
    clock.advance(1)
    assert sorted([a.join().value, b.join().value]) == ["first", "second"]


def test_an_earlier_item_wakes_the_waiting_leader_at_once(queue, clock) -> None:
    queue.put_after("late", 10)
    consumer = Consumer(queue.take)
    assert wait_until(lambda: clock.next_deadline() == START + 10)
    queue.put_after("early", 1)
    assert wait_until(lambda: clock.next_deadline() == START + 1)
    clock.advance(1)
    assert consumer.join().value == "early"
    assert values(queue.to_list()) == ["late"]


def test_an_earlier_item_becomes_the_leaders_deadline_with_followers_waiting(queue, clock) -> None:
    queue.put_after("late", 10)
    consumers = [Consumer(queue.take) for _ in range(3)]
    assert clock.wait_for_untimed(2)
    queue.put_after("early", 1)
    assert wait_until(lambda: clock.next_deadline() == START + 1 and clock.untimed() == 2)
    clock.advance(1)
    assert wait_until(lambda: sum(c.done.is_set() for c in consumers) == 1)
    # The next leader now waits for "late".
    assert wait_until(lambda: clock.next_deadline() == START + 10)
    clock.advance(9)
    assert wait_until(lambda: sum(c.done.is_set() for c in consumers) == 2)
    queue.close()
    got = sorted(c.join().value for c in consumers if c.done.wait(10) and c.error is None)
    assert got == ["early", "late"]


def test_a_polling_leader_and_a_taking_follower_share_the_items(queue, clock) -> None:
    # FakeClock may wake every waiter at a deadline (a spurious wake-up the Clock
    # contract allows), so either consumer may get "first"; the other must then
    # lead for "second".
    queue.put_after("first", 4)
    queue.put_after("second", 6)
    poller = Consumer(lambda: queue.poll(100.0))
    assert wait_until(lambda: clock.next_deadline() == START + 4)
    taker = Consumer(queue.take)
    assert clock.wait_for_untimed(1)
    clock.advance(4)
    assert wait_until(lambda: poller.done.is_set() or taker.done.is_set())
    assert wait_until(lambda: clock.next_deadline() == START + 6)
    clock.advance(2)
    assert sorted([poller.join().value, taker.join().value]) == ["first", "second"]


# -- remove, drain, peek, clear -------------------------------------------------
def test_remove_takes_out_one_item_and_keeps_the_order(queue, clock) -> None:
    items = [queue.put_after(n, d) for n, d in [("a", 1), ("b", 2), ("c", 3), ("d", 4)]]
    assert queue.remove(items[2]) is True
    assert queue.remove(items[0]) is True
    assert queue.remove(items[0]) is False
    clock.advance(5)
    assert values([queue.take(), queue.take()]) == ["b", "d"]


def test_remove_matches_an_equal_item_and_prefers_the_earliest(queue) -> None:
    queue.put_at("a", START + 2)
    queue.put_at("a", START + 1)
    assert queue.remove(DelayedItem("a", START + 2)) is True
    assert queue.to_list() == [DelayedItem("a", START + 1)]
    assert queue.remove(DelayedItem("zzz", START)) is False


def test_removing_the_head_makes_the_leader_wait_for_the_next_one(queue, clock) -> None:
    head = queue.put_after("head", 1)
    queue.put_after("next", 3)
    consumer = Consumer(queue.take)
    assert wait_until(lambda: clock.next_deadline() == START + 1)
    assert queue.remove(head)
    clock.advance(1)  # the leader wakes, finds "next" not due, waits again
    assert wait_until(lambda: clock.next_deadline() == START + 3)
    assert not consumer.done.is_set()
    clock.advance(2)
    assert consumer.join().value == "next"


def test_drain_to_moves_only_due_items_in_due_order(queue, clock) -> None:
    for name, delay in [("c", 3), ("a", 1), ("late", 9), ("b", 2)]:
        queue.put_after(name, delay)
    clock.advance(3)
    sink: list[DelayedItem[str]] = []
    assert queue.drain_to(sink) == 3
    assert values(sink) == ["a", "b", "c"]
    assert values(queue.to_list()) == ["late"]


def test_drain_to_respects_max_items_and_accepts_a_callable(queue, clock) -> None:
    for i in range(5):
        queue.put_after(str(i), 0)
    got: list[str] = []
    assert queue.drain_to(lambda item: got.append(item.value), max_items=2) == 2
    assert queue.drain_to(lambda item: got.append(item.value), max_items=0) == 0
    assert got == ["0", "1"]
    assert len(queue) == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_drain_to_rejects_a_bad_max_items(queue, bad) -> None:
    with pytest.raises(InvalidOption, match="max_items"):
        queue.drain_to([], max_items=bad)


def test_peek_and_next_deadline_show_the_head_without_removing_it(queue) -> None:
    assert queue.peek() is None
    assert queue.next_deadline() is None
    queue.put_after("b", 2)
    a = queue.put_after("a", 1)
    assert queue.peek() == a
    assert queue.next_deadline() == START + 1
    assert len(queue) == 2


def test_clear_empties_the_queue(queue, clock) -> None:
    queue.put_after("a", 1)
    queue.put_after("b", 0)
    queue.clear()
    assert len(queue) == 0
    clock.advance(5)
    assert queue.poll() is None
    assert list(queue) == []


def test_repr_tells_state_and_size(queue) -> None:
    queue.put_after("a", 1)
    assert "open len=1" in repr(queue)


# -- close ----------------------------------------------------------------------------
def test_close_wakes_every_blocked_consumer_with_queue_closed(queue, clock) -> None:
    queue.put_after("far", 100)
    consumers = [Consumer(queue.take) for _ in range(3)] + [Consumer(lambda: queue.poll(50))]
    assert clock.wait_for_waiters(2)  # the take leader and the timed poll
    assert clock.wait_for_untimed(2)
    queue.close()
    for c in consumers:
        with pytest.raises(QueueClosed):
            c.join()
    assert queue.closed
    assert values(queue.to_list()) == ["far"]


def test_consumers_still_get_due_items_after_close_then_queue_closed(queue, clock) -> None:
    queue.put_after("due", 0)
    queue.put_after("due too", 0)
    queue.put_after("future", 10)
    queue.close()
    assert queue.take().value == "due"
    assert queue.poll().value == "due too"
    with pytest.raises(QueueClosed):
        queue.take()
    with pytest.raises(QueueClosed):
        queue.poll()
    assert len(queue) == 1


def test_put_after_close_raises_and_stores_nothing(queue) -> None:
    queue.close()
    queue.close()  # idempotent
    with pytest.raises(QueueClosed):
        queue.put_after("x", 1)
    with pytest.raises(QueueClosed):
        queue.offer(DelayedItem("y", START))
    assert len(queue) == 0


def test_remove_runs_a_users_equality_outside_the_lock(clock) -> None:
    q: DelayQueue[Task] = DelayQueue(clock=clock)

    @dataclass(frozen=True, eq=False)
    class Nosy(Task):
        def __eq__(self, other: object) -> bool:
            q.peek()  # would deadlock if called under the queue's lock
            return isinstance(other, Task) and other.name == self.name

        __hash__ = Task.__hash__

    q.put(Nosy("a", START + 1))
    q.put(Nosy("b", START + 2))
    finder = Consumer(lambda: q.remove(Task("b", 0.0)))
    assert finder.join() is True
    assert [t.name for t in q.to_list()] == ["a"]


# -- absolute deadlines: time passing between reading the clock and waiting ---------


class MovesAfterARead(FakeClock):
    """A FakeClock that jumps forward right after another thread next reads it,
    as if the test advanced it between that thread's clock read and its wait."""

    def __init__(self) -> None:
        super().__init__()
        self._jump = 0.0
        self._armed_by: threading.Thread | None = None

    def jump_after_next_read(self, seconds: float) -> None:
        """Arm: the next ``monotonic()`` from a thread other than the caller's jumps."""
        self._armed_by = threading.current_thread()
        self._jump = seconds

    def monotonic(self) -> float:
        now = super().monotonic()
        if self._jump and threading.current_thread() is not self._armed_by:
            seconds, self._jump = self._jump, 0.0
            self.advance(seconds)
        return now


def test_a_taking_leader_does_not_oversleep_when_time_passes_before_its_wait() -> None:
    clock = MovesAfterARead()
    q: DelayQueue[DelayedItem[str]] = DelayQueue(clock=clock)
    consumer = Consumer(q.take)
    assert wait_until(lambda: q._waiting == 1, timeout=10)  # untimed: the queue is empty
    clock.jump_after_next_read(2.0)
    q.put_at("x", START + 0.5)  # wakes it; 2 s pass just after it reads the clock
    # It must wait until START + 0.5, which has passed, not for 0.5 s from START + 2.
    assert consumer.join().value == "x"
    q.close()


def test_a_polling_leader_does_not_oversleep_when_time_passes_before_its_wait() -> None:
    clock = MovesAfterARead()
    q: DelayQueue[DelayedItem[str]] = DelayQueue(clock=clock)
    q.put_at("x", START + 0.5)
    clock.jump_after_next_read(2.0)  # 2 s pass just after the poller first reads the clock
    assert Consumer(lambda: q.poll(60.0)).join().value == "x"
    q.close()
