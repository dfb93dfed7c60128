"""The one interface of delayq's in-process timers, and the handle they return.

Three timers implement :class:`Timer`, so a user picks a data structure by
name and nothing else changes:

* :class:`~delayq.timers.hashed_wheel.HashedWheelTimer`: a ring of N slots
  turned one tick at a time (Netty's design), O(1) schedule and cancel.
* :class:`~delayq.timers.timing_wheel.TimingWheel`: Kafka's hierarchical
  wheel (``SystemTimer``), O(1) schedule and cancel, any delay, 1 ms ticks.
* :class:`~delayq.timers.heap_timer.DelayQueueTimer`: a binary heap
  (:class:`~delayq.timers.delay_queue.DelayQueue`), exact deadlines,
  O(log n) schedule.

Rules every implementation follows:

* Deadlines are monotonic seconds (``clock.monotonic()``). A callback never
  runs before its deadline; a wheel runs it at the first tick boundary at or
  after it, so it may be up to one tick late.
* Callbacks run on an executor (a small thread pool by default), never on the
  timer's own thread and never under its lock. A callback that raises is
  logged and does not stop the timer. When more than a handful fall due at
  once they are handed over in chunks of up to 32, run in order on one
  executor thread each: a callback that blocks delays the rest of its chunk
  (give blocking work its own executor), never the timer.
* ``schedule_*`` and ``cancel`` are O(1) on the wheels.

:class:`TimerHandle` is both what the user holds and what the wheels keep in
their buckets (flat lists), so a pending timer costs one small object with
``__slots__`` and a list slot: no per-timer closure, dict or linked node.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from delayq.errors import ConfigurationError

__all__ = ["Timer", "TimerHandle", "WheelHandle"]


class _Link(Protocol):
    """Where a handle lives: the structure that can cancel it, or a final state."""

    def _cancel(self, handle: TimerHandle) -> bool: ...


class _Final:
    """A handle's final state; cancelling from it is a no-op that returns False."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _cancel(self, handle: TimerHandle) -> bool:
        return False

    def __repr__(self) -> str:
        return self.name


EXPIRED: _Link = _Final("expired")
"""The handle was due and handed to the executor (its callback ran or will run)."""
CANCELLED: _Link = _Final("cancelled")
"""``cancel()`` removed the handle before it was due."""
DROPPED: _Link = _Final("dropped")
"""The timer was stopped while the handle was pending; it never fires."""


class TimerHandle:
    """A scheduled callback: its deadline, and ``cancel()``.

    Returned by :meth:`Timer.schedule_at` / :meth:`Timer.schedule_after`.
    ``_call`` is the callback, or ``(callback, *args)`` when there are
    arguments (one slot for both: 8 bytes less per pending timer; an exact
    tuple is never callable, so the two cannot be confused).
    ``_link`` is what the handle belongs to while pending (the wheel's
    :class:`_Owner`, or the heap timer), then one of the final states
    ``expired``, ``cancelled`` or ``dropped``. ``_n`` is a per-structure
    small integer (the hashed wheel's remaining rounds, the hierarchical
    wheel's level at scheduling time, which orders ties FIFO).

    A handle references its callback, its arguments and its owner, never
    another handle: a wheel's bucket is a flat list of handles, so a pending
    timer costs one small object and a list slot, and nothing forms a cycle
    that only the garbage collector could free.
    """

    __slots__ = ("_call", "_deadline", "_link", "_n")

    # Timers create handles with ``TimerHandle()`` and assign the slots: a
    # class without ``__init__`` is created in C, about 70 ns less per
    # schedule than a Python ``__init__`` frame.
    _deadline: float
    _call: Any  # Callable[..., object] | tuple[Callable[..., object], *args]
    _link: Any  # a _Link or an _Owner; Any so that identity checks do not narrow it
    _n: int

    @property
    def deadline(self) -> float:
        """Monotonic time (seconds) at or after which the callback runs."""
        return self._deadline

    @property
    def callback(self) -> Callable[..., object]:
        """The function that runs when the timer fires."""
        call = self._call
        fn: Callable[..., object] = call[0] if call.__class__ is tuple else call
        return fn

    @property
    def args(self) -> tuple[Any, ...]:
        """Positional arguments passed to :attr:`callback`."""
        call = self._call
        return call[1:] if call.__class__ is tuple else ()

    def cancel(self) -> bool:
        """Stop the callback from running; True if this call cancelled it.

        False when it had already fired (been handed to the executor), was
        already cancelled, or was dropped by ``stop()``. O(1) on the wheels.
        """
        link: _Link = self._link
        return link._cancel(self)

    @property
    def pending(self) -> bool:
        """True while the handle waits for its deadline."""
        return not isinstance(self._link, _Final)

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` removed it."""
        return self._link is CANCELLED

    @property
    def expired(self) -> bool:
        """True once it was due and handed to the executor."""
        return self._link is EXPIRED

    def _run(self) -> None:
        call = self._call
        if call.__class__ is tuple:
            call[0](*call[1:])
        else:
            call()

    def __repr__(self) -> str:
        state = "pending" if self.pending else repr(self._link)
        fn = self.callback
        name = getattr(fn, "__qualname__", repr(fn))
        return f"<TimerHandle {name} deadline={self._deadline:.6f} {state}>"


COMPACT_MIN = 4096
"""Cancelled handles a wheel keeps in its buckets before it may compact them."""


class _Owner:
    """What a wheel's pending handles point to: its lock and cancel count, not the wheel.

    Cancellation is lazy: ``cancel()`` marks the handle cancelled and counts
    it in ``dead``; the handle stays in its bucket until the wheel passes it
    (and drops it) or compacts. The wheel compacts every bucket in ``advance``
    once ``dead`` reaches :data:`COMPACT_MIN` and outnumbers the pending
    handles (amortised O(1) per cancel: dead handles never hold more memory
    than live ones for long); a cancel that brings ``dead`` to a power of two
    from there wakes the driver (``cond``) so that a sleeping wheel compacts
    too. Guarded by ``lock``.
    """

    __slots__ = ("cond", "dead", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond: threading.Condition | None = None
        self.dead = 0

    def _cancel(self, handle: TimerHandle) -> bool:
        return WheelHandle.cancel(handle)  # type: ignore[arg-type]  # only wheel handles link here


class WheelHandle(TimerHandle):
    """A handle of a wheel: cancel is one frame, O(1), and lazy (see :class:`_Owner`).

    A final state never changes again, so it is safe to test before taking
    the lock.
    """

    __slots__ = ()

    def cancel(self) -> bool:
        """Stop the callback from running; True if this call cancelled it."""
        owner = self._link
        if owner.__class__ is not _Owner:
            return False
        lock = owner.lock
        lock.acquire()  # in try/finally: cheaper than ``with``
        try:
            if self._link is not owner:  # expired or dropped meanwhile
                return False
            self._link = CANCELLED
            dead = owner.dead + 1
            owner.dead = dead
            if dead >= COMPACT_MIN and not dead & (dead - 1):
                cond = owner.cond
                if cond is not None:
                    cond.notify()  # the driver's next advance may compact
            return True
        finally:
            lock.release()


@runtime_checkable
class Timer(Protocol):
    """Run a callback later, once, in this process.

    ``schedule_at`` takes a monotonic deadline (``clock.monotonic()`` seconds);
    ``schedule_after`` is ``schedule_at(clock.monotonic() + delay)``. Both
    validate the time (:class:`~delayq.errors.InvalidDelay` for NaN, inf,
    bool, str), treat a time in the past as "due now", and raise
    :class:`~delayq.errors.QueueClosed` after :meth:`stop`.
    """

    def schedule_at(self, deadline: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` at or after monotonic time ``deadline``."""
        ...

    def schedule_after(self, delay: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Run ``fn(*args)`` ``delay`` seconds from now (negative: now)."""
        ...

    def pending(self) -> int:
        """How many callbacks wait for their deadline (not cancelled, not fired)."""
        ...

    def stop(self, *, wait: bool = True) -> list[TimerHandle]:
        """Stop the timer; return the handles that never fired, in deadline order.

        With ``wait``, also wait for callbacks already handed to a thread pool
        the timer owns. Idempotent: a second call returns ``[]``.
        """
        ...

    @property
    def closed(self) -> bool:
        """True once :meth:`stop` was called."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def _no_clock() -> float:
    """A pure wheel core's clock: it has none (only a driver schedules relative times)."""
    raise ConfigurationError("a pure wheel core has no clock; use schedule_at")


class _Ticks:
    """Maps monotonic times to integer tick numbers counted from ``start``.

    ``boundary(n) = start + n * tick``. A deadline's tick is the first boundary
    at or after it (so a wheel never fires early); ``now``'s tick is the last
    boundary at or before it. Both are corrected by one step against the exact
    float boundary, so ``due(deadline) <= current(now)`` implies
    ``deadline <= now`` despite rounding.
    """

    __slots__ = ("start", "tick")

    def __init__(self, start: float, tick: float) -> None:
        self.start = start
        self.tick = tick

    def boundary(self, n: int) -> float:
        return self.start + n * self.tick

    def due(self, deadline: float) -> int:
        start, tick = self.start, self.tick
        n = math.ceil((deadline - start) / tick)
        if start + n * tick < deadline:
            n += 1
        elif start + (n - 1) * tick >= deadline:
            n -= 1
        return n

    def current(self, now: float) -> int:
        start, tick = self.start, self.tick
        n = math.floor((now - start) / tick)
        if start + n * tick > now:
            n -= 1
        elif start + (n + 1) * tick <= now:
            n += 1
        return n
