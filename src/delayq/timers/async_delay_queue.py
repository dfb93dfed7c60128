"""The delay queue for one asyncio event loop: :class:`AsyncDelayQueue`.

The same semantics as :class:`~delayq.timers.delay_queue.DelayQueue` (due
order, FIFO ties, leader/follower waiting, close semantics) and the same heap
entries, with asyncio events instead of a lock and a condition.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterator, MutableSequence
from typing import Generic, cast

from delayq._validate import check_seconds
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import QueueClosed
from delayq.timers.delay_queue import (
    _INF,
    DelayedItem,
    T,
    V,
    _check_max_items,
    _deadline_of,
    _Entry,
    _heappop,
    _heappush,
    _index_of,
    _item,
    _new_item,
    _remove_at,
    _sink_adder,
)

__all__ = ["AsyncDelayQueue"]


class AsyncDelayQueue(Generic[T]):
    """:class:`DelayQueue` for one asyncio event loop.

    ``put`` is synchronous (the queue is unbounded); ``await take()`` and
    ``await get(timeout)`` wait for due items with the same leader/follower
    rule: one waiting task sleeps until the head's deadline, the others until
    woken. Not thread-safe: from another thread use
    ``loop.call_soon_threadsafe(queue.put, item)``.

    State (``_heap``, ``_leader``, ``_waiters``, ``_closed``) is touched only
    from the event loop thread, so no lock is needed. ``_waiters`` holds one
    ``asyncio.Event`` per waiting task, oldest first; waking "one" sets the
    oldest unset event.
    """

    __slots__ = ("_clock", "_closed", "_heap", "_key", "_leader", "_monotonic", "_seq", "_waiters")

    def __init__(
        self, *, clock: Clock = SYSTEM_CLOCK, key: Callable[[T], float] | None = None
    ) -> None:
        self._clock = clock
        self._monotonic = clock.monotonic
        self._key: Callable[[T], float] = key if key is not None else _deadline_of
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()
        self._leader: asyncio.Event | None = None
        self._waiters: deque[asyncio.Event] = deque()
        self._closed = False

    # -- producing ---------------------------------------------------------
    def put(self, item: T) -> None:
        """Add ``item`` (due at ``key(item)``); raises QueueClosed after close."""
        deadline = self._key(item)
        if not (deadline.__class__ is float and -_INF < deadline < _INF):
            deadline = check_seconds(deadline, "deadline")
        self._push(deadline, item)

    def offer(self, item: T) -> bool:
        """Add ``item`` and return True (the queue is unbounded)."""
        self.put(item)
        return True

    def put_after(self: AsyncDelayQueue[DelayedItem[V]], value: V, delay: float) -> DelayedItem[V]:
        """Put ``value`` due ``delay`` seconds from now (negative = already due)."""
        cls = delay.__class__
        if not ((cls is float and -_INF < delay < _INF) or cls is int):
            delay = check_seconds(delay, "delay")
        if self._closed:
            raise QueueClosed("cannot put into a closed AsyncDelayQueue")
        try:
            deadline = self._monotonic() + delay
        except OverflowError:  # an int past float's range: check_seconds says so
            deadline = self._monotonic() + check_seconds(delay, "delay")
        item: DelayedItem[V] = _new_item(DelayedItem, (value, deadline))
        heap = self._heap
        entry = (deadline, next(self._seq), value, None)
        _heappush(heap, entry)
        if heap[0] is entry:
            self._leader = None
            if self._waiters:
                self._wake_one()
        return item

    def put_at(self: AsyncDelayQueue[DelayedItem[V]], value: V, deadline: float) -> DelayedItem[V]:
        """Put ``value`` due at monotonic time ``deadline``; return the stored item."""
        if not (deadline.__class__ is float and -_INF < deadline < _INF):
            deadline = check_seconds(deadline, "deadline")
        if self._closed:
            raise QueueClosed("cannot put into a closed AsyncDelayQueue")
        item: DelayedItem[V] = _new_item(DelayedItem, (value, deadline))
        heap = self._heap
        entry = (deadline, next(self._seq), value, None)
        _heappush(heap, entry)
        if heap[0] is entry:
            self._leader = None
            if self._waiters:
                self._wake_one()
        return item

    def _push(self, deadline: float, item: T) -> None:
        if self._closed:
            raise QueueClosed("cannot put into a closed AsyncDelayQueue")
        heap = self._heap
        entry = (deadline, next(self._seq), item)
        _heappush(heap, entry)
        if heap[0] is entry:
            self._leader = None
            if self._waiters:
                self._wake_one()

    def _wake_one(self) -> None:
        for event in self._waiters:
            if not event.is_set():
                event.set()
                return

    # -- consuming ---------------------------------------------------------
    async def take(self) -> T:
        """Remove and return the earliest item, waiting until it is due.

        Raises QueueClosed once closed and no item is due.
        """
        heap = self._heap
        if heap:  # the fast path, a due head: no second coroutine frame
            deadline = heap[0][0]
            if deadline <= self._monotonic():
                entry = _heappop(heap)
                if heap and self._waiters and self._leader is None:
                    self._wake_one()
                if len(entry) == 3:
                    return entry[2]
                return _new_item(DelayedItem, (entry[2], deadline))  # type: ignore[return-value]
        # Without a timeout _get only returns an item (which may itself be None).
        return cast(T, await self._get(None))

    async def get(self, timeout: float | None = None) -> T | None:
        """Like :meth:`take`, but give up after ``timeout`` seconds and return None.

        ``timeout=None`` waits as long as needed (same as :meth:`take`).
        """
        if timeout is None:
            return await self._get(None)
        return await self._get(check_seconds(timeout, "timeout"))

    async def _get(self, timeout: float | None) -> T | None:
        heap = self._heap
        monotonic = self._monotonic
        wait_async = self._clock.wait_async
        end = None if timeout is None else monotonic() + timeout
        event: asyncio.Event | None = None
        try:
            while True:
                now = monotonic()
                if heap:
                    delay = heap[0][0] - now
                    if delay <= 0:
                        return _item(_heappop(heap))
                else:
                    delay = _INF
                if self._closed:
                    raise QueueClosed("AsyncDelayQueue is closed and no item is due")
                remaining = _INF if end is None else end - now
                if remaining <= 0:
                    return None
                if event is None:
                    event = asyncio.Event()
                    self._waiters.append(event)
                else:
                    event.clear()
                if heap and self._leader is None and delay <= remaining:
                    self._leader = event
                    try:
                        await wait_async(event, delay)
                    finally:
                        if self._leader is event:
                            self._leader = None
                else:
                    await wait_async(event, None if remaining == _INF else remaining)
        finally:
            if event is not None:
                self._waiters.remove(event)
            if self._leader is None and heap:
                self._wake_one()

    def poll(self) -> T | None:
        """Remove and return the earliest item if due, else None; never waits."""
        heap = self._heap
        if heap and heap[0][0] <= self._monotonic():
            item = _item(_heappop(heap))
            if self._leader is None and heap:
                self._wake_one()
            return item
        if self._closed:
            raise QueueClosed("AsyncDelayQueue is closed and no item is due")
        return None

    def drain_to(
        self, sink: MutableSequence[T] | Callable[[T], object], max_items: int | None = None
    ) -> int:
        """Move every due item (at most ``max_items``) to ``sink``; return how many."""
        limit = _check_max_items(max_items)
        add = _sink_adder(sink)
        heap = self._heap
        now = self._monotonic()
        out: list[T] = []
        while heap and heap[0][0] <= now and len(out) != limit:
            out.append(_item(_heappop(heap)))
        if out and self._leader is None and heap:
            self._wake_one()
        for item in out:
            add(item)
        return len(out)

    # -- inspecting and housekeeping ----------------------------------------
    def peek(self) -> T | None:
        """The earliest item, due or not, without removing it; None if empty."""
        return _item(self._heap[0]) if self._heap else None

    def next_deadline(self) -> float | None:
        """The earliest monotonic deadline in the queue, or None if empty."""
        return self._heap[0][0] if self._heap else None

    def remove(self, item: T) -> bool:
        """Remove one occurrence of ``item`` (identity first, then ``==``); O(n)."""
        index = _index_of(self._heap, item)
        if index < 0:
            return False
        _remove_at(self._heap, index)
        return True

    def clear(self) -> None:
        """Remove every item, due or not."""
        self._heap.clear()

    def to_list(self) -> list[T]:
        """A snapshot of every item in due order (not removed)."""
        return [_item(e) for e in sorted(self._heap)]

    def close(self) -> None:
        """Refuse further puts and wake every waiting task (they raise QueueClosed
        unless an item is due). Idempotent."""
        self._closed = True
        for event in self._waiters:
            event.set()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[T]:
        return iter(self.to_list())

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<AsyncDelayQueue {state} len={len(self._heap)} next_deadline={self.next_deadline()}>"
        )
