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

This module is past 400 lines on purpose: the schedule path is written out
twice (``schedule_at`` and the timer's ``schedule_after``, generated from it by
:mod:`delayq.timers._gen_hotpaths`) so that each call is one Python frame.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from delayq._validate import check_int, check_seconds
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import QueueClosed, QueueFull
from delayq.timers._driver import ErrorHandler, WheelTimer, check_max_pending, check_tick
from delayq.timers.base import (
    COMPACT_MIN,
    DROPPED,
    EXPIRED,
    TimerHandle,
    WheelHandle,
    _no_clock,
    _Owner,
    _Ticks,
)

__all__ = ["HashedWheel", "HashedWheelTimer"]

_INF = math.inf
_ceil = math.ceil
_NO_LIMIT = sys.maxsize


def _check_slots(slots: object, name: str = "slots") -> int:
    return check_int(slots, name, minimum=1)


def _deadline_key(handle: TimerHandle) -> float:
    return handle._deadline


class HashedWheel:
    """The pure hashed wheel: schedule, cancel, ``advance(now)``; no thread, no clock.

    ``start`` is ``t0``, the monotonic time of tick 0. Tick ``n`` covers
    ``(t0 + tick*(n-1), t0 + tick*n]`` and ``advance(now)`` processes every
    tick whose boundary is ``<= now``. ``schedule_at`` and ``cancel`` are
    O(1); ``advance`` visits each passed slot once (or, after a gap longer
    than a turn, each slot once with the number of passes precomputed).

    Each slot is a flat list of handles in scheduling order. Cancellation is
    lazy (see :class:`~delayq.timers.base._Owner`): a visit drops cancelled
    handles, so a slot is compacted at least once per turn.

    ``schedule_at`` and ``handle.cancel()`` take ``_lock``; ``advance`` and
    ``clear`` do not, their caller holds it. :class:`HashedWheelTimer`
    attaches its driver's lock and condition (:meth:`_attach`: a schedule
    that needs an earlier wake-up notifies it) and sets ``_closed`` on stop.
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_current",
        "_held",
        "_limit",
        "_lock",
        "_max_pending",
        "_monotonic",
        "_overdue",
        "_owner",
        "_size",
        "_sleep_tick",
        "_start",
        "_tick",
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
        self._start, self._tick = self._ticks.start, self._ticks.tick  # read by every schedule
        self._size = _check_slots(slots)
        self._wheel: list[list[TimerHandle]] = [[] for _ in range(self._size)]
        self._overdue: list[TimerHandle] = []  # scheduled at or before the current tick: due now
        self._current = 0
        self._held = 0  # handles in the slots: pending, or cancelled and not yet dropped
        self._max_pending = check_max_pending(max_pending)
        self._limit = _NO_LIMIT if self._max_pending is None else self._max_pending
        # The lock, the pending and cancelled counts: what handles point to.
        self._owner = _Owner()
        self._lock = self._owner.lock
        self._cond: threading.Condition | None = None  # the driver's condition, to wake it
        self._monotonic: Callable[[], float] = _no_clock  # the driver's clock
        self._closed = False  # set by the driver when its timer stops
        # The tick a driver sleeps until (inf: until notified; -inf: nobody sleeps).
        self._sleep_tick = -_INF

    def _attach(
        self, lock: threading.Lock, cond: threading.Condition, monotonic: Callable[[], float]
    ) -> None:
        """Use a driver's lock and clock, and notify its condition for earlier wake-ups."""
        self._lock = self._owner.lock = lock
        self._cond = self._owner.cond = cond
        self._monotonic = monotonic

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
        return self._held - self._owner.dead

    def pending(self) -> int:
        """How many handles wait (not fired, not cancelled)."""
        return self._held - self._owner.dead

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
        handle = WheelHandle()
        handle._deadline = deadline
        handle._call = (fn, *args) if args else fn
        start = self._start
        tick = self._tick
        due = _ceil((deadline - start) / tick)  # inlined _Ticks.due: the hot path
        if start + due * tick < deadline:
            due += 1
        elif start + (due - 1) * tick >= deadline:
            due -= 1
        # acquire/release in try/finally: about 80 ns cheaper than ``with``.
        lock = self._lock
        lock.acquire()
        try:
            if self._held >= self._limit:  # -1 once closed: one test for both
                self._refuse()
            handle._link = self._owner
            current = self._current
            if due > current:
                size = self._size
                handle._n = (due - current - 1) // size
                self._wheel[due % size].append(handle)
                self._held += 1
                if current + 1 < self._sleep_tick:  # only while a driver sleeps past the next tick
                    self._sleep_tick = -_INF
                    self._wake()
            else:
                handle._n = 0
                self._overdue.append(handle)
                self._held += 1
                if current < self._sleep_tick:
                    self._sleep_tick = -_INF
                    self._wake()
        finally:
            lock.release()
        return handle

    def _schedule_after(
        self, delay: float, fn: Callable[..., object], /, *args: Any
    ) -> TimerHandle:
        """One-frame ``schedule_at(monotonic() + delay, fn, *args)``: the timer's schedule_after.

        The body of :meth:`schedule_at` written out again (a call per schedule
        saved), generated from it. ``_monotonic`` is the driver's clock.
        """
        cls = delay.__class__
        if not ((cls is float and -_INF < delay < _INF) or cls is int):
            delay = check_seconds(delay, "delay")
        try:
            deadline = self._monotonic() + delay
        except OverflowError:  # an int past float's range: check_seconds says so
            deadline = self._monotonic() + check_seconds(delay, "delay")
        # BEGIN GENERATED from schedule_at (python -m delayq.timers._gen_hotpaths)
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        handle = WheelHandle()
        handle._deadline = deadline
        handle._call = (fn, *args) if args else fn
        start = self._start
        tick = self._tick
        due = _ceil((deadline - start) / tick)  # inlined _Ticks.due: the hot path
        if start + due * tick < deadline:
            due += 1
        elif start + (due - 1) * tick >= deadline:
            due -= 1
        # acquire/release in try/finally: about 80 ns cheaper than ``with``.
        lock = self._lock
        lock.acquire()
        try:
            if self._held >= self._limit:  # -1 once closed: one test for both
                self._refuse()
            handle._link = self._owner
            current = self._current
            if due > current:
                size = self._size
                handle._n = (due - current - 1) // size
                self._wheel[due % size].append(handle)
                self._held += 1
                if current + 1 < self._sleep_tick:  # only while a driver sleeps past the next tick
                    self._sleep_tick = -_INF
                    self._wake()
            else:
                handle._n = 0
                self._overdue.append(handle)
                self._held += 1
                if current < self._sleep_tick:
                    self._sleep_tick = -_INF
                    self._wake()
        finally:
            lock.release()
        return handle
        # END GENERATED

    def _refuse(self) -> None:
        """Raise why a schedule is refused: stopped, or ``max_pending`` reached.

        ``_held`` counts cancelled handles not yet dropped too, so a full
        count is checked again without them first (lock held).
        """
        if self._closed:
            raise QueueClosed("cannot schedule on a stopped timer")
        if self._held - self._owner.dead >= self._limit:
            raise QueueFull(
                f"the wheel holds max_pending={self._max_pending} pending timers; "
                "cancel some or create the timer with a larger max_pending"
            )
        self._compact()  # room once the cancelled ones are dropped

    def _close(self) -> None:
        """Refuse every later schedule (the driver's stop; lock held)."""
        self._closed = True
        self._limit = -1

    def _wake(self) -> None:
        if self._cond is not None:
            self._cond.notify()

    def rounds_of(self, handle: TimerHandle) -> int:
        """How many more times the pointer passes ``handle``'s slot before it fires."""
        return handle._n

    def slot_of(self, handle: TimerHandle) -> int | None:
        """The slot holding ``handle`` (-1: due now), None if it is not pending here.

        For inspection and tests: searches the slots.
        """
        if handle._link is not self._owner:
            return None
        if any(h is handle for h in self._overdue):
            return -1
        for index, slot in enumerate(self._wheel):
            if any(h is handle for h in slot):
                return index
        return None  # pragma: no cover - a pending handle is always in a slot

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
        if self._held == self._owner.dead:  # nothing pending
            return None
        return self._current if self._overdue else self._current + 1

    def cascade_early(self, max_tasks: int = 256) -> int:
        """Nothing to do ahead of time on a single ring (the driver protocol); returns 0."""
        return 0

    def advance(self, now: float) -> list[TimerHandle]:
        """Process every tick whose boundary is ``<= now``; return the handles now due.

        Returned handles are marked expired (``cancel()`` returns False), in
        deadline order, ties in scheduling order. ``now`` earlier than the
        current tick is a no-op.
        """
        if self._owner.dead >= COMPACT_MIN and self._wants_compaction():
            self._compact()
        out: list[TimerHandle] = []
        if self._overdue:
            overdue, self._overdue = self._overdue, []
            self._visit(overdue, 1 << 62, out)
        target = self._ticks.current(now)
        current = self._current
        if target > current:
            if self._held == self._owner.dead:
                pass  # nothing pending to visit: jump
            elif target - current < len(self._wheel):
                wheel = self._wheel
                size = len(wheel)
                visit = self._visit
                for tick in range(current + 1, target + 1):
                    index = tick % size
                    slot = wheel[index]
                    if slot:
                        wheel[index] = visit(slot, 1, out)
            else:
                self._visit_all(current, target, out)
            self._current = target
        if len(out) > 1:
            out.sort(key=_deadline_key)
        return out

    def _visit(
        self, slot: list[TimerHandle], passes: int, out: list[TimerHandle]
    ) -> list[TimerHandle]:
        """The pointer passes ``slot`` ``passes`` times: fire tasks with fewer rounds left.

        Returns the handles that stay (cancelled ones are dropped), in order.
        """
        owner = self._owner
        keep: list[TimerHandle] = []
        stay = keep.append
        fire = out.append
        fired = 0
        for handle in slot:
            if handle._link is not owner:
                continue  # cancelled: dropped here
            n = handle._n
            if n < passes:
                handle._link = EXPIRED
                fire(handle)
                fired += 1
            else:
                handle._n = n - passes
                stay(handle)
        dropped = len(slot) - fired - len(keep)
        owner.dead -= dropped
        self._held -= fired + dropped
        return keep

    def _visit_all(self, current: int, target: int, out: list[TimerHandle]) -> None:
        """A gap of at least one full turn: visit each slot once with its pass count."""
        wheel = self._wheel
        size = len(wheel)
        for index, slot in enumerate(wheel):
            if not slot:
                continue
            first = current + 1 + (index - current - 1) % size  # first tick > current here
            passes = (target - first) // size + 1
            wheel[index] = self._visit(slot, passes, out)

    def _wants_compaction(self) -> bool:
        """True when cancelled handles outnumber pending ones (and there are enough)."""
        dead = self._owner.dead
        return dead >= COMPACT_MIN and dead > self._held - dead

    def _compact(self) -> None:
        """Drop every cancelled handle from the slots (order kept)."""
        owner = self._owner
        self._held -= owner.dead
        wheel = self._wheel
        for index, slot in enumerate(wheel):
            if slot:
                wheel[index] = [h for h in slot if h._link is owner]
        self._overdue = [h for h in self._overdue if h._link is owner]
        owner.dead = 0

    def clear(self) -> list[TimerHandle]:
        """Remove every pending handle; return them (marked dropped) in deadline order."""
        owner = self._owner
        out: list[TimerHandle] = []
        for slot in (self._overdue, *self._wheel):
            for handle in slot:
                if handle._link is owner:
                    handle._link = DROPPED
                    out.append(handle)
            slot.clear()
        self._held = 0
        owner.dead = 0
        out.sort(key=_deadline_key)
        return out

    def __repr__(self) -> str:
        return (
            f"<HashedWheel tick={self.tick} slots={self.slots} "
            f"current_tick={self._current} pending={self.pending()}>"
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
