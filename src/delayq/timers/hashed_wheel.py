"""The hashed timing wheel: a ring of N slots turned one tick at a time.

This is the ring of the seeds (and Netty's ``HashedWheelTimer``): ``N`` slots,
a tick duration, and every task in slot ``dueTick % N`` carrying the number of
rounds the pointer must still pass it before it fires::

    dueTick = first tick boundary at or after the deadline
            = ceil((deadline - t0) / tick)     (= currentTick + ceil(d / tick)
                                                 when scheduled on a boundary)
    slot    = dueTick % N
    rounds  = (dueTick - currentTick - 1) // N

Seed 000 writes ``rounds = dueTick / N - currentTick / N``: the number of
times the pointer wraps past slot 0. We count the visits to the task's own slot
instead (seed 004's "Cycle-Num", decremented each time the slot is visited):
both fire at the same tick, and ours needs no division at visit time.

Ticks are absolute: tick ``n`` ends at ``t0 + tick * n``, and the driver
sleeps until the next boundary rather than for a fixed ``tick``, so scheduling
error does not accumulate. The ticks are computed from the deadline, not from
"now + delay" rounded at the current tick, so a task never fires early; it
fires up to one tick late (the seed measured about 30 ms mean error with
50 ms ticks).

:class:`HashedWheel` is the pure core (``advance(now)``, no thread, no clock);
:class:`HashedWheelTimer` is the threaded :class:`~delayq.timers.base.Timer`.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from delayq._validate import check_seconds
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import InvalidOption, QueueClosed, QueueFull
from delayq.timers._driver import ErrorHandler, WheelTimer, check_max_pending, check_tick
from delayq.timers.base import DROPPED, EXPIRED, LinkedHandle, TimerHandle, _Node, _Ticks

__all__ = ["HashedWheel", "HashedWheelTimer"]

_INF = math.inf
_ceil = math.ceil
_NO_LIMIT = sys.maxsize


class _Slot(_Node):
    """The sentinel of one slot's circular list of handles (FIFO)."""

    __slots__ = ()

    def __init__(self) -> None:
        self._prev = self
        self._next = self


def _check_slots(slots: object, name: str = "slots") -> int:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise InvalidOption(f"{name} must be an int >= 1, got {slots!r}")
    return slots


def _deadline_key(handle: TimerHandle) -> float:
    return handle._deadline


class HashedWheel:
    """The pure hashed wheel: schedule, cancel, ``advance(now)``; no thread, no clock.

    ``start`` is ``t0``, the monotonic time of tick 0. Tick ``n`` covers
    ``(t0 + tick*(n-1), t0 + tick*n]`` and ``advance(now)`` processes every
    tick whose boundary is ``<= now``. ``schedule_at`` and ``cancel`` are
    O(1); ``advance`` visits each passed slot once (or, after a gap longer
    than a turn, each slot once with the number of passes precomputed).

    ``schedule_at`` and ``handle.cancel()`` take ``_lock``; ``advance`` and
    ``clear`` do not, their caller holds it. :class:`HashedWheelTimer`
    replaces ``_lock`` with its driver's lock (and sets ``_cond``, to wake the
    driver when a schedule needs an earlier wake-up, and ``_closed`` on stop).
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_count",
        "_current",
        "_limit",
        "_lock",
        "_max_pending",
        "_overdue",
        "_sleep_tick",
        "_ticks",
        "_wheel",
    )

    def __init__(
        self,
        *,
        tick: float = 0.01,
        slots: int = 512,
        start: float = 0.0,
        max_pending: int | None = None,
    ) -> None:
        self._ticks = _Ticks(check_seconds(start, "start"), check_tick(tick))
        self._wheel = [_Slot() for _ in range(_check_slots(slots))]
        self._overdue = _Slot()  # scheduled at or before the current tick: due now
        self._current = 0
        self._count = 0
        self._max_pending = check_max_pending(max_pending)
        self._limit = _NO_LIMIT if self._max_pending is None else self._max_pending
        # Guards schedule and cancel; a driver replaces it with its own lock,
        # under which it also calls advance() and clear().
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None  # the driver's condition, to wake it
        self._closed = False  # set by the driver when its timer stops
        # The tick a driver sleeps until (inf: until notified; -inf: nobody sleeps).
        self._sleep_tick = -_INF

    # -- properties -----------------------------------------------------------
    @property
    def tick(self) -> float:
        """Seconds per tick."""
        return self._ticks.tick

    @property
    def slots(self) -> int:
        """Number of slots on the ring (N)."""
        return len(self._wheel)

    @property
    def start(self) -> float:
        """Monotonic time of tick 0 (t0)."""
        return self._ticks.start

    @property
    def current_tick(self) -> int:
        """The last tick processed by :meth:`advance`."""
        return self._current

    def __len__(self) -> int:
        return self._count

    def pending(self) -> int:
        """How many handles wait (not fired, not cancelled)."""
        return self._count

    # -- scheduling -------------------------------------------------------------
    def schedule_at(self, deadline: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Add ``fn(*args)`` due at ``deadline``; a past deadline is due at the next advance.

        Thread-safe (takes ``_lock``). This is also the bound method a
        :class:`HashedWheelTimer` exposes as its own ``schedule_at``, so the
        whole call, validation included, is one Python frame.
        """
        if not (deadline.__class__ is float and -_INF < deadline < _INF):
            deadline = check_seconds(deadline, "deadline")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        handle = LinkedHandle()
        handle._deadline = deadline
        handle._fn = fn
        handle._args = args
        ticks = self._ticks
        start, tick = ticks.start, ticks.tick
        due = _ceil((deadline - start) / tick)  # inlined _Ticks.due: the hot path
        if start + due * tick < deadline:
            due += 1
        elif start + (due - 1) * tick >= deadline:
            due -= 1
        # acquire/release in try/finally: about 80 ns cheaper than ``with``.
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise QueueClosed("cannot schedule on a stopped timer")
            if self._count >= self._limit:
                raise self._full()
            handle._link = self
            current = self._current
            if due <= current:
                slot = self._overdue
                handle._n = 0
                wake = current
            else:
                wheel = self._wheel
                size = len(wheel)
                handle._n = (due - current - 1) // size
                slot = wheel[due % size]
                wake = current + 1
            last = slot._prev
            handle._prev = last
            handle._next = slot
            last._next = handle
            slot._prev = handle
            self._count += 1
            if wake < self._sleep_tick:  # only while a driver sleeps past it
                self._sleep_tick = -_INF
                self._wake()
        finally:
            lock.release()
        return handle

    def _full(self) -> QueueFull:
        return QueueFull(
            f"the wheel holds max_pending={self._max_pending} pending timers; "
            "cancel some or create the timer with a larger max_pending"
        )

    def _wake(self) -> None:
        if self._cond is not None:
            self._cond.notify()

    def rounds_of(self, handle: TimerHandle) -> int:
        """How many more times the pointer passes ``handle``'s slot before it fires."""
        return handle._n

    def slot_of(self, handle: TimerHandle) -> int | None:
        """The slot holding ``handle`` (-1: due now), None if it is not pending here.

        For inspection and tests: walks the slot's list to its sentinel.
        """
        if handle._link is not self:
            return None
        node: _Node = handle._next
        while not isinstance(node, _Slot):
            node = node._next
        return -1 if node is self._overdue else self._wheel.index(node)

    def _cancel(self, handle: TimerHandle) -> bool:
        return LinkedHandle.cancel(handle)  # type: ignore[arg-type]  # handles are linked

    # -- time ---------------------------------------------------------------------
    def next_expiration(self) -> float | None:
        """When :meth:`advance` next has work: the next tick boundary, or None if empty.

        A hashed wheel cannot tell which slot holds the next due task without
        scanning, so it wakes on every tick while it holds tasks (the seeds'
        design); when empty it does not tick at all.
        """
        tick = self._next_tick()
        return None if tick is None else self._ticks.boundary(tick)

    def _next_tick(self) -> int | None:
        if self._overdue._next is not self._overdue:
            return self._current
        if self._count == 0:
            return None
        return self._current + 1

    def cascade_early(self, max_tasks: int = 256) -> int:
        """Nothing to do ahead of time on a single ring (the driver protocol); returns 0."""
        return 0

    def advance(self, now: float) -> list[TimerHandle]:
        """Process every tick whose boundary is ``<= now``; return the handles now due.

        Returned handles are marked expired (``cancel()`` returns False), in
        deadline order, ties in scheduling order. ``now`` earlier than the
        current tick is a no-op.
        """
        out: list[TimerHandle] = []
        overdue = self._overdue
        if overdue._next is not overdue:
            self._take_all(overdue, out)
        target = self._ticks.current(now)
        current = self._current
        if target > current:
            if self._count == 0:
                pass  # nothing to visit: jump
            elif target - current < len(self._wheel):
                wheel = self._wheel
                size = len(wheel)
                for tick in range(current + 1, target + 1):
                    slot = wheel[tick % size]
                    if slot._next is not slot:
                        self._visit(slot, 1, out)
            else:
                self._visit_all(current, target, out)
            self._current = target
        if len(out) > 1:
            out.sort(key=_deadline_key)
        return out

    def _take_all(self, slot: _Slot, out: list[TimerHandle]) -> None:
        node: Any = slot._next
        while node is not slot:
            node._link = EXPIRED
            out.append(node)
            node = node._next
        slot._next = slot._prev = slot
        self._count -= len(out)

    def _visit(self, slot: _Slot, passes: int, out: list[TimerHandle]) -> None:
        """The pointer passes ``slot`` ``passes`` times: fire tasks with fewer rounds left."""
        node: Any = slot._next
        fired = 0
        while node is not slot:
            nxt = node._next
            if node._n < passes:
                prev = node._prev
                prev._next = nxt
                nxt._prev = prev
                node._link = EXPIRED
                out.append(node)
                fired += 1
            else:
                node._n -= passes
            node = nxt
        self._count -= fired

    def _visit_all(self, current: int, target: int, out: list[TimerHandle]) -> None:
        """A gap of at least one full turn: visit each slot once with its pass count."""
        wheel = self._wheel
        size = len(wheel)
        for index, slot in enumerate(wheel):
            if slot._next is slot:
                continue
            first = current + 1 + (index - current - 1) % size  # first tick > current here
            passes = (target - first) // size + 1
            self._visit(slot, passes, out)

    def clear(self) -> list[TimerHandle]:
        """Remove every pending handle; return them (marked dropped) in deadline order."""
        out: list[TimerHandle] = []
        for slot in (self._overdue, *self._wheel):
            node: Any = slot._next
            while node is not slot:
                node._link = DROPPED
                out.append(node)
                node = node._next
            slot._next = slot._prev = slot
        self._count = 0
        out.sort(key=_deadline_key)
        return out

    def __repr__(self) -> str:
        return (
            f"<HashedWheel tick={self.tick} slots={self.slots} "
            f"current_tick={self._current} pending={self._count}>"
        )


class HashedWheelTimer(WheelTimer):
    """A :class:`~delayq.timers.base.Timer` on a hashed wheel (seed 000/004, Netty).

    ``tick`` seconds per slot, ``slots`` slots per turn: a callback runs at
    the first tick boundary at or after its deadline, so up to ``tick`` late,
    never early. Any delay works (long ones go round several times).
    ``max_pending`` bounds the number of pending callbacks
    (:class:`~delayq.errors.QueueFull` beyond it). Callbacks run on
    ``executor`` (a small thread pool the timer owns by default).

    The driver thread sleeps until the next absolute tick boundary
    ``t0 + tick*(n+1)`` while tasks are pending, and not at all while the
    wheel is empty.
    """

    _core: HashedWheel

    def __init__(
        self,
        *,
        tick: float = 0.01,
        slots: int = 512,
        max_pending: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        executor: Executor | None = None,
        on_error: ErrorHandler | None = None,
    ) -> None:
        core = HashedWheel(tick=tick, slots=slots, start=clock.monotonic(), max_pending=max_pending)
        super().__init__(
            core, clock=clock, executor=executor, on_error=on_error, name="delayq-hashed-wheel"
        )

    @property
    def tick(self) -> float:
        """Seconds per tick."""
        return self._core.tick

    @property
    def slots(self) -> int:
        """Number of slots on the ring."""
        return self._core.slots

    def __repr__(self) -> str:
        state = "stopped" if self._closed else "running"
        return (
            f"<HashedWheelTimer {state} tick={self.tick} slots={self.slots} "
            f"pending={self.pending()}>"
        )
