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
serves the next claim once the child is gone. Under a backlog the thread also
queues ready claims in the same child behind the running one (``_inchild``).

The timeout watcher lives in ``_timeouts``, the event loop of async handlers
in ``_async``, the feeding of process-pool children in ``_inchild``: parts of
:class:`Runner`, sharing its state.

Daemon threads, unlike ``ThreadPoolExecutor``'s, do not keep the process
alive: a handler stuck past the grace period cannot block interpreter exit
(its job's lease simply runs out).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import threading

from delayq.app import DelayQ
from delayq.clock import Clock
from delayq.codec import encode_result
from delayq.errors import InvalidResult
from delayq.job import Handler, JobContext
from delayq.worker._async import LOOP_BLOCKED, AsyncHandlers
from delayq.worker._commit import GroupCommitter
from delayq.worker._decide import RETURNED, decide, format_error
from delayq.worker._inchild import ChildHandlers
from delayq.worker._inflight import InFlight, InFlightTable
from delayq.worker._loop import EventLoopThread
from delayq.worker._process import ProcessPool
from delayq.worker._timeouts import TimeoutWatcher

__all__ = ["LOOP_BLOCKED", "Runner"]

log = logging.getLogger("delayq.worker")


class Runner(TimeoutWatcher, AsyncHandlers, ChildHandlers):
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
        ready_hold: float,
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
        self._ready_hold = ready_hold
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
            log.exception("delayq worker: unexpected error processing job %s", rec.claim.job.id)
            self._give_up(rec)
            return True

    def _give_up(self, rec: InFlight, *, slot: bool = True) -> None:
        """A bug in the worker, not in the handler: free the slot ``rec`` holds
        (``slot``) and let the lease run out so the job runs again."""
        table = self._table
        with table.lock:
            if not rec.done:
                rec.done = True
                if slot:
                    table.running -= 1
            rec.abandoned = True
            if table.records.pop(rec.key, None) is not None:
                table.stats.counts["errors"] += 1
            table.changed.notify_all()
            table.work.notify()

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
                    claim.claimed_at + (mono - rec.mono_claimed) - claim.due
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
        return self._execute(rec, handler, claim.context(rec.lease_lost), mono)

    def _execute(self, rec: InFlight, handler: Handler, ctx: JobContext, started: float) -> bool:
        """Run the handler of a started attempt now: a sync one on this thread (its
        timeout armed first), an async one on the loop (armed when it starts
        there). False when this thread must end (see :meth:`_attempt`)."""
        clock = self._clock
        if self._pool is not None:
            return self._execute_in_child(self._pool, rec, handler, ctx)
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
        if handler.store_result:
            try:
                text = encode_result(result)
            except InvalidResult as exc:
                return self._finish(rec, exc, clock.monotonic() - started)
            return self._finish(rec, None, clock.monotonic() - started, result=text)
        return self._finish(rec, None, clock.monotonic() - started)

    def _finish(
        self,
        rec: InFlight,
        exc: BaseException | None,
        duration: float,
        *,
        error: str | None = None,
        result: str | None = None,
        final: bool = False,
    ) -> bool:
        """Decide and record a handler's result (``error``: its text, when not
        ``exc``'s own traceback; ``result``: the return value as JSON text, for a
        handler that stores it); False when it was fenced (timed out) and this
        thread must end. A return value that could not be stored
        (:class:`~delayq.errors.InvalidResult`, or ``final``) is dead-lettered
        at once: the body ran, and a retry would run its side effects again."""
        claim = rec.claim
        if exc is not None and error is None:
            error = format_error(exc)
        decision = decide(
            claim,
            claim.claimed_at + (self._clock.monotonic() - rec.mono_claimed),
            ran=True,
            error=error,
            started_at=claim.claimed_at + (rec.started_mono - rec.mono_claimed),
            result=result,
            final=final or isinstance(exc, InvalidResult),
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

    def _finish_task(
        self, rec: InFlight, exc: BaseException | None, duration: float, result: str | None = None
    ) -> None:
        self._finish(rec, exc, duration, result=result)

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
