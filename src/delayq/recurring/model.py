"""Recurring jobs: cron and interval schedules, stored in the store, one job per occurrence.

::

    app.recurring("report.daily", cron="0 3 * * *", tz="Europe/Berlin", payload={"to": "ops"})
    app.recurring("cache.warm", every=300, jitter=10)
    app.pause_recurring("report.daily"); app.resume_recurring("report.daily")

The model, with no I/O: a :class:`Schedule` (as stored through the store's
:class:`~delayq.backends.base.ScheduleStore`), its occurrences, the job ids of
an occurrence (``<name>@<UTC time>``) and of its tick, and :func:`plan`, what
one tick does. :mod:`delayq.recurring.schedules` stores, edits and runs them;
ARCHITECTURE.md ("Recurring schedules") tells how the tick chain needs no
leader process. (Past 400 lines: the misfire policy, the timing of a schedule
and its status are one pure model that every other part of the package reads.)

The occurrence job is an ordinary job of the schedule's handler (its retries,
backoff, dead letters, cancel by id), enqueued by its tick :data:`LEAD` seconds
ahead, so it starts as promptly as any job due at that time; a tick costs one
extra small job per occurrence, run by whichever worker claims it.

Time zones
----------
Cron expressions are evaluated by cronsim in the schedule's ``tz`` (a
``zoneinfo`` name), the way Debian cron does: a job at a fixed local time that
falls into the hour skipped when clocks spring forward (02:30 in Berlin or New
York) runs once, at the first instant after the gap (03:00); a fixed local time
that happens twice when clocks fall back (01:30 in New York, 02:30 in Berlin)
runs once, at its first instance (summer time). Expressions with a ``*`` in the
minute or hour field follow real elapsed time (an hourly job runs every hour, 25
times on the fall-back day). ``every=`` counts real seconds and ignores time zones.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from delayq.backends.base import ScheduleRecord
from delayq.errors import BackendError, InvalidOption
from delayq.job import Misfire, occurrence_time

__all__ = [
    "LEAD",
    "MACROS",
    "MAX_CATCHUP",
    "MIN_EVERY",
    "OVERLAP",
    "TICK_HANDLER",
    "MissedRuns",
    "Occurrence",
    "Plan",
    "Schedule",
    "ScheduleStatus",
    "check_cron",
    "check_zone",
    "expand_cron",
    "occurrence_id",
    "occurrence_time",
    "plan",
    "tick_id",
]

TICK_HANDLER = "delayq.recurring"
"""The built-in handler name of tick jobs (every app runs them)."""

MIN_EVERY = 1.0
"""The shortest ``every=`` interval, in seconds."""

LEAD = 0.7
"""Seconds before an occurrence that its tick is due: the occurrence job is then
enqueued ahead of its time and claimed like any job due at that time. Not a
whole second, so the ticks of whole-second schedules never share a due time
with occurrences (ties are claimed in enqueue order, and a tick would then
stand in line before an occurrence)."""

MAX_CATCHUP = 1000
"""The most missed occurrences ``misfire="catchup:N"`` may run."""

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The cron macros and the expressions they stand for (as in Vixie cron)."""

OVERLAP = ("allow", "skip", "replace")
"""The overlap policies: what an occurrence does while the previous one still runs."""


def expand_cron(expr: str) -> str:
    """``expr`` with a macro (``@daily``, ...) replaced by its expression."""
    return MACROS.get(expr.strip().lower(), expr)


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
    occurrences, oldest first (``N`` at most :data:`MAX_CATCHUP`); a number of
    seconds ``g`` (or ``"grace:g"``) runs the latest due occurrence if it is at
    most ``g`` seconds late, else none.
    """

    policy: Literal["skip", "latest", "catchup", "grace"] = "latest"
    count: int = 1
    grace: float | None = None

    SKIP_GRACE: ClassVar[float] = Misfire.SKIP_GRACE

    @classmethod
    def parse(cls, value: object) -> MissedRuns:
        if value is None or value == "latest":
            return cls()
        if isinstance(value, MissedRuns):
            return value
        if value == "skip":
            return cls("skip")
        if (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.startswith("grace:")
        ):
            grace = Misfire.parse(value).grace
            assert grace is not None
            return cls("grace", grace=grace)
        text = value.removeprefix("catchup:") if isinstance(value, str) else None
        if text is not None and text != value and text.isdigit():
            count = int(text)
            if 1 <= count <= MAX_CATCHUP:
                return cls("catchup", count)
        raise InvalidOption(
            f"misfire must be 'latest', 'skip', 'catchup:<N>' with 1 <= N <= {MAX_CATCHUP} "
            f"or a grace in seconds; got {value!r}"
        )

    def to_spec(self) -> str:
        if self.policy == "grace":
            return Misfire("grace", self.grace).to_spec()
        return f"catchup:{self.count}" if self.policy == "catchup" else self.policy

    @property
    def window(self) -> int:
        """How many of the latest due occurrences the policy looks at."""
        return self.count

    def choose(self, due: list[float], now: float) -> list[float]:
        """The occurrences to run, from ``due`` (ascending, the latest ``window``)."""
        if not due:
            return []
        if self.policy in ("skip", "grace"):
            grace = self.SKIP_GRACE if self.grace is None else self.grace
            return due[-1:] if now - due[-1] <= grace else []
        return due[-self.count :]


# -- timing -------------------------------------------------------------------------------
def check_zone(tz: object) -> ZoneInfo:
    """``tz`` (an IANA name or a ``ZoneInfo``) as a ``ZoneInfo``, else InvalidOption."""
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


_CRON_FIELDS = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")


def _cron_form_problem(expr: str) -> str | None:
    """What is wrong with the shape of ``expr`` (its macro, its number of fields, a
    Quartz ``?``), in words that name the field, or None. cronsim would name the
    first field it cannot read, which for Quartz syntax is not the one at fault."""
    text = expand_cron(expr)
    if text.startswith("@"):
        return f"{expr.strip()!r} is not a known macro; use one of {', '.join(MACROS)}"
    parts = text.split()
    if len(parts) not in (5, 6):
        extra = " (Quartz's year field is not cron)" if len(parts) == 7 else ""
        return (
            f"it has {len(parts)} fields{extra}; give 5 (minute hour day-of-month month "
            f"day-of-week) or 6 (second first)"
        )
    names = _CRON_FIELDS[6 - len(parts) :]
    for i, part in enumerate(parts):
        if "?" not in part:
            continue
        where = f"'?' in the {names[i]} field (field {i + 1} of {len(parts)})"
        if names[i] in ("day-of-month", "day-of-week") and part == "?":
            fixed = " ".join("*" if j == i else p for j, p in enumerate(parts))
            if any(c.isdigit() for c in parts[-1]):  # Quartz: 1-7 from Sunday
                return (
                    f"{where} is Quartz syntax, not cron; use '*' there ({fixed!r}), and "
                    f"number the days of the week as cron does (0 or 7 is Sunday; Quartz's 1 is)"
                )
            return f"{where} is Quartz syntax, not cron; '*' means the same here: {fixed!r}"
        return f"{where} is not cron syntax"
    return None


def check_cron(expr: object, zone: ZoneInfo, now: float) -> str:
    """``expr`` if cronsim reads it and it fires after ``now`` in ``zone``, else InvalidOption."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidOption(f"cron must be a cron expression such as '0 3 * * *', got {expr!r}")
    problem = _cron_form_problem(expr)
    if problem is not None:
        raise InvalidOption(f"cron {expr!r} is not a valid cron expression: {problem}")
    try:
        next(CronSim(expand_cron(expr), datetime.fromtimestamp(now, zone)))
    except (CronSimError, ValueError, KeyError, IndexError) as exc:
        raise InvalidOption(f"cron {expr!r} is not a valid cron expression: {exc}") from exc
    except StopIteration:
        raise InvalidOption(f"cron {expr!r} never fires") from None
    return expr


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule as stored (see the module docstring).

    Times are epoch seconds. ``payload`` is JSON text, ``backoff`` a backoff spec,
    ``misfire`` a :class:`MissedRuns` spec, ``overlap`` one of :data:`OVERLAP`;
    ``anchor`` is the first ``every=`` occurrence; occurrences at or before
    ``not_before`` never run. ``generation`` is drawn when the schedule is
    created and kept by its edits (a schedule removed and created again is a
    new generation, whatever its record version). ``version`` is the store's
    record version (not part of the definition).
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
    overlap: str = "allow"
    paused: bool = False
    not_before: float = 0.0
    anchor: float = 0.0
    generation: str = ""
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
        "overlap",
    )
    TIMING: ClassVar[tuple[str, ...]] = ("cron", "every", "tz", "start", "end")

    # -- storage ------------------------------------------------------------------------
    def to_json(self) -> str:
        data = asdict(self)
        del data["version"], data["name"]
        for key, default in _OPTIONAL.items():  # left out at their defaults, so a
            if data[key] == default:  # delayq that predates them reads the record
                del data[key]
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def generation_of(record: ScheduleRecord) -> str:
        """The generation of a stored record, without reading the rest of it."""
        try:
            data = json.loads(record.data)
        except ValueError:
            return ""
        return str(data.get("generation", "")) if isinstance(data, dict) else ""

    @classmethod
    def from_record(cls, record: ScheduleRecord) -> Schedule:
        try:
            data = json.loads(record.data)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            known = {k: v for k, v in data.items() if k in _FIELDS}  # newer fields: ignored
            schedule = cls(name=record.name, version=record.version, **known)
            schedule.next_after(schedule.not_before)  # the timing must evaluate
        except (TypeError, ValueError, InvalidOption) as exc:
            raise BackendError(f"recurring schedule {record.name!r} is unreadable: {exc}") from exc
        return schedule

    def same_definition(self, other: Schedule) -> bool:
        """True when ``other`` defines the same schedule (payloads compared as
        JSON values: key order does not count)."""
        return all(
            getattr(self, k) == getattr(other, k) for k in self.DEFINITION if k != "payload"
        ) and (
            self.payload == other.payload or json.loads(self.payload) == json.loads(other.payload)
        )

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
                CronSim(expand_cron(self.cron), datetime.fromtimestamp(t, ZoneInfo(self.tz)))
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
            for when in CronSim(expand_cron(self.cron), top, reverse=True):
                at = when.timestamp()
                if at < lo or at <= self.not_before or len(found) >= limit:
                    break
                found.append(at)
        found.reverse()
        return found

    def misfire_of(self, at: float, now: float) -> str:
        """The job misfire policy of the occurrence at ``at``, enqueued at ``now``
        (see :class:`Misfire`).

        It applies ``misfire`` to a job enqueued ahead that is claimed late: under
        ``latest`` it is skipped once the next occurrence is due (that one
        supersedes it), under ``catchup:N`` once the N-th next one is due, under
        ``skip`` when more than :attr:`MissedRuns.SKIP_GRACE` late, and under a
        grace when more than that late. An occurrence a late tick chose (already
        due when enqueued) always runs under ``latest`` and ``catchup:N``: the
        tick chose it as one of the latest, and only a later tick supersedes it
        (explicitly: it cancels the occurrence), however long a backlog keeps
        every job late.
        """
        missed = self.missed
        if missed.policy == "skip":
            return "skip"
        if missed.policy == "grace":
            return missed.to_spec()
        if at <= now:
            return "run"
        later = self.nth_after(at, missed.count)
        return "run" if later is None else Misfire("grace", later - at).to_spec()

    def nth_after(self, t: float, n: int) -> float | None:
        """The ``n``-th occurrence after ``t`` (1: :meth:`next_after`), or None.
        One cron walk (or one multiplication), not ``n`` look-ups."""
        at = self.next_after(t)  # start/end checked here, then plain steps
        if at is None or n == 1:
            return at
        if self.every is not None:
            at = (round(at * 1000) + (n - 1) * round(self.every * 1000)) / 1000
        else:
            assert self.cron is not None
            it = CronSim(expand_cron(self.cron), datetime.fromtimestamp(at, ZoneInfo(self.tz)))
            for _ in range(n - 1):
                try:
                    at = next(it).timestamp()
                except StopIteration:
                    return None
        return None if self.end is not None and at > self.end else at

    def runs_at(self, at: float) -> bool:
        """True when ``at`` is an occurrence this schedule runs (not paused, after
        ``not_before``)."""
        return not self.paused and at > self.not_before and self.due_between(at, at, 1) == [at]

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


_FIELDS = frozenset(Schedule.__dataclass_fields__) - {"name", "version"}
_OPTIONAL = {"overlap": "allow", "generation": ""}


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick does: enqueue the occurrences ``runs`` and the tick of
    ``next_tick`` (due :data:`LEAD` seconds before it)."""

    runs: tuple[float, ...]
    next_tick: float | None


def plan(schedule: Schedule, tick_at: float, now: float) -> Plan:
    """The pure decision of the tick of the occurrence ``tick_at``, run at ``now``.

    The tick answers for the occurrences in ``[tick_at, max(tick_at, now)]``:
    the previous tick planned this one as the first occurrence after that
    window of its own, so consecutive ticks never answer for the same
    occurrence. On time (``now < tick_at``) that is ``tick_at`` alone, enqueued
    ahead of its due time; a late tick (after downtime) applies the ``misfire``
    policy to what is due. (An occurrence enqueued before the downtime applies
    the same policy by itself: see :meth:`Schedule.misfire_of`.)
    """
    if schedule.paused:
        return Plan((), None)
    missed = schedule.missed
    hi = max(tick_at, now)
    due = schedule.due_between(tick_at, hi, missed.window)
    return Plan(tuple(missed.choose(due, now)), schedule.next_after(max(hi, schedule.not_before)))


# -- status -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a schedule and what became of its job.

    ``state`` is the job's state, None when there is no job (not enqueued yet,
    fell into a pause, skipped for an overlap, or its finished record expired).
    ``updated_at`` is when the job last changed (its end, once finished);
    ``note`` its outcome note or last error.
    """

    at: float
    job_id: str
    state: str | None = None
    attempts: int = 0
    updated_at: float | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """A schedule with its next run times and its recent occurrences (newest first)."""

    schedule: Schedule
    next_runs: tuple[float, ...]
    history: tuple[Occurrence, ...]

    @property
    def last_run(self) -> Occurrence | None:
        """The newest occurrence that started (running or finished), or None."""
        for occurrence in self.history:
            if occurrence.state not in (None, "scheduled", "cancelled"):
                return occurrence
        return None

    def as_dict(self, now: float) -> dict[str, Any]:
        data = self.schedule.as_dict(now)
        data["next_runs"] = list(self.next_runs)
        data["history"] = [asdict(o) for o in self.history]
        last = self.last_run
        data["last_run"] = None if last is None else asdict(last)
        return data
