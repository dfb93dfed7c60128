"""RetryQueue: deliver items, retry failures with backoff, dead-letter the rest.

The classic use of a delay queue (a webhook or notification that failed is
retried at 2 s, 5 s, 10 s, 20 s and then given up on) packaged as one object::

    def send(notice: Notice) -> None: ...  # raises on failure

    with RetryQueue(send, backoff="2s,5s,10s,20s", max_attempts=5,
                    on_dead_letter=lambda n, attempts, exc: log_failed(n, exc)) as retries:
        retries.submit(notice)            # attempt 1 runs at once on the worker

Deliveries run on worker threads, never under a lock, one at a time per
worker. After attempt ``n`` fails, attempt ``n + 1`` is due
``backoff.delay(n)`` seconds later; after ``max_attempts`` failures the item,
the attempt count and the last exception go to ``on_dead_letter`` (by default
they are logged at ERROR on the ``delayq`` logger). Items live in memory only:
for retries that survive a restart, use the durable ``DelayQ``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from delayq._validate import check_int, check_seconds
from delayq.backoff import Backoff, backoff_from_spec
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import QueueClosed
from delayq.timers.delay_queue import DelayQueue

__all__ = ["RetryQueue"]

T = TypeVar("T")

logger = logging.getLogger("delayq")


@dataclass(frozen=True, slots=True, eq=False)
class _Attempt(Generic[T]):
    """Attempt number ``attempt`` (1-based) at delivering ``item``, due at ``deadline``."""

    deadline: float
    item: T
    attempt: int


def _log_dead_letter(item: object, attempts: int, exc: BaseException) -> None:
    logger.error("RetryQueue gave up on %r after %d attempts", item, attempts, exc_info=exc)


class RetryQueue(Generic[T]):
    """Deliver items on worker threads, retrying failures with a backoff policy.

    ``deliver(item)`` succeeds by returning and fails by raising
    :class:`Exception`. ``backoff`` is a :class:`~delayq.backoff.Backoff` or
    anything :func:`~delayq.backoff.backoff_from_spec` reads (``"2s,5s,10s"``,
    ``[2, 5, 10]``, a spec dict; ``None`` is the default exponential policy).
    ``max_attempts`` counts the first delivery. ``clock`` decides when retries
    are due; the ``timeout`` of :meth:`close` is real seconds.

    Lock rule: ``_lock`` guards ``_pending``, ``_in_flight`` (attempts being
    delivered), ``_held`` (attempts taken or retried after close began),
    ``_taking`` (workers inside ``take()``), ``_closing`` and ``_collected``; ``_changed`` is
    its condition, notified when ``_taking`` drops. Lock order: ``_lock``
    before the inner queue's lock. ``deliver`` and ``on_dead_letter`` run
    with no lock held.
    """

    def __init__(
        self,
        deliver: Callable[[T], object],
        *,
        backoff: Backoff | Mapping[str, Any] | str | Iterable[float] | None = None,
        max_attempts: int = 5,
        on_dead_letter: Callable[[T, int, BaseException], object] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        workers: int = 1,
        name: str = "delayq-retry",
    ) -> None:
        check_int(max_attempts, "max_attempts", minimum=1)
        check_int(workers, "workers", minimum=1)
        self._deliver = deliver
        self._backoff = backoff_from_spec(backoff)
        self._max_attempts = max_attempts
        self._on_dead_letter: Callable[[T, int, BaseException], object] = (
            on_dead_letter if on_dead_letter is not None else _log_dead_letter
        )
        self._clock = clock
        self._queue: DelayQueue[_Attempt[T]] = DelayQueue(clock=clock)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._taking = 0
        self._pending = 0
        self._in_flight: set[_Attempt[T]] = set()
        self._held: list[_Attempt[T]] = []
        self._closing = False
        self._collected = False
        self._workers = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for worker in self._workers:
            worker.start()

    @property
    def backoff(self) -> Backoff:
        """The policy deciding how long to wait after each failed attempt."""
        return self._backoff

    @property
    def max_attempts(self) -> int:
        """Attempts per item, the first delivery included."""
        return self._max_attempts

    def submit(self, item: T, *, delay: float = 0.0) -> None:
        """Schedule the first delivery of ``item`` ``delay`` seconds from now.

        Raises :class:`~delayq.errors.QueueClosed` after :meth:`close` and
        :class:`~delayq.errors.InvalidDelay` for a delay that is not a finite
        number (a negative delay means now).
        """
        seconds = check_seconds(delay, "delay")
        with self._lock:
            if self._closing:
                raise QueueClosed("cannot submit to a closed RetryQueue")
            self._pending += 1
        try:
            self._queue.put(_Attempt(self._clock.monotonic() + seconds, item, 1))
        except QueueClosed:
            with self._lock:
                self._pending -= 1
            raise

    def pending(self) -> int:
        """Items submitted and neither delivered, dead-lettered nor handed back by close."""
        with self._lock:
            return self._pending

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        with self._lock:
            return self._closing

    def close(self, timeout: float | None = None) -> list[T]:
        """Stop, and return the items that were not delivered or dead-lettered.

        No new delivery starts after this call. Deliveries already running
        get up to ``timeout`` real seconds (``None``: as long as they take) to
        finish; one still running then is included in the result and may yet
        succeed, so treat the result as at-least-once. Idempotent: a second
        call returns an empty list.
        """
        wait = None if timeout is None else max(0.0, check_seconds(timeout, "timeout"))
        with self._lock:
            if self._closing:
                return []
            self._closing = True
        # Wakes workers blocked in take(); they stop without starting a delivery.
        self._queue.close()
        end = None if wait is None else _now() + wait
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join(None if end is None else max(0.0, end - _now()))
        with self._changed:
            # A worker between take() and recording the item is never in user
            # code, so this wait is short; afterwards every item is accounted for.
            self._changed.wait_for(lambda: self._taking == 0)
            waiting = self._held + self._queue.to_list()
            self._held = []
            self._queue.clear()
            self._collected = True
            # Waiting items are handed back now; running ones count until they end.
            self._pending -= len(waiting)
            left = waiting + list(self._in_flight)
        left.sort(key=lambda a: a.deadline)
        return [a.item for a in left]

    def __enter__(self) -> RetryQueue[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<RetryQueue {state} pending={self.pending()} max_attempts={self._max_attempts}>"

    # -- the worker ------------------------------------------------------------
    def _run(self) -> None:
        queue = self._queue
        changed = self._changed
        while True:
            with changed:
                if self._closing:
                    return
                self._taking += 1
            try:
                attempt = queue.take()
            except QueueClosed:
                return
            finally:
                with changed:
                    self._taking -= 1
                    changed.notify_all()
            with changed:
                if self._closing:
                    self._held.append(attempt)
                    continue
                self._in_flight.add(attempt)
            try:
                self._deliver(attempt.item)
            except Exception as exc:
                self._failed(attempt, exc)
            else:
                self._finish(attempt)

    def _failed(self, attempt: _Attempt[T], exc: Exception) -> None:
        if attempt.attempt >= self._max_attempts:
            self._finish(attempt)
            try:
                self._on_dead_letter(attempt.item, attempt.attempt, exc)
            except Exception:
                logger.exception("RetryQueue on_dead_letter callback failed for %r", attempt.item)
            return
        try:
            delay = self._backoff.delay(attempt.attempt)
        except Exception:
            logger.exception("RetryQueue backoff policy failed; retrying at once")
            delay = 0.0
        retry = _Attempt(self._clock.monotonic() + delay, attempt.item, attempt.attempt + 1)
        with self._lock:
            self._in_flight.discard(attempt)
            if self._collected:
                self._pending -= 1  # close() already returned the item
                return
            if self._closing:
                self._held.append(retry)
                return
            # Put under our lock so close() cannot miss the retry: close takes
            # this lock to set _closing before it closes the queue.
            self._queue.put(retry)

    def _finish(self, attempt: _Attempt[T]) -> None:
        with self._lock:
            self._in_flight.discard(attempt)
            self._pending -= 1


def _now() -> float:
    # close(timeout) bounds real waiting (thread joins), whatever clock drives retries.
    return SYSTEM_CLOCK.monotonic()
