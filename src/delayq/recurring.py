"""Recurring jobs: cron and interval schedules, stored in the store, one job per occurrence.

::

    app.recurring("report.daily", cron="0 3 * * *", tz="Europe/Berlin", payload={"to": "ops"})
    app.recurring("cache.warm", every=300, jitter=10)
    app.pause_recurring("report.daily"); app.resume_recurring("report.daily")

How it runs with no leader process
----------------------------------
A schedule is a record in the store (:class:`~delayq.backends.base.ScheduleStore`,
feature ``recurring``): every process sees every edit, and they survive restarts.
The chain of occurrences is carried by ordinary jobs:

* A **tick** job (handler :data:`TICK_HANDLER`, built into every app) is due at
  each occurrence time. When a worker runs it, it reads the schedule's current
  record, decides which occurrences are due (the schedule's ``misfire`` policy
  after downtime), and enqueues, in one all-or-none ``enqueue`` with
  ``on_conflict="keep"``, one **occurrence** job per due occurrence plus the tick
  of the next occurrence.
* Job ids are deterministic: ``<name>@<UTC time>`` for an occurrence and
  ``delayq.recurring:<name>@<UTC time>`` for a tick. However many producers
  seed a chain, and however many workers run ticks (a retried tick, a chain
  re-seeded by an edit), one occurrence is one job: every later ``enqueue`` of
  the same id keeps the existing job.
* Adding, changing or resuming a schedule seeds the tick of its next occurrence
  (``keep`` again). A paused or removed schedule's pending tick finds that out
  when it runs and ends the chain. Occurrences at or before ``not_before`` (the
  time of the last add, resume or timing change) never run, so a pending old
  tick cannot run what fell into a pause.

The occurrence job is an ordinary job of the schedule's handler (its retries,
backoff, dead letters, cancel by id); a tick costs one extra small job per
occurrence, run by whichever worker claims it. Occurrences are enqueued when
their tick runs, so they start one claim after their due time (milliseconds).

Time zones
----------
Cron expressions are evaluated by cronsim in the schedule's ``tz`` (a
``zoneinfo`` name), the way Debian cron does: a job at a fixed local time that
falls into the hour skipped when clocks spring forward (02:30 in Berlin or New
York) runs once, at the first instant after the gap (03:00); a fixed local time
that happens twice when clocks fall back (01:30) runs once, at its first
instance (summer time). Expressions with a ``*`` in the minute or hour field
follow real elapsed time (an hourly job runs every hour, 25 times on the
fall-back day). ``every=`` counts real seconds and ignores time zones.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from delayq._validate import check_datetime, check_seconds
from delayq.backends._schedules import check_schedule_name
from delayq.backends.base import ScheduleRecord, ScheduleStore
from delayq.errors import BackendError, ConfigurationError, InvalidOption
from delayq.job import JobSpec, Misfire

if TYPE_CHECKING:
    from delayq.app import DelayQ, JobContext

__all__ = [
    "MIN_EVERY",
    "TICK_HANDLER",
    "MissedRuns",
    "Plan",
    "RecurringSchedules",
    "Schedule",
    "occurrence_id",
    "plan",
    "tick_id",
]

TICK_HANDLER = "delayq.recurring"
"""The built-in handler name of tick jobs (every app runs them)."""

MIN_EVERY = 1.0
"""The shortest ``every=`` interval, in seconds."""

MAX_CATCHUP = 1000
"""The most missed occurrences ``misfire="catchup:N"`` may run."""

_TICK_MAX_ATTEMPTS = 100  # a tick fails only when the store does; keep trying for hours
_TICK_BACKOFF: dict[str, Any] = {"kind": "exponential", "base": 1.0, "factor": 2.0, "cap": 300.0}
_CAS_TRIES = 20  # compare-and-set attempts of one edit racing others


# -- ids ------------------------------------------------------------------------------
def _stamp(t: float) -> str:
    ms = round(t * 1000)
    text = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else text + "Z"


def occurrence_id(name: str, at: float) -> str:
    """The job id of the occurrence of schedule ``name`` at ``at`` (epoch seconds)."""
    return f"{name}@{_stamp(at)}"


def tick_id(name: str, at: float) -> str:
    """The job id of the tick that starts the occurrence of ``name`` at ``at``."""
    return f"{TICK_HANDLER}:{name}@{_stamp(at)}"


# -- the misfire policy after downtime --------------------------------------------------
@dataclass(frozen=True, slots=True)
class MissedRuns:
    """Which due occurrences run when a tick finds several (after downtime).

    ``"latest"`` (the default) runs the latest due occurrence once, however
    late; ``"skip"`` runs none that is more than :attr:`SKIP_GRACE` seconds late
    (so only an on-time occurrence runs); ``"catchup:N"`` runs the last ``N`` due
    occurrences, oldest first (``N`` at most :data:`MAX_CATCHUP`).
    """

    policy: Literal["skip", "latest", "catchup"] = "latest"
    count: int = 1

    SKIP_GRACE: ClassVar[float] = Misfire.SKIP_GRACE

    @classmethod
    def parse(cls, value: object) -> MissedRuns:
        if value is None or value == "latest":
            return cls()
        if isinstance(value, MissedRuns):
            return value
        if value == "skip":
            return cls("skip")
        text = value.removeprefix("catchup:") if isinstance(value, str) else None
        if text is not None and text != value and text.isdigit():
            count = int(text)
            if 1 <= count <= MAX_CATCHUP:
                return cls("catchup", count)
        raise InvalidOption(
            f"misfire must be 'latest', 'skip' or 'catchup:<N>' with 1 <= N <= {MAX_CATCHUP}; "
            f"got {value!r}"
        )

    def to_spec(self) -> str:
        return f"catchup:{self.count}" if self.policy == "catchup" else self.policy

    @property
    def window(self) -> int:
        """How many of the latest due occurrences the policy looks at."""
        return self.count

    def choose(self, due: list[float], now: float) -> list[float]:
        """The occurrences to run, from ``due`` (ascending, the latest ``window``)."""
        if not due:
            return []
        if self.policy == "skip":
            return due[-1:] if now - due[-1] <= self.SKIP_GRACE else []
        return due[-self.count :]


# -- timing -------------------------------------------------------------------------------
def _zone(tz: object) -> ZoneInfo:
    if isinstance(tz, ZoneInfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise InvalidOption(f"tz must be a time zone name such as 'Europe/Berlin', got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidOption(
            f"tz {tz!r} is not a known time zone (an IANA name such as 'Europe/Berlin' or 'UTC')"
        ) from exc


def _cron(expr: object, zone: ZoneInfo, now: float) -> str:
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidOption(f"cron must be a cron expression such as '0 3 * * *', got {expr!r}")
    try:
        next(CronSim(expr, datetime.fromtimestamp(now, zone)))
    except (CronSimError, ValueError, KeyError, IndexError) as exc:
        raise InvalidOption(f"cron {expr!r} is not a valid cron expression: {exc}") from exc
    except StopIteration:
        raise InvalidOption(f"cron {expr!r} never fires") from None
    return expr


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule as stored (see the module docstring).

    Times are epoch seconds. ``payload`` is JSON text, ``backoff`` a backoff spec,
    ``misfire`` a :class:`MissedRuns` spec; ``anchor`` is the first ``every=``
    occurrence; occurrences at or before ``not_before`` never run.
    ``version`` is the store's record version (not part of the definition).
    """

    name: str
    handler: str
    payload: str = "null"
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    start: float | None = None
    end: float | None = None
    jitter: float = 0.0
    max_attempts: int = 5
    backoff: dict[str, Any] = field(default_factory=lambda: {"kind": "exponential"})
    misfire: str = "latest"
    paused: bool = False
    not_before: float = 0.0
    anchor: float = 0.0
    version: int = 0

    DEFINITION: ClassVar[tuple[str, ...]] = (
        "handler",
        "payload",
        "cron",
        "every",
        "tz",
        "start",
        "end",
        "jitter",
        "max_attempts",
        "backoff",
        "misfire",
    )
    TIMING: ClassVar[tuple[str, ...]] = ("cron", "every", "tz", "start", "end")

    # -- storage ------------------------------------------------------------------------
    def to_json(self) -> str:
        data = asdict(self)
        del data["version"], data["name"]
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_record(cls, record: ScheduleRecord) -> Schedule:
        try:
            data = json.loads(record.data)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            schedule = cls(name=record.name, version=record.version, **data)
            schedule.next_after(schedule.not_before)  # the timing must evaluate
        except (TypeError, ValueError, InvalidOption) as exc:
            raise BackendError(f"recurring schedule {record.name!r} is unreadable: {exc}") from exc
        return schedule

    def same_definition(self, other: Schedule) -> bool:
        return all(getattr(self, k) == getattr(other, k) for k in self.DEFINITION)

    def same_timing(self, other: Schedule) -> bool:
        return all(getattr(self, k) == getattr(other, k) for k in self.TIMING)

    # -- occurrences ----------------------------------------------------------------------
    @property
    def missed(self) -> MissedRuns:
        return MissedRuns.parse(self.misfire)

    def _after(self, t: float) -> float | None:
        """The first occurrence strictly after ``t`` (before start/end limits)."""
        if self.every is not None:
            step = round(self.every * 1000)
            anchor = round(self.anchor * 1000)
            at = math.floor(t * 1000)
            k = 0 if at < anchor else (at - anchor) // step + 1
            return (anchor + k * step) / 1000
        assert self.cron is not None
        try:
            return next(
                CronSim(self.cron, datetime.fromtimestamp(t, ZoneInfo(self.tz)))
            ).timestamp()
        except StopIteration:
            return None

    def next_after(self, t: float) -> float | None:
        """The first occurrence strictly after ``t`` within ``start``/``end``, or None."""
        if self.start is not None and t < self.start:
            t = math.nextafter(self.start, -math.inf)
        at = self._after(t)
        while at is not None and self.start is not None and at < self.start:
            at = self._after(at)
        if at is None or (self.end is not None and at > self.end):
            return None
        return at

    def due_between(self, lo: float, hi: float, limit: int) -> list[float]:
        """The latest ``limit`` occurrences in ``[lo, hi]`` (and after ``not_before``),
        ascending. Costs O(limit), however long the window."""
        lo = max(lo, self.start if self.start is not None else lo)
        hi = min(hi, self.end if self.end is not None else hi)
        found: list[float] = []
        if hi < lo:
            return found
        if self.every is not None:
            step = round(self.every * 1000)
            anchor = round(self.anchor * 1000)
            k = (math.floor(hi * 1000) - anchor) // step
            while k >= 0 and len(found) < limit:
                at = (anchor + k * step) / 1000
                if at < lo or at <= self.not_before:
                    break
                found.append(at)
                k -= 1
        else:
            assert self.cron is not None
            zone = ZoneInfo(self.tz)
            # A start with microseconds is its own first step back: occurrences <= hi.
            # (fromtimestamp, not "+ timedelta": that would lose the fold of a repeated hour)
            top = datetime.fromtimestamp(math.floor(hi) + 0.5, zone)
            for when in CronSim(self.cron, top, reverse=True):
                at = when.timestamp()
                if at < lo or at <= self.not_before or len(found) >= limit:
                    break
                found.append(at)
        found.reverse()
        return found

    def next_run(self, now: float) -> float | None:
        """When the next occurrence after ``now`` is due (None: paused or ended)."""
        return None if self.paused else self.next_after(max(now, self.not_before))

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        """The schedule as JSON data (with ``next_run`` when ``now`` is given)."""
        data = asdict(self)
        data["payload"] = json.loads(self.payload)
        if now is not None:
            data["next_run"] = self.next_run(now)
        return data


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick does: enqueue ``runs`` (occurrence times) and the tick of ``next_tick``."""

    runs: tuple[float, ...]
    next_tick: float | None


def plan(schedule: Schedule, tick_at: float, now: float) -> Plan:
    """The pure decision of the tick due at ``tick_at`` run at ``now``.

    The tick answers for occurrences in ``[tick_at, now]``: the previous tick
    planned this one as the first occurrence after its own ``now``, so
    consecutive ticks never answer for the same occurrence.
    """
    if schedule.paused:
        return Plan((), None)
    missed = schedule.missed
    due = schedule.due_between(tick_at, now, missed.window)
    return Plan(tuple(missed.choose(due, now)), schedule.next_after(max(now, schedule.not_before)))


# -- the app's side -------------------------------------------------------------------------
_UNSET: Any = object()


class RecurringSchedules:
    """Add, list, change, pause, resume and remove schedules; run ticks.

    The app holds one (``DelayQ`` delegates to it); ``rng`` draws the jitter.
    Holds no state of its own besides the app and the rng (``random.Random`` is
    thread-safe for ``uniform``), so it is safe to share between threads.
    """

    def __init__(self, app: DelayQ, *, rng: random.Random | None = None) -> None:
        self._app = app
        self._rng = rng if rng is not None else random.Random()

    @property
    def store(self) -> ScheduleStore:
        """The app's store, if it keeps schedules (else a clear ConfigurationError)."""
        backend = self._app.backend
        if "recurring" not in getattr(backend, "features", ()) or not isinstance(
            backend, ScheduleStore
        ):
            raise ConfigurationError(
                f"the store {backend.url} does not keep recurring schedules "
                f"(it lacks the 'recurring' feature)"
            )
        return backend

    # -- definitions --------------------------------------------------------------------
    def define(
        self,
        name: object,
        *,
        cron: object = None,
        every: object = None,
        tz: object = "UTC",
        payload: Any = None,
        handler: object = None,
        start: object = None,
        end: object = None,
        jitter: object = 0,
        max_attempts: object = None,
        backoff: Any = None,
        misfire: object = "latest",
        now: float,
        anchor: float | None = None,
    ) -> Schedule:
        """Validate a definition into a :class:`Schedule` (not stored). Every bad
        argument is an :class:`~delayq.errors.InvalidInput` naming it."""
        name = check_schedule_name(name)
        if (cron is None) == (every is None):
            raise InvalidOption("give exactly one of cron= (an expression) or every= (seconds)")
        zone = _zone(tz)
        start_at = None if start is None else check_datetime(start, "start")
        end_at = None if end is None else check_datetime(end, "end")
        if start_at is not None and end_at is not None and end_at < start_at:
            raise InvalidOption(f"end must not be before start, got start={start!r} end={end!r}")
        interval = None
        if every is not None:
            interval = round(self._seconds(every, "every"), 3)
            if not MIN_EVERY <= interval <= 100 * 365.25 * 86400:
                raise InvalidOption(f"every must be at least {MIN_EVERY} second, got {every!r}")
        expr = None if cron is None else _cron(cron, zone, now)
        spread = self._seconds(jitter, "jitter")
        if spread < 0:
            raise InvalidOption(f"jitter must be >= 0 seconds, got {jitter!r}")
        # One checked spec gives the handler name, payload text and job options
        # with the app's defaults, exactly as schedule() would store them.
        spec = self._app.build(
            name if handler is None else handler,  # type: ignore[arg-type]
            payload,
            delay=0,
            max_attempts=max_attempts,  # type: ignore[arg-type]
            backoff=backoff,
        )
        missed = MissedRuns.parse(misfire)
        if anchor is None:
            anchor = start_at if start_at is not None else float(math.ceil(now)) + (interval or 0)
        return Schedule(
            name=name,
            handler=spec.name,
            payload=spec.payload,
            cron=expr,
            every=interval,
            tz=zone.key,
            start=start_at,
            end=end_at,
            jitter=spread,
            max_attempts=spec.max_attempts,
            backoff=spec.backoff,
            misfire=missed.to_spec(),
            not_before=now,
            anchor=anchor,
        )

    @staticmethod
    def _seconds(value: object, field_name: str) -> float:
        if isinstance(value, timedelta):
            return value.total_seconds()
        return check_seconds(value, field_name)

    def add(self, name: object, **definition: Any) -> Schedule:
        """Store the schedule (create it, or change it to this definition); see
        :meth:`DelayQ.recurring <delayq.app.DelayQ.recurring>`."""
        now = self._app.clock.time()
        wanted = self.define(name, now=now, **definition)
        store = self.store
        for _ in range(_CAS_TRIES):
            record = store.get_schedule(wanted.name)
            current = None if record is None else Schedule.from_record(record)
            if current is not None and current.same_definition(wanted):
                self._seed(current, now)  # repairs a chain that ended (a buried tick)
                return current
            new = wanted if current is None else self._changed(current, wanted, now)
            version = store.put_schedule(
                new.name, new.to_json(), version=current.version if current else 0
            )
            if version is not None:
                new = replace(new, version=version)
                self._seed(new, now)
                return new
        raise BackendError(f"recurring schedule {wanted.name!r} kept changing under this edit")

    @staticmethod
    def _changed(current: Schedule, wanted: Schedule, now: float) -> Schedule:
        """``wanted`` replacing ``current``: the pause state stays; a changed timing
        starts from now (``not_before``), an unchanged one keeps its place."""
        if wanted.same_timing(current):
            wanted = replace(wanted, not_before=current.not_before, anchor=current.anchor)
        return replace(wanted, paused=current.paused)

    def update(self, name: object, **changes: Any) -> Schedule:
        """Change some fields of a stored schedule (the others stay)."""
        name = check_schedule_name(name)
        current = self.get(name)
        if current is None:
            raise InvalidOption(f"no recurring schedule is named {name!r}")
        if "cron" in changes and changes["cron"] is not None:
            changes.setdefault("every", None)
        if "every" in changes and changes["every"] is not None:
            changes.setdefault("cron", None)
        definition: dict[str, Any] = {
            "cron": current.cron,
            "every": current.every,
            "tz": current.tz,
            "payload": json.loads(current.payload),
            "handler": current.handler,
            "start": current.start,
            "end": current.end,
            "jitter": current.jitter,
            "max_attempts": current.max_attempts,
            "backoff": current.backoff,
            "misfire": current.misfire,
        }
        unknown = set(changes) - set(definition)
        if unknown:
            raise InvalidOption(
                f"unknown schedule field(s) {sorted(unknown)}; accepted: {sorted(definition)}"
            )
        definition.update(changes)
        return self.add(name, **definition)

    def get(self, name: object) -> Schedule | None:
        record = self.store.get_schedule(check_schedule_name(name))
        return None if record is None else Schedule.from_record(record)

    def list_schedules(self) -> list[Schedule]:
        return [Schedule.from_record(r) for r in self.store.list_schedules()]

    def pause(self, name: object) -> bool:
        """Stop the schedule's occurrences until resumed; False if there is no such schedule."""
        return self._set_paused(check_schedule_name(name), True)

    def resume(self, name: object) -> bool:
        """Run the schedule again from its next occurrence (none of those that fell
        into the pause); False if there is no such schedule."""
        return self._set_paused(check_schedule_name(name), False)

    def _set_paused(self, name: str, paused: bool) -> bool:
        store = self.store
        for _ in range(_CAS_TRIES):
            record = store.get_schedule(name)
            if record is None:
                return False
            current = Schedule.from_record(record)
            now = self._app.clock.time()
            if current.paused == paused:
                self._seed(current, now)
                return True
            new = replace(current, paused=paused)
            if not paused:
                new = replace(new, not_before=now)
            version = store.put_schedule(name, new.to_json(), version=current.version)
            if version is not None:
                self._seed(replace(new, version=version), now)
                return True
        raise BackendError(f"recurring schedule {name!r} kept changing under this edit")

    def remove(self, name: object) -> bool:
        """Delete the schedule: no occurrence after this call starts. False if none."""
        return self.store.delete_schedule(check_schedule_name(name))

    # -- the chain ------------------------------------------------------------------------
    def _seed(self, schedule: Schedule, now: float) -> None:
        at = schedule.next_run(now)
        if at is not None:
            self._app.enqueue([self._tick_spec(schedule.name, at, now)], on_conflict="keep")

    @staticmethod
    def _tick_spec(name: str, at: float, now: float) -> JobSpec:
        return JobSpec(
            id=tick_id(name, at),
            name=TICK_HANDLER,
            payload=json.dumps({"schedule": name, "at": at}),
            run_at=at,
            max_attempts=_TICK_MAX_ATTEMPTS,
            backoff=_TICK_BACKOFF,
            misfire="run",
            created_at=now,
        )

    def _occurrence_spec(self, schedule: Schedule, at: float, now: float) -> JobSpec:
        jitter = self._rng.uniform(0.0, schedule.jitter) if schedule.jitter else 0.0
        return JobSpec(
            id=occurrence_id(schedule.name, at),
            name=schedule.handler,
            payload=schedule.payload,
            run_at=at + jitter,
            max_attempts=schedule.max_attempts,
            backoff=schedule.backoff,
            # The tick applied the downtime policy; "skip" also skips an
            # occurrence that waited too long in the queue afterwards.
            misfire="skip" if schedule.missed.policy == "skip" else "run",
            created_at=now,
        )

    def run_tick(self, payload: Any, ctx: JobContext) -> str:
        """The built-in handler of tick jobs: enqueue the due occurrences and the next tick.

        Returns a note of what it did (the worker records handler results only
        as success). A store failure raises, so the tick is retried.
        """
        if not isinstance(payload, Mapping) or not isinstance(payload.get("schedule"), str):
            raise InvalidOption(
                f"a recurring tick needs {{'schedule': name, 'at': time}}, got {payload!r}"
            )
        name = payload["schedule"]
        tick_at = check_seconds(payload.get("at"), "at")
        record = self.store.get_schedule(name)
        if record is None:
            return f"schedule {name!r} was removed: the chain ends"
        schedule = Schedule.from_record(record)
        now = ctx.claimed_at  # the store's clock
        decision = plan(schedule, tick_at, now)
        specs = [self._occurrence_spec(schedule, at, now) for at in decision.runs]
        if decision.next_tick is not None:
            specs.append(self._tick_spec(name, decision.next_tick, now))
        if specs:
            self._app.enqueue(specs, on_conflict="keep")
        return f"ran {len(decision.runs)} occurrence(s); next tick {decision.next_tick}"
