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
thread sleeps until the earliest deadline): an async handler is cancelled; a
sync one cannot be interrupted, so its thread is left to it and a new thread
takes its place (the slot is free again), and its result, if it ever returns,
is ignored (fenced: the attempt was already decided). Its retry (by the job's
backoff) is recorded only when the abandoned body really ends, so two
attempts never run at once; a last attempt is dead-lettered at once. Bodies
still running that way are abandoned work, capped by ``max_abandoned``.

An async handler's timeout starts when its coroutine starts on the loop, and a
coroutine whose attempt was decided before it could start never runs. While
async handlers run, the watcher pings the loop; one that does not answer
within ``LOOP_BLOCKED`` seconds is logged (a handler blocks it).

With a process pool (``_process.ProcessPool``) a started attempt's handler,
sync or async, runs in a child process while its thread waits for the answer;
a timeout kills the child instead of leaving a thread to it, and the thread
serves the next claim once the child is gone.

Daemon threads, unlike ``ThreadPoolExecutor``'s, do not keep the process
alive: a handler stuck past the grace period cannot block interpreter exit
(its job's lease simply runs out).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
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
from delayq.worker._decide import RETURNED, Decision, decide, format_error, timeout_error
from delayq.worker._inflight import InFlight, InFlightTable
from delayq.worker._loop import Cancelled, EventLoopThread
from delayq.worker._process import ChildFailed, ProcessPool

__all__ = ["LOOP_BLOCKED", "Runner"]

log = logging.getLogger("delayq.worker")

LOOP_BLOCKED = 1.0
"""Seconds the asyncio loop may go without running a callback, while async handlers
are on it, before the worker logs that a handler blocks it."""


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
        pool: ProcessPool | None = None,
    ) -> None:
        self._table = table
        self._pool = pool
        self._app = app
        self._committer = committer
        self._clock = clock
        self._name = name
        self._timeout = timeout
        self._unknown_grace = unknown_handler_grace
        # A store that counts attempts from the start takes an unknown handler's
        # hand-back with its attempt given back.
        self._keep_attempt = "attempt_at_start" in getattr(app.backend, "features", ())
        self._loop: EventLoopThread | None = None
        self._loop_lock = threading.Lock()
        self._thread_ids = itertools.count()
        self._threads: set[threading.Thread] = set()
        # The timeout watcher (started with the first handler that has a timeout)
        # sleeps until the earliest deadline; guarded by the table's lock.
        self._timeouts_changed = threading.Condition(table.lock)
        self._watching_until = math.inf
        self._watcher: threading.Thread | None = None
        # The event loop's health, guarded by the table's lock: coroutines of
        # handlers running on it, the watcher's next look, the last ping.
        self._async_live = 0
        self._loop_check_at = math.inf
        self._ping_answered = True
        self._ping_sent = 0.0

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
        if self._pool is not None:
            self._pool.shutdown()

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
                keep_attempt=self._keep_attempt,
            )
        table = self._table
        with table.lock:
            expired = mono >= rec.lease_deadline
            returning = table.stopping or expired
            if not returning and decision is None:
                rec.started = True
                rec.started_mono = mono
                rec.mark_at = mono + table.mark_after
                table.stats.start_lateness.add(
                    claim.claimed_at + (mono - rec.mono_claimed) - job.run_at
                )
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
            token=claim.token,
            lease_lost=rec.lease_lost,
        )
        return self._execute(rec, handler, ctx, mono)

    def _execute(self, rec: InFlight, handler: Handler, ctx: JobContext, started: float) -> bool:
        """Run the handler of a started attempt now: a sync one on this thread (its
        timeout armed first), an async one on the loop (armed when it starts
        there). False when this thread must end (see :meth:`_attempt`)."""
        clock = self._clock
        if self._pool is not None:
            return self._execute_in_child(self._pool, rec, handler, ctx, started)
        if handler.is_async:
            self._start_async(rec, handler, ctx, started)
            return True
        timeout = self._timeout_of(handler)
        if timeout is not None:
            self._arm_timeout(rec, started + timeout)
        try:
            result = handler.call(rec.claim.job.payload, ctx)
        except BaseException as exc:  # SystemExit from a handler is its failure too
            return self._finish(rec, exc, clock.monotonic() - started)
        if result is not None and inspect.isawaitable(result):
            # A sync wrapper around an async function (a decorator without
            # functools.wraps, a lambda): its coroutine runs on the loop, never dropped.
            with self._table.lock:
                timed_out = rec.done
            if timed_out:
                if inspect.iscoroutine(result):
                    result.close()
                self._committer.body_ended(rec)
                return False
            self._disarm_timeout(rec)
            self._start_async(rec, handler, ctx, started, awaitable=result)
            return True
        return self._finish(rec, None, clock.monotonic() - started)

    def _execute_in_child(
        self, pool: ProcessPool, rec: InFlight, handler: Handler, ctx: JobContext, started: float
    ) -> bool:
        """Run a started attempt's handler in a child process and record the answer.
        Its timeout starts when a child takes it (a wait for a child being started
        does not use it up)."""
        timeout = self._timeout_of(handler)
        table = self._table

        def begin() -> bool:  # a child is ready: the handler starts now, unless decided
            with table.lock:
                if rec.done or rec.abandoned:
                    return False
                if timeout is not None:
                    self._watch_locked(rec, self._clock.monotonic() + timeout)
                return True

        failed = pool.run(rec.key, handler.name, rec.claim.job.payload, ctx, begin=begin)
        duration = self._clock.monotonic() - started
        with table.lock:
            # Decided meanwhile: by its timeout (the child was killed for it) or
            # at shutdown (abandoned); its result is not the attempt's.
            decided = rec.done or rec.abandoned
        if decided:
            self._committer.body_ended(rec)  # a retry held for it is recorded now
            return True
        if failed is None:
            return self._finish(rec, None, duration)
        summary, error = failed
        return self._finish(rec, ChildFailed(summary), duration, error=error)

    def _finish(
        self, rec: InFlight, exc: BaseException | None, duration: float, *, error: str | None = None
    ) -> bool:
        """Decide and record a handler's result (``error``: its text, when not
        ``exc``'s own traceback); False when it was fenced (timed out) and this
        thread must end."""
        claim = rec.claim
        if exc is not None and error is None:
            error = format_error(exc)
        decision = decide(
            claim,
            claim.claimed_at + (self._clock.monotonic() - rec.mono_claimed),
            ran=True,
            error=error,
            started_at=claim.claimed_at + (rec.started_mono - rec.mono_claimed),
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
        if not rec.abandoned and self._pool is None:
            log.warning(
                "job %s (%s) returned after its timeout; its result is ignored",
                claim.job.id,
                claim.job.name,
            )
        self._committer.body_ended(rec)  # a retry held for it may be recorded now
        # A killed child gives its thread back; a sync handler's thread was replaced.
        return self._pool is not None

    def _finish_task(self, rec: InFlight, exc: BaseException | None, duration: float) -> None:
        self._finish(rec, exc, duration)

    # -- timeouts -------------------------------------------------------------------------
    def _timeout_of(self, handler: Handler) -> float | None:
        return handler.timeout if handler.timeout is not None else self._timeout

    def _arm_timeout(self, rec: InFlight, deadline: float) -> None:
        with self._table.lock:
            if not rec.done:
                self._watch_locked(rec, deadline)

    def _disarm_timeout(self, rec: InFlight) -> None:
        with self._table.lock:
            rec.timeout_at = math.inf

    def _watch_locked(self, rec: InFlight, deadline: float) -> None:
        """Give ``rec`` a timeout deadline; wake (or start) the watcher if it is the earliest."""
        rec.timeout_at = deadline
        if deadline < self._watching_until:
            self._timeouts_changed.notify()
        self._start_watcher_locked()

    def _start_watcher_locked(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch_timeouts, name=f"{self._name}-timeouts", daemon=True
            )
            self._watcher.start()

    def _watch_timeouts(self) -> None:
        """The watcher's loop: sleep until the earliest handler deadline (or the next
        look at the event loop), expire timeouts, check that the loop runs."""
        table = self._table
        clock = self._clock
        while True:
            with table.lock:
                while True:
                    if table.closed:
                        return
                    now = clock.monotonic()
                    deadline = min(
                        (
                            r.timeout_at
                            for r in table.records.values()
                            if not r.done and not r.abandoned
                        ),
                        default=math.inf,
                    )
                    check = self._loop_check_at
                    if deadline <= now or check <= now:
                        break
                    wake = min(deadline, check)
                    self._watching_until = wake
                    clock.wait_until(self._timeouts_changed, None if wake == math.inf else wake)
                self._watching_until = math.inf
            try:
                if deadline <= now:
                    self.expire_timeouts()
                if check <= now:
                    self._check_loop(now)
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
            timeout = self._timeout if handler is None else self._timeout_of(handler)
            assert timeout is not None  # only a handler with a timeout has a deadline
            error = timeout_error(claim.job.name, timeout, killed=self._pool is not None)
            decision = decide(
                claim, claim.claimed_at + (now - rec.mono_claimed), ran=True, error=error
            )
            assert decision is not None
            self._on_timeout(rec, decision, now - rec.timeout_at + timeout)

    def _on_timeout(self, rec: InFlight, decision: Decision, duration: float) -> None:
        """``rec``'s handler ran past its timeout: fail the attempt, free its slot.

        The handler cannot be stopped at once (a sync one not at all, a cancelled
        coroutine only at its next ``await``), so it counts as abandoned work until
        it ends, and a retry is recorded only then: the next attempt never runs
        beside this one. A last attempt is dead-lettered at once (nothing runs next).
        """
        claim = rec.claim
        hold = decision.outcome == "retried"
        if not self._committer.finish(
            rec, decision, duration, handler_slot=True, timed_out=True, hold=hold
        ):
            return  # it finished meanwhile
        table = self._table
        with table.lock:
            is_async, cancel = rec.is_async, rec.cancel
            abandoned, cap = table.abandoned, table.abandoned_cap
        log.warning(
            "job %s (%s): attempt %d ran past its timeout; %s",
            claim.job.id,
            claim.job.name,
            claim.attempt,
            "retried once its handler ends" if hold else "dead-lettered",
        )
        if abandoned >= cap:
            log.error(
                "%d handler(s) run on past their timeout (max_abandoned=%d): this worker "
                "claims no more jobs until some end, and reports itself unhealthy",
                abandoned,
                cap,
            )
        if self._pool is not None:
            self._pool.kill(rec.key)  # its thread serves again once the child is gone
        elif is_async:
            if cancel is not None:
                cancel()
        else:
            self._spawn()  # the stuck thread is left to its handler

    def on_lease_lost(self, rec: InFlight) -> None:
        """The lease keeper found ``rec``'s lease gone (``rec.lease_lost`` is set, which
        the handler sees as ``ctx.lease_lost``): an async handler is cancelled, as
        its result could not be recorded any more and another worker may run the
        job now; a sync one is told only (it cannot be interrupted), in a child
        process too."""
        if self._pool is not None:
            self._pool.lease_lost(rec.key)
            return
        with self._table.lock:
            cancel = rec.cancel if rec.is_async and not rec.done else None
        if cancel is not None:
            log.warning(
                "job %s (%s): cancelling its async handler, its lease is lost",
                rec.claim.job.id,
                rec.claim.job.name,
            )
            cancel()

    # -- the event loop's health ----------------------------------------------------------
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

        async def invoke() -> BaseException | None:
            with table.lock:
                if rec.done or rec.abandoned:
                    if awaitable is not None and inspect.iscoroutine(awaitable):
                        awaitable.close()
                    return None  # decided before it could start: never run it
                self._loop_started_locked()
                if timeout is not None:
                    self._watch_locked(rec, clock.monotonic() + timeout)
            try:
                result = handler.call(payload, ctx) if awaitable is None else awaitable
                if inspect.isawaitable(result):
                    await result
            except (asyncio.CancelledError, GeneratorExit):
                raise  # a cancellation, or this coroutine being closed: not swallowed
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: would end the loop
                return exc
            finally:
                with table.lock:
                    self._async_live -= 1
                    alive = rec.body_alive
                if alive:  # timed out earlier: its held retry is recorded now (not on the loop)
                    table.add_task(functools.partial(self._committer.body_ended, rec))
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
        with table.lock:
            rec.is_async = True
            rec.cancel = future.cancel
            decided = rec.done  # decided while it was being started
        if decided:
            future.cancel()

        def done(f: concurrent.futures.Future[BaseException | None]) -> None:
            # Runs on the loop thread: hand the store calls to a handler thread.
            with table.lock:
                if rec.done or rec.abandoned:
                    return  # timed out (already recorded) or cancelled at shutdown
            exc: BaseException | None
            if f.cancelled():
                exc = Cancelled("the async handler was cancelled")
            else:
                exc = f.exception() or f.result()
            duration = clock.monotonic() - started
            table.add_task(functools.partial(self._finish_task, rec, exc, duration))

        future.add_done_callback(done)
