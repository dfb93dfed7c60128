"""Delay queues: a consumer gets an item only once its deadline has passed.

:class:`DelayQueue` follows ``java.util.concurrent.DelayQueue``: an unbounded
binary heap ordered by deadline, one lock, one condition, and the
leader/follower pattern. The first consumer that finds a not-yet-due head
becomes the *leader* and waits exactly until that deadline; every other
consumer waits untimed. When the leader leaves (with an item or because its
wait ended) it wakes one follower, which may become the next leader. A put
that creates a new, earlier head resets the leader and wakes one consumer, so
a waiting consumer learns at once about an earlier item. There is no polling
interval, no busy waiting and no thread per item.

:class:`~delayq.timers.async_delay_queue.AsyncDelayQueue` has the same
semantics for one asyncio event loop (its own module, sharing the entries).

Deadlines are **monotonic** seconds from the queue's clock
(``clock.monotonic()``). Items with equal deadlines come out in the order they
were put (FIFO). Delays given to :meth:`DelayQueue.put_after` are validated:
NaN, infinities, ``bool`` and strings raise :class:`~delayq.errors.InvalidDelay`
naming the value; a negative delay means "already due", as in Java.

Closing: after :meth:`DelayQueue.close` puts raise
:class:`~delayq.errors.QueueClosed`; consumers still receive items that are
already due, and instead of waiting for a future deadline they get
``QueueClosed`` (blocked consumers are woken at once). Items that are not yet
due stay in the queue for :meth:`DelayQueue.to_list` / :meth:`DelayQueue.clear`.
This mirrors ``queue.Queue.shutdown(immediate=False)`` in Python 3.13.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import threading
from collections.abc import Callable, Iterator, MutableSequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast, runtime_checkable

from delayq._validate import check_int, check_seconds
from delayq.clock import SYSTEM_CLOCK, Clock, SystemClock
from delayq.errors import QueueClosed

__all__ = ["DelayQueue", "Delayed", "DelayedItem"]

T = TypeVar("T")
V = TypeVar("V")

_INF = math.inf
_heappush = heapq.heappush
_heappop = heapq.heappop
_deadline_of: Callable[[object], float] = operator.attrgetter("deadline")

# A heap entry: (deadline, sequence number, item) for ``put(item)``, or
# (deadline, sequence number, value, None) for ``put_after`` / ``put_at``,
# whose DelayedItem is built again when it leaves the queue. Plain tuples
# compare in C; the sequence number breaks ties FIFO and keeps items
# themselves from ever being compared. Keeping no DelayedItem inside lets the
# garbage collector untrack an entry whose value is atomic (an int, a str):
# a tuple subclass is never untracked, and a queue of 200,000 tracked items
# spends more time in full collections than in the heap.
_Entry = tuple[float, int, T] | tuple[float, int, Any, None]


def _item(entry: _Entry[T]) -> T:
    """The item an entry stands for (a DelayedItem rebuilt from its fields)."""
    if len(entry) == 3:
        return entry[2]
    return cast(T, _new_item(DelayedItem, (entry[2], entry[0])))


@runtime_checkable
class Delayed(Protocol):
    """Anything with a monotonic ``deadline`` (seconds, the clock's ``monotonic()``)."""

    @property
    def deadline(self) -> float: ...


class DelayedItem(NamedTuple, Generic[T]):
    """A plain value paired with its monotonic deadline (immutable).

    Returned by :meth:`DelayQueue.put_after` / :meth:`DelayQueue.put_at` so the
    caller can :meth:`~DelayQueue.remove` it later. A named tuple rather than
    a frozen dataclass: the queues build it with ``tuple.__new__`` (one C
    call, no Python ``__init__`` frame), which is most of the cost of a
    ``put_after`` otherwise.
    """

    value: T
    deadline: float


_new_item = tuple.__new__


def _index_of(heap: list[_Entry[T]], item: T) -> int:
    """Index of the earliest entry holding ``item`` (identity first, then ``==``), or -1."""
    best = _index_of_identical(heap, item)
    if best < 0:
        for i, entry in enumerate(heap):
            if _item(entry) == item and (best < 0 or entry < heap[best]):
                best = i
    return best


def _index_of_identical(heap: list[_Entry[T]], item: T) -> int:
    best = -1
    for i, entry in enumerate(heap):
        if entry[2] is item and (best < 0 or entry < heap[best]):
            best = i
    return best


def _remove_at(heap: list[_Entry[T]], index: int) -> None:
    last = heap.pop()
    if index < len(heap):
        heap[index] = last
        heapq.heapify(heap)


def _check_max_items(max_items: int | None) -> int:
    if max_items is None:
        return -1
    return check_int(max_items, "max_items", minimum=0, none_ok=True)


def _sink_adder(sink: MutableSequence[T] | Callable[[T], object]) -> Callable[[T], object]:
    if callable(sink):
        return sink
    return sink.append


class DelayQueue(Generic[T]):
    """An unbounded, thread-safe queue whose items come out only when due.

    ``key(item)`` returns the item's monotonic deadline; by default the item's
    ``deadline`` attribute is read (see :class:`Delayed`). The deadline is read
    once, when the item is put.

    Lock rule: ``_lock`` guards ``_heap``, ``_leader``, ``_waiting`` (consumers
    inside a wait, so a notify nobody would receive is skipped) and ``_closed``.
    ``_available`` is the one condition on ``_lock``: consumers wait on it, and
    it is notified when a new head arrives, when a leader leaves, and on close.
    No user code runs under the lock: ``key`` runs before it is taken, a
    ``drain_to`` sink after it is released, and :meth:`remove` compares items
    with ``==`` on a snapshot.
    """

    __slots__ = (
        "_available",
        "_clock",
        "_closed",
        "_heap",
        "_key",
        "_leader",
        "_lock",
        "_monotonic",
        "_seq",
        "_wait",
        "_wait_until",
        "_waiting",
    )

    def __init__(
        self, *, clock: Clock = SYSTEM_CLOCK, key: Callable[[T], float] | None = None
    ) -> None:
        self._clock = clock
        self._monotonic = clock.monotonic
        # Timed waits: the system clock's wait is Condition.wait, called
        # directly with a relative timeout (a frame and a clock read less per
        # wait). Any other clock waits until the absolute deadline
        # (Clock.wait_until), so a FakeClock advanced between reading the time
        # and waiting cannot make a consumer oversleep. ``_wait_until`` is None
        # for the system clock.
        self._wait: Callable[[threading.Condition, float | None], bool] = (
            threading.Condition.wait if type(clock) is SystemClock else clock.wait
        )
        self._wait_until: Callable[[threading.Condition, float | None], bool] | None = (
            None if type(clock) is SystemClock else clock.wait_until
        )
        self._key: Callable[[T], float] = key if key is not None else _deadline_of
        self._lock = threading.Lock()
        self._waiting = 0
        self._available = threading.Condition(self._lock)
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()
        self._leader: int | None = None
        self._closed = False

    # -- producing ---------------------------------------------------------
    def put(self, item: T) -> None:
        """Add ``item``; it becomes available at ``key(item)``.

        Never blocks (the queue is unbounded). Raises
        :class:`~delayq.errors.QueueClosed` after :meth:`close`.
        """
        deadline = self._key(item)
        if not (deadline.__class__ is float and -_INF < deadline < _INF):
            deadline = check_seconds(deadline, "deadline")
        # _push inlined: this is the hot path (acquire/release in try/finally
        # costs less than ``with``).
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise QueueClosed("cannot put into a closed DelayQueue")
            heap = self._heap
            entry = (deadline, next(self._seq), item)
            _heappush(heap, entry)
            if heap[0] is entry:
                self._leader = None
                if self._waiting:
                    self._available.notify()
        finally:
            lock.release()

    def offer(self, item: T) -> bool:
        """Add ``item`` and return True (the queue is unbounded; Java's name)."""
        self.put(item)
        return True

    # put_after and put_at are the calls users make most: each is one Python
    # frame (validation, the item, the push inlined; the item built by
    # tuple.__new__), which is what puts them on par with a bare heapq loop.
    def put_after(self: DelayQueue[DelayedItem[V]], value: V, delay: float) -> DelayedItem[V]:
        """Put ``value`` due ``delay`` seconds from now; return the stored item.

        ``delay`` must be a finite real number (``InvalidDelay`` otherwise); a
        negative delay means the value is already due. The queue keeps the
        value and the deadline, not the returned object: ``take`` returns an
        equal :class:`DelayedItem` (a value object), and ``remove`` accepts it.
        """
        cls = delay.__class__
        if not ((cls is float and -_INF < delay < _INF) or cls is int):
            delay = check_seconds(delay, "delay")
        try:
            deadline = self._monotonic() + delay
        except OverflowError:  # an int past float's range: check_seconds says so
            deadline = self._monotonic() + check_seconds(delay, "delay")
        # BEGIN GENERATED from put_at (python -m delayq.timers._gen_hotpaths)
        item: DelayedItem[V] = _new_item(DelayedItem, (value, deadline))
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise QueueClosed("cannot put into a closed DelayQueue")
            heap = self._heap
            entry = (deadline, next(self._seq), value, None)
            _heappush(heap, entry)
            if heap[0] is entry:
                # A new head: whoever waits timed waits for the wrong deadline.
                self._leader = None
                if self._waiting:
                    self._available.notify()
        finally:
            lock.release()
        return item
        # END GENERATED

    def put_at(self: DelayQueue[DelayedItem[V]], value: V, deadline: float) -> DelayedItem[V]:
        """Put ``value`` due at monotonic time ``deadline``; return the stored item."""
        if not (deadline.__class__ is float and -_INF < deadline < _INF):
            deadline = check_seconds(deadline, "deadline")
        item: DelayedItem[V] = _new_item(DelayedItem, (value, deadline))
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise QueueClosed("cannot put into a closed DelayQueue")
            heap = self._heap
            entry = (deadline, next(self._seq), value, None)
            _heappush(heap, entry)
            if heap[0] is entry:
                # A new head: whoever waits timed waits for the wrong deadline.
                self._leader = None
                if self._waiting:
                    self._available.notify()
        finally:
            lock.release()
        return item

    # -- consuming ---------------------------------------------------------
    def take(self) -> T:
        """Remove and return the earliest item, waiting until it is due.

        Raises :class:`~delayq.errors.QueueClosed` once the queue is closed
        and no item is due (a consumer blocked here is woken by :meth:`close`).
        """
        # The fast path (a due head) is this frame alone; waiting is _wait_for_head's.
        lock = self._lock
        lock.acquire()
        try:
            heap = self._heap
            if heap:
                deadline = heap[0][0]
                if deadline <= self._monotonic():
                    entry = _heappop(heap)
                    if self._waiting and heap and self._leader is None:
                        self._available.notify()
                    if len(entry) == 3:
                        return entry[2]
                    return _new_item(DelayedItem, (entry[2], deadline))  # type: ignore[return-value]
            return self._wait_for_head()
        finally:
            lock.release()

    def _wait_for_head(self) -> T:
        """The rest of :meth:`take`, lock held: wait (leader or follower) until the head is due."""
        heap = self._heap
        monotonic = self._monotonic
        wait = self._wait
        wait_until = self._wait_until
        cond = self._available
        try:
            while True:
                if heap:
                    deadline = heap[0][0]
                    delay = deadline - monotonic()
                    if delay <= 0:
                        return _item(_heappop(heap))
                    if self._closed:
                        raise QueueClosed("DelayQueue is closed and no item is due")
                    self._waiting += 1
                    if self._leader is not None:
                        wait(cond, None)
                    else:
                        me = threading.get_ident()
                        self._leader = me
                        try:
                            if wait_until is None:
                                wait(cond, delay)
                            else:
                                wait_until(cond, deadline)
                        finally:
                            if self._leader == me:
                                self._leader = None
                    self._waiting -= 1
                elif self._closed:
                    raise QueueClosed("DelayQueue is closed and empty")
                else:
                    self._waiting += 1
                    wait(cond, None)
                    self._waiting -= 1
        finally:
            if self._leader is None and heap and self._waiting:
                cond.notify()

    def poll(self, timeout: float | None = None) -> T | None:
        """Remove and return the earliest item if it is due, else None.

        With ``timeout`` > 0, wait up to that many seconds for an item to
        become due. ``None`` or ``0`` never waits. Raises
        :class:`~delayq.errors.QueueClosed` when the queue is closed and no
        item is due.
        """
        heap = self._heap
        monotonic = self._monotonic
        if timeout is None or (timeout.__class__ in (int, float) and timeout <= 0):
            lock = self._lock
            lock.acquire()  # in try/finally: about 100 ns cheaper than ``with``
            try:
                if heap and heap[0][0] <= monotonic():
                    entry = _heappop(heap)
                    if self._waiting and heap and self._leader is None:
                        self._available.notify()
                    if len(entry) == 3:
                        return entry[2]
                    return _new_item(DelayedItem, (entry[2], entry[0]))  # type: ignore[return-value]
                if self._closed:
                    raise QueueClosed("DelayQueue is closed and no item is due")
                return None
            finally:
                lock.release()
        seconds = check_seconds(timeout, "timeout")
        wait = self._wait
        wait_until = self._wait_until
        cond = self._available
        with self._lock:
            now = monotonic()
            end = now + seconds
            try:
                while True:
                    if heap:
                        head = heap[0][0]
                        delay = head - now
                        if delay <= 0:
                            return _item(_heappop(heap))
                    else:
                        head = delay = _INF
                    if self._closed:
                        raise QueueClosed("DelayQueue is closed and no item is due")
                    remaining = end - now
                    if remaining <= 0:
                        return None
                    self._waiting += 1
                    if remaining < delay or self._leader is not None:
                        # Our own timeout comes first (or someone else leads).
                        if wait_until is None:
                            wait(cond, remaining)
                        else:
                            wait_until(cond, end)
                    else:
                        me = threading.get_ident()
                        self._leader = me
                        try:
                            if wait_until is None:
                                wait(cond, delay)
                            else:
                                wait_until(cond, head)
                        finally:
                            if self._leader == me:
                                self._leader = None
                    self._waiting -= 1
                    now = monotonic()
            finally:
                if self._leader is None and heap and self._waiting:
                    cond.notify()

    def drain_to(
        self, sink: MutableSequence[T] | Callable[[T], object], max_items: int | None = None
    ) -> int:
        """Move every due item (at most ``max_items``) to ``sink``; return how many.

        ``sink`` is a list-like (its ``append`` is used) or a callable taking
        one item. Items are removed under the lock and handed to ``sink``
        after it is released, in due order. Works after :meth:`close` too.
        """
        limit = _check_max_items(max_items)
        add = _sink_adder(sink)
        out: list[T] = []
        heap = self._heap
        with self._lock:
            now = self._monotonic()
            while heap and heap[0][0] <= now and len(out) != limit:
                out.append(_item(_heappop(heap)))
            if out and self._leader is None and heap and self._waiting:
                self._available.notify()
        for item in out:
            add(item)
        return len(out)

    # -- inspecting and housekeeping ----------------------------------------
    def peek(self) -> T | None:
        """The earliest item, due or not, without removing it; None if empty."""
        with self._lock:
            return _item(self._heap[0]) if self._heap else None

    def next_deadline(self) -> float | None:
        """The earliest monotonic deadline in the queue, or None if empty."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def remove(self, item: T) -> bool:
        """Remove one occurrence of ``item`` (the earliest due); True if found.

        Matches by identity first, then by ``==``. O(n), like Java's
        ``DelayQueue.remove``: use a timing wheel when cancellations are frequent.
        """
        heap = self._heap
        with self._lock:
            index = _index_of_identical(heap, item)
            if index >= 0:
                # A removed head leaves the leader waiting for a later deadline:
                # it wakes early and re-waits, which is harmless.
                _remove_at(heap, index)
                return True
            snapshot = list(heap)
        # Compare with == outside the lock: a user's __eq__ never runs under it.
        # Entries are unique tuples, so sorting them never compares items.
        candidates = sorted(e for e in snapshot if _item(e) == item)
        with self._lock:
            for entry in candidates:
                index = next((i for i, e in enumerate(heap) if e is entry), -1)
                if index >= 0:
                    _remove_at(heap, index)
                    return True
        return False

    def clear(self) -> None:
        """Remove every item, due or not."""
        with self._lock:
            self._heap.clear()

    def to_list(self) -> list[T]:
        """A snapshot of every item, due or not, in due order (not removed)."""
        with self._lock:
            entries = sorted(self._heap)
        return [_item(e) for e in entries]

    def close(self) -> None:
        """Refuse further puts and wake every blocked consumer.

        Consumers still get items that are already due; when none is due
        they raise :class:`~delayq.errors.QueueClosed` instead of waiting.
        Idempotent.
        """
        with self._lock:
            self._closed = True
            self._available.notify_all()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[T]:
        """Iterate over a snapshot in due order (see :meth:`to_list`)."""
        return iter(self.to_list())

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<DelayQueue {state} len={len(self._heap)} next_deadline={self.next_deadline()}>"
