"""The job model: value types shared by the app, the worker and every backend.

A job is "a handler name + a JSON payload, due at a time". Durable due times
are wall-clock epoch seconds on the deciding clock (the backend's).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from delayq._validate import check_seconds
from delayq.errors import InvalidOption

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "FINAL_STATES",
    "CancelOutcome",
    "Claim",
    "EnqueueOutcome",
    "Handler",
    "Job",
    "JobContext",
    "JobSpec",
    "JobState",
    "KeyInfo",
    "Misfire",
    "OnConflict",
    "PayloadPreview",
    "RescheduleOutcome",
    "Stats",
    "check_on_conflict",
    "occurrence_time",
]

DEFAULT_MAX_ATTEMPTS = 5

OnConflict = Literal["reject", "keep", "replace"]
_ON_CONFLICT = ("reject", "keep", "replace")


def check_on_conflict(value: object) -> OnConflict:
    if value not in _ON_CONFLICT:
        raise InvalidOption(
            f"on_conflict must be one of 'reject', 'keep', 'replace'; got {value!r}"
        )
    return value  # type: ignore[return-value]


class JobState(StrEnum):
    """Where a job is in its life."""

    SCHEDULED = "scheduled"  # waiting for its due time (or due and waiting for a worker)
    RUNNING = "running"  # claimed under a lease
    SUCCEEDED = "succeeded"  # handler returned
    DEAD = "dead"  # in the dead-letter set, with its last error
    CANCELLED = "cancelled"  # cancelled before it ran
    SKIPPED = "skipped"  # not run because of its misfire policy


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED, JobState.SKIPPED})


class CancelOutcome(StrEnum):
    """The definite answer of ``cancel(job_id)``.

    ``CANCELLED`` means no attempt of the job had ever started: nothing ran.
    ``CANCELLED_AFTER_ATTEMPT`` means it is cancelled now, but an earlier
    attempt had started (it failed and waited for a retry, or its worker lost
    the lease, so the store cannot know whether the handler ran). Test
    ``outcome.cancelled`` for "will not run again" and
    ``outcome.attempt_started`` for "may have run".
    """

    CANCELLED = "cancelled"  # cancelled; no attempt had started
    CANCELLED_AFTER_ATTEMPT = "cancelled_after_attempt"  # cancelled; an attempt had started
    RUNNING = "running"  # running under a live lease: not cancelled
    FINISHED = "finished"  # already finished (succeeded, dead, cancelled or skipped)
    NOT_FOUND = "not_found"

    @classmethod
    def done(cls, attempts: int) -> CancelOutcome:
        """The outcome of a cancel that took effect on a job with ``attempts`` started."""
        return cls.CANCELLED_AFTER_ATTEMPT if attempts > 0 else cls.CANCELLED

    @property
    def cancelled(self) -> bool:
        """The job is cancelled by this call: it will not run (again)."""
        return self is CancelOutcome.CANCELLED or self is CancelOutcome.CANCELLED_AFTER_ATTEMPT

    @property
    def attempt_started(self) -> bool:
        """An attempt had started before this cancel (its handler may have run)."""
        return self is CancelOutcome.CANCELLED_AFTER_ATTEMPT or self is CancelOutcome.RUNNING


class RescheduleOutcome(StrEnum):
    """The definite answer of ``reschedule(job_id, ...)`` (see :class:`CancelOutcome`)."""

    RESCHEDULED = "rescheduled"  # moved; no attempt had started
    RESCHEDULED_AFTER_ATTEMPT = "rescheduled_after_attempt"  # moved; an attempt had started
    RUNNING = "running"  # running under a live lease: not moved
    FINISHED = "finished"
    NOT_FOUND = "not_found"

    @classmethod
    def done(cls, attempts: int) -> RescheduleOutcome:
        """The outcome of a reschedule that took effect on a job with ``attempts`` started."""
        return cls.RESCHEDULED_AFTER_ATTEMPT if attempts > 0 else cls.RESCHEDULED

    @property
    def rescheduled(self) -> bool:
        """The job was moved by this call."""
        return (
            self is RescheduleOutcome.RESCHEDULED
            or self is RescheduleOutcome.RESCHEDULED_AFTER_ATTEMPT
        )

    @property
    def attempt_started(self) -> bool:
        """An attempt had started before this call (its handler may have run)."""
        return (
            self is RescheduleOutcome.RESCHEDULED_AFTER_ATTEMPT or self is RescheduleOutcome.RUNNING
        )


class EnqueueOutcome(StrEnum):
    """What ``enqueue`` did with one job."""

    CREATED = "created"
    KEPT = "kept"  # on_conflict="keep": the existing job was left as it was
    REPLACED = "replaced"  # on_conflict="replace": the existing job was overwritten


@dataclass(frozen=True, slots=True)
class Misfire:
    """What to do with a job found overdue (after downtime) when its handler would start.

    ``Misfire.parse("run")`` always runs it, ``"skip"`` never runs an overdue
    job, and a number of seconds (or ``"grace:30"``) runs it only if it is at
    most that late. A job counts as overdue when its handler would start more
    than ``grace`` seconds after its due time; ``"skip"`` uses a 1-second grace so
    ordinary scheduling latency never skips a job.
    """

    policy: Literal["run", "skip", "grace"] = "run"
    grace: float | None = None

    SKIP_GRACE = 1.0

    @classmethod
    def parse(cls, value: Misfire | str | float | int | None) -> Misfire:
        if value is None:
            return cls()
        if isinstance(value, Misfire):
            return value
        if isinstance(value, str):
            if value == "run":
                return cls("run")
            if value == "skip":
                return cls("skip", cls.SKIP_GRACE)
            if value.startswith("grace:"):
                return cls._grace(value.removeprefix("grace:"))
            raise InvalidOption(
                f"misfire must be 'run', 'skip', a grace period in seconds or 'grace:<seconds>'; "
                f"got {value!r}"
            )
        return cls._grace(value)

    @classmethod
    def _grace(cls, value: object) -> Misfire:
        try:
            seconds = check_seconds(float(value) if isinstance(value, str) else value, "misfire")
        except ValueError as exc:
            raise InvalidOption(f"misfire grace must be a number of seconds: {exc}") from exc
        if seconds < 0:
            raise InvalidOption(f"misfire grace must be >= 0 seconds, got {value!r}")
        return cls("grace", seconds)

    def to_spec(self) -> str:
        """Compact text form stored with the job: ``run``, ``skip`` or ``grace:<s>``."""
        return self.policy if self.policy != "grace" else f"grace:{self.grace!r}"

    def should_run(self, lateness: float) -> bool:
        """True when a job claimed ``lateness`` seconds after its due time should run."""
        return self.grace is None or lateness <= self.grace


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job, ready for ``Backend.enqueue``.

    ``payload`` is already-encoded JSON text (see :mod:`delayq.codec`);
    ``backoff`` is a backoff spec dict (``Backoff.to_spec()``); ``misfire`` the
    text form of :class:`Misfire`.

    ``delay`` (seconds, optional) makes the due time relative: the store sets
    ``run_at`` to ITS "now" plus ``delay`` (a negative delay counts as 0) when
    it stores the job, and ``run_at`` is then only the producer's estimate. A
    distributed store decides "due" on its server's clock, so ``delay=10``
    means ten seconds on that clock even when the producer's clock is skewed.
    Backends check every spec on ``enqueue`` (``delayq.backends._common.check_spec``).
    """

    id: str
    name: str
    payload: str
    run_at: float
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: dict[str, Any] = field(default_factory=lambda: {"kind": "exponential"})
    misfire: str = "run"
    created_at: float = 0.0
    delay: float | None = None
    key: str | None = None  # flow-control key: the limits of this key apply (delayq.flow)
    priority: int = 0  # among due jobs, higher is claimed first
    group: str | None = None  # fair share: due jobs of different groups are claimed in turn


@dataclass(frozen=True, slots=True)
class Job:
    """A job as a backend reports it."""

    id: str
    name: str
    payload: Any
    run_at: float
    state: JobState
    attempts: int  # attempts started so far (a claim starts one)
    max_attempts: int
    backoff: dict[str, Any]
    misfire: str
    created_at: float
    updated_at: float
    last_error: str | None = None
    outcome: str | None = None  # a note on how it ended, e.g. "skipped: 312.0s late"
    lease_until: float | None = None
    key: str | None = None  # flow control (see JobSpec)
    priority: int = 0
    group: str | None = None
    throttled_until: float | None = None  # due, but over its key's rate until then
    keyed: KeyInfo | None = None  # the current job of a keyed call's key (delayq.keyed)
    result: str | None = None  # a succeeded job's return value as JSON text (None: none kept)


@dataclass(frozen=True, slots=True)
class PayloadPreview:
    """A payload a list shows cut (``list_jobs(preview=n)``): the first ``n``
    characters of its stored JSON text and the length of the whole text. The
    store cuts it where it reads, so a list of big payloads stays small;
    ``get`` returns the whole payload."""

    text: str
    chars: int


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A keyed job's key, mode and counters, as ``get`` reports them."""

    key: str
    mode: str  # e.g. "debounce max_wait=60", "append max_items=100"
    run: int  # this job is the key's run number ``run`` (its id: key, then key#2...)
    first_at: float  # the run's first call
    extended: int = 0  # debounce: times the due time moved
    items: int = 0  # append: payloads in the batch
    calls: int = 0  # calls that reached this run


@dataclass(frozen=True, slots=True)
class Claim:
    """A job claimed under a lease.

    ``token`` is a fencing token: ack / retry / bury / extend are rejected with
    :class:`~delayq.errors.StaleClaim` once the lease expired and the job was
    handed to someone else. ``claimed_at`` is the claim time on the backend's
    clock; misfire and lateness compare it with :attr:`due`.
    """

    job: Job
    token: int
    lease_until: float
    claimed_at: float
    due_at: float | None = None
    """The job's due time on ``claimed_at``'s clock when the store judged it on other
    clocks than the one ``job.run_at`` was set by (RabbitMQ: a producer's wall clock
    does not decide when its job is due); None: ``job.run_at``."""

    @property
    def due(self) -> float:
        """When the job fell due, on the clock of ``claimed_at`` (for misfire and lateness)."""
        return self.job.run_at if self.due_at is None else self.due_at

    @property
    def attempt(self) -> int:
        """The number of this attempt (1 for the first run)."""
        return self.job.attempts

    def context(self, lease_lost: threading.Event | None = None) -> JobContext:
        """What the handler of this attempt is told (``lease_lost``: the worker's
        event for this claim, set when its lease is gone)."""
        job = self.job
        return JobContext(
            id=job.id,
            name=job.name,
            attempt=self.attempt,
            max_attempts=job.max_attempts,
            run_at=self.due,
            claimed_at=self.claimed_at,
            lease_until=self.lease_until,
            created_at=job.created_at,
            token=self.token,
            lease_lost=threading.Event() if lease_lost is None else lease_lost,
        )


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts by state and the next due time (epoch seconds) of a queue."""

    scheduled: int = 0
    due: int = 0  # scheduled and already due, waiting for a worker
    running: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    skipped: int = 0
    next_due: float | None = None

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], *, due: int, next_due: float | None) -> Stats:
        """Stats from a count per state (keyed by state value; a missing state is 0)."""
        return cls(
            scheduled=int(counts.get("scheduled", 0)),
            due=int(due),
            running=int(counts.get("running", 0)),
            succeeded=int(counts.get("succeeded", 0)),
            dead=int(counts.get("dead", 0)),
            cancelled=int(counts.get("cancelled", 0)),
            skipped=int(counts.get("skipped", 0)),
            next_due=next_due,
        )

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a handler knows about the run it is part of.

    ``id`` is the idempotency key: at-least-once delivery means a handler may
    see the same id again (after a crash or an expired lease). ``token`` is the
    claim's fencing token (it only grows), for a handler that fences its own
    side effects (store it with the write, refuse writes with a smaller one);
    ``lease_lost`` is set when the lease is gone (an async handler is then
    cancelled). Times are epoch seconds on the backend's clock.
    """

    id: str
    name: str
    attempt: int  # 1 for the first run
    max_attempts: int
    run_at: float  # when the job was due
    claimed_at: float  # when this attempt was claimed
    lease_until: float
    created_at: float
    token: int = 0  # the claim's fencing token: fence side effects with it
    lease_lost: threading.Event = field(default_factory=threading.Event)
    """Set when the worker lost this attempt's lease (a renewal was refused, or the
    lease ran out with no renewal): another worker may run the job now, and the
    result will not be recorded. Check it before a side effect, or wait on it."""

    @property
    def lateness(self) -> float:
        """Seconds between the due time and the claim of this attempt."""
        return self.claimed_at - self.run_at

    @property
    def scheduled_for(self) -> float | None:
        """The nominal time of a recurring occurrence (from its id
        ``<name>@<UTC time>``: before jitter, and kept when a retry or a crash
        moves ``run_at``); None for a job whose id has no such time."""
        return occurrence_time(self.id)

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now sends the job to the dead-letter set."""
        return self.attempt >= self.max_attempts


_OCCURRENCE_STAMP = re.compile(r"@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{3})?Z\Z")


def occurrence_time(job_id: str) -> float | None:
    """The UTC time at the end of a recurring occurrence id ``<name>@<UTC time>``
    (as :func:`delayq.recurring.occurrence_id` writes it), else None."""
    found = _OCCURRENCE_STAMP.search(job_id)
    if found is None:
        return None
    when = datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return when.timestamp() + (float(found.group(2)) if found.group(2) else 0.0)


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler and how to call it (decided once, at registration).

    ``takes_context`` is true when the function accepts a second positional
    argument: it is then called as ``fn(payload, ctx)``, else as ``fn(payload)``.
    ``timeout`` (seconds, None for the worker's default) bounds one attempt.
    ``store_result``: the return value is kept with the finished record (see
    :mod:`delayq.results`).
    """

    name: str
    fn: Callable[..., Any]
    is_async: bool
    takes_context: bool
    timeout: float | None = None
    store_result: bool = False

    def call(self, payload: Any, ctx: JobContext) -> Any:
        """Call the function (returns a coroutine for an async handler)."""
        if self.takes_context:
            return self.fn(payload, ctx)
        return self.fn(payload)
