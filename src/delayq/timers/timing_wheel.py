"""Kafka's hierarchical timing wheel (``SystemTimer`` + ``TimingWheel``, seed 001).

Level 0 has ``wheel_size`` buckets of one tick each (1 ms x 20 by default, so
it spans 20 ms). When a deadline is beyond a level's span, the task goes to
the level above, whose buckets are as wide as the whole level below (20 ms,
then 400 ms, 8 s, 160 s, ...). Upper levels are created lazily, on the first
task that needs them, so a timer due in years costs a handful of levels, and
memory is proportional to the pending tasks, not to the span.

Each bucket is a flat list of handles (O(1) add; cancel is O(1) and lazy,
the handle is dropped when its bucket is processed). A bucket of level ``k``
expires at its start; its tasks are then re-inserted from level 0
upwards and land in a finer level (or fire, if their tick has come), which is
why every task finally fires from level 0, at the first 1 ms boundary at or
after its deadline.

Kafka keeps the non-empty buckets in a ``java.util.concurrent.DelayQueue``
ordered by expiration, and its reaper thread blocks on that queue, so the
clock never advances through empty ticks. In the pure core,
:class:`HierarchicalWheel`, a binary heap of buckets plays that role
(``next_expiration()`` is its head), and :class:`TimingWheel`'s driver thread
sleeps on the clock until that head. A bucket is in the heap at most once per
expiration, so the heap holds at most one entry per bucket.

Times inside the core are integer ticks counted from ``start``: a task's tick
is the first boundary at or after its deadline (it never fires early), and
``advance(now)`` processes every bucket whose expiration is ``<= now``.

This module is long on purpose: the core's schedule path is written out twice
(``schedule_at`` and the timer's ``schedule_after``, generated from it by
:mod:`delayq.timers._gen_hotpaths`) so that each call is one Python frame, and
the core, its levels and buckets, and the thin timer around them change
together.
"""

from __future__ import annotations

import heapq
import math
import sys
import threading
from bisect import bisect_right as _bisect
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

__all__ = ["HierarchicalWheel", "TimingWheel"]

_INF = math.inf
_ceil = math.ceil
_NO_LIMIT = sys.maxsize


class _Bucket(list[TimerHandle]):
    """One bucket: a flat list of handles, and its expiration tick (-1: not queued).

    When an upper-level bucket grows to its level's ``early_at`` handles it
    is big enough to be cascaded ahead of its expiration. Cancelled handles
    stay in the list until the bucket is processed or the wheel compacts
    (see :class:`~delayq.timers.base._Owner`).
    """

    __slots__ = ("expiration", "level")

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.expiration = -1


class _Level:
    """One wheel of the hierarchy.

    ``unit`` ticks per bucket (``wheel_size ** index``), ``span`` ticks per
    turn (``unit * wheel_size``: a task goes to the finest level whose span
    from ``current`` covers it), ``current`` is the core's current tick
    rounded down to ``unit``.

    The ring has ``size = 2 * wheel_size`` buckets, bucket ``id`` (covering
    ticks ``[id * unit, (id + 1) * unit)``) at ``buckets[id % size]``. The
    first ``wheel_size`` ids from ``current`` take new tasks; the next
    ``wheel_size`` take the tasks of the level above's next bucket when it
    is cascaded ahead of its expiration (see
    :meth:`HierarchicalWheel.cascade_early`), so both fit without sharing a
    bucket.
    """

    __slots__ = ("buckets", "current", "early_at", "index", "size", "span", "unit")

    def __init__(
        self, index: int, unit: int, wheel_size: int, current: int, early_min: int
    ) -> None:
        self.index = index
        # A bucket holding this many handles is cascaded early (-1: never; level 0 never).
        self.early_at = early_min if index > 0 else -1
        self.unit = unit
        self.size = 2 * wheel_size
        self.span = unit * wheel_size
        self.current = current - current % unit
        self.buckets = [_Bucket(index) for _ in range(self.size)]


DEFAULT_EARLY_CASCADE = 256
"""Upper-level buckets that receive this many tasks are cascaded ahead of expiry."""


def _check_early_cascade(value: int | None) -> int:
    if value is None:
        return -1
    return check_int(value, "early_cascade", minimum=1, none_ok=True)


def _order_key(handle: TimerHandle) -> tuple[float, int]:
    # Ties FIFO without a sequence number: of two tasks with the same
    # deadline, the one scheduled first went to the same or a higher level
    # (levels only get finer as time passes), and within one bucket handles
    # keep their order through every cascade.
    return (handle._deadline, -handle._n)


class HierarchicalWheel:
    """The pure hierarchical wheel: schedule, cancel, ``advance(now)``; no thread, no clock.

    ``tick`` seconds per level-0 bucket, ``wheel_size`` buckets per level,
    ``start`` is the monotonic time of tick 0. ``schedule_at`` and ``cancel``
    are O(1) (plus O(log b) to queue a bucket that was empty, b = buckets in
    use); ``advance`` touches only expired buckets, and each task is
    re-inserted at most once per level. ``cascade_early`` does part of that
    re-insertion ahead of time for upper-level buckets holding
    ``early_cascade`` tasks or more (None: never), in bounded steps.

    ``schedule_at`` and ``handle.cancel()`` take ``_lock``; ``advance``,
    ``cascade_early`` and ``clear`` do not, their caller holds it. :class:`TimingWheel` replaces
    ``_lock`` with its driver's lock (and sets ``_cond``, to wake the driver
    when a schedule needs an earlier wake-up, and ``_closed`` on stop).
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_current",
        "_early",
        "_early_lead",
        "_early_min",
        "_heap",
        "_held",
        "_levels",
        "_limit",
        "_limits",
        "_lock",
        "_max_pending",
        "_monotonic",
        "_overdue",
        "_owner",
        "_pushes",
        "_ring",
        "_size",
        "_sleep_tick",
        "_start",
        "_tick",
        "_ticks",
    )

    def __init__(
        self,
        *,
        tick: float = 0.001,
        wheel_size: int = 20,
        start: float = 0.0,
        max_pending: int | None = None,
        early_cascade: int | None = DEFAULT_EARLY_CASCADE,
    ) -> None:
        seconds = check_tick(tick)
        check_int(wheel_size, "wheel_size", minimum=2)
        self._ticks = _Ticks(check_seconds(start, "start"), seconds)
        self._size = wheel_size
        self._current = 0
        self._early_min = _check_early_cascade(early_cascade)
        self._levels = [_Level(0, 1, wheel_size, 0, self._early_min)]
        # limits[i] = levels[i].current + levels[i].span: a task due before it fits
        # level i, so bisect finds the finest level for a tick in one C call.
        self._limits = [self._levels[0].current + self._levels[0].span]
        self._ring = 2 * wheel_size  # buckets per level
        # (expiration tick, push number, bucket): the non-empty buckets by expiration.
        self._heap: list[tuple[int, int, _Bucket]] = []
        self._pushes = 0
        # (tick, push number, bucket, expiration): big upper-level buckets by the
        # tick from which they may be cascaded early (their expiration - unit).
        self._early: list[tuple[int, int, _Bucket, int]] = []
        self._early_lead = wheel_size * wheel_size  # ticks
        self._overdue = _Bucket(-1)  # scheduled at or before the current tick: due now
        self._held = 0  # handles in the buckets: pending, or cancelled and not yet dropped
        self._start, self._tick = self._ticks.start, self._ticks.tick  # read by every schedule
        self._max_pending = check_max_pending(max_pending)
        self._limit = _NO_LIMIT if self._max_pending is None else self._max_pending
        # The lock, the pending and cancelled counts: what handles point to.
        # The lock guards schedule and cancel; a driver attaches its own,
        # under which it also calls advance() and clear().
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
        """Seconds per level-0 bucket."""
        return self._ticks.tick

    @property
    def wheel_size(self) -> int:
        """Buckets per level."""
        return self._size

    @property
    def start(self) -> float:
        """Monotonic time of tick 0."""
        return self._ticks.start

    @property
    def current_tick(self) -> int:
        """The last tick :meth:`advance` reached."""
        return self._current

    @property
    def levels(self) -> int:
        """How many levels exist (overflow levels are created on demand)."""
        return len(self._levels)

    def __len__(self) -> int:
        return self._held - self._owner.dead

    def pending(self) -> int:
        """How many handles wait (not fired, not cancelled)."""
        return self._held - self._owner.dead

    def level_of(self, handle: TimerHandle) -> int | None:
        """The level whose bucket holds ``handle`` (-1: due now), None if not pending.

        For inspection and tests: searches the buckets.
        """
        if handle._link is not self._owner:
            return None
        for bucket in (self._overdue, *(b for level in self._levels for b in level.buckets)):
            if any(h is handle for h in bucket):
                return bucket.level
        return None  # pragma: no cover - a pending handle is always in a bucket

    # -- scheduling -------------------------------------------------------------
    def schedule_at(self, deadline: float, fn: Callable[..., object], /, *args: Any) -> TimerHandle:
        """Add ``fn(*args)`` due at ``deadline``; a past deadline is due at the next advance.

        Thread-safe (takes ``_lock``). This is also the bound method a
        :class:`TimingWheel` exposes as its own ``schedule_at``, so the whole
        call, validation included, is one Python frame.
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
            if due > self._current:
                # _bucket_for inlined for the common case: a level that already exists.
                index = _bisect(self._limits, due)
                if index < len(self._limits):
                    handle._n = index
                    level = self._levels[index]
                    unit = level.unit
                    bucket_id = due // unit
                    bucket = level.buckets[bucket_id % self._ring]
                    expiration = bucket_id * unit
                    if bucket.expiration != expiration:
                        self._queue_bucket(bucket, expiration)
                    bucket.append(handle)
                    if len(bucket) == level.early_at:
                        self._queue_early(bucket)
                else:
                    bucket, expiration = self._bucket_for(due)
                    handle._n = bucket.level
                    bucket.append(handle)
                    if len(bucket) == self._levels[bucket.level].early_at:
                        self._queue_early(bucket)
            else:
                handle._n = -1
                self._overdue.append(handle)
                expiration = self._current
            self._held += 1
            if expiration < self._sleep_tick:  # only while a driver sleeps past it
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
            if due > self._current:
                # _bucket_for inlined for the common case: a level that already exists.
                index = _bisect(self._limits, due)
                if index < len(self._limits):
                    handle._n = index
                    level = self._levels[index]
                    unit = level.unit
                    bucket_id = due // unit
                    bucket = level.buckets[bucket_id % self._ring]
                    expiration = bucket_id * unit
                    if bucket.expiration != expiration:
                        self._queue_bucket(bucket, expiration)
                    bucket.append(handle)
                    if len(bucket) == level.early_at:
                        self._queue_early(bucket)
                else:
                    bucket, expiration = self._bucket_for(due)
                    handle._n = bucket.level
                    bucket.append(handle)
                    if len(bucket) == self._levels[bucket.level].early_at:
                        self._queue_early(bucket)
            else:
                handle._n = -1
                self._overdue.append(handle)
                expiration = self._current
            self._held += 1
            if expiration < self._sleep_tick:  # only while a driver sleeps past it
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

    def _queue_bucket(self, bucket: _Bucket, expiration: int) -> None:
        """Put a bucket that just became non-empty (for ``expiration``) on the heap."""
        bucket.expiration = expiration
        self._pushes += 1
        heapq.heappush(self._heap, (expiration, self._pushes, bucket))

    def _queue_early(self, bucket: _Bucket) -> None:
        """Note that ``bucket`` (upper level, just grown big) may be cascaded early.

        From one unit before its expiration it is the level's next bucket,
        and its tasks fit the level below (whose ring has room for them). It
        is cascaded from at most ``wheel_size**2`` ticks (one level-2 bucket,
        400 ms at the defaults) before it expires, not a whole unit of a high
        level (8 s at level 3): time enough to move it in steps, and work
        done neither long before it is needed nor twice for tasks that keep
        arriving in it.
        """
        expiration = bucket.expiration
        tick = expiration - min(self._levels[bucket.level].unit, self._early_lead)
        self._pushes += 1
        heapq.heappush(self._early, (tick, self._pushes, bucket, expiration))
        if tick < self._sleep_tick:  # a sleeping driver should start on it sooner
            self._sleep_tick = -_INF
            self._wake()

    def _bucket_for(self, due: int) -> tuple[_Bucket, int]:
        """The bucket for tick ``due`` (> current), queued, and its expiration.

        Walks up from level 0 and creates overflow levels as needed. The
        caller appends the handle, then queues the bucket for early cascade
        if that made it big (``len(bucket) == level.early_at``).
        """
        levels = self._levels
        level = levels[0]
        while due >= level.current + level.span:
            if level.index + 1 < len(levels):
                level = levels[level.index + 1]
            else:
                level = _Level(
                    level.index + 1, level.span, self._size, level.current, self._early_min
                )
                levels.append(level)
                self._limits.append(level.current + level.span)
        unit = level.unit
        bucket_id = due // unit
        bucket = level.buckets[bucket_id % level.size]
        expiration = bucket_id * unit
        if bucket.expiration != expiration:
            self._queue_bucket(bucket, expiration)
        return bucket, expiration

    def _place(self, handle: TimerHandle, due: int) -> None:
        """Add ``handle`` (due at tick ``due``) to the finest level that spans it."""
        if due <= self._current:
            self._overdue.append(handle)
            return
        bucket = self._bucket_for(due)[0]
        bucket.append(handle)
        if len(bucket) == self._levels[bucket.level].early_at:
            self._queue_early(bucket)

    # -- time ---------------------------------------------------------------------
    def next_expiration(self) -> float | None:
        """Monotonic time of the earliest non-empty bucket (None if there is none).

        Buckets emptied by cancellation are dropped from the head here, so a
        driver does not wake for them.
        """
        tick = self._next_expiring()
        return None if tick is None else self._ticks.boundary(tick)

    def next_early_cascade(self) -> float | None:
        """Monotonic time from which :meth:`cascade_early` has work (None: no big bucket)."""
        tick = self._next_early()
        return None if tick is None else self._ticks.boundary(tick)

    def _next_tick(self) -> int | None:
        """The driver's next wake-up: an expiration, or early cascade work."""
        tick = self._next_expiring()
        early = self._next_early()
        if early is None:
            return tick
        return early if tick is None or early < tick else tick

    def _next_early(self) -> int | None:
        early = self._early
        while early:
            tick, _, bucket, expiration = early[0]
            if bucket.expiration == expiration and self._has_live(bucket):
                return max(tick, self._current)
            heapq.heappop(early)
        return None

    def _next_expiring(self) -> int | None:
        if self._has_live(self._overdue):
            return self._current
        heap = self._heap
        while heap:
            expiration, _, bucket = heap[0]
            if bucket.expiration == expiration and self._has_live(bucket):
                return expiration
            heapq.heappop(heap)
            if bucket.expiration == expiration:
                bucket.expiration = -1
        return None

    def _has_live(self, bucket: _Bucket) -> bool:
        """True if ``bucket`` holds a pending handle; drops the cancelled ones before it."""
        owner = self._owner
        dead = 0
        for handle in bucket:
            if handle._link is owner:
                break
            dead += 1
        if dead:
            del bucket[:dead]
            owner.dead -= dead
            self._held -= dead
        return bool(bucket)

    def advance(self, now: float) -> list[TimerHandle]:
        """Expire every bucket due by ``now``; return the handles that fire.

        Tasks of expired upper-level buckets move down a level (or fire);
        returned handles are marked expired, in deadline order, ties in
        scheduling order.
        """
        owner = self._owner
        if owner.dead >= COMPACT_MIN and self._wants_compaction():
            self._compact()
        out: list[TimerHandle] = []
        fire = out.append
        dead = 0
        overdue = self._overdue
        if overdue:
            for handle in overdue:
                if handle._link is owner:
                    handle._link = EXPIRED
                    fire(handle)
                else:
                    dead += 1
            overdue.clear()
        target = self._ticks.current(now)
        heap = self._heap
        due_of = self._ticks.due
        place = self._place
        while heap and heap[0][0] <= target:
            expiration, _, bucket = heapq.heappop(heap)
            if bucket.expiration != expiration:
                continue  # stale entry (the bucket was pruned and reused)
            bucket.expiration = -1
            self._advance_clock(expiration)
            handles = bucket[:]
            bucket.clear()
            if bucket.level == 0:  # every task here is due at exactly this tick
                for handle in handles:
                    if handle._link is owner:
                        handle._link = EXPIRED
                        fire(handle)
                    else:
                        dead += 1
                continue
            for handle in handles:
                if handle._link is not owner:
                    dead += 1
                    continue
                due = due_of(handle._deadline)
                if due <= expiration:
                    handle._link = EXPIRED
                    fire(handle)
                else:
                    place(handle, due)
        self._advance_clock(target)
        self._held -= len(out) + dead
        owner.dead -= dead
        if len(out) > 1:
            out.sort(key=_order_key)
        return out

    def cascade_early(self, max_tasks: int = 256) -> int:
        """Move tasks of big upper-level buckets down one level before they expire.

        When a level-k bucket expires, all its tasks move down at once: with
        1 ms ticks a 400 ms level-2 bucket holds 8,000 tasks at 20,000 timers
        per second, several milliseconds of work during which nothing else
        fires. A driver calls this instead while it would otherwise sleep:
        once the current tick is within one bucket width (at most
        ``wheel_size**2`` ticks) of a big bucket's expiration
        (``early_cascade`` tasks or more), its tasks are moved to
        the buckets of the level below that they would reach at expiration
        (buckets are absolute ticks, and that level's ring has room for one
        more turn). At most ``max_tasks`` move per call, so the caller can
        fire what is due in between; returns how many moved (0: nothing to
        do before :meth:`next_early_cascade`). ``advance`` fires exactly the
        same tasks in deadline order whether or not this ran (tasks due at the
        same tick may come out in another order than they were scheduled).
        """
        early = self._early
        current = self._current
        due_of = self._ticks.due
        levels = self._levels
        owner = self._owner
        moved = 0
        while early and early[0][0] <= current and moved < max_tasks:
            _, _, bucket, expiration = early[0]
            if bucket.expiration != expiration or not bucket:
                heapq.heappop(early)
                continue
            lower = levels[bucket.level - 1]
            unit, size, ring = lower.unit, lower.size, lower.buckets
            taken = 0
            dead = 0
            for handle in bucket:
                if moved == max_tasks:
                    break
                taken += 1
                if handle._link is not owner:
                    dead += 1
                    continue
                bucket_id = due_of(handle._deadline) // unit
                target = ring[bucket_id % size]
                target_expiration = bucket_id * unit
                if target.expiration != target_expiration:
                    self._queue_bucket(target, target_expiration)
                target.append(handle)
                if len(target) == lower.early_at:
                    self._queue_early(target)
                moved += 1
            del bucket[:taken]  # the moved prefix
            owner.dead -= dead
            self._held -= dead
            if not bucket:  # it may grow big again before it expires, and be queued again
                heapq.heappop(early)
        return moved

    def _advance_clock(self, tick: int) -> None:
        if tick > self._current:
            self._current = tick
            limits = self._limits
            for level in self._levels:
                level.current = current = tick - tick % level.unit
                limits[level.index] = current + level.span

    def clear(self) -> list[TimerHandle]:
        """Remove every pending handle; return them (marked dropped) in deadline order."""
        owner = self._owner
        out: list[TimerHandle] = []
        buckets = [self._overdue]
        for level in self._levels:
            buckets.extend(level.buckets)
        for bucket in buckets:
            for handle in bucket:
                if handle._link is owner:
                    handle._link = DROPPED
                    out.append(handle)
            bucket.clear()
            bucket.expiration = -1
        self._heap.clear()
        self._early.clear()
        self._held = 0
        owner.dead = 0
        out.sort(key=_order_key)
        return out

    def _wants_compaction(self) -> bool:
        """True when cancelled handles outnumber pending ones (and there are enough)."""
        dead = self._owner.dead
        return dead >= COMPACT_MIN and dead > self._held - dead

    def _compact(self) -> None:
        """Drop every cancelled handle from the buckets (order kept)."""
        owner = self._owner
        self._held -= owner.dead
        for bucket in (self._overdue, *(b for level in self._levels for b in level.buckets)):
            if bucket:
                bucket[:] = [h for h in bucket if h._link is owner]
        owner.dead = 0

    def __repr__(self) -> str:
        return (
            f"<HierarchicalWheel tick={self.tick} wheel_size={self._size} levels={self.levels} "
            f"current_tick={self._current} pending={self.pending()}>"
        )


class TimingWheel(WheelTimer):
    """A :class:`~delayq.timers.base.Timer` on Kafka's hierarchical wheel.

    ``tick`` (1 ms) per level-0 bucket, ``wheel_size`` (20) buckets per level,
    overflow levels created on demand: any delay, up to years, O(1) schedule
    and cancel, memory proportional to the pending callbacks. A callback runs
    at the first tick boundary at or after its deadline (up to one tick late,
    never early), on ``executor`` (a small thread pool the timer owns by
    default). ``max_pending`` bounds the pending callbacks
    (:class:`~delayq.errors.QueueFull` beyond it).

    The driver thread sleeps until the earliest non-empty bucket (no empty
    ticks) and is woken when a schedule creates an earlier one. An upper-level
    bucket that holds ``early_cascade`` tasks or more is moved down a level
    ahead of its expiration, in steps of a few hundred tasks while the driver
    has nothing due (:meth:`HierarchicalWheel.cascade_early`), so its expiry
    does not hold up the timers due at that moment; ``None`` turns this off.
    """

    _core: HierarchicalWheel

    def __init__(
        self,
        *,
        tick: float = 0.001,
        wheel_size: int = 20,
        max_pending: int | None = None,
        early_cascade: int | None = DEFAULT_EARLY_CASCADE,
        clock: Clock = SYSTEM_CLOCK,
        executor: Executor | None = None,
        on_error: ErrorHandler | None = None,
    ) -> None:
        core = HierarchicalWheel(
            tick=tick,
            wheel_size=wheel_size,
            start=clock.monotonic(),
            max_pending=max_pending,
            early_cascade=early_cascade,
        )
        super().__init__(
            core, clock=clock, executor=executor, on_error=on_error, name="delayq-timing-wheel"
        )

    @property
    def tick(self) -> float:
        """Seconds per level-0 bucket."""
        return self._core.tick

    @property
    def wheel_size(self) -> int:
        """Buckets per level."""
        return self._core.wheel_size

    @property
    def levels(self) -> int:
        """How many levels exist so far."""
        with self._lock:
            return self._core.levels

    def __repr__(self) -> str:
        state = "stopped" if self._closed else "running"
        return (
            f"<TimingWheel {state} tick={self.tick} wheel_size={self.wheel_size} "
            f"levels={self._core.levels} pending={self.pending()}>"
        )
