"""Running handlers: the handler threads, the event loop, timeouts.

``concurrency + 1`` daemon threads take ready claims from the in-flight table
(at most ``concurrency`` handlers at once; the extra thread means a thread
committing a batch of results never holds up a claimed job) and small tasks
(the bookkeeping of async handlers). Sync handlers run on these threads; async
handlers run on one event-loop thread and hold their slot until they end.

Before a handler starts, its claim's lease is checked on the local monotonic
clock: a claim whose lease already ran out (the process was paused: SIGSTOP,
a long GC, a frozen VM) is handed back unstarted instead of being run after
another worker may have run it.

A handler running past its timeout counts as failed at once (a watcher
thread sleeps until the earliest deadline) (retried by the
job's backoff, dead-lettered on its last attempt): an async handler is
cancelled; a sync one cannot be interrupted, so its thread is left to it and a
new thread takes its place (the slot is free again), and its result, if it
ever returns, is ignored (fenced: the attempt was already decided).

Daemon threads, unlike ``ThreadPoolExecutor``'s, do not keep the process
alive: a handler stuck past the grace period cannot block interpreter exit
(its job's lease simply runs out).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import itertools
import logging
import math
import threading
from collections.abc import Awaitable
from typing import Any

from delayq.app import DelayQ
from delayq.clock import Clock
from delayq.job import Handler, JobContext
from delayq.worker._commit import GroupCommitter
from delayq.worker._decide import RETURNED, decide, format_error, timeout_error
from delayq.worker._inflight import InFlight, InFlightTable
from delayq.worker._loop import Cancelled, EventLoopThread

__all__ = ["Runner"]

log = logging.getLogger("delayq.worker")


class Runner:
    """Runs the handlers of ready claims (see the module docstring).

    ``_loop`` is guarded by ``_loop_lock``; the threads' bookkeeping lives in
    the in-flight table.
    """

    def __init__(
        self,
        table: InFlightTable,
        app: DelayQ,
        committer: GroupCommitter,
        clock: Clock,
        *,
        name: str,
        timeout: float | None,
        unknown_handler_grace: float,
    ) -> None:
        self._table = table
        self._app = app
        self._committer = committer
        self._clock = clock
        self._name = name
        self._timeout = timeout
        self._unknown_grace = unknown_handler_grace
        self._loop: EventLoopThread | None = None
        self._loop_lock = threading.Lock()
        self._thread_ids = itertools.count()
        self._threads: set[threading.Thread] = set()
        # The timeout watcher (started with the first handler that has a timeout)
        # sleeps until the earliest deadline; guarded by the table's lock.
        self._timeouts_changed = threading.Condition(table.lock)
        self._watching_until = math.inf
        self._watcher: threading.Thread | None = None

    # -- threads --------------------------------------------------------------------------
    def start(self, threads: int) -> None:
        for _ in range(threads):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._serve, name=f"{self._name}-handler-{next(self._thread_ids)}", daemon=True
        )
        with self._loop_lock:
            self._threads.add(thread)
        thread.start()

    def owns_current_thread(self) -> bool:
        with self._loop_lock:
            return threading.current_thread() in self._threads

    def _serve(self) -> None:
        try:
            while (item := self._table.take_work()) is not None:
                if isinstance(item, InFlight):
                    if not self._attempt_safely(item):
                        return  # this thread was left to a handler past its timeout
                    continue
                try:
                    item()
                except BaseException:  # a bug in the worker itself; keep the thread alive
                    log.exception("delayq worker: unexpected error in a handler thread")
        finally:
            with self._loop_lock:
                self._threads.discard(threading.current_thread())

    def shutdown(self) -> None:
        self._table.close()
        with self._table.lock:
            self._timeouts_changed.notify_all()
        with self._loop_lock:
            if self._loop is not None:
                self._loop.shutdown()

    def on_lease_lost(self, rec: InFlight) -> None:
        """The lease keeper found ``rec``'s lease gone (``rec.lease_lost`` is set)."""

    # -- one attempt ----------------------------------------------------------------------
    def _attempt_safely(self, rec: InFlight) -> bool:
        try:
            return self._attempt(rec)
        except BaseException:
            # A bug in the worker, not in the handler: free the slot and let the
            # lease run out so the job runs again.
            log.exception("delayq worker: unexpected error processing job %s", rec.claim.job.id)
            table = self._table
            with table.lock:
                if not rec.done:
                    rec.done = True
                    table.running -= 1
                rec.abandoned = True
                if table.records.pop(rec.key, None) is not None:
                    table.stats.counts["errors"] += 1
                table.changed.notify_all()
                table.work.notify()
            return True

    def _attempt(self, rec: InFlight) -> bool:
        """Run ``rec``'s handler on this thread (or start it on the loop). Returns
        False when this thread must end: its handler ran past its timeout and
        another thread took its place."""
        claim = rec.claim
        job = claim.job
        clock = self._clock
        handler = self._app.get_handler(job.name)
        mono = clock.monotonic()
        if handler is not None and job.misfire == "run":
            decision = None  # the common case: nothing stops it from running
        else:
            decision = decide(
                claim,
                claim.claimed_at + (mono - rec.mono_claimed),  # "now" on the store's clock
                ran=False,
                handler_known=handler is not None,
                registered=tuple(self._app.handlers) if handler is None else (),
                unknown_grace=self._unknown_grace,
            )
        timeout = None
        if handler is not None:
            timeout = handler.timeout if handler.timeout is not None else self._timeout
        table = self._table
        with table.lock:
            expired = mono >= rec.lease_deadline
            returning = table.stopping or expired
            if not returning and decision is None:
                rec.started = True
                rec.started_mono = mono
                rec.mark_at = mono + table.mark_after
                rec.is_async = handler is not None and handler.is_async
                if timeout is not None:
                    self._watch_locked(rec, mono + timeout)
        if returning:
            if expired and not table.stopping:
                log.warning(
                    "job %s (%s): its lease ran out before its handler could start (was this "
                    "process paused?); handing it back unstarted",
                    job.id,
                    job.name,
                )
            self._committer.finish(rec, RETURNED, handler_slot=True)
            return True
        if decision is not None:
            self._committer.finish(rec, decision, handler_slot=True)
            return True
        assert handler is not None
        ctx = JobContext(
            id=job.id,
            name=job.name,
            attempt=claim.attempt,
            max_attempts=job.max_attempts,
            run_at=job.run_at,
            claimed_at=claim.claimed_at,
            lease_until=claim.lease_until,
            created_at=job.created_at,
        )
        if handler.is_async:
            self._start_async(rec, handler, ctx, mono)
            return True
        try:
            result = handler.call(job.payload, ctx)
        except BaseException as exc:  # SystemExit from a handler is its failure too
            return self._finish(rec, exc, clock.monotonic() - mono)
        if result is not None and inspect.isawaitable(result):
            # A sync wrapper around an async function (a decorator without
            # functools.wraps, a lambda): its coroutine runs on the loop, never dropped.
            self._start_async(rec, handler, ctx, mono, awaitable=result)
            return True
        return self._finish(rec, None, clock.monotonic() - mono)

    def _finish(self, rec: InFlight, exc: BaseException | None, duration: float) -> bool:
        """Decide and record a handler's result; False when it was fenced (timed out)."""
        claim = rec.claim
        decision = decide(
            claim,
            claim.claimed_at + (self._clock.monotonic() - rec.mono_claimed),
            ran=True,
            error=None if exc is None else format_error(exc),
        )
        assert decision is not None
        if exc is not None:
            job = claim.job
            if decision.outcome == "retried":
                log.info(
                    "job %s (%s) failed on attempt %d/%d (%s); retrying at %.3f",
                    job.id,
                    job.name,
                    claim.attempt,
                    job.max_attempts,
                    exc,
                    decision.retry_at,
                )
            else:
                log.warning(
                    "job %s (%s) failed on attempt %d/%d; dead-lettered: %s",
                    job.id,
                    job.name,
                    claim.attempt,
                    job.max_attempts,
                    exc,
                )
        if self._committer.finish(rec, decision, duration, handler_slot=True):
            return True
        if not rec.abandoned:
            log.warning(
                "job %s (%s) returned after its timeout; its result is ignored",
                claim.job.id,
                claim.job.name,
            )
        return False

    def _finish_task(self, rec: InFlight, exc: BaseException | None, duration: float) -> None:
        self._finish(rec, exc, duration)

    # -- timeouts -------------------------------------------------------------------------
    def _watch_locked(self, rec: InFlight, deadline: float) -> None:
        """Give ``rec`` a timeout deadline; wake (or start) the watcher if it is the earliest."""
        rec.timeout_at = deadline
        if deadline < self._watching_until:
            self._timeouts_changed.notify()
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch_timeouts, name=f"{self._name}-timeouts", daemon=True
            )
            self._watcher.start()

    def _watch_timeouts(self) -> None:
        """The timeout watcher's loop: sleep until the earliest handler deadline, expire."""
        table = self._table
        clock = self._clock
        while True:
            with table.lock:
                while True:
                    if table.closed:
                        return
                    deadline = min(
                        (
                            r.timeout_at
                            for r in table.records.values()
                            if not r.done and not r.abandoned
                        ),
                        default=math.inf,
                    )
                    if deadline <= clock.monotonic():
                        break
                    self._watching_until = deadline
                    clock.wait_until(
                        self._timeouts_changed, None if deadline == math.inf else deadline
                    )
                self._watching_until = math.inf
            try:
                self.expire_timeouts()
            except Exception:
                log.exception("delayq worker: unexpected error while expiring handler timeouts")

    def expire_timeouts(self) -> None:
        """Fail every running handler past its timeout (the watcher calls this)."""
        table = self._table
        now = self._clock.monotonic()
        with table.lock:
            expired = [
                rec
                for rec in table.records.values()
                if rec.timeout_at <= now and not rec.done and not rec.abandoned
            ]
        for rec in expired:
            claim = rec.claim
            handler = self._app.get_handler(claim.job.name)
            timeout = self._timeout
            if handler is not None and handler.timeout is not None:
                timeout = handler.timeout
            assert timeout is not None  # only a handler with a timeout has a deadline
            error = timeout_error(claim.job.name, timeout)
            decision = decide(
                claim, claim.claimed_at + (now - rec.mono_claimed), ran=True, error=error
            )
            assert decision is not None
            duration = now - rec.timeout_at + timeout
            if not self._committer.finish(
                rec, decision, duration, handler_slot=True, timed_out=True
            ):
                continue  # it finished meanwhile
            log.warning(
                "job %s (%s): attempt %d ran past its timeout; %s",
                claim.job.id,
                claim.job.name,
                claim.attempt,
                "retried" if decision.outcome == "retried" else "dead-lettered",
            )
            with self._table.lock:
                is_async, cancel = rec.is_async, rec.cancel
            if is_async:
                if cancel is not None:  # else _start_async cancels it as it starts
                    cancel()
            else:
                self._spawn()  # the stuck thread is left to its handler

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

        Every way the handler can end becomes a recorded result: ``invoke``
        returns the handler's exception, BaseExceptions such as ``SystemExit``
        included (inside a task they would otherwise escape the loop and end it);
        only a cancellation propagates, recorded as :class:`Cancelled` unless
        the attempt was already decided (a timeout) or abandoned at shutdown.
        """
        clock = self._clock
        payload = rec.claim.job.payload

        async def invoke() -> BaseException | None:
            try:
                result = handler.call(payload, ctx) if awaitable is None else awaitable
                if inspect.isawaitable(result):
                    await result
            except (asyncio.CancelledError, GeneratorExit):
                raise  # a cancellation, or this coroutine being closed: not swallowed
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: would end the loop
                return exc
            return None

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
        with self._table.lock:
            rec.is_async = True
            rec.cancel = future.cancel
            timed_out = rec.done  # its timeout passed while it was being started
        if timed_out:
            future.cancel()

        def done(f: concurrent.futures.Future[BaseException | None]) -> None:
            # Runs on the loop thread: hand the store calls to a handler thread.
            with self._table.lock:
                if rec.done or rec.abandoned:
                    return  # timed out (already recorded) or cancelled at shutdown
            exc: BaseException | None
            if f.cancelled():
                exc = Cancelled("the async handler was cancelled")
            else:
                exc = f.exception() or f.result()
            duration = clock.monotonic() - started
            self._table.add_task(functools.partial(self._finish_task, rec, exc, duration))

        future.add_done_callback(done)
