"""RetryQueue with a FakeClock: retries on the backoff schedule, dead letters, clean close."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from delayq import ExponentialBackoff, InvalidDelay, InvalidOption, QueueClosed, RetryQueue
from delayq.testing import FakeClock
from tests._util import wait_until

START = 1_000.0


class Flaky:
    """A deliver callable failing the first ``failures`` calls per item."""

    def __init__(self, clock: FakeClock, failures: int) -> None:
        self.clock = clock
        self.failures = failures
        self.calls: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def __call__(self, item: str) -> None:
        with self.lock:
            self.calls.append((item, self.clock.monotonic()))
            count = sum(1 for name, _ in self.calls if name == item)
        if count <= self.failures:
            raise ConnectionError(f"{item} attempt {count} failed")

    def times(self, item: str) -> list[float]:
        with self.lock:
            return [t - START for name, t in self.calls if name == item]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dead() -> list[tuple[str, int, BaseException]]:
    return []


def make(
    clock: FakeClock,
    deliver: Flaky,
    dead: list[tuple[str, int, BaseException]],
    **options: object,
) -> RetryQueue[str]:
    return RetryQueue(
        deliver,
        clock=clock,
        on_dead_letter=lambda item, attempts, exc: dead.append((item, attempts, exc)),
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def flaky(clock: FakeClock) -> Flaky:
    return Flaky(clock, failures=2)


@pytest.fixture
def retries(clock, flaky, dead) -> Iterator[RetryQueue[str]]:
    q = make(clock, flaky, dead, backoff="2s,5s,10s", max_attempts=4)
    yield q
    q.close(timeout=5)


def test_a_failing_item_is_retried_on_the_backoff_schedule_until_it_succeeds(
    retries, clock, flaky, dead
) -> None:
    retries.submit("loan-9001")
    assert wait_until(lambda: flaky.times("loan-9001") == [0.0])
    assert wait_until(lambda: clock.next_deadline() == START + 2)
    clock.advance(2)
    assert wait_until(lambda: flaky.times("loan-9001") == [0.0, 2.0])
    assert wait_until(lambda: clock.next_deadline() == START + 7)
    clock.advance(5)
    assert wait_until(lambda: retries.pending() == 0)
    assert flaky.times("loan-9001") == [0.0, 2.0, 7.0]
    assert dead == []


def test_an_item_failing_every_attempt_goes_to_the_dead_letter_callback(clock, dead) -> None:
    always = Flaky(clock, failures=10)
    q = make(clock, always, dead, backoff=[1], max_attempts=3)
    try:
        q.submit("doomed")
        for attempt in (1, 2):
            assert wait_until(lambda n=attempt: len(always.times("doomed")) == n)
            assert wait_until(lambda: clock.waiters() == 1)
            clock.advance(1)
        assert wait_until(lambda: len(dead) == 1)
        item, attempts, exc = dead[0]
        assert (item, attempts) == ("doomed", 3)
        assert isinstance(exc, ConnectionError)
        assert "attempt 3" in str(exc)
        assert q.pending() == 0
        assert always.times("doomed") == [0.0, 1.0, 2.0]
    finally:
        assert q.close(timeout=5) == []


def test_without_a_callback_dead_letters_are_logged(clock, caplog) -> None:
    always = Flaky(clock, failures=10)
    q: RetryQueue[str] = RetryQueue(always, clock=clock, max_attempts=1)
    with caplog.at_level(logging.ERROR, logger="delayq"):
        q.submit("webhook-1")
        assert wait_until(lambda: q.pending() == 0)
    q.close(timeout=5)
    assert any("gave up on 'webhook-1' after 1 attempts" in r.getMessage() for r in caplog.records)


def test_a_failing_dead_letter_callback_does_not_stop_the_worker(clock, caplog) -> None:
    always = Flaky(clock, failures=1)

    def explode(item: str, attempts: int, exc: BaseException) -> None:
        raise ValueError("callback broke")

    q: RetryQueue[str] = RetryQueue(always, clock=clock, max_attempts=1, on_dead_letter=explode)
    with caplog.at_level(logging.ERROR, logger="delayq"):
        q.submit("a")
        assert wait_until(lambda: q.pending() == 0)
        q.submit("b")  # succeeds: "b" has not failed yet
        assert wait_until(lambda: always.times("b") == [0.0])
    q.close(timeout=5)
    assert any("on_dead_letter callback failed" in r.getMessage() for r in caplog.records)


def test_exponential_backoff_policy_is_followed(clock, dead) -> None:
    flaky = Flaky(clock, failures=3)
    q = make(clock, flaky, dead, backoff=ExponentialBackoff(base=0.05, factor=2, cap=1))
    try:
        q.submit("job")
        for expected in (0.05, 0.15, 0.35):
            assert wait_until(lambda e=expected: clock.next_deadline() == pytest.approx(START + e))
            clock.advance_to(clock.next_deadline())  # type: ignore[arg-type]
        assert wait_until(lambda: q.pending() == 0)
        assert flaky.times("job") == pytest.approx([0.0, 0.05, 0.15, 0.35])
    finally:
        q.close(timeout=5)


def test_submit_with_a_delay_waits_before_the_first_attempt(retries, clock, flaky) -> None:
    retries.submit("later", delay=3)
    assert retries.pending() == 1
    assert wait_until(lambda: clock.next_deadline() == START + 3)
    assert flaky.times("later") == []
    clock.advance(3)
    assert wait_until(lambda: flaky.times("later") == [3.0])


def test_close_returns_the_items_still_waiting_and_refuses_new_ones(retries, clock) -> None:
    retries.submit("b", delay=20)
    retries.submit("a", delay=10)
    assert wait_until(lambda: clock.waiters() == 1)
    assert retries.close(timeout=5) == ["a", "b"]
    assert retries.closed
    with pytest.raises(QueueClosed):
        retries.submit("c")
    assert retries.close() == []


def test_close_includes_an_item_whose_retry_was_pending(retries, clock, flaky) -> None:
    retries.submit("loan")
    assert wait_until(lambda: clock.next_deadline() == START + 2)
    assert retries.close(timeout=5) == ["loan"]


def test_close_reports_a_delivery_still_running_after_the_timeout(clock, dead) -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(item: str) -> None:
        started.set()
        release.wait(10)

    q: RetryQueue[str] = RetryQueue(slow, clock=clock, on_dead_letter=lambda *a: None)
    q.submit("in-flight")
    q.submit("queued", delay=1)
    assert started.wait(10)
    assert q.close(timeout=0) == ["in-flight", "queued"]
    release.set()
    assert wait_until(lambda: q.pending() == 0)


def test_close_waits_for_a_running_delivery_to_finish(clock, dead) -> None:
    started = threading.Event()
    release = threading.Event()
    delivered: list[str] = []

    def slow(item: str) -> None:
        started.set()
        release.wait(10)
        delivered.append(item)

    q: RetryQueue[str] = RetryQueue(slow, clock=clock)
    q.submit("x")
    assert started.wait(10)
    closer = threading.Thread(target=lambda: delivered.append(str(q.close())))
    closer.start()
    release.set()
    closer.join(10)
    assert delivered == ["x", "[]"]


def test_no_delivery_starts_after_close_even_for_due_items(clock) -> None:
    gate = threading.Event()
    seen: list[str] = []

    def deliver(item: str) -> None:
        seen.append(item)
        gate.wait(10)

    q: RetryQueue[str] = RetryQueue(deliver, clock=clock)
    q.submit("first")
    assert wait_until(lambda: seen == ["first"])
    q.submit("due-1")
    q.submit("due-2")
    closer_result: list[list[str]] = []
    closer = threading.Thread(target=lambda: closer_result.append(q.close()))
    closer.start()
    assert wait_until(lambda: q.closed)
    gate.set()
    closer.join(10)
    assert seen == ["first"]
    assert closer_result == [["due-1", "due-2"]]


def test_the_context_manager_closes(clock) -> None:
    with RetryQueue(lambda item: None, clock=clock) as q:
        q.submit("x", delay=5)
    assert q.closed
    assert "closed" in repr(q)


def test_several_workers_deliver_in_parallel(clock) -> None:
    both = threading.Barrier(2, timeout=10)
    q: RetryQueue[str] = RetryQueue(lambda item: both.wait(), clock=clock, workers=2)
    q.submit("a")
    q.submit("b")
    assert wait_until(lambda: q.pending() == 0)
    q.close(timeout=5)


@pytest.mark.parametrize(
    ("option", "bad"),
    [("max_attempts", 0), ("max_attempts", True), ("workers", 0), ("backoff", "soon")],
)
def test_bad_options_raise_invalid_option(option: str, bad: object) -> None:
    with pytest.raises(InvalidOption):
        RetryQueue(lambda item: None, **{option: bad})  # type: ignore[arg-type]


def test_submit_rejects_a_bad_delay(retries) -> None:
    with pytest.raises(InvalidDelay):
        retries.submit("x", delay=float("nan"))
    assert retries.pending() == 0


def test_properties_expose_the_policy(retries) -> None:
    assert retries.max_attempts == 4
    assert retries.backoff.delay(2) == 5.0
