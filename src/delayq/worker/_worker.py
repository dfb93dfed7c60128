"""The public :class:`Worker`: options, lifecycle and signals; its parts do the work."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from collections.abc import Callable, Collection
from types import FrameType
from typing import Any

from delayq._loader import app_target
from delayq._validate import check_handler_names, check_int, check_option_seconds
from delayq.app import DelayQ
from delayq.backends import Backend
from delayq.backends.base import FiltersHandlers, ReportsHealth
from delayq.clock import Clock
from delayq.errors import ConfigurationError, InvalidOption, QueueClosed
from delayq.worker._commit import GroupCommitter
from delayq.worker._decide import DEFAULT_UNKNOWN_HANDLER_GRACE, JobResult
from delayq.worker._dispatcher import Dispatcher, ready_hold
from delayq.worker._health import WorkerHealth
from delayq.worker._inflight import InFlightTable
from delayq.worker._leases import MARK_AFTER, LeaseKeeper
from delayq.worker._process import ProcessPool
from delayq.worker._runner import Runner
from delayq.worker._stats import WorkerStats

__all__ = ["Worker"]

log = logging.getLogger("delayq.worker")


def _positive_int(value: object, name: str, *, allow_zero: bool = False) -> int:
    return check_int(value, name, minimum=0 if allow_zero else 1)


class Worker:
    """Run the handlers of ``app`` for due jobs.

    ``concurrency`` handlers run at once. ``prefetch`` more jobs may be claimed
    ahead of free slots while a backlog exists (default ``concurrency // 2``, and
    ``2 * concurrency`` with a process pool; 0 claims only for free slots); each
    claim asks for at most ``batch`` jobs (default ``concurrency + prefetch``).
    ``lease`` is how long a claim is held without renewal (renewed every
    ``lease / 3``); ``grace`` how long :meth:`stop` lets in-flight handlers finish.
    ``timeout`` (seconds, None for none) bounds one attempt of handlers registered
    without their own ``timeout``. A job naming a handler this worker does not know
    is retried by its backoff for ``unknown_handler_grace`` seconds (a rolling
    deploy) before it is dead-lettered. ``on_result`` is called (on a handler
    thread, never under a lock) with a :class:`JobResult` after each attempt is
    recorded. ``idle_wait`` caps one wait for due jobs (a safety net; the backend
    wakes the worker when a job arrives). ``max_abandoned`` (default
    ``concurrency``) caps the handlers that ran past their timeout and still run (a
    sync thread, a cancelled coroutine that goes on): at the cap the worker claims
    nothing more until one ends.

    ``pool="process"`` runs every handler in one of ``concurrency`` spawned child
    processes instead of on a handler thread: CPU-bound handlers use every core,
    and a handler past its timeout is killed (SIGTERM, then SIGKILL) and retried
    by its backoff once its child is gone; a child that dies mid-handler fails
    the attempt with its exit signal. Each child loads the app by its name,
    ``app_target`` (``"package.module:app"``; found among the imported modules
    when not given), and gets the payload as JSON. ``max_tasks_per_child``
    replaces a child after that many jobs (a handler leaking memory). Under a
    backlog a few prefetched claims wait in a child's pipe behind its running
    task (they count as ready until the child starts them, and are taken back
    after the same hold as any prefetched claim), so a child never idles between
    jobs while this process records the last one.

    ``handlers`` (names, default all): the worker serves only those handlers of
    the queue and claims only their jobs, filtered in the store's claim (feature
    ``handler_filter``), so a slow handler can have workers of its own beside
    workers for the rest. Its waits sleep toward those handlers' next due job.
    A store without the feature, or a name the app does not register (at
    :meth:`start`), is a :class:`~delayq.errors.ConfigurationError`.

    Its parts: an in-flight table (every held claim, one lock), the dispatcher
    (claims and prefetch, commit retries), the lease keeper (its own thread), the runner
    (handler threads, the event loop, timeouts), the group committer, and the
    pure ``decide()``.
    """

    def __init__(
        self,
        app: DelayQ,
        *,
        concurrency: int = 8,
        prefetch: int | None = None,
        lease: float = 30.0,
        batch: int | None = None,
        grace: float = 30.0,
        timeout: float | None = None,
        unknown_handler_grace: float = DEFAULT_UNKNOWN_HANDLER_GRACE,
        clock: Clock | None = None,
        idle_wait: float = 10.0,
        on_result: Callable[[JobResult], None] | None = None,
        name: str = "delayq-worker",
        max_abandoned: int | None = None,
        pool: str = "thread",
        max_tasks_per_child: int | None = None,
        app_target: str | None = None,
        handlers: Collection[str] | None = None,
    ) -> None:
        self.app = app
        self._backend: Backend = app.backend
        self.handlers = self._handler_filter(handlers)
        self.clock: Clock = app.clock if clock is None else clock
        self.concurrency = _positive_int(concurrency, "concurrency")
        if prefetch is None:
            # A process pool's children are fed from the prefetched claims (queued
            # behind their running task): more of them keeps every child busy.
            self.prefetch = self.concurrency * 2 if pool == "process" else self.concurrency // 2
        else:
            self.prefetch = _positive_int(prefetch, "prefetch", allow_zero=True)
        self.batch = (
            self.concurrency + self.prefetch if batch is None else _positive_int(batch, "batch")
        )
        self.lease = check_option_seconds(lease, "lease")
        self.grace = check_option_seconds(grace, "grace", allow_zero=True)
        self.timeout = None if timeout is None else check_option_seconds(timeout, "timeout")
        self.unknown_handler_grace = check_option_seconds(
            unknown_handler_grace, "unknown_handler_grace", allow_zero=True
        )
        self.idle_wait = check_option_seconds(idle_wait, "idle_wait")
        self.name = name
        self.pool = pool
        self._pool = self._process_pool(app, pool, max_tasks_per_child, app_target)
        gather = max(1, min(self.batch, self.concurrency) // 2)
        self._table = InFlightTable(
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            grace=self.grace,
            abandoned_cap=(
                self.concurrency
                if max_abandoned is None
                else _positive_int(max_abandoned, "max_abandoned")
            ),
        )
        self._table.mark_after = min(MARK_AFTER, self.lease / 10)
        self._committer = GroupCommitter(
            self._table,
            self._backend,
            self.clock,
            lease=self.lease,
            batch=self.batch,
            gather=gather,
            on_result=on_result,
            names=self.handlers,
        )
        self._runner = Runner(
            self._table,
            app,
            self._committer,
            self.clock,
            name=name,
            timeout=self.timeout,
            unknown_handler_grace=self.unknown_handler_grace,
            ready_hold=ready_hold(self.lease),
            pool=self._pool,
        )
        self._keeper = LeaseKeeper(
            self._table,
            self._backend,
            self.clock,
            lease=self.lease,
            name=name,
            on_lease_lost=self._runner.on_lease_lost,
        )
        self._dispatcher = Dispatcher(
            self._table,
            self._backend,
            self.clock,
            committer=self._committer,
            lease=self.lease,
            batch=self.batch,
            gather=gather,
            idle_wait=self.idle_wait,
            names=self.handlers,
        )
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._draining = threading.Event()  # set once the dispatcher stopped claiming
        self._crash: BaseException | None = None
        self._starting = False

    def _handler_filter(self, handlers: Collection[str] | None) -> frozenset[str] | None:
        names = check_handler_names(handlers)
        if names is None:
            return None
        if "handler_filter" not in self._backend.features or not isinstance(
            self._backend, FiltersHandlers
        ):
            raise ConfigurationError(
                f"handlers= needs a store whose claim filters by handler (feature "
                f"handler_filter); {self._backend.url} does not: run the worker without it"
            )
        return names

    def _check_handlers_registered(self) -> None:
        """A filtered worker claims only jobs it can run: every name must be registered."""
        if self.handlers is None:
            return
        missing = sorted(n for n in self.handlers if self.app.get_handler(n) is None)
        if missing:
            known = sorted(self.app.handlers)
            raise ConfigurationError(
                f"handlers= names {', '.join(map(repr, missing))}, which the app does not "
                f"register (it registers {', '.join(map(repr, known)) or 'none'})"
            )

    def _process_pool(
        self, app: DelayQ, pool: str, max_tasks: int | None, target: str | None
    ) -> ProcessPool | None:
        if pool not in ("thread", "process"):
            raise InvalidOption(f"pool must be 'thread' or 'process', got {pool!r}")
        if max_tasks is not None:
            max_tasks = _positive_int(max_tasks, "max_tasks_per_child")
        if pool == "thread":
            if max_tasks is not None or target is not None:
                raise InvalidOption("max_tasks_per_child and app_target need pool='process'")
            return None
        if target is None:
            target = app_target(app)
            if target is None:
                raise InvalidOption(
                    "pool='process' needs app_target='package.module:app' (the children "
                    "import the app by name; this app is no module-level variable)"
                )
        return ProcessPool(target, size=self.concurrency, max_tasks_per_child=max_tasks)

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> Worker:
        """Start claiming in a background thread; returns self.

        With a process pool, first starts its children and waits until each has
        loaded the app (:class:`~delayq.errors.ConfigurationError` if one cannot).
        With ``handlers=``, each must be registered in the app (ConfigurationError)."""
        self._check_handlers_registered()
        with self._table.lock:
            if self._thread is not None or self._starting:
                raise QueueClosed("this worker was already started; create a new Worker")
            self._starting = True
        if self._pool is not None:
            try:
                self._pool.start()
            except BaseException:
                self._done.set()
                raise
        with self._table.lock:
            # One thread more than handlers: the thread committing a batch of
            # results never holds up a claimed job.
            self._runner.start(self.concurrency + 1)
            self._keeper.start()
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
            # A signal's Python handler runs in this thread between bytecodes. An
            # untimed wait wakes for it only when the kernel delivers the signal to
            # this very thread; a timed wait also lets one that reached another
            # thread (os.kill from a handler) run its handler within a moment.
            while not self._done.wait(0.25):
                pass
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
        with_grace = not self._table.stopping
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
        """Stop claiming, hand back claims whose handler has not started, and let
        in-flight handlers finish within ``grace`` seconds.

        Calling it again with a smaller grace shortens the wait. With
        ``wait=True`` returns when the worker has stopped.
        """
        if grace is not None:
            grace = check_option_seconds(grace, "grace", allow_zero=True)
        table = self._table
        with table.lock:
            if not table.stopping:
                table.stopping = True
                table.stop_mono = self.clock.monotonic()
            if grace is not None:
                table.grace = min(table.grace, grace)
            table.changed.notify_all()
            table.work.notify_all()
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
        if wait and not self._runner.owns_current_thread():
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
        """A snapshot of the counters and the lateness and duration percentiles.

        O(buckets) and O(1) memory however many jobs ran (fixed-size histograms).
        """
        table = self._table
        with table.lock:
            return table.stats.snapshot(
                in_flight=len(table.records), prefetched=len(table.ready), abandoned=table.abandoned
            )

    def health_snapshot(self) -> WorkerHealth:
        """The facts a liveness check judges (see :class:`WorkerHealth`), read under
        the in-flight table's lock at one instant of the worker's clock."""
        table = self._table
        committer = self._committer
        backend = self._backend
        store = backend.health() if isinstance(backend, ReportsHealth) else {}  # no lock held
        with table.lock:
            stuck = dict(table.stuck_call)
            calling = committer.call_started
            if calling is not None:
                stuck["committer"] = calling
            renewed = min(
                (
                    rec.lease_deadline - self.lease
                    for rec in table.records.values()
                    if not (rec.lost or rec.abandoned)
                ),
                default=None,
            )
            return WorkerHealth(
                now=self.clock.monotonic(),
                lease=self.lease,
                in_flight=len(table.records),
                beats=dict(table.beats),
                stuck_calls=stuck,
                abandoned=table.abandoned,
                abandoned_cap=table.abandoned_cap,
                loop_blocked_since=table.loop_blocked_since,
                oldest_result_waiting=committer.oldest_waiting_locked(),
                least_recently_renewed=renewed,
                idle_wait=self.idle_wait,
                running=self.running,
                stopping=table.stopping,
                store=store,
            )

    # -- the dispatcher thread ------------------------------------------------
    def _main(self) -> None:
        dispatcher = self._dispatcher
        try:
            dispatcher.dispatch()
            self._draining.set()
            dispatcher.return_ready()
            dispatcher.drain()
        except BaseException as exc:
            log.exception("delayq worker crashed")
            self._crash = exc
        finally:
            self._draining.set()
            self._runner.shutdown()
            self._done.set()
