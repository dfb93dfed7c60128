"""The DelayQ app: a handler registry plus schedule / cancel / reschedule / inspect.

``DelayQ`` is what producers and workers share::

    app = DelayQ("sqlite:///jobs.db")

    @app.handler("order.cancel")
    def cancel_unpaid(payload, ctx):          # or def cancel_unpaid(payload)
        ...

    job_id = app.schedule("order.cancel", {"order": 42}, delay=30 * 60)
    app.cancel(job_id)                        # -> CancelOutcome.CANCELLED

Every input is validated at the call that received it (a clear error naming
the field, nothing stored); the store only ever sees a :class:`JobSpec`.

A producer does not need to import the handlers: scheduling a name that is not
registered in this process is allowed, and a worker that does not know the
name dead-letters the job with that reason (only registered names ever run).

The checks of job arguments live in :mod:`delayq._build`; this module is the
public surface (registry, producers, inspection, lifecycle); the recurring
schedules' methods are a base class in :mod:`delayq._recurring_app`.
"""

from __future__ import annotations

import inspect
import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

from delayq._build import (
    BackoffArg,
    JobBuilder,
    MisfireArg,
    WhenArg,
    check_name,
    is_async_callable,
    takes_context,
)
from delayq._commit_app import AppCommitHook
from delayq._limits import AppLimits
from delayq._recurring_app import AppRecurring
from delayq._results_app import AppResults
from delayq._validate import (
    MAX_DELAY,
    check_datetime,
    check_duration,
    check_int,
    check_job_id,
    check_limit,
    check_option_seconds,
    check_payload_at,
    check_payload_contains,
    check_preview,
)
from delayq.backends import Backend, open_backend
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.codec import DEFAULT_MAX_PAYLOAD_BYTES
from delayq.errors import ConfigurationError, InvalidOption, Unsupported
from delayq.job import (
    DEFAULT_MAX_ATTEMPTS,
    CancelOutcome,
    EnqueueOutcome,
    Handler,
    Job,
    JobContext,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    Stats,
    check_on_conflict,
)
from delayq.keyed import KeyedMode, KeyedResult, KeyPolicy, Unique
from delayq.recurring.model import TICK_HANDLER
from delayq.recurring.schedules import RecurringSchedules
from delayq.results import finished_jobs
from delayq.task import Task

__all__ = [
    "MAX_DELAY",
    "URL_ENV",
    "BackoffArg",
    "DelayQ",
    "Handler",
    "JobContext",
    "MisfireArg",
    "ProducerHook",
    "WhenArg",
]

log = logging.getLogger("delayq.app")

URL_ENV = "DELAYQ_URL"
"""Environment variable read by ``DelayQ()`` (and the CLI) when no URL is given."""

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


class ProducerHook(Protocol):
    """Sees what a :class:`DelayQ` stores and cancels: metrics, tracing.

    ``before_enqueue`` may return annotated specs (same ids, same names); an
    error there stores nothing. ``after_enqueue`` and ``after_cancel`` run once
    the store answered; an error there is logged, never raised, because the
    job is stored (or cancelled) whatever the observer thinks.
    """

    def before_enqueue(self, specs: list[JobSpec]) -> list[JobSpec]: ...

    def after_enqueue(
        self, specs: Sequence[JobSpec], outcomes: Sequence[EnqueueOutcome]
    ) -> None: ...

    def after_cancel(self, job_id: str, outcome: CancelOutcome) -> None: ...


class DelayQ(JobBuilder, AppLimits, AppRecurring, AppResults, AppCommitHook):
    """Schedule durable delayed jobs and register the handlers that run them.

    ``url`` names the store (``sqlite:///jobs.db``, ``memory://``,
    ``redis://host/0``); when it is None, ``$DELAYQ_URL`` is used, else a SQLite
    file ``delayq.db`` in the working directory. Alternatively pass an opened
    ``backend=`` (the app then does not close it). ``backend_options`` go to the
    store (``synchronous="FULL"``, ``result_ttl=...``).

    ``max_attempts``, ``backoff`` and ``misfire`` are the defaults for jobs
    scheduled through this app; each ``schedule`` call may override them. They
    are stored with the job, so a worker always uses the policy the job was
    scheduled with.

    ``rng`` draws the jitter of recurring schedules' occurrences (pass a seeded
    ``random.Random`` to make it exact in tests); see :meth:`recurring`.

    Thread-safe: ``_lock`` guards ``_handlers`` (registration); everything else
    is immutable after construction or delegated to the thread-safe backend.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        backend: Backend | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: BackoffArg = None,
        misfire: MisfireArg = "run",
        rng: random.Random | None = None,
        **backend_options: Any,
    ) -> None:
        check_int(max_payload_bytes, "max_payload_bytes", minimum=1)
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self._default_max_attempts = self._check_max_attempts(max_attempts)
        self._default_backoff = self._backoff_spec(backoff)
        self._default_misfire = self._misfire_spec(misfire)
        self._lock = threading.Lock()
        self._handlers: dict[str, Handler] = {}
        self._hooks: tuple[ProducerHook, ...] = ()  # replaced whole, read without the lock
        if backend is not None:
            if url is not None or backend_options:
                raise ConfigurationError(
                    "give either a url (with backend options) or an opened backend=, not both"
                )
            if not isinstance(backend, Backend):
                raise ConfigurationError(
                    f"backend= must implement the delayq Backend protocol, got {backend!r}"
                )
            self._backend = backend
            self._owns_backend = False
        else:
            if url is None:
                url = os.environ.get(URL_ENV) or None
            try:
                self._backend = open_backend(url, clock=clock, **backend_options)
            except TypeError as exc:
                # A misspelt option (synchronus=) reaches the store's constructor.
                unknown = [k for k in backend_options if f"'{k}'" in str(exc)]
                if "unexpected keyword argument" not in str(exc) or not unknown:
                    raise
                raise ConfigurationError(
                    f"unknown store option {unknown[0]!r} for {url or 'the default store'}: {exc}"
                ) from exc
            self._owns_backend = True
        self._no_flow_control = (
            None if "flow_control" in self._backend.features else self._backend.url
        )
        self._closed = False
        self._recurring = RecurringSchedules(self, rng=rng)

    # -- handlers -----------------------------------------------------------
    def handler(
        self,
        name: str,
        *,
        replace: bool = False,
        timeout: float | None = None,
        store_result: bool = False,
    ) -> Callable[[F], F]:
        """Register the decorated function (sync or async) under ``name``.

        The function is called as ``fn(payload)`` or, when it accepts a second
        positional argument, ``fn(payload, ctx)`` with a :class:`JobContext`.
        Registering a name twice is an error unless ``replace=True``.

        An async function stays async behind a sync decorator that uses
        ``functools.wraps`` (it runs on the worker's event loop); whatever a
        handler returns that is awaitable is awaited before the job counts as
        succeeded.

        ``timeout`` (seconds) bounds one attempt; past it the attempt counts as
        failed and is retried by the job's backoff (the worker's ``timeout``
        applies when it is None). An async handler is cancelled; a sync one
        cannot be interrupted: its thread is left to it and its late result
        is ignored.

        ``store_result=True`` keeps the return value (JSON data) with the job's
        finished record, for :meth:`result` (see :mod:`delayq.results`).
        """
        check_name(name)
        if timeout is not None:
            check_option_seconds(timeout, "timeout")

        def register(fn: F) -> F:
            self.register(name, fn, replace=replace, timeout=timeout, store_result=store_result)
            return fn

        return register

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        replace: bool = False,
        timeout: float | None = None,
        store_result: bool = False,
    ) -> Handler:
        """Register ``fn`` under ``name`` (the non-decorator form of :meth:`handler`)."""
        check_name(name)
        if timeout is not None:
            timeout = check_option_seconds(timeout, "timeout")
        if store_result:
            self._check_results(f"the results of handler {name!r}")
        if name == TICK_HANDLER:
            raise ConfigurationError(f"{TICK_HANDLER!r} is the built-in handler of recurring ticks")
        if not callable(fn):
            raise ConfigurationError(f"handler {name!r} must be callable, got {fn!r}")
        entry = Handler(
            name=name,
            fn=fn,
            is_async=is_async_callable(fn),
            takes_context=takes_context(name, fn),
            timeout=timeout,
            store_result=bool(store_result),
        )
        with self._lock:
            if name in self._handlers and not replace:
                raise ConfigurationError(
                    f"a handler is already registered as {name!r}; pass replace=True to swap it"
                )
            self._handlers[name] = entry
        return entry

    def task(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: MisfireArg = None,
        store_result: bool = False,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register the decorated function as a typed :class:`~delayq.task.Task`.

        ``name`` defaults to ``module.qualname``; fix it to keep jobs running
        across a rename. The job options are the defaults of its jobs.
        ``store_result=True`` keeps each job's return value (see
        :mod:`delayq.results`): ``task.schedule(...).result()``.
        """
        options = {"max_attempts": max_attempts, "backoff": backoff, "misfire": misfire}
        options = {k: v for k, v in options.items() if v is not None}

        def register(fn: Callable[P, R]) -> Task[P, R]:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            return Task(self, fn, task_name, timeout=timeout, store_result=store_result, **options)

        return register

    @property
    def handlers(self) -> Mapping[str, Handler]:
        """A read-only snapshot of the registered handlers by name."""
        with self._lock:
            return MappingProxyType(dict(self._handlers))

    def get_handler(self, name: str) -> Handler | None:
        """The handler registered under ``name``, or None."""
        with self._lock:
            found = self._handlers.get(name)
        if found is None and name == TICK_HANDLER:  # built in: recurring schedules' ticks
            return self._recurring_tick
        return found

    # -- producers ----------------------------------------------------------
    def schedule(
        self,
        name: str,
        payload: Any = None,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
        job_id: str | None = None,
        on_conflict: OnConflict | KeyedMode = "reject",
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: MisfireArg = None,
        key: str | None = None,
        priority: int = 0,
        group: str | None = None,
        connection: object = None,
        max_wait: float | None = None,
        window: float | None = None,
        trailing: bool | None = None,
        unique: Unique | None = None,
        max_items: int | None = None,
        on_commit: bool = False,
    ) -> str:
        """Schedule handler ``name`` to run with ``payload``; return the job id.

        Give at most one of ``delay`` (seconds or a ``timedelta``; <= 0 means
        now) or ``at`` (an aware ``datetime`` or epoch seconds; a past time means
        now); with neither, the job is due now. ``job_id`` makes scheduling
        idempotent: an existing id is rejected
        (:class:`~delayq.errors.JobConflict`), kept (``on_conflict="keep"``) or
        replaced (``"replace"``, e.g. to debounce). ``payload`` must be JSON data.

        The returned id is the same whether the job was created, kept or
        replaced. To learn which, build the job and store it yourself:
        ``[outcome] = app.enqueue([app.build(name, payload, ...)], on_conflict="keep")``
        gives an :class:`~delayq.job.EnqueueOutcome` (``CREATED``, ``KEPT``,
        ``REPLACED``).

        ``misfire`` decides what happens when the job starts late:
        ``"run"`` (the default) runs it however late; ``"skip"`` skips it when its
        handler would start more than 1 second after its due time *for any reason*
        (a wait for a free slot after the claim included), so it
        also skips jobs that are late only because the workers are busy (a
        backlog), not just after downtime; a number of seconds (``misfire=300``)
        skips only jobs later than that, which is the way to skip what piled up
        while no worker ran without dropping jobs that merely waited in a queue.
        A skipped job ends as ``SKIPPED`` with a note saying how late it was.

        Flow control (stores with the ``flow_control`` feature): ``key`` puts the
        job under the limits declared for that key with :meth:`limit`
        (concurrency, rate); ``priority`` (an int, higher first) orders it among
        the due jobs; ``group`` gives it a fair share: due jobs of different
        groups are claimed in turn, so one group's backlog cannot starve the
        others. They never make a job run before it is due.

        ``connection`` (PostgreSQL only: a psycopg connection, a SQLAlchemy
        ``Connection`` / ``Session``, or Django's ``django.db.connection``) writes
        the job inside that connection's transaction: it exists if and only if the
        caller's transaction commits.

        Keyed calls (stores with the ``keyed`` feature; ``job_id`` is the key,
        see :mod:`delayq.keyed` and :meth:`schedule_keyed` for the outcome):
        ``on_conflict="debounce", max_wait=60``; ``"throttle", window=10``
        (``trailing=True``); ``unique="until_finished" | "until_started" |
        seconds`` with ``"keep"`` or ``"reject"``; ``"append", max_items=100``.
        The id returned is the job acted on (``key``, then ``key#2``...).

        ``on_commit=True`` stores the job only once the caller's database
        transaction commits (nothing when it rolls back), through the commit hook
        an integration installed (see :mod:`delayq._commit_app`); the arguments
        are checked and the id returned at once.
        """
        keyed = KeyPolicy.build(
            on_conflict,
            max_wait=max_wait,
            window=window,
            trailing=trailing,
            unique=unique,
            max_items=max_items,
        )
        if keyed is not None:
            if connection is not None or on_commit:
                raise InvalidOption("connection= and on_commit= do not apply to keyed calls")
            spec = self.build(
                name, payload, delay=delay, at=at, job_id=job_id, max_attempts=max_attempts,
                backoff=backoff, misfire=misfire, key=key, priority=priority, group=group,
            )  # fmt: skip
            return self._keyed(spec, keyed, job_id).id
        policy = check_on_conflict(on_conflict)
        spec = self.build(
            name,
            payload,
            delay=delay,
            at=at,
            job_id=job_id,
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
            key=key,
            priority=priority,
            group=group,
        )
        if on_commit:
            if connection is not None:
                raise InvalidOption("give connection= or on_commit=True, not both")
            return self._enqueue_on_commit(spec, policy)
        if self._hooks or connection is not None:
            return self._store([spec], policy, connection)[0][0].id
        self._backend.enqueue([spec], on_conflict=policy)
        return spec.id

    def schedule_keyed(
        self,
        name: str,
        payload: Any = None,
        *,
        job_id: str,
        on_conflict: OnConflict | KeyedMode,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
        max_wait: float | None = None,
        window: float | None = None,
        trailing: bool | None = None,
        unique: Unique | None = None,
        max_items: int | None = None,
        **options: Any,
    ) -> KeyedResult:
        """A keyed :meth:`schedule` that answers with a :class:`~delayq.keyed.KeyedResult`
        (the job id, ``CREATED`` / ``EXTENDED`` / ``CAPPED`` / ``KEPT`` / ``DROPPED``
        / ``FOLDED`` / ``APPENDED``, and the due time)."""
        keyed = KeyPolicy.build(
            on_conflict,
            max_wait=max_wait,
            window=window,
            trailing=trailing,
            unique=unique,
            max_items=max_items,
        )
        if keyed is None:
            raise InvalidOption(
                f"schedule_keyed needs a keyed mode: on_conflict 'debounce', 'throttle' or "
                f"'append', or unique= with 'keep' / 'reject'; got on_conflict={on_conflict!r}"
            )
        spec = self.build(name, payload, delay=delay, at=at, job_id=job_id, **options)
        return self._keyed(spec, keyed, job_id)

    def _keyed(self, spec: JobSpec, keyed: KeyPolicy, job_id: str | None) -> KeyedResult:
        if job_id is None:
            raise InvalidOption(f"{keyed.mode} needs job_id= (the key its calls share)")
        if "#" in job_id:
            raise InvalidOption(
                f"a key must not contain '#' (it numbers the key's runs): {job_id!r}"
            )
        if "keyed" not in getattr(self._backend, "features", ()):
            raise InvalidOption(f"{self._backend.url} does not support keyed calls ({keyed.mode})")
        return self._backend.enqueue_keyed(spec, keyed)  # type: ignore[attr-defined,no-any-return]

    def schedule_many(
        self, jobs: Iterable[Mapping[str, Any]], *, on_conflict: OnConflict = "reject"
    ) -> list[str]:
        """Schedule a batch atomically (one transaction); return the ids in order.

        Each item is a mapping of :meth:`schedule`'s arguments (``name``,
        ``payload``, ``delay`` or ``at`` or neither for "now", ``job_id``, ``max_attempts``,
        ``backoff``, ``misfire``, ``key``, ``priority``, ``group``). Every item is
        validated before anything is stored; an error names the item (``jobs[3]: ...``).
        """
        policy = check_on_conflict(on_conflict)
        now = self.clock.time()
        specs = self._build_batch(jobs, now)
        if specs:
            specs = self._store(specs, policy)[0]
        return [s.id for s in specs]

    def enqueue(
        self, specs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """Store already-built specs (see :meth:`build`) and report each outcome."""
        return self._store(list(specs), check_on_conflict(on_conflict))[1]

    def add_hook(self, hook: ProducerHook) -> None:
        """Have ``hook`` see every enqueue and cancel of this app (see :class:`ProducerHook`)."""
        with self._lock:
            self._hooks = (*self._hooks, hook)

    def _store(
        self, specs: list[JobSpec], policy: OnConflict, connection: Any = None
    ) -> tuple[list[JobSpec], list[EnqueueOutcome]]:
        """Enqueue ``specs`` through the hooks (in the caller's transaction when
        ``connection`` is given); the specs stored and their outcomes."""
        hooks = self._hooks
        for hook in hooks:
            specs = hook.before_enqueue(specs)
        if connection is None:
            outcomes = self._backend.enqueue(specs, on_conflict=policy)
        elif "transactional_enqueue" in getattr(self._backend, "features", ()):
            outcomes = self._backend.enqueue(  # type: ignore[call-arg]
                specs, on_conflict=policy, connection=connection
            )
        else:
            raise InvalidOption(
                f"connection= joins a database transaction; {self._backend.url} cannot "
                f"(only stores with the 'transactional_enqueue' feature, like postgresql://)"
            )
        for hook in hooks:
            try:
                hook.after_enqueue(specs, outcomes)
            except Exception:
                log.exception("a producer hook failed after enqueue (the jobs are stored)")
        return specs, outcomes

    def build(
        self,
        name: str,
        payload: Any = None,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
        job_id: str | None = None,
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: MisfireArg = None,
        key: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> JobSpec:
        """Validate :meth:`schedule`'s arguments into a :class:`JobSpec` without storing it."""
        return self._build(
            name,
            payload,
            delay=delay,
            at=at,
            job_id=job_id,
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
            key=key,
            priority=priority,
            group=group,
            now=self.clock.time(),
        )

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a scheduled job: cancelled, running, finished or not found."""
        job_id = check_job_id(job_id)
        outcome = self._backend.cancel(job_id)
        if outcome.cancelled:
            finished_jobs(self._backend).notify([job_id])  # wakes a result() waiting for it
        for hook in self._hooks:
            try:
                hook.after_cancel(job_id, outcome)
            except Exception:
                log.exception("a producer hook failed after cancel (the outcome stands)")
        return outcome

    def reschedule(
        self,
        job_id: str,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
    ) -> RescheduleOutcome:
        """Move a scheduled job to a new due time (exactly one of ``delay`` / ``at``)."""
        job_id = check_job_id(job_id)
        now = self.clock.time()
        run_at = self._run_at(delay, at, now)
        if at is None:  # relative: due on the store's clock
            return self._backend.reschedule(job_id, delay=run_at - now)
        return self._backend.reschedule(job_id, run_at)

    # -- inspection and dead letters ----------------------------------------
    def get(self, job_id: str) -> Job | None:
        """The job (state, attempts, due time, last error, outcome) or None."""
        return self._backend.get(check_job_id(job_id))

    def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        due_after: WhenArg | None = None,
        due_before: WhenArg | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
        payload_contains: str | None = None,
        payload_at: tuple[str, object] | None = None,
    ) -> list[Job]:
        """Jobs (optionally of one state, handler ``name``, due within a window) in
        due-time order; ``after=(job.run_at, job.id)`` of a page's last job gives
        the next page (keyset pagination, see ``Backend.list_jobs``).

        ``preview=n`` lists a payload longer than ``n`` characters of JSON as a
        :class:`~delayq.job.PayloadPreview` (a store without it lists it whole).
        ``payload_contains`` (a substring of the payload's JSON) and
        ``payload_at=(path, value)`` (e.g. ``("$.customer.id", 42)``) search the
        payloads on a store with ``payload_search`` in its ``features`` (memory,
        SQLite, PostgreSQL); others raise :class:`~delayq.errors.Unsupported`."""
        if state is not None:
            try:
                state = JobState(state)
            except ValueError:
                known = ", ".join(s.value for s in JobState)
                raise InvalidOption(f"state must be one of {known}; got {state!r}") from None
        extra: dict[str, Any] = {}  # only when given: a store may predate these two
        if name is not None:
            extra["name"] = check_name(name)
        if after is not None:
            extra["after"] = self._cursor(after)
        if payload_contains is not None or payload_at is not None:
            check_payload_contains(payload_contains)
            check_payload_at(payload_at)
            if "payload_search" not in self._backend.features:
                raise Unsupported(
                    f"the {type(self._backend).__name__} store cannot search payloads "
                    "(it would read every payload to filter them); filter by handler "
                    "name, state or due time"
                )
            extra.update(payload_contains=payload_contains, payload_at=payload_at)
        if preview is not None:
            check_preview(preview)
            if "preview" in _parameters(self._backend.list_jobs):
                extra["preview"] = preview
        return self._backend.list_jobs(
            state=state,
            due_after=None if due_after is None else check_datetime(due_after, "due_after"),
            due_before=None if due_before is None else check_datetime(due_before, "due_before"),
            limit=check_limit(limit),
            **extra,
        )

    def stats(self) -> Stats:
        """Counts by state and the next due time."""
        return self._backend.stats()

    def dead_letters(self, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        """Dead jobs with their last error, most recently buried first; ``preview`` as
        in :meth:`list_jobs`."""
        extra: dict[str, Any] = {}
        if check_preview(preview) is not None and "preview" in _parameters(
            self._backend.dead_letters
        ):
            extra["preview"] = preview
        return self._backend.dead_letters(limit=check_limit(limit), **extra)

    def requeue(
        self,
        job_id: str,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
    ) -> bool:
        """Give a dead job a fresh set of attempts, due now (or at ``delay`` / ``at``).

        Returns False when there is no dead job with that id.
        """
        job_id = check_job_id(job_id)
        now = self.clock.time()
        run_at = now if delay is None and at is None else self._run_at(delay, at, now)
        if at is None:  # relative (or now): due on the store's clock
            return self._backend.requeue_dead(job_id, delay=run_at - now)
        return self._backend.requeue_dead(job_id, run_at)

    def purge_dead(
        self,
        *,
        job_ids: Sequence[str] | None = None,
        older_than: float | timedelta | None = None,
    ) -> int:
        """Delete dead jobs: all of them, those in ``job_ids``, or those dead for
        more than ``older_than`` seconds. Returns how many were deleted.

        ``job_ids`` is a list (any iterable) of ids; a bare str is refused with
        :class:`~delayq.errors.InvalidOption` rather than read as its characters
        (write ``job_ids=["order-17"]`` for one id).
        """
        ids = None if job_ids is None else [check_job_id(j) for j in self._id_list(job_ids)]
        cutoff = None
        if older_than is not None:
            age = check_duration(older_than, "older_than")
            if age < 0:
                raise InvalidOption(f"older_than must be >= 0 seconds, got {older_than!r}")
            cutoff = self.clock.time() - age
        return self._backend.purge_dead(job_ids=ids, older_than=cutoff)

    # -- lifecycle ----------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The store this app talks to."""
        return self._backend

    def swap_store(self, backend: Backend, clock: Clock) -> tuple[Backend, Clock]:
        """Talk to ``backend`` on ``clock`` from now on; return the store and clock
        this app used until now (to swap them back). For tests
        (:func:`delayq.testing.inline`); the app does not close either store."""
        if not isinstance(backend, Backend):
            raise ConfigurationError(
                f"backend must implement the delayq Backend protocol, got {backend!r}"
            )
        with self._lock:
            saved = (self._backend, self.clock)
            self._backend, self.clock = backend, clock
            self._no_flow_control = None if "flow_control" in backend.features else backend.url
        return saved

    @property
    def url(self) -> str:
        """The store's URL (credentials masked)."""
        return self._backend.url

    def close(self) -> None:
        """Close the store if this app opened it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_backend:
            self._backend.close()

    def __enter__(self) -> DelayQ:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"DelayQ({self._backend.url!r}, handlers={sorted(self._handlers)})"


def _parameters(method: Any) -> Mapping[str, Any]:
    """The parameters of a store's method (an older or third-party store may lack
    the newest keywords: they are passed only where it takes them)."""
    return inspect.signature(method).parameters
