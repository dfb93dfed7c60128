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
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import os
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeVar

from delayq._validate import (
    MAX_ATTEMPTS,
    MAX_DELAY,
    check_datetime,
    check_duration,
    check_int,
    check_job_id,
    check_limit,
    check_list_cursor,
    check_option_seconds,
    utf8_problem,
)
from delayq.backends import Backend, open_backend
from delayq.backoff import Backoff, ExponentialBackoff, ScheduleBackoff, backoff_from_spec
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.codec import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload
from delayq.errors import ConfigurationError, InvalidDelay, InvalidInput, InvalidOption
from delayq.job import (
    DEFAULT_MAX_ATTEMPTS,
    CancelOutcome,
    EnqueueOutcome,
    Job,
    JobSpec,
    JobState,
    Misfire,
    OnConflict,
    RescheduleOutcome,
    Stats,
    check_on_conflict,
)
from delayq.recurring import TICK_HANDLER, Schedule
from delayq.recurring_manager import RecurringSchedules

__all__ = ["MAX_DELAY", "URL_ENV", "DelayQ", "Handler", "JobContext", "ProducerHook"]

log = logging.getLogger("delayq.app")

URL_ENV = "DELAYQ_URL"
"""Environment variable read by ``DelayQ()`` (and the CLI) when no URL is given."""

MAX_NAME_LENGTH = 200

F = TypeVar("F", bound=Callable[..., Any])

BackoffArg = Backoff | Mapping[str, Any] | str | Sequence[float] | None
MisfireArg = Misfire | str | float | int | None
WhenArg = datetime | float | int

_SCHEDULE_KEYS = frozenset(
    {"name", "payload", "delay", "at", "job_id", "max_attempts", "backoff", "misfire"}
)


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


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a handler knows about the run it is part of.

    ``id`` is the idempotency key: at-least-once delivery means a handler may
    see the same id again (after a crash or an expired lease). Times are epoch
    seconds on the backend's clock.
    """

    id: str
    name: str
    attempt: int  # 1 for the first run
    max_attempts: int
    run_at: float  # when the job was due
    claimed_at: float  # when this attempt was claimed
    lease_until: float
    created_at: float

    @property
    def lateness(self) -> float:
        """Seconds between the due time and the claim of this attempt."""
        return self.claimed_at - self.run_at

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now sends the job to the dead-letter set."""
        return self.attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler and how to call it (decided once, at registration).

    ``takes_context`` is true when the function accepts a second positional
    argument: it is then called as ``fn(payload, ctx)``, else as ``fn(payload)``.
    ``timeout`` (seconds, None for the worker's default) bounds one attempt.
    """

    name: str
    fn: Callable[..., Any]
    is_async: bool
    takes_context: bool
    timeout: float | None = None

    def call(self, payload: Any, ctx: JobContext) -> Any:
        """Call the function (returns a coroutine for an async handler)."""
        if self.takes_context:
            return self.fn(payload, ctx)
        return self.fn(payload)


def _check_name(value: object, field: str = "name") -> str:
    if not isinstance(value, str):
        raise InvalidOption(f"{field} must be a str, got {type(value).__name__}")
    problem = _name_problem(value)
    if problem is not None:
        raise InvalidOption(f"{field} {problem}")
    return value


@functools.lru_cache(maxsize=4096)  # names repeat and scheduling is hot
def _name_problem(value: str) -> str | None:
    if not value.strip():
        return f"must be a non-empty handler name, got {value!r}"
    if len(value) > MAX_NAME_LENGTH:
        return f"is {len(value)} characters; at most {MAX_NAME_LENGTH} are allowed"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return f"must not contain control characters, got {value!r}"
    return utf8_problem(value)


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for an async function, a callable instance with an async ``__call__``,
    or a sync wrapper (``functools.wraps``) around either: such a wrapper returns
    the coroutine, which the worker must await, not drop."""
    try:
        inner = inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ cycle
        inner = fn
    for candidate in (fn, inner) if inner is not fn else (fn,):
        if inspect.iscoroutinefunction(candidate):
            return True
        call = getattr(type(candidate), "__call__", None)  # noqa: B004 - callable instances
        if call is not None and inspect.iscoroutinefunction(call):
            return True
    return False


def _takes_context(name: str, fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"handler {name!r}: cannot read the signature of {fn!r}; wrap it in a function "
            f"taking (payload) or (payload, ctx)"
        ) from exc
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    required = [p for p in positional if p.default is p.empty]
    required_kw = [
        p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if len(required) > 2 or required_kw or (not positional and not var_positional):
        raise ConfigurationError(
            f"handler {name!r}: {getattr(fn, '__qualname__', fn)!r}{sig} must accept "
            f"(payload) or (payload, ctx)"
        )
    return len(positional) >= 2 or var_positional


def _id_prefix(now: float) -> str:
    return f"{int(now * 1_000_000) & (1 << 56) - 1:014x}"


def _new_id(now: float) -> str:
    """A new job id: 32 hex digits, the creation time in microseconds then 72 random bits.

    Like a ULID, ids sort by creation time, so a store's id index grows at its
    end instead of splitting random pages (much faster inserts into big tables).
    """
    return _id_prefix(now) + os.urandom(9).hex()


class _BatchIds:
    """New job ids for one ``schedule_many`` call: the ids of :func:`_new_id`, with
    the time prefix computed once (one ``now`` per batch) and the random bits
    read from the OS 256 ids at a time instead of one system call per id."""

    __slots__ = ("_hex", "_pos", "_prefix")

    _CHUNK = 256 * 18  # hex digits: 256 ids of 72 random bits

    def __init__(self, now: float) -> None:
        self._prefix = _id_prefix(now)
        self._hex = ""
        self._pos = 0

    def next(self) -> str:
        pos = self._pos
        if pos >= len(self._hex):
            self._hex = os.urandom(self._CHUNK // 2).hex()
            pos = 0
        self._pos = pos + 18
        return self._prefix + self._hex[pos : pos + 18]


_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_PLAIN_DEPTH = 100
_encode_plain = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
).encode


def _is_plain(value: object, depth: int = 0) -> bool:
    """True when ``value`` is built only of the exact types dict (with str keys),
    list, tuple, str, int, float, bool and None, at most ``_PLAIN_DEPTH`` deep.

    Such a payload needs no checking walk: ``json`` encodes it exactly as
    :func:`~delayq.codec.encode_payload` would, and only a NaN or infinity can
    still fail (``allow_nan=False`` raises). The type checks run in C (sets of
    ``type`` over a container), so a flat dict costs about a microsecond.
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth >= _PLAIN_DEPTH:
        return False
    items: Iterable[object]
    if kind is dict:
        if not _STR.issuperset(map(type, value)):  # type: ignore[call-overload]
            return False
        items = value.values()  # type: ignore[attr-defined]
    elif kind is list or kind is tuple:
        items = value  # type: ignore[assignment]
    else:
        return False
    if _SCALARS.issuperset(map(type, items)):
        return True
    return all(_is_plain(item, depth + 1) for item in items)


_IMMUTABLE_OPTIONS = (str, int, float, Misfire, ExponentialBackoff, ScheduleBackoff)


def _parsed(
    cache: dict[int, tuple[object, Any]] | None, value: object, parse: Callable[[object], Any]
) -> Any:
    """``parse(value)``, remembered in ``cache`` (one batch) by the identity of an
    immutable ``value``: the cache holds the value itself, so its id is not reused."""
    if cache is None or not isinstance(value, _IMMUTABLE_OPTIONS):
        return parse(value)
    hit = cache.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    result = parse(value)
    cache[id(value)] = (value, result)
    return result


class DelayQ:
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
        self._closed = False
        self._recurring = RecurringSchedules(self, rng=rng)

    # -- handlers -----------------------------------------------------------
    def handler(
        self, name: str, *, replace: bool = False, timeout: float | None = None
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
        """
        _check_name(name)
        if timeout is not None:
            check_option_seconds(timeout, "timeout")

        def register(fn: F) -> F:
            self.register(name, fn, replace=replace, timeout=timeout)
            return fn

        return register

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        replace: bool = False,
        timeout: float | None = None,
    ) -> Handler:
        """Register ``fn`` under ``name`` (the non-decorator form of :meth:`handler`)."""
        _check_name(name)
        if timeout is not None:
            timeout = check_option_seconds(timeout, "timeout")
        if name == TICK_HANDLER:
            raise ConfigurationError(f"{TICK_HANDLER!r} is the built-in handler of recurring ticks")
        if not callable(fn):
            raise ConfigurationError(f"handler {name!r} must be callable, got {fn!r}")
        entry = Handler(
            name=name,
            fn=fn,
            is_async=_is_async_callable(fn),
            takes_context=_takes_context(name, fn),
            timeout=timeout,
        )
        with self._lock:
            if name in self._handlers and not replace:
                raise ConfigurationError(
                    f"a handler is already registered as {name!r}; pass replace=True to swap it"
                )
            self._handlers[name] = entry
        return entry

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
        on_conflict: OnConflict = "reject",
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: MisfireArg = None,
        connection: object = None,
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

        ``misfire`` decides what happens when the job is claimed late:
        ``"run"`` (the default) runs it however late; ``"skip"`` skips it when it
        is claimed more than 1 second after its due time *for any reason*, so it
        also skips jobs that are late only because the workers are busy (a
        backlog), not just after downtime; a number of seconds (``misfire=300``)
        skips only jobs later than that, which is the way to skip what piled up
        while no worker ran without dropping jobs that merely waited in a queue.
        A skipped job ends as ``SKIPPED`` with a note saying how late it was.

        ``connection`` (PostgreSQL only: a psycopg connection, or a SQLAlchemy
        ``Connection`` / ``Session``) writes the job inside that connection's
        transaction: it exists if and only if the caller's transaction commits.
        """
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
        )
        if self._hooks or connection is not None:
            return self._store([spec], policy, connection)[0][0].id
        self._backend.enqueue([spec], on_conflict=policy)
        return spec.id

    def schedule_many(
        self, jobs: Iterable[Mapping[str, Any]], *, on_conflict: OnConflict = "reject"
    ) -> list[str]:
        """Schedule a batch atomically (one transaction); return the ids in order.

        Each item is a mapping of :meth:`schedule`'s arguments (``name``,
        ``payload``, ``delay`` or ``at`` or neither for "now", ``job_id``, ``max_attempts``,
        ``backoff``, ``misfire``). Every item is validated before anything is
        stored; an error names the item (``jobs[3]: ...``).
        """
        policy = check_on_conflict(on_conflict)
        now = self.clock.time()
        specs: list[JobSpec] = []
        seen: set[str] = set()
        ids = _BatchIds(now)
        options: dict[int, tuple[object, Any]] = {}  # parsed backoff / misfire, by identity
        for i, item in enumerate(jobs):
            try:
                if type(item) is not dict and not isinstance(item, Mapping):
                    raise InvalidOption(
                        f"each job must be a mapping of schedule() arguments, "
                        f"got {type(item).__name__}"
                    )
                if not _SCHEDULE_KEYS.issuperset(item):
                    unknown = set(item) - _SCHEDULE_KEYS
                    raise InvalidOption(
                        f"unknown key(s) {sorted(unknown)}; accepted: {sorted(_SCHEDULE_KEYS)}"
                    )
                if "name" not in item:
                    raise InvalidOption("missing the handler 'name'")
                spec = self._build(
                    item["name"],
                    item.get("payload"),
                    delay=item.get("delay"),
                    at=item.get("at"),
                    job_id=item.get("job_id"),
                    max_attempts=item.get("max_attempts"),
                    backoff=item.get("backoff"),
                    misfire=item.get("misfire"),
                    now=now,
                    ids=ids,
                    options=options,
                )
                if spec.id in seen:
                    raise InvalidOption(f"job_id {spec.id!r} appears more than once in the batch")
            except InvalidInput as exc:
                raise type(exc)(f"jobs[{i}]: {exc}") from exc
            seen.add(spec.id)
            specs.append(spec)
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
            now=self.clock.time(),
        )

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a scheduled job: cancelled, running, finished or not found."""
        job_id = check_job_id(job_id)
        outcome = self._backend.cancel(job_id)
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

    # -- recurring schedules -------------------------------------------------
    def recurring(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        payload: Any = None,
        handler: str | None = None,
        start: WhenArg | None = None,
        end: WhenArg | None = None,
        jitter: float | timedelta = 0,
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: str = "latest",
    ) -> Schedule:
        """Store a recurring schedule (or change the stored one to this definition).

        Give exactly one of ``cron`` (a cron expression, evaluated in ``tz``, a
        ``zoneinfo`` name) or ``every`` (seconds or a ``timedelta``, at least 1
        s). Each occurrence runs handler ``handler`` (default: ``name``) with
        ``payload`` as an ordinary job with id ``<name>@<UTC time>`` and the job
        options ``max_attempts`` / ``backoff``; ``jitter`` delays each one by a
        random 0..jitter seconds. ``start`` / ``end`` bound the occurrences.
        ``misfire`` decides what runs after downtime: ``"latest"`` (the latest
        missed occurrence, once), ``"skip"`` (none) or ``"catchup:N"`` (the last
        N). Calling it again with the same definition changes nothing (call it
        at every start-up); a paused schedule stays paused. Needs a store with
        the ``recurring`` feature. See :mod:`delayq.recurring`.
        """
        return self._recurring.add(
            name,
            cron=cron,
            every=every,
            tz=tz,
            payload=payload,
            handler=handler,
            start=start,
            end=end,
            jitter=jitter,
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
        )

    def recurring_schedules(self) -> list[Schedule]:
        """Every stored schedule, by name (``schedule.next_run(now)`` says when next)."""
        return self._recurring.list_schedules()

    def get_recurring(self, name: str) -> Schedule | None:
        """The stored schedule named ``name``, or None."""
        return self._recurring.get(name)

    def update_recurring(self, name: str, **changes: Any) -> Schedule:
        """Change some of a stored schedule's fields (``recurring``'s arguments)."""
        return self._recurring.update(name, **changes)

    def pause_recurring(self, name: str) -> bool:
        """Stop a schedule's occurrences until resumed; False when there is none."""
        return self._recurring.pause(name)

    def resume_recurring(self, name: str) -> bool:
        """Resume from the next occurrence (none of the paused ones); False when none.
        On a schedule that is not paused it restarts a chain that stopped (a
        dead-lettered tick)."""
        return self._recurring.resume(name)

    def remove_recurring(self, name: str) -> bool:
        """Delete a schedule: no later occurrence starts; False when there was none."""
        return self._recurring.remove(name)

    @functools.cached_property
    def _recurring_tick(self) -> Handler:
        return Handler(TICK_HANDLER, self._recurring.run_tick, is_async=False, takes_context=True)

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
    ) -> list[Job]:
        """Jobs (optionally of one state, handler ``name``, due within a window) in
        due-time order; ``after=(job.run_at, job.id)`` of a page's last job gives
        the next page (keyset pagination, see ``Backend.list_jobs``)."""
        if state is not None:
            try:
                state = JobState(state)
            except ValueError:
                known = ", ".join(s.value for s in JobState)
                raise InvalidOption(f"state must be one of {known}; got {state!r}") from None
        extra: dict[str, Any] = {}  # only when given: a store may predate these two
        if name is not None:
            extra["name"] = _check_name(name)
        if after is not None:
            extra["after"] = self._cursor(after)
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

    def dead_letters(self, *, limit: int = 100) -> list[Job]:
        """Dead jobs with their last error, most recently buried first."""
        return self._backend.dead_letters(limit=check_limit(limit))

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

    # -- validation ---------------------------------------------------------
    def _build(
        self,
        name: object,
        payload: Any,
        *,
        delay: Any,
        at: Any,
        job_id: Any,
        max_attempts: Any,
        backoff: Any,
        misfire: Any,
        now: float,
        ids: _BatchIds | None = None,
        options: dict[int, tuple[object, Any]] | None = None,
    ) -> JobSpec:
        """Validate one job into a spec (checks in this order: id, name, payload,
        due time, max_attempts, backoff, misfire).

        ``ids`` and ``options`` speed up a batch: ids drawn from one source, and
        backoff / misfire values that are the very same immutable object as an
        earlier item's parsed only once.
        """
        if delay is None and at is None:
            delay = 0.0  # neither: due now, on the store's clock like any delay
        if job_id is not None:
            job_id = check_job_id(job_id)
        elif ids is not None:
            job_id = ids.next()
        else:
            job_id = _new_id(now)
        return JobSpec(
            id=job_id,
            name=_check_name(name),
            payload=self._encode(payload),
            run_at=(run_at := self._run_at(delay, at, now)),
            max_attempts=(
                self._default_max_attempts
                if max_attempts is None
                else self._check_max_attempts(max_attempts)
            ),
            backoff=(
                self._default_backoff
                if backoff is None
                else _parsed(options, backoff, self._backoff_spec)
            ),
            misfire=(
                self._default_misfire
                if misfire is None
                else _parsed(options, misfire, self._misfire_spec)
            ),
            created_at=now,
            # delay= is relative on the STORE's clock (a skewed producer clock
            # must not move it); run_at is then only this host's estimate.
            delay=None if at is not None else run_at - now,
        )

    def _encode(self, payload: Any) -> str:
        """``payload`` as compact JSON text, size-checked.

        Plain JSON data (the usual case) is encoded at once without the checking
        walk of :func:`~delayq.codec.encode_payload`, which gives the same text;
        anything else, and every error, takes that checked path, so bad input
        gets the same message naming what is wrong.
        """
        if _is_plain(payload):
            try:
                text = _encode_plain(payload)
            except ValueError:
                pass  # NaN or infinity: the checked path names where
            else:
                limit = self.max_payload_bytes
                if text.isascii():  # O(1): a flag of the str
                    if len(text) <= limit:
                        return text
                else:
                    try:
                        if len(text.encode("utf-8")) <= limit:
                            return text
                    except UnicodeEncodeError:
                        pass  # a lone surrogate: the checked path names where
        return encode_payload(payload, max_bytes=self.max_payload_bytes)

    def _run_at(self, delay: object, at: object, now: float) -> float:
        if at is None and (type(delay) is float or (type(delay) is int and -1e300 < delay < 1e300)):
            # The hot path (a plain number of seconds); anything unusual below.
            seconds = float(delay)
            if math.isfinite(seconds) and seconds <= MAX_DELAY:
                return now + max(0.0, seconds)
        if (delay is None) == (at is None):
            raise InvalidOption(
                "give exactly one of delay= (seconds from now) or at= (an aware datetime or "
                "epoch seconds)"
            )
        if delay is not None:
            seconds = check_duration(delay, "delay")
            if seconds > MAX_DELAY:
                raise InvalidDelay(
                    f"delay must be at most {MAX_DELAY:.0f} seconds (100 years), got {delay!r}"
                )
            # A delay <= 0 means "due now"; clamping keeps FIFO order among such jobs.
            return now + max(0.0, seconds)
        when = check_datetime(at, "at")
        if when - now > MAX_DELAY:
            raise InvalidDelay(f"at must be within 100 years from now, got {at!r}")
        # A past due time means "due now" (not "overdue": that would trip misfire policies).
        return max(now, when)

    @staticmethod
    def _check_max_attempts(value: object) -> int:
        return check_int(value, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS)

    @staticmethod
    def _id_list(job_ids: object) -> Iterable[object]:
        """``job_ids`` as an iterable of ids; a bare str is refused, not split into
        characters (``purge_dead(job_ids="order-17")`` would purge ids "o", "r", ...)."""
        if isinstance(job_ids, str | bytes):
            one = job_ids if isinstance(job_ids, str) else job_ids.decode("utf-8", "replace")
            raise InvalidOption(
                f"job_ids must be a list of ids, got the {type(job_ids).__name__} "
                f"{job_ids!r}; for one id write job_ids=[{one!r}]"
            )
        if not isinstance(job_ids, Iterable):
            raise InvalidOption(
                f"job_ids must be a list of ids, got {type(job_ids).__name__} {job_ids!r}"
            )
        return job_ids

    @staticmethod
    def _cursor(after: object) -> tuple[float, str] | None:
        cursor = check_list_cursor(after)
        return None if cursor is None else (cursor[0], check_job_id(cursor[1]))

    @staticmethod
    def _backoff_spec(value: object) -> dict[str, Any]:
        if not isinstance(value, Backoff | Mapping | str | list | tuple) and value is not None:
            raise InvalidOption(
                f"backoff must be a Backoff policy, a spec dict, '2s,5s,10s,20s' or a list of "
                f"seconds; got {value!r}"
            )
        try:
            policy = backoff_from_spec(value)
            spec = policy.to_spec()
            backoff_from_spec(spec)  # a worker must be able to read it back
        except InvalidInput as exc:
            raise InvalidOption(f"backoff: {exc}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidOption(
                f"backoff must be a Backoff policy, a spec dict, '2s,5s,10s,20s' or a list of "
                f"seconds; got {value!r}"
            ) from exc
        return spec

    @staticmethod
    def _misfire_spec(value: object) -> str:
        return Misfire.parse(value).to_spec()  # type: ignore[arg-type]
