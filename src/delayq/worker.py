"""The worker: claims due jobs from a backend and runs their handlers.

One dispatcher thread claims jobs and hands them to a pool of ``concurrency``
threads (sync handlers run there; async handlers run on one event-loop thread
and only their bookkeeping uses a pool thread). It never polls: between claims
it blocks in ``backend.wait_for_due``, which returns at the next due time or
as soon as an earlier job arrives, and it claims only as many jobs as it has
free slots (so no claimed job waits behind a busy handler). When more jobs are
due than there are slots, a freed slot waits up to ``COALESCE`` (2 ms) for a few
more to free, so one claim transaction serves several jobs.

What happens to a claimed job:

* no handler registered under its name: dead-lettered with that reason;
* overdue beyond its misfire policy: finished as SKIPPED with an outcome note;
* the handler returns: SUCCEEDED;
* the handler raises: retried at ``now + backoff.delay(attempt)`` (the job's
  stored backoff) until ``max_attempts``, then dead-lettered with the error and
  traceback.

Results are recorded by group commit: a pool thread whose handler finished
puts the result in a buffer; the first one to find no flush in progress
becomes the flusher and records everything buffered with one
``backend.complete`` call (one transaction, so one fsync on SQLite FULL, one
script call on Redis), repeating until the buffer is empty, while the others
only append and move on. Nothing waits on purpose: batches are as large as
what finished during the previous commit, one job when idle, many under load.
A slot frees when its result is committed.

Leases are renewed every ``lease / 3`` seconds while a handler runs, so a long
handler keeps its job; a crashed worker stops renewing and the job runs again
after its lease. A stale fencing token when recording a result (the lease was
lost) is logged for that job, never fatal.

Stopping (``stop()``, SIGINT or SIGTERM under :meth:`Worker.run`): stop
claiming, return claims whose handler has not started (``retry`` at their
original due time: the contract has no "un-claim", so such a claim keeps the
attempt it used), let in-flight handlers finish within ``grace`` seconds while
still renewing their leases, then return. Handlers still running after the
grace period are abandoned: their leases run out and the jobs run again
elsewhere (at-least-once). A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import inspect
import logging
import math
import queue
import signal
import threading
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal

from delayq.app import DelayQ, Handler, JobContext
from delayq.backends import Backend
from delayq.backends.base import Completion
from delayq.backoff import backoff_from_spec
from delayq.clock import Clock
from delayq.errors import BackendError, InvalidInput, InvalidOption, QueueClosed, StaleClaim
from delayq.job import Claim, JobState, Misfire

__all__ = ["JobResult", "Outcome", "Worker", "WorkerStats", "percentile"]

log = logging.getLogger("delayq.worker")

Outcome = Literal["succeeded", "retried", "dead", "skipped", "returned", "stale", "error"]
"""How one claimed attempt ended, from the worker's point of view.

``stale``: the lease was lost before the result could be recorded; ``error``:
the store failed while recording it (the job runs again after its lease).
"""

MAX_ERROR_CHARS = 16_000
"""Longest error text (message + traceback) stored with a job; the middle is cut."""

_SLOW_NOTE_AFTER = Misfire.SKIP_GRACE

COALESCE = 0.002
"""While more jobs are due than there are slots, the dispatcher waits up to this
long (seconds) for half of ``min(batch, concurrency)`` slots to free before
claiming, so one claim transaction serves several jobs. Only under backlog: a
job is then late anyway, by queueing; an idle worker claims at once."""


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100, nearest rank) of ``samples``; NaN when empty."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class JobResult:
    """What happened to one claimed attempt (passed to ``on_result``)."""

    job_id: str
    name: str
    attempt: int
    outcome: Outcome
    lateness: float  # seconds between the due time and the claim
    duration: float  # seconds the handler ran (0 when it did not run)
    error: str | None = None
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counters since the worker started, and lateness percentiles (seconds)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    skipped: int = 0
    returned: int = 0
    stale: int = 0
    errors: int = 0
    in_flight: int = 0
    lateness_p50: float = math.nan
    lateness_p99: float = math.nan
    lateness_max: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(eq=False, slots=True)
class _InFlight:
    """One claimed job. ``lock`` serialises the store calls made for it (lease
    renewal by the dispatcher, the final ack/retry/bury by a pool thread), so a
    renewal never races the final call; the other fields are guarded by the
    worker's ``_cond``."""

    claim: Claim
    mono_claimed: float
    renew_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    lost: bool = False  # the lease was lost (extend said stale)
    abandoned: bool = False  # still running after the grace period


@dataclass(eq=False, slots=True)
class _Finished:
    """A finished attempt waiting in the group-commit buffer."""

    key: int
    rec: _InFlight
    outcome: Outcome
    make: Callable[[Claim], Completion]  # the store call, from the claim at commit time
    duration: float
    error: str | None
    retry_at: float | None


class _Pool:
    """Daemon threads running submitted callables.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not keep the process
    alive: a handler stuck past the grace period cannot block interpreter exit
    (its job's lease simply runs out).
    """

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def owns_current_thread(self) -> bool:
        return threading.current_thread() in self._threads

    def submit(self, fn: Callable[[], None]) -> None:
        self._queue.put(fn)

    def _run(self) -> None:
        while (fn := self._queue.get()) is not None:
            try:
                fn()
            except BaseException:  # a bug in the worker itself; keep the thread alive
                log.exception("delayq worker: unexpected error in a pool thread")

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


class _Loop:
    """An asyncio event loop on its own daemon thread, for async handlers.

    Handler code must not end the loop: when ``run_forever`` returns or raises
    before :meth:`shutdown` (a handler called ``loop.stop()``, or a callback let
    a ``SystemExit`` escape), the loop is logged and run again, so the tasks on
    it still finish and report. ``_closing`` is only touched on the loop thread.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                except BaseException:
                    log.exception("delayq worker: an error escaped the asyncio loop")
                    if self._closing:
                        return
                    continue
                if self._closing:
                    return
                log.warning("delayq worker: a handler stopped the asyncio loop; it goes on")
        finally:
            self.loop.close()

    @property
    def alive(self) -> bool:
        """True while the loop accepts work (its thread runs and it is not closed)."""
        return self._thread.is_alive() and not self.loop.is_closed()

    def shutdown(self) -> None:
        def cancel_all() -> None:
            self._closing = True
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_soon(self.loop.stop)

        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(cancel_all)


class _Cancelled(Exception):
    """Recorded as the error of an async handler that was cancelled (not by shutdown)."""


def _format_error(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc)).rstrip()
    if len(text) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2
        text = f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"
    return text


class Worker:
    """Run the handlers of ``app`` for due jobs.

    ``concurrency`` handlers run at once; each claim asks for at most
    ``min(batch, free slots)`` jobs. ``lease`` is how long a claim is held
    without renewal (renewed every ``lease / 3``); ``grace`` how long
    :meth:`stop` lets in-flight handlers finish. ``on_result`` is called (on a
    pool thread, never under a lock) with a :class:`JobResult` after each
    attempt. ``idle_wait`` caps one wait for due jobs (a safety net; the
    backend wakes the worker when a job arrives).

    Lock rule: ``_cond`` (a Condition over ``_lock``) guards ``_inflight``,
    ``_finished``, ``_flushing``, ``_stopping``, ``_grace``, ``_stop_mono``, the
    counters and ``_lateness``; it is never held while a handler or a store call
    runs. It is notified when a slot frees or a stop is requested.
    """

    def __init__(
        self,
        app: DelayQ,
        *,
        concurrency: int = 8,
        lease: float = 30.0,
        batch: int | None = None,
        grace: float = 30.0,
        clock: Clock | None = None,
        idle_wait: float = 10.0,
        on_result: Callable[[JobResult], None] | None = None,
        max_lateness_samples: int = 1_000_000,
        name: str = "delayq-worker",
    ) -> None:
        self.app = app
        self._backend: Backend = app.backend
        self.clock: Clock = app.clock if clock is None else clock
        self.concurrency = self._positive_int(concurrency, "concurrency")
        self.batch = self.concurrency if batch is None else self._positive_int(batch, "batch")
        self.lease = self._positive_seconds(lease, "lease")
        self.grace = self._positive_seconds(grace, "grace", allow_zero=True)
        self.idle_wait = self._positive_seconds(idle_wait, "idle_wait")
        self.name = name
        self._on_result = on_result
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inflight: dict[int, _InFlight] = {}
        self._finished: list[_Finished] = []  # the group-commit buffer
        self._flushing = False  # a pool thread is committing the buffer
        self._stopping = False
        self._grace = self.grace
        self._stop_mono: float | None = None
        self._counts: dict[str, int] = dict.fromkeys(
            ("claimed", "succeeded", "retried", "dead", "skipped", "returned", "stale", "errors"),
            0,
        )
        self._lateness: deque[float] = deque(maxlen=max_lateness_samples)
        self._thread: threading.Thread | None = None
        self._pool: _Pool | None = None
        self._loop: _Loop | None = None
        self._loop_lock = threading.Lock()
        self._done = threading.Event()
        self._draining = threading.Event()  # set once the dispatcher stopped claiming
        self._crash: BaseException | None = None
        self._seq = 0

    # -- validation ---------------------------------------------------------
    @staticmethod
    def _positive_int(value: object, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidOption(f"{name} must be an int >= 1, got {value!r}")
        return value

    @staticmethod
    def _positive_seconds(value: object, name: str, *, allow_zero: bool = False) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidOption(f"{name} must be a finite number of seconds, got {value!r}")
        if value < 0 or (value == 0 and not allow_zero):
            raise InvalidOption(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value!r}")
        return float(value)

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> Worker:
        """Start claiming in a background thread; returns self."""
        with self._cond:
            if self._thread is not None:
                raise QueueClosed("this worker was already started; create a new Worker")
            # One thread more than handlers: the thread committing a batch of
            # results never holds up a claimed job.
            self._pool = _Pool(self.concurrency + 1, f"{self.name}-handler")
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """Run until stopped (``stop()`` from another thread, SIGINT or SIGTERM).

        In the main thread, SIGINT and SIGTERM request a graceful stop; a
        second signal stops without waiting for in-flight handlers.

        In the main thread it also treats the process as a worker process and
        freezes the garbage collector's view of the heap built so far (modules,
        the app, the store's client) with ``gc.freeze()`` until it returns. A
        full collection walks every tracked object while holding the GIL, so
        it stalls the dispatcher and every handler at once: with the Redis
        client loaded that is 15-20 ms once every few seconds under load, and
        every job due meanwhile runs that late. Frozen objects are never
        scanned; garbage created later is still collected as usual, and what
        was garbage at the start is collected first. Only when nothing froze
        the heap before (``gc.get_freeze_count() == 0``); :meth:`start` (a
        worker embedded in a larger process) leaves the collector alone.
        """
        previous: dict[signal.Signals, Any] = {}
        froze = False
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
            if gc.get_freeze_count() == 0:
                gc.collect()
                gc.freeze()
                froze = True
        try:
            self.start()
            # Event.wait is interruptible by signals, so the handlers above run promptly.
            self._done.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if froze:
                gc.unfreeze()
        if self._crash is not None:
            raise self._crash

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between bytecodes: only hand off to a thread,
        # never take a lock here (the main thread might hold it).
        with_grace = not self._stopping
        name = signal.Signals(signum).name
        threading.Thread(
            target=self._signal_stop, args=(name, with_grace), name="delayq-stop", daemon=True
        ).start()

    def _signal_stop(self, name: str, with_grace: bool) -> None:
        if with_grace:
            log.info("%s: stopping; in-flight jobs get %.1fs to finish", name, self.grace)
            self.stop(wait=False)
        else:
            log.warning("%s again: stopping now, abandoning in-flight jobs", name)
            self.stop(grace=0.0, wait=False)

    def stop(self, grace: float | None = None, *, wait: bool = True) -> None:
        """Stop claiming and let in-flight handlers finish within ``grace`` seconds.

        Calling it again with a smaller grace shortens the wait. With
        ``wait=True`` returns when the worker has stopped.
        """
        if grace is not None:
            grace = self._positive_seconds(grace, "grace", allow_zero=True)
        with self._cond:
            if not self._stopping:
                self._stopping = True
                self._stop_mono = self.clock.monotonic()
            if grace is not None:
                self._grace = min(self._grace, grace)
            self._cond.notify_all()
            started = self._thread is not None
        if not started:
            self._done.set()
            return
        # The dispatcher may be about to block in wait_for_due; interrupt until it
        # has seen the stop (an interrupt sent just before it blocks could be lost).
        self._backend.interrupt()
        if threading.current_thread() is self._thread:
            return  # called from the dispatcher itself (e.g. by a store wrapper)
        while not self._done.is_set() and not self._draining.wait(0.05):
            self._backend.interrupt()
        pool = self._pool
        if wait and not (pool is not None and pool.owns_current_thread()):
            self.join()

    def join(self, timeout: float | None = None) -> bool:
        """Wait (real time) until the worker stopped; True if it did."""
        return self._done.wait(timeout)

    @property
    def running(self) -> bool:
        """True between start and the end of the stop."""
        return self._thread is not None and not self._done.is_set()

    @property
    def stopping(self) -> bool:
        """True once a stop was requested and the worker no longer claims jobs."""
        return self._draining.is_set()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation --------------------------------------------------------
    def stats(self) -> WorkerStats:
        """A snapshot of the counters and lateness percentiles."""
        with self._cond:
            counts = dict(self._counts)
            samples = list(self._lateness)
            in_flight = len(self._inflight)
        return WorkerStats(
            **counts,
            in_flight=in_flight,
            lateness_p50=percentile(samples, 50),
            lateness_p99=percentile(samples, 99),
            lateness_max=max(samples, default=math.nan),
        )

    def lateness_samples(self) -> list[float]:
        """Lateness (claim time minus due time, seconds) of every claim recorded."""
        with self._cond:
            return list(self._lateness)

    # -- the dispatcher -----------------------------------------------------
    def _main(self) -> None:
        try:
            self._dispatch()
            self._draining.set()
            self._drain()
        except BaseException as exc:
            log.exception("delayq worker crashed")
            self._crash = exc
        finally:
            self._draining.set()
            if self._pool is not None:
                self._pool.shutdown()
            with self._loop_lock:
                if self._loop is not None:
                    self._loop.shutdown()
            self._done.set()

    def _dispatch(self) -> None:
        error_pause = 0.0
        backlog = False  # the last claim was full: more jobs are due than slots
        gather = max(1, min(self.batch, self.concurrency) // 2)
        while True:
            with self._cond:
                if self._stopping:
                    return
                free = self.concurrency - len(self._inflight)
            self._renew_due()
            if free <= 0:
                self._wait_for_slot()
                continue
            if backlog and free < gather:
                # Saturated: let a few more slots free up (at most COALESCE seconds)
                # so one claim transaction serves several jobs instead of one.
                free = self._gather_slots(gather)
            limit = min(free, self.batch)
            try:
                claims = self._backend.claim(limit=limit, lease=self.lease)
            except QueueClosed:
                self._store_closed()
                return
            except Exception:
                error_pause = min(5.0, max(0.1, error_pause * 2))
                log.exception("claim failed; trying again in %.1fs", error_pause)
                self._pause(self._wait_budget(error_pause))  # renewals go on
                continue
            self._start_all(claims)
            backlog = len(claims) == limit
            if not backlog:
                try:
                    self._backend.wait_for_due(self._wait_budget(self.idle_wait))
                except QueueClosed:
                    self._store_closed()
                    return
                except Exception:
                    # e.g. BackendUnavailable (SQLite busy timeout): like a failed
                    # claim, it must not end the worker; back off and claim again.
                    error_pause = min(5.0, max(0.1, error_pause * 2))
                    log.exception("waiting for due jobs failed; trying again in %.1fs", error_pause)
                    self._pause(self._wait_budget(error_pause))  # renewals go on
                    continue
            error_pause = 0.0

    def _store_closed(self) -> None:
        log.warning("the store %s was closed; the worker stops", self._backend.url)
        with self._cond:
            self._stopping = True
            self._stop_mono = self.clock.monotonic()

    def _start_all(self, claims: Sequence[Claim]) -> None:
        if not claims:
            return
        mono = self.clock.monotonic()
        pool = self._pool
        assert pool is not None
        records = []
        with self._cond:
            for claim in claims:
                rec = _InFlight(claim, mono, mono + self.lease / 3)
                self._seq += 1
                self._inflight[self._seq] = rec
                self._counts["claimed"] += 1
                self._lateness.append(claim.claimed_at - claim.job.run_at)
                records.append((self._seq, rec))
        for key, rec in records:
            pool.submit(functools.partial(self._process_safely, key, rec))

    def _wait_budget(self, cap: float) -> float:
        """Seconds the dispatcher may sleep: ``cap``, or less if a lease needs renewing."""
        with self._cond:
            next_renew = min((r.renew_at for r in self._inflight.values()), default=math.inf)
        return max(0.0, min(cap, next_renew - self.clock.monotonic()))

    def _wait_for_slot(self) -> None:
        budget = self._wait_budget(self.idle_wait)
        with self._cond:
            if not self._stopping and len(self._inflight) >= self.concurrency and budget > 0:
                self.clock.wait(self._cond, budget)

    def _gather_slots(self, want: int) -> int:
        """Wait up to COALESCE seconds for ``want`` free slots; return the free count."""
        with self._cond:
            deadline = self.clock.monotonic() + COALESCE
            while True:
                free = self.concurrency - len(self._inflight)
                left = deadline - self.clock.monotonic()
                if free >= want or left <= 0 or self._stopping:
                    return free
                self.clock.wait(self._cond, left)

    def _pause(self, seconds: float) -> None:
        with self._cond:
            if not self._stopping:
                self.clock.wait(self._cond, seconds)

    def _renew_due(self) -> None:
        now = self.clock.monotonic()
        with self._cond:
            due = [
                (key, r)
                for key, r in self._inflight.items()
                if r.renew_at <= now and not r.lost and not r.abandoned
            ]
        for key, rec in due:
            with rec.lock:
                with self._cond:
                    if self._inflight.get(key) is not rec:
                        continue  # finished meanwhile
                    claim = rec.claim
                try:
                    renewed = self._backend.extend(claim, self.lease)
                except StaleClaim:
                    log.warning(
                        "lost the lease of job %s (%s) while its handler runs; "
                        "it may run again elsewhere",
                        claim.job.id,
                        claim.job.name,
                    )
                    with self._cond:
                        rec.lost = True
                        rec.renew_at = math.inf  # nothing left to renew
                    continue
                except Exception:
                    log.exception("renewing the lease of job %s failed; retrying", claim.job.id)
                    with self._cond:
                        rec.renew_at = self.clock.monotonic() + min(1.0, self.lease / 10)
                    continue
                with self._cond:
                    rec.claim = renewed
                    rec.renew_at = self.clock.monotonic() + self.lease / 3

    def _drain(self) -> None:
        """After a stop: keep renewing leases until in-flight handlers finish or
        the grace period ends."""
        while True:
            self._renew_due()
            with self._cond:
                if not self._inflight:
                    return
                assert self._stop_mono is not None
                left = self._stop_mono + self._grace - self.clock.monotonic()
                if left <= 0:
                    for rec in self._inflight.values():
                        rec.abandoned = True
                    log.warning(
                        "grace period over: abandoning %d running job(s) %s; they run again "
                        "after their leases expire",
                        len(self._inflight),
                        sorted(r.claim.job.id for r in self._inflight.values())[:10],
                    )
                    return
                next_renew = min(r.renew_at for r in self._inflight.values())
                self.clock.wait(self._cond, min(left, next_renew - self.clock.monotonic()))

    # -- one job ------------------------------------------------------------
    def _process_safely(self, key: int, rec: _InFlight) -> None:
        try:
            self._process(key, rec)
        except BaseException:
            # A bug in the worker, not in the handler: free the slot and let the
            # lease run out so the job runs again.
            log.exception("delayq worker: unexpected error processing job %s", rec.claim.job.id)
            with self._cond:
                rec.abandoned = True
                if self._inflight.pop(key, None) is not None:
                    self._counts["errors"] += 1
                self._cond.notify_all()

    def _process(self, key: int, rec: _InFlight) -> None:
        claim = rec.claim
        job = claim.job
        with self._cond:
            returning = self._stopping
            rec.started = not returning
        if returning:
            self._record(
                key,
                rec,
                "returned",
                Completion.release,  # the attempt given back, still due at its run_at
            )
            return
        handler = self.app.get_handler(job.name)
        if handler is None:
            known = ", ".join(sorted(self.app.handlers)) or "none"
            reason = (
                f"UnknownHandler: no handler is registered under {job.name!r} in this worker "
                f"(registered: {known}); requeue the job once a worker knows it"
            )
            self._record(key, rec, "dead", lambda c: Completion.bury(c, reason), error=reason)
            return
        lateness = claim.claimed_at - job.run_at
        try:
            misfire = Misfire.parse(job.misfire)
        except InvalidInput as exc:
            reason = f"cannot read the job's misfire policy {job.misfire!r}: {exc}"
            self._record(key, rec, "dead", lambda c: Completion.bury(c, reason), error=reason)
            return
        if not misfire.should_run(lateness):
            note = f"skipped: {lateness:.3f}s late (misfire policy {misfire.to_spec()})"
            self._record(
                key,
                rec,
                "skipped",
                lambda c: Completion.ack(c, state=JobState.SKIPPED, outcome=note),
            )
            return
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
            self._start_async(key, rec, handler, ctx)
            return
        started = self.clock.monotonic()
        try:
            result = handler.call(job.payload, ctx)
        except BaseException as exc:  # SystemExit from a handler is its failure too
            self._finish(key, rec, exc, self.clock.monotonic() - started)
            return
        if inspect.isawaitable(result):
            # A sync wrapper around an async function (a decorator without
            # functools.wraps, a lambda): its coroutine runs on the loop, never dropped.
            self._start_async(key, rec, handler, ctx, awaitable=result, started=started)
            return
        self._finish(key, rec, None, self.clock.monotonic() - started)

    def _event_loop(self, *, replace: bool = False) -> asyncio.AbstractEventLoop:
        """The loop for async handlers, started on first use and replaced if it died."""
        with self._loop_lock:
            if self._loop is None or replace or not self._loop.alive:
                if self._loop is not None:
                    log.warning("delayq worker: the asyncio loop had stopped; starting a new one")
                self._loop = _Loop(f"{self.name}-asyncio")
            return self._loop.loop

    def _start_async(
        self,
        key: int,
        rec: _InFlight,
        handler: Handler,
        ctx: JobContext,
        *,
        awaitable: Awaitable[Any] | None = None,
        started: float | None = None,
    ) -> None:
        """Run an async handler (or await what a sync one returned) on the loop thread.

        Every way the handler can end becomes a recorded result: ``invoke``
        returns the handler's exception, BaseExceptions such as ``SystemExit``
        included (inside a task they would otherwise escape the loop and end it);
        only a cancellation propagates, recorded as :class:`_Cancelled` unless
        the worker abandoned the job at shutdown.
        """
        clock = self.clock
        payload = rec.claim.job.payload
        if started is None:
            started = clock.monotonic()

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
            self._finish(key, rec, exc, clock.monotonic() - started)
            return

        def done(f: concurrent.futures.Future[BaseException | None]) -> None:
            # Runs on the loop thread: hand the store calls to a pool thread.
            with self._cond:
                if rec.abandoned:
                    return  # cancelled at shutdown: the lease runs out
            exc: BaseException | None
            if f.cancelled():
                exc = _Cancelled("the async handler was cancelled")
            else:
                exc = f.exception() or f.result()
            duration = clock.monotonic() - started
            pool = self._pool
            assert pool is not None
            pool.submit(functools.partial(self._finish, key, rec, exc, duration))

        future.add_done_callback(done)

    def _finish(self, key: int, rec: _InFlight, exc: BaseException | None, duration: float) -> None:
        claim = rec.claim
        job = claim.job
        lateness = claim.claimed_at - job.run_at
        if exc is None:
            note = None
            if lateness > _SLOW_NOTE_AFTER:
                note = f"ran {lateness:.3f}s late (misfire policy {job.misfire})"
            self._record(key, rec, "succeeded", lambda c: Completion.ack(c, outcome=note), duration)
            return
        error = _format_error(exc)
        if claim.attempt >= job.max_attempts:
            log.warning(
                "job %s (%s) failed on its last attempt %d/%d; dead-lettered: %s",
                job.id,
                job.name,
                claim.attempt,
                job.max_attempts,
                exc,
            )
            self._record(
                key, rec, "dead", lambda c: Completion.bury(c, error), duration, error=error
            )
            return
        try:
            delay = backoff_from_spec(job.backoff).delay(claim.attempt)
        except InvalidInput as spec_error:
            reason = f"{error}\n\ncannot read the job's backoff {job.backoff!r}: {spec_error}"
            self._record(
                key, rec, "dead", lambda c: Completion.bury(c, reason), duration, error=reason
            )
            return
        # "now" on the backend's clock: the claim time plus the local time since.
        run_at = claim.claimed_at + (self.clock.monotonic() - rec.mono_claimed) + delay
        log.info(
            "job %s (%s) failed on attempt %d/%d (%s); retrying in %.3fs",
            job.id,
            job.name,
            claim.attempt,
            job.max_attempts,
            exc,
            delay,
        )
        self._record(
            key,
            rec,
            "retried",
            lambda c: Completion.retry(c, run_at, error),
            duration,
            error=error,
            retry_at=run_at,
        )

    def _record(
        self,
        key: int,
        rec: _InFlight,
        outcome: Outcome,
        make: Callable[[Claim], Completion],
        duration: float = 0.0,
        *,
        error: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        """Hand a finished attempt to the group commit.

        Group commit: the first pool thread to find no flush in progress becomes
        the flusher and records everything buffered so far with ONE
        ``backend.complete`` call, then again for what was buffered meanwhile,
        until the buffer is empty; the others only append. There is no
        artificial delay: a batch holds what finished while the previous one was
        being committed, so batches grow with the load (one fsync for many jobs
        on SQLite FULL, one script call on Redis).

        ``make`` builds the store call from the claim as it is at commit time (a
        lease renewal may have replaced it meanwhile).
        """
        entry = _Finished(key, rec, outcome, make, duration, error, retry_at)
        with self._cond:
            self._finished.append(entry)
            if self._flushing:
                return  # the thread flushing now commits it in its next round
            self._flushing = True
            batch, self._finished = self._finished, []
        while batch:
            try:
                batch = self._commit(batch)
            except BaseException:
                # A bug in the worker: free the slots so nothing is stuck (the
                # leases run out and the jobs run again), then report it.
                with self._cond:
                    for item in batch:
                        if self._inflight.pop(item.key, None) is not None:
                            self._counts["errors"] += 1
                    self._flushing = False
                    self._cond.notify_all()
                raise

    def _commit(self, batch: list[_Finished]) -> list[_Finished]:
        """Record ``batch`` in one store call, free the slots, report the results.

        Returns the next batch: what was buffered meanwhile (empty when the
        buffer was empty; this thread then is no longer the flusher).
        """
        results: list[tuple[_Finished, Claim, Outcome]] = []
        # Each claim's lock keeps its lease renewal out while it is being finished.
        locks = [entry.rec.lock for entry in batch]
        for lock in locks:
            lock.acquire()
        try:
            with self._cond:
                current = [(e, e.rec.claim) for e in batch if not e.rec.abandoned]
            if len(current) < len(batch):
                for entry in batch:
                    if entry.rec.abandoned:
                        log.warning(
                            "job %s finished after the grace period; not recording it",
                            entry.rec.claim.job.id,
                        )
            completions: list[tuple[_Finished, Claim, Completion]] = []
            for entry, claim in current:
                try:
                    completions.append((entry, claim, entry.make(claim)))
                except Exception:
                    log.exception(
                        "job %s (%s): cannot record %r; it runs again after its lease",
                        claim.job.id,
                        claim.job.name,
                        entry.outcome,
                    )
                    results.append((entry, claim, "error"))
            if completions:
                self._complete(completions, results)
            with self._cond:
                # Out of flight while each claim's lock is still held: a renewal
                # waiting for that lock then finds the job finished, instead of
                # extending an acked claim (and logging a false "lost the lease").
                for entry, _, outcome in results:
                    self._inflight.pop(entry.key, None)
                    self._counts["errors" if outcome == "error" else outcome] += 1
                self._cond.notify_all()
                following, self._finished = self._finished, []
                if not following:
                    self._flushing = False
        finally:
            for lock in locks:
                lock.release()
        if any(outcome == "retried" for _, _, outcome in results):
            # Wake this process's waiters: a retry may be due before they planned to wake.
            try:
                self._backend.interrupt()
            except Exception:
                log.exception("waking the dispatcher after a retry failed")
        if self._on_result is not None:
            for entry, claim, outcome in results:
                self._report(entry, claim, outcome)
        return following

    def _complete(
        self,
        completions: list[tuple[_Finished, Claim, Completion]],
        results: list[tuple[_Finished, Claim, Outcome]],
    ) -> None:
        """The store call of one group commit; appends each entry's outcome to ``results``."""
        try:
            answers = self._backend.complete([c for _, _, c in completions])
            if len(answers) != len(completions):
                raise BackendError(
                    f"the store answered {len(answers)} results for {len(completions)} completions"
                )
        except Exception:
            log.exception(
                "recording %d result(s) failed; those jobs run again after their leases: %s",
                len(completions),
                [claim.job.id for _, claim, _ in completions][:10],
            )
            results += [(entry, claim, "error") for entry, claim, _ in completions]
            return
        for (entry, claim, _), stale in zip(completions, answers, strict=True):
            if stale is None:
                results.append((entry, claim, entry.outcome))
                continue
            log.warning(
                "job %s (%s): its lease expired before the result was recorded; "
                "the job may run again (make handlers idempotent on ctx.id)",
                claim.job.id,
                claim.job.name,
            )
            results.append((entry, claim, "stale"))

    def _report(self, entry: _Finished, claim: Claim, outcome: Outcome) -> None:
        assert self._on_result is not None
        result = JobResult(
            job_id=claim.job.id,
            name=claim.job.name,
            attempt=claim.attempt,
            outcome=outcome,
            lateness=claim.claimed_at - claim.job.run_at,
            duration=entry.duration,
            error=entry.error,
            retry_at=entry.retry_at,
        )
        try:
            self._on_result(result)
        except Exception:
            log.exception("on_result callback failed")
