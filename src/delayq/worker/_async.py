"""The runner's async handlers: one event-loop thread, and a watch on its health.

An async handler's timeout starts when its coroutine starts on the loop, and a
coroutine whose attempt was decided before it could start never runs. While
async handlers run, the timeout watcher pings the loop; one that does not
answer within ``LOOP_BLOCKED`` seconds is logged (a handler blocks it). A part
of :class:`Runner` (``_runner``), which holds the state named below.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from delayq.codec import encode_result
from delayq.job import Handler, JobContext
from delayq.worker._inflight import InFlight
from delayq.worker._loop import Cancelled, EventLoopThread
from delayq.worker._runner_state import RunnerState

__all__ = ["LOOP_BLOCKED", "AsyncHandlers"]

log = logging.getLogger("delayq.worker")

LOOP_BLOCKED = 1.0
"""Seconds the asyncio loop may go without running a callback, while async handlers
are on it, before the worker logs that a handler blocks it."""


class AsyncHandlers(RunnerState):
    """The event loop of async handlers and its health (mixed into ``Runner``)."""

    if TYPE_CHECKING:  # provided by Runner and its other parts

        def _timeout_of(self, handler: Handler) -> float | None: ...

        def _watch_locked(self, rec: InFlight, deadline: float) -> None: ...

        def _start_watcher_locked(self) -> None: ...

        def _finish(
            self,
            rec: InFlight,
            exc: BaseException | None,
            duration: float,
            *,
            error: str | None = None,
            result: str | None = None,
            final: bool = False,
        ) -> bool: ...

        def _finish_task(
            self,
            rec: InFlight,
            exc: BaseException | None,
            duration: float,
            result: str | None = None,
        ) -> None: ...

    def _loop_started_locked(self) -> None:
        """An async handler began on the loop: watch that the loop keeps running."""
        self._async_live += 1
        if self._async_live == 1 and self._loop_check_at == math.inf:
            self._loop_check_at = self._clock.monotonic() + LOOP_BLOCKED
            if self._loop_check_at < self._watching_until:
                self._timeouts_changed.notify()
            self._start_watcher_locked()

    def _check_loop(self, now: float) -> None:
        """Ping the loop; an unanswered ping after ``LOOP_BLOCKED`` seconds means a
        handler blocks it (sync I/O or ``time.sleep`` inside ``async def``)."""
        table = self._table
        with table.lock:
            if self._async_live == 0 and table.loop_blocked_since is None:
                self._loop_check_at = math.inf
                return
            self._loop_check_at = now + LOOP_BLOCKED
            if not self._ping_answered:
                if table.loop_blocked_since is None:
                    table.loop_blocked_since = self._ping_sent
                    table.stats.loop_blocked += 1
                    blocked = now - self._ping_sent
                else:
                    return
            else:
                self._ping_answered = False
                self._ping_sent = now
                blocked = 0.0
            loop = self._loop
        if blocked:
            log.warning(
                "the asyncio loop of async handlers has not run for %.1fs: a handler blocks it "
                "(time.sleep or blocking I/O inside async def); every async handler waits",
                blocked,
            )
            return
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed: replaced at the next start
                loop.loop.call_soon_threadsafe(self._pong)

    def _pong(self) -> None:
        """On the loop thread: the loop runs callbacks again."""
        table = self._table
        with table.lock:
            self._ping_answered = True
            since = table.loop_blocked_since
            table.loop_blocked_since = None
            now = self._clock.monotonic()
        if since is not None:
            log.warning("the asyncio loop runs again after %.1fs blocked", now - since)

    # -- async handlers -------------------------------------------------------------------
    def _event_loop(self, *, replace: bool = False) -> asyncio.AbstractEventLoop:
        """The loop for async handlers, started on first use and replaced if it died."""
        with self._loop_lock:
            if self._loop is None or replace or not self._loop.alive:
                if self._loop is not None:
                    log.warning("delayq worker: the asyncio loop had stopped; starting a new one")
                self._loop = EventLoopThread(f"{self._name}-asyncio")
            return self._loop.loop

    def _start_async(
        self,
        rec: InFlight,
        handler: Handler,
        ctx: JobContext,
        started: float,
        *,
        awaitable: Awaitable[Any] | None = None,
    ) -> None:
        """Run an async handler (or await what a sync one returned) on the loop thread.

        The coroutine first checks that its attempt is still undecided (a
        handler whose attempt ended while it waited for the loop, by a lost
        lease or a stop, never starts), and its timeout starts then, when it
        really starts: a loop blocked by another handler does not use up its time.

        Every way the handler can end becomes a recorded result: ``invoke``
        returns the handler's exception, BaseExceptions such as ``SystemExit``
        included (inside a task they would otherwise escape the loop and end it);
        only a cancellation propagates, recorded as :class:`Cancelled` unless
        the attempt was already decided (a timeout) or abandoned at shutdown.
        A timed-out coroutine that goes on after its cancel (it swallowed the
        ``CancelledError``) is abandoned work until it really ends.
        """
        clock = self._clock
        table = self._table
        payload = rec.claim.job.payload
        timeout = self._timeout_of(handler)

        async def invoke() -> tuple[BaseException | None, str | None]:
            """The handler's exception, or its return value as JSON text (when it
            stores its result)."""
            with table.lock:
                if rec.done or rec.abandoned:
                    if awaitable is not None and inspect.iscoroutine(awaitable):
                        awaitable.close()
                    return None, None  # decided before it could start: never run it
                self._loop_started_locked()
                if timeout is not None:
                    self._watch_locked(rec, clock.monotonic() + timeout)
            try:
                result = handler.call(payload, ctx) if awaitable is None else awaitable
                if inspect.isawaitable(result):
                    result = await result
                if handler.store_result:
                    return None, encode_result(result)
            except (asyncio.CancelledError, GeneratorExit):
                raise  # a cancellation, or this coroutine being closed: not swallowed
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: would end the loop
                return exc, None
            finally:
                with table.lock:
                    self._async_live -= 1
                    alive = rec.body_alive
                if alive:  # timed out earlier: its held retry is recorded now (not on the loop)
                    table.add_task(functools.partial(self._committer.body_ended, rec))
            return None, None

        coro = invoke()
        try:
            try:
                future = asyncio.run_coroutine_threadsafe(coro, self._event_loop())
            except RuntimeError:  # the loop closed between the check and the call
                future = asyncio.run_coroutine_threadsafe(coro, self._event_loop(replace=True))
        except BaseException as exc:
            coro.close()
            if awaitable is not None and inspect.iscoroutine(awaitable):
                awaitable.close()
            self._finish(rec, exc, clock.monotonic() - started)
            return
        with table.lock:
            rec.is_async = True
            rec.cancel = future.cancel
            decided = rec.done  # decided while it was being started
            # Its lease lost while it was handed to the loop: the lease keeper
            # found no cancel to call (it sets lease_lost before it takes the lock).
            lost = rec.lease_lost.is_set()
        if lost and not decided:
            log.warning(
                "job %s (%s): cancelling its async handler, its lease is lost",
                rec.claim.job.id,
                rec.claim.job.name,
            )
        if decided or lost:
            future.cancel()

        def done(f: concurrent.futures.Future[tuple[BaseException | None, str | None]]) -> None:
            # Runs on the loop thread: hand the store calls to a handler thread.
            with table.lock:
                if rec.done or rec.abandoned:
                    return  # timed out (already recorded) or cancelled at shutdown
            exc: BaseException | None
            text: str | None = None
            if f.cancelled():
                exc = Cancelled("the async handler was cancelled")
            else:
                exc = f.exception()
                if exc is None:
                    exc, text = f.result()
            duration = clock.monotonic() - started
            table.add_task(functools.partial(self._finish_task, rec, exc, duration, text))

        future.add_done_callback(done)
