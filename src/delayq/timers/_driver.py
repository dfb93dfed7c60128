"""Shared plumbing of the threaded timers: executor hand-off and the wheel driver loop.

The wheels' cores are pure (``advance(now)`` returns what is due, nothing reads
a clock or starts a thread). :class:`WheelTimer` is the thin driver around a
core: one daemon thread that sleeps on the clock until the core's next
expiration (``clock.wait`` on a condition, so a :class:`~delayq.testing.FakeClock`
drives it in tests), is woken early when a schedule creates an earlier
expiration, and hands due callbacks to an executor. No callback runs on the
driver thread or under the lock (Kafka's ``SystemTimer`` hands expired tasks to
a thread pool; Netty's ``HashedWheelTimer`` ran them on the tick thread, and a
slow callback delayed every other timer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Protocol, Self

from delayq._validate import check_int, check_seconds
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import InvalidDelay, InvalidOption
from delayq.timers.base import DROPPED, TimerHandle, _Ticks

__all__ = [
    "ErrorHandler",
    "TimerBase",
    "WheelCore",
    "WheelTimer",
    "check_max_pending",
    "check_tick",
]

log = logging.getLogger("delayq.timers")

ErrorHandler = Callable[[TimerHandle, Exception], object]
"""Called (on the executor thread) with the handle and the exception its callback raised."""

DEFAULT_WORKERS = 4
"""Threads in the pool a timer creates when no executor is given."""

_local = threading.local()
_INF = float("inf")
_EARLY_STEP = 256  # tasks a wheel may cascade early per driver step (~0.1-0.2 ms)
_CHUNK = 32  # callbacks handed to the executor as one task, at most


def _log_error(handle: TimerHandle, exc: Exception) -> None:
    log.error("timer callback %r raised", handle, exc_info=exc)


def check_tick(tick: object) -> float:
    """Validate a tick duration: a finite number of seconds > 0."""
    try:
        seconds = check_seconds(tick, "tick")
    except InvalidDelay as exc:
        raise InvalidOption(str(exc)) from exc
    if not seconds > 0:
        raise InvalidOption(f"tick must be > 0 seconds, got {tick!r}")
    return seconds


def check_max_pending(max_pending: int | None) -> int | None:
    """Validate an optional ``max_pending`` bound."""
    if max_pending is None:
        return None
    return check_int(max_pending, "max_pending", minimum=1, none_ok=True)


class TimerBase:
    """Executor hand-off, ``schedule_after``, context manager: common to every timer.

    Subclasses implement ``schedule_at``, ``pending`` and ``_stop_driver``.
    ``_in_flight`` counts handles taken from the structure but not yet given to
    the executor (guarded by the subclass's lock); tests use it to know the
    driver has finished a step.
    """

    _clock: Clock
    _closed: bool
    _in_flight: int

    def __init__(
        self,
        *,
        clock: Clock,
        executor: Executor | None,
        on_error: ErrorHandler | None,
        name: str,
    ) -> None:
        self._clock = clock
        self._owns_executor = executor is None
        self._executor: Executor = (
            executor
            if executor is not None
            else ThreadPoolExecutor(max_workers=DEFAULT_WORKERS, thread_name_prefix=name)
        )
        self._on_error: ErrorHandler = on_error if on_error is not None else _log_error
        self._closed = False
        self._in_flight = 0
        self._stop_lock = threading.Lock()

    # -- scheduling ----------------------------------------------------------
    def schedule_at(
        self, deadline: float, fn: Callable[..., object], /, *args: Any
    ) -> TimerHandle:  # pragma: no cover - abstract
        raise NotImplementedError

    def schedule_after(self, delay: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` ``delay`` seconds from now; a negative delay means now."""
        seconds = check_seconds(delay, "delay")
        return self.schedule_at(self._clock.monotonic() + seconds, fn, *args)

    @property
    def closed(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._closed

    # -- firing ----------------------------------------------------------------
    def _run(self, handle: TimerHandle) -> None:
        """Run one callback on an executor thread; an exception goes to ``on_error``."""
        _local.timer = self
        try:
            handle._run()
        except Exception as exc:
            self._report(handle, exc)
        finally:
            _local.timer = None

    def _run_chunk(self, chunk: list[TimerHandle]) -> None:
        """Run several callbacks in order on one executor thread, each as :meth:`_run` does."""
        _local.timer = self
        try:
            for handle in chunk:
                call = handle._call  # TimerHandle._run inlined: a frame less per callback
                try:
                    if call.__class__ is tuple:
                        call[0](*call[1:])
                    else:
                        call()
                except Exception as exc:
                    self._report(handle, exc)
        finally:
            _local.timer = None

    def _report(self, handle: TimerHandle, exc: Exception) -> None:
        try:
            self._on_error(handle, exc)
        except Exception:
            log.exception("timer on_error handler raised")

    def _dispatch(self, due: list[TimerHandle]) -> None:
        """Hand due handles to the executor (called without the lock held).

        A handful goes one callback per task. More are handed over in up to
        ``DEFAULT_WORKERS`` chunks of at most ``_CHUNK`` callbacks each, in
        deadline order: a task per callback costs the driver and the pool
        more than most callbacks do (a Future, a queue hand-off and a thread
        wake-up each), and at thousands of timers per second that overhead,
        not the callbacks, is what made timers late. A callback that blocks
        delays only the rest of its chunk, never the driver.
        """
        submit = self._executor.submit
        n = len(due)
        if n <= DEFAULT_WORKERS:
            run = self._run
            for handle in due:
                try:
                    submit(run, handle)
                except RuntimeError as exc:  # the executor was shut down under us
                    log.error("cannot run %r: executor refused it (%s)", handle, exc)
            return
        size = min(_CHUNK, -(-n // DEFAULT_WORKERS))
        run_chunk = self._run_chunk
        for start in range(0, n, size):
            chunk = due[start : start + size]
            try:
                submit(run_chunk, chunk)
            except RuntimeError as exc:
                log.error("cannot run %d callbacks: executor refused them (%s)", len(chunk), exc)

    # -- stopping ----------------------------------------------------------------
    def _stop_driver(self) -> list[TimerHandle]:  # pragma: no cover - abstract
        raise NotImplementedError

    def stop(self, *, wait: bool = True) -> list[TimerHandle]:
        """Stop firing; return the handles that never fired, in deadline order.

        Returned handles are marked dropped (``cancel()`` on them returns
        False). Callbacks already handed to the executor still run; with
        ``wait`` and a pool the timer created itself, this waits for them
        (except when called from one of those callbacks). Idempotent.
        """
        with self._stop_lock:
            if self._closed:
                return []
            dropped = self._stop_driver()
            for handle in dropped:
                handle._link = DROPPED
            dropped.sort(key=_deadline_key)
        if self._owns_executor:
            inside = getattr(_local, "timer", None) is self
            self._executor.shutdown(wait=wait and not inside)
        return dropped

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _deadline_key(handle: TimerHandle) -> float:
    return handle._deadline


class WheelCore(Protocol):
    """What :class:`WheelTimer` needs from a pure wheel core.

    The driver protocol: the core's ``schedule_at`` / ``_schedule_after``
    and its handles' ``cancel`` take the lock the driver gives it with
    ``_attach`` (with the condition to notify and the clock that
    ``_schedule_after`` reads); the driver calls everything else under that
    lock. When ``advance`` has
    nothing due, the driver gives the core a bounded step of early work
    (``cascade_early``) before it sleeps. Before sleeping, it sets
    ``_sleep_tick`` to the tick it sleeps until (``_next_tick()``, or inf); a
    schedule whose bucket expires earlier (or that creates early work sooner)
    resets it to -inf and notifies ``_cond``. While the driver is awake ``_sleep_tick`` is -inf, so
    schedules do not notify at all. ``_close()`` makes ``schedule_at`` raise
    :class:`~delayq.errors.QueueClosed`.
    """

    _closed: bool
    _sleep_tick: float
    _ticks: _Ticks

    def _attach(
        self, lock: threading.Lock, cond: threading.Condition, monotonic: Callable[[], float]
    ) -> None: ...

    def schedule_at(
        self, deadline: float, fn: Callable[..., object], /, *args: Any
    ) -> TimerHandle: ...

    def _schedule_after(
        self, delay: float, fn: Callable[..., object], /, *args: Any
    ) -> TimerHandle: ...

    def _next_tick(self) -> int | None: ...

    def _close(self) -> None: ...

    def cascade_early(self, max_tasks: int = ...) -> int: ...

    def advance(self, now: float) -> list[TimerHandle]: ...

    def clear(self) -> list[TimerHandle]: ...

    def __len__(self) -> int: ...


class WheelTimer(TimerBase):
    """A driver thread around a pure wheel core.

    Lock rule: ``_lock`` guards the core (including its ``_sleep_tick`` and
    ``_closed``), ``_closed`` and ``_in_flight``; ``_cond`` is the condition
    on it that the driver sleeps on. The core's ``schedule_at`` and its
    handles' ``cancel`` take the same lock (the core is given it as
    ``_lock``, and ``_cond`` to wake the driver). The driver holds the lock
    only while it calls the core, never while it hands callbacks to the
    executor.

    ``schedule_at`` and ``schedule_after`` are the core's own bound methods
    (assigned per instance): a schedule is then one Python call, validation,
    clock read and locking included.
    """

    def __init__(
        self,
        core: WheelCore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        executor: Executor | None = None,
        on_error: ErrorHandler | None = None,
        name: str,
    ) -> None:
        super().__init__(clock=clock, executor=executor, on_error=on_error, name=name)
        # ``with self._lock`` (a C lock) is cheaper than ``with self._cond``.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._core = core
        core._attach(self._lock, self._cond, clock.monotonic)
        # The hot paths: the core's own bound methods, one Python frame per call.
        self.schedule_at = core.schedule_at  # type: ignore[method-assign]
        self.schedule_after = core._schedule_after  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def schedule_at(self, deadline: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` at or after monotonic ``deadline`` (in the past: now).

        (Each instance binds this name to its core's ``schedule_at``, which
        does the same; this definition documents it and serves class-level calls.)
        """
        return self._core.schedule_at(deadline, fn, *args)

    def schedule_after(self, delay: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` ``delay`` seconds from now; a negative delay means now.

        (Bound per instance to the core's ``_schedule_after``, like ``schedule_at``.)
        """
        return self._core._schedule_after(delay, fn, *args)

    def pending(self) -> int:
        """How many callbacks wait for their deadline."""
        return len(self._core)

    def _loop(self) -> None:
        cond = self._cond
        core = self._core
        clock = self._clock
        monotonic = clock.monotonic
        wait_until = clock.wait_until
        boundary = core._ticks.boundary
        cascade_early = core.cascade_early
        while True:
            with cond:
                while True:
                    if self._closed:
                        return
                    due = core.advance(monotonic())
                    if due:
                        self._in_flight += len(due)
                        break
                    if cascade_early(_EARLY_STEP):
                        break  # one bounded step; others may take the lock in between
                    tick = core._next_tick()
                    if tick is None:
                        core._sleep_tick = _INF
                        wait_until(cond, None)
                    else:
                        core._sleep_tick = tick
                        # An absolute deadline: time that passes between
                        # reading the clock and waiting cannot make it late.
                        wait_until(cond, boundary(tick))
                    core._sleep_tick = -_INF  # awake: schedules need not notify
            if not due:
                continue
            try:
                self._dispatch(due)
            finally:
                with cond:
                    self._in_flight -= len(due)

    def _stop_driver(self) -> list[TimerHandle]:
        with self._cond:
            self._closed = True
            self._core._close()
            self._cond.notify_all()
            dropped = self._core.clear()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        return dropped
