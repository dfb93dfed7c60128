"""Time, passed in.

Every component takes a :class:`Clock`. This is the only module that reads
``time.*`` directly; tests use :class:`delayq.testing.FakeClock`, which moves
only when the test advances it, so time-dependent logic is tested without real
sleeps.

Two kinds of time are used:

* ``time()``: wall-clock epoch seconds. Durable due times use it.
* ``monotonic()``: never goes backwards. In-process deadlines use it.
"""

from __future__ import annotations

import asyncio
import threading
import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of time and a way to wait for it.

    ``wait`` and ``wait_async`` let a clock decide what "timeout seconds have
    passed" means: a real clock waits for real, a fake clock wakes the waiter
    when the test advances it past the deadline. Both may return early
    (spurious wake-ups); callers re-check their state in a loop.
    """

    def time(self) -> float:
        """Wall-clock time in epoch seconds."""
        ...

    def monotonic(self) -> float:
        """Monotonic time in seconds, for in-process deadlines."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` of this clock's time."""
        ...

    def wait(self, condition: threading.Condition, timeout: float | None) -> bool:
        """Wait on ``condition`` (its lock held by the caller) for up to ``timeout``.

        Returns False when the timeout elapsed, True when notified. ``None``
        waits until notified.
        """
        ...

    def wait_until(self, condition: threading.Condition, deadline: float | None) -> bool:
        """Wait on ``condition`` (lock held) until monotonic time ``deadline``.

        The absolute form of :meth:`wait`: a deadline computed from an item's
        due time cannot drift if the clock moves between reading it and waiting.
        Returns False when the deadline passed, True when notified.
        """
        ...

    async def sleep_async(self, seconds: float) -> None:
        """Suspend the calling coroutine for ``seconds`` of this clock's time."""
        ...

    async def wait_async(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set or ``timeout`` elapses; True if it was set."""
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and real waiting."""

    __slots__ = ()

    # The C functions themselves: no Python frame on the hot path of every schedule.
    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    def wait(self, condition: threading.Condition, timeout: float | None) -> bool:
        if timeout is not None and timeout <= 0:
            return False
        return condition.wait(timeout)

    def wait_until(self, condition: threading.Condition, deadline: float | None) -> bool:
        if deadline is None:
            return condition.wait()
        return self.wait(condition, deadline - _time.monotonic())

    async def sleep_async(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_async(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            await event.wait()
            return True
        if timeout <= 0:
            return False
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()
"""The process-wide real clock, the default everywhere a ``clock`` is accepted."""
