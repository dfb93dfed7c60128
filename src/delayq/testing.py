"""Helpers for testing code that uses delayq.

:class:`FakeClock` is a :class:`~delayq.clock.Clock` that moves only when the
test calls :meth:`FakeClock.advance`. Threads and coroutines that wait on it
(``sleep``, ``wait``, ``wait_async``) are woken when the clock passes their
deadline, so time-dependent behaviour is tested exactly and without real sleeps.

:class:`~delayq.backends.memory.MemoryBackend` is the in-memory store: run an
app and its handlers against ``MemoryBackend(clock=FakeClock())``.

Test mode runs due jobs inline, in the test's thread, with a worker's rules
(retries by backoff, dead letters, misfire, results)::

    app = InlineApp()                  # a DelayQ on memory:// and a FakeClock
    handle = total.schedule(42)        # (tasks registered on app)
    app.advance(1800)                  # steps through every due time, runs what is due
    handle.result()                    # its value (or its final error)

:func:`inline` does the same for an app you already have (your module-level
``app`` and its tasks) for the length of a ``with`` block; the pytest fixtures
``delayq_app`` and ``delayq_clock`` (the plugin ``delayq.pytest_plugin``,
loaded by pytest when delayq is installed) give a fresh :class:`InlineApp`.
See docs/testing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from delayq.app import DelayQ
from delayq.backends import Backend
from delayq.backends.memory import MemoryBackend
from delayq.errors import ConfigurationError, ResultTimeout
from delayq.worker import JobResult, run_due

__all__ = ["FakeClock", "InlineApp", "MemoryBackend", "advance", "inline", "run_due"]


@dataclass(eq=False)
class _Waiter:
    deadline: float
    wake: Callable[[], None]
    seq: int = field(default=0)


class FakeClock:
    """A hand-driven clock for tests.

    ``time()`` starts at ``start`` (epoch seconds) and ``monotonic()`` at
    ``monotonic_start``; both move together by :meth:`advance`.

    Lock rule: ``_lock`` guards ``_elapsed`` and ``_waiters``; it is never held
    while a waiter's condition is acquired (so ``advance`` cannot deadlock with a
    thread that holds its own condition). ``_changed`` is notified whenever a
    waiter registers, for :meth:`wait_for_waiters`.
    """

    def __init__(self, start: float = 1_700_000_000.0, *, monotonic_start: float = 1_000.0) -> None:
        self._wall0 = float(start)
        self._mono0 = float(monotonic_start)
        self._elapsed = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters: dict[int, _Waiter] = {}
        self._seq = itertools.count()

    # -- reading -----------------------------------------------------------
    def time(self) -> float:
        with self._lock:
            return self._wall0 + self._elapsed

    def monotonic(self) -> float:
        with self._lock:
            return self._mono0 + self._elapsed

    # -- driving -----------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake every waiter now due."""
        if not seconds >= 0:
            raise ValueError(f"FakeClock.advance: seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._elapsed += seconds
            now = self._mono0 + self._elapsed
            due = [w for w in self._waiters.values() if w.deadline <= now]
            for w in due:
                del self._waiters[w.seq]
        for w in sorted(due, key=lambda w: (w.deadline, w.seq)):
            w.wake()

    def advance_to(self, monotonic: float) -> None:
        """Advance until ``monotonic()`` equals ``monotonic`` (never backwards)."""
        self.advance(max(0.0, monotonic - self.monotonic()))

    def waiters(self) -> int:
        """How many threads or tasks are waiting on this clock with a deadline."""
        with self._lock:
            return len(self._waiters)

    def next_deadline(self) -> float | None:
        """The earliest monotonic deadline anyone waits for, or None."""
        with self._lock:
            return min((w.deadline for w in self._waiters.values()), default=None)

    def wait_for_waiters(self, count: int, timeout: float = 10.0) -> bool:
        """Block (really) until at least ``count`` waiters have deadlines registered.

        Lets a test make sure a thread is asleep before it advances the clock.
        """
        with self._changed:
            return self._changed.wait_for(lambda: len(self._waiters) >= count, timeout)

    # -- waiting -----------------------------------------------------------
    def _register(self, timeout: float, wake: Callable[[], None]) -> _Waiter:
        with self._lock:
            return self._register_locked(self._mono0 + self._elapsed + timeout, wake)

    def _register_locked(self, deadline: float, wake: Callable[[], None]) -> _Waiter:
        w = _Waiter(deadline, wake, next(self._seq))
        self._waiters[w.seq] = w
        self._changed.notify_all()
        return w

    def _unregister(self, w: _Waiter) -> None:
        with self._lock:
            self._waiters.pop(w.seq, None)

    def wait(self, condition: threading.Condition, timeout: float | None) -> bool:
        if timeout is None:
            condition.wait()
            return True
        if timeout <= 0:
            return False

        def wake() -> None:
            with condition:
                condition.notify_all()

        w = self._register(timeout, wake)
        try:
            condition.wait()
        finally:
            self._unregister(w)
        return self.monotonic() < w.deadline

    def wait_until(self, condition: threading.Condition, deadline: float | None) -> bool:
        if deadline is None:
            condition.wait()
            return True

        def wake() -> None:
            with condition:
                condition.notify_all()

        with self._lock:
            # Checked and registered under one lock: an advance() cannot slip in between.
            if self._mono0 + self._elapsed >= deadline:
                return False
            w = self._register_locked(deadline, wake)
        try:
            condition.wait()
        finally:
            self._unregister(w)
        return self.monotonic() < deadline

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        deadline = self.monotonic() + seconds
        cond = threading.Condition()
        with cond:
            while (left := deadline - self.monotonic()) > 0:
                self.wait(cond, left)

    async def wait_async(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            await event.wait()
            return True
        if timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        expired = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(expired.set)

        w = self._register(timeout, wake)
        waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(expired.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._unregister(w)
            for t in waiters:
                t.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        return event.is_set()

    async def sleep_async(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        deadline = self.monotonic() + seconds
        never = asyncio.Event()
        while (left := deadline - self.monotonic()) > 0:
            await self.wait_async(never, left)

    def __repr__(self) -> str:
        return f"FakeClock(time={self.time():.6f}, monotonic={self.monotonic():.6f})"


def advance(app: DelayQ, seconds: float) -> list[JobResult]:
    """Move ``app``'s :class:`FakeClock` forward by ``seconds``, stopping at each due
    time on the way to run what is due then (so a retry 2 s after a failure runs 2 s
    later, as on a worker), and return every attempt run."""
    clock = app.clock
    if not isinstance(clock, FakeClock):
        raise ConfigurationError(
            f"advance() moves a FakeClock; this app runs on {clock!r} (use InlineApp or inline())"
        )
    if not seconds >= 0:
        raise ValueError(f"advance: seconds must be >= 0, got {seconds!r}")
    target = clock.time() + seconds
    results = run_due(app)
    while (due := app.backend.next_due()) is not None and due <= target:
        clock.advance(max(0.0, due - clock.time()))
        results += run_due(app)
    clock.advance(max(0.0, target - clock.time()))
    return results + run_due(app)


class InlineApp(DelayQ):
    """A :class:`~delayq.app.DelayQ` on a fresh memory store and a :class:`FakeClock`
    (``clock``, or a new one) whose due jobs run inline: :meth:`run_due`,
    :meth:`advance`. Other options are :class:`DelayQ`'s (``max_attempts=``...)."""

    clock: FakeClock

    def __init__(self, *, clock: FakeClock | None = None, **options: Any) -> None:
        clock = FakeClock() if clock is None else clock
        store = cast(Backend, MemoryBackend(clock=clock))  # features: a ClassVar, as in every store
        super().__init__(backend=store, clock=clock, **options)

    def run_due(self, *, limit: int = 10_000) -> list[JobResult]:
        """Run every job due now, in this thread (see :func:`delayq.worker.run_due`)."""
        return run_due(self, limit=limit)

    def advance(self, seconds: float) -> list[JobResult]:
        """Move the clock forward, running what falls due on the way (:func:`advance`)."""
        return advance(self, seconds)

    def result(self, job_id: str, *, timeout: float | None = 30.0) -> Any:
        """The job's value or final error now: nothing advances this app's clock while
        the test waits, so a job not finished yet raises ResultTimeout at once."""
        try:
            return super().result(job_id, timeout=0)
        except ResultTimeout as exc:
            raise ResultTimeout(
                f"{exc}: it is not finished, and in test mode it runs only when the test "
                f"advances the clock (app.advance(seconds), app.run_due())"
            ) from None

    async def aresult(self, job_id: str, *, timeout: float | None = 30.0) -> Any:
        """:meth:`result` for async code."""
        return self.result(job_id, timeout=timeout)

    def close(self) -> None:
        """Close the app and its memory store."""
        super().close()
        self.backend.close()


@contextlib.contextmanager
def inline(app: DelayQ, *, clock: FakeClock | None = None) -> Iterator[FakeClock]:
    """Run ``app`` (yours, with its handlers and tasks) on a fresh memory store and a
    :class:`FakeClock` for the ``with`` block, then put its own store and clock back.
    Yields the clock; run jobs with ``run_due(app)`` / ``advance(app, seconds)``.

    Not for an app a worker or another thread uses meanwhile: the swap is not atomic.
    """
    clock = FakeClock() if clock is None else clock
    store = MemoryBackend(clock=clock)
    saved = app.swap_store(cast(Backend, store), clock)
    try:
        yield clock
    finally:
        app.swap_store(*saved)
        store.close()
