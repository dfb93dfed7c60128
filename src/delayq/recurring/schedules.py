"""The app's side of recurring schedules: define, store, edit them, and run their ticks.

:class:`RecurringSchedules` is what ``DelayQ.recurring`` and its siblings
delegate to. The model (schedules, occurrences, the pure ``plan`` of a tick)
is :mod:`delayq.recurring.model`; this module adds the input checks (through the
app's own ``build``, so job options are checked and defaulted exactly as for
``schedule``), the compare-and-set edits of the stored record, and the tick
handler that extends the chain.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

from delayq._validate import (
    MAX_DELAY,
    check_datetime,
    check_duration,
    check_schedule_name,
    check_seconds,
)
from delayq.backends.base import Backend, ScheduleStore
from delayq.clock import Clock
from delayq.errors import BackendError, ConfigurationError, InvalidOption, JobConflict
from delayq.job import EnqueueOutcome, JobContext, JobSpec, JobState
from delayq.recurring.model import (
    LEAD,
    MIN_EVERY,
    TICK_HANDLER,
    MissedRuns,
    Plan,
    Schedule,
    check_cron,
    check_zone,
    occurrence_id,
    plan,
    tick_id,
)

__all__ = ["JobFactory", "RecurringSchedules"]

_TICK_MAX_ATTEMPTS = 100  # a tick fails only when the store does; keep trying for hours
_TICK_BACKOFF: dict[str, Any] = {"kind": "exponential", "base": 1.0, "factor": 2.0, "cap": 300.0}
_CAS_TRIES = 20  # compare-and-set attempts of one edit racing others
# Occurrence jobs are enqueued at most LEAD seconds ahead (on the store's clock);
# an edit settles those within twice that, for a producer clock a little behind.
_SETTLE_WINDOW = 2 * LEAD
_SETTLE_MAX = 100


class JobFactory(Protocol):
    """What the schedules need of their app (:class:`~delayq.app.DelayQ` is one):
    its store, its clock, and its checks of job arguments."""

    @property
    def backend(self) -> Backend: ...

    @property
    def clock(self) -> Clock: ...

    def build(
        self,
        name: str,
        payload: Any = None,
        *,
        delay: float | timedelta | None = None,
        max_attempts: int | None = None,
        backoff: Any = None,
    ) -> JobSpec: ...


class RecurringSchedules:
    """Add, list, change, pause, resume and remove schedules; run ticks.

    The jobs a schedule makes (ticks, occurrences) are delayq's own: they go to
    the store directly, past the app's producer hooks (no trace envelope around
    a tick's payload, no "scheduled" count for what no producer called).

    The app holds one (``DelayQ`` delegates to it); ``rng`` draws the jitter.
    Holds no state of its own besides the app and the rng (``random.Random`` is
    thread-safe for ``uniform``), so it is safe to share between threads.
    """

    def __init__(self, app: JobFactory, *, rng: random.Random | None = None) -> None:
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
    ) -> Schedule:
        """Validate a definition into a :class:`Schedule` (not stored). Every bad
        argument is an :class:`~delayq.errors.InvalidInput` naming it."""
        name = check_schedule_name(name)
        if (cron is None) == (every is None):
            raise InvalidOption("give exactly one of cron= (an expression) or every= (seconds)")
        zone = check_zone(tz)
        start_at = None if start is None else check_datetime(start, "start")
        end_at = None if end is None else check_datetime(end, "end")
        if start_at is not None and end_at is not None and end_at < start_at:
            raise InvalidOption(f"end must not be before start, got start={start!r} end={end!r}")
        interval = None
        if every is not None:
            interval = round(check_duration(every, "every"), 3)
            if not MIN_EVERY <= interval <= MAX_DELAY:
                raise InvalidOption(
                    f"every must be at least {MIN_EVERY} second and at most 100 years, "
                    f"got {every!r}"
                )
        expr = None if cron is None else check_cron(cron, zone, now)
        spread = check_duration(jitter, "jitter")
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
        # every=: from start, else one interval after the next whole second
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
                # (created: a same-named schedule removed a moment ago may have left
                # a cancelled occurrence that this one runs)
                self._settle(new if current is None else current, new, now)
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
                self._settle(current, new, now)
                self._seed(replace(new, version=version), now)
                return True
        raise BackendError(f"recurring schedule {name!r} kept changing under this edit")

    def remove(self, name: object) -> bool:
        """Delete the schedule: no occurrence after this call starts. False if none."""
        name = check_schedule_name(name)
        store = self.store
        for _ in range(_CAS_TRIES):
            record = store.get_schedule(name)
            if record is None:
                return False
            if store.delete_schedule(name, version=record.version):
                self._settle(Schedule.from_record(record), None, self._app.clock.time())
                return True
        raise BackendError(f"recurring schedule {name!r} kept changing under this edit")

    # -- the chain ------------------------------------------------------------------------
    def _settle(
        self,
        old: Schedule,
        new: Schedule | None,
        now: float,
        times: Sequence[float] | None = None,
    ) -> None:
        """After an edit from ``old`` to ``new`` (None: removed), make the occurrence
        jobs already enqueued ahead (``times``, or those of either definition due
        within the next ``_SETTLE_WINDOW`` seconds) follow ``new``: a waiting job
        is cancelled, then enqueued again by ``new`` if it still runs then (also
        one an earlier edit cancelled, e.g. a pause now resumed). Jobs that started
        are left alone, and so are those already due unless ``new`` pauses or
        removes the schedule.

        Every edit settles after its write, and a tick settles what it enqueued
        when the record changed under it, so an edit racing a tick never leaves
        an occurrence of the old definition behind.
        """
        if times is None:
            found: set[float] = set()
            for schedule in (old, new):
                if schedule is not None:
                    found.update(
                        schedule.due_between(
                            now - schedule.jitter, now + _SETTLE_WINDOW, _SETTLE_MAX
                        )
                    )
            times = sorted(found)
        backend = self._app.backend
        running = new is not None and not new.paused
        for at in times:
            if running and at <= now:
                continue  # due before this edit: it runs as it was enqueued
            job_id = occurrence_id(old.name, at)
            job = backend.get(job_id)
            if job is None:
                continue  # its tick has not run: it will read the new record
            if job.state is JobState.SCHEDULED:
                if not backend.cancel(job_id).cancelled:
                    continue  # claimed meanwhile: it runs as it was
            elif job.state is not JobState.CANCELLED:
                continue  # running or finished
            if new is not None and new.runs_at(at):
                with contextlib.suppress(JobConflict):  # claimed after a concurrent settle
                    backend.enqueue([self._occurrence_spec(new, at, now)], on_conflict="replace")

    def _seed(self, schedule: Schedule, now: float) -> None:
        """Make sure the tick of the next occurrence is there.

        When a tick with that id exists but no longer waits (it is running, or
        ran, perhaps reading the record from before this edit and ending the
        chain), do its work here: everything it enqueues is idempotent.
        """
        at = schedule.next_run(now)
        if at is None:
            return
        backend = self._app.backend
        spec = self._tick_spec(schedule.name, at, now)
        [outcome] = backend.enqueue([spec], on_conflict="keep")
        if outcome is EnqueueOutcome.KEPT:
            existing = backend.get(spec.id)
            if existing is None or existing.state is not JobState.SCHEDULED:
                self._advance(schedule, at, now)

    @staticmethod
    def _tick_spec(name: str, at: float, now: float) -> JobSpec:
        return JobSpec(
            id=tick_id(name, at),
            name=TICK_HANDLER,
            payload=json.dumps({"schedule": name, "at": at}),
            run_at=at - LEAD,
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
            misfire=schedule.misfire_of(at),
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
        store = self.store
        record = store.get_schedule(name)
        if record is None:
            return f"schedule {name!r} was removed: the chain ends"
        decision = self._advance(Schedule.from_record(record), tick_at, ctx.claimed_at)
        return f"enqueued {len(decision.runs)} occurrence(s); next occurrence {decision.next_tick}"

    def _advance(self, schedule: Schedule, tick_at: float, now: float) -> Plan:
        """What a tick does (``now`` on the store's clock when a worker runs it)."""
        decision = plan(schedule, tick_at, now)
        specs = [self._occurrence_spec(schedule, at, now) for at in decision.runs]
        if decision.next_tick is not None:
            specs.append(self._tick_spec(schedule.name, decision.next_tick, now))
        if specs:
            self._app.backend.enqueue(specs, on_conflict="keep")
        if decision.runs:
            # An edit that committed after the schedule was read may have settled
            # before the enqueue: settle what was enqueued against the record now.
            latest = self.store.get_schedule(schedule.name)
            if latest is None or latest.version != schedule.version:
                fresh = None if latest is None else Schedule.from_record(latest)
                self._settle(schedule, fresh, now, decision.runs)
        return decision
