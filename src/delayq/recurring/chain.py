"""The chain of a recurring schedule: its tick jobs and occurrence jobs.

:class:`Chain` is the part of :class:`~delayq.recurring.schedules.RecurringSchedules`
that touches jobs: the tick handler (enqueue the due occurrences and the next
tick, under the ``misfire`` and ``overlap`` policies), the seed of a chain, the
settling of occurrences already enqueued after an edit, and run-now. The
records and their edits are :mod:`delayq.recurring.schedules`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

from delayq._validate import (
    check_schedule_name,
    check_seconds,
)
from delayq.backends.base import Backend, ScheduleStore
from delayq.clock import Clock
from delayq.errors import ConfigurationError, InvalidOption, JobConflict
from delayq.job import EnqueueOutcome, JobContext, JobSpec, JobState
from delayq.recurring.model import (
    LEAD,
    TICK_HANDLER,
    Plan,
    Schedule,
    occurrence_id,
    plan,
    tick_id,
)

__all__ = ["Chain", "JobFactory"]

log = logging.getLogger("delayq.recurring")

_TICK_MAX_ATTEMPTS = 100  # a tick fails only when the store does; keep trying for hours
_TICK_BACKOFF: dict[str, Any] = {"kind": "exponential", "base": 1.0, "factor": 2.0, "cap": 300.0}
# Occurrence jobs are enqueued at most LEAD seconds ahead (on the store's clock);
# an edit settles those within twice that, for a producer clock a little behind.
_SETTLE_WINDOW = 2 * LEAD
_SETTLE_MAX = 100
# A cancelled occurrence is enqueued again only while its time is at least this
# far ahead: a job not yet due cannot have run, so "replace" never brings back
# one that another edit revived and a worker already ran.
_REVIVE_MARGIN = 0.1
_WAITING = (JobState.SCHEDULED, JobState.RUNNING)


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


class Chain:
    """The jobs of recurring schedules (see the module docstring). Holds no state
    of its own besides the app and the rng (``random.Random`` is thread-safe for
    ``uniform``), so it is safe to share between threads."""

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

    # -- the chain ------------------------------------------------------------------------
    def _settle(
        self,
        old: Schedule,
        new: Schedule | None,
        now: float,
        times: Sequence[float] | None = None,
    ) -> None:
        """After an edit from ``old`` to ``new`` (None: removed), make the occurrence
        jobs already enqueued (``times``, or those of either definition due within
        the next ``_SETTLE_WINDOW`` seconds) follow ``new``: a waiting job is
        cancelled, then enqueued again by ``new`` if it still runs then (also one
        an earlier edit cancelled, e.g. a pause now resumed). Jobs that started
        are left alone, and so are those already due unless ``new`` pauses or
        removes the schedule: then every waiting occurrence is cancelled, also
        the catch-up and latest ones a late tick enqueued long after their time
        (the last ``window + _SETTLE_MAX`` occurrences are looked at). When
        ``new`` is ``old`` (the same definition declared again) a waiting job is
        left alone and only a cancelled one is enqueued again.

        Every edit settles after its write, and a tick settles what it enqueued
        when the record changed under it, so an edit racing a tick never leaves
        an occurrence of the old definition behind.
        """
        running = new is not None and not new.paused
        if times is None:
            found: set[float] = set()
            for schedule in (old, new):
                if schedule is None:
                    continue
                if running:
                    lo, limit = now - schedule.jitter, _SETTLE_MAX
                else:  # stopping: everything still waiting, however far back
                    lo, limit = -math.inf, schedule.missed.window + _SETTLE_MAX
                found.update(schedule.due_between(lo, now + _SETTLE_WINDOW, limit))
            times = sorted(found)
        backend = self._app.backend
        for at in times:
            if running and at <= now:
                continue  # due before this edit: it runs as it was enqueued
            job_id = occurrence_id(old.name, at)
            job = backend.get(job_id)
            if job is None:
                continue  # its tick has not run: it will read the new record
            if job.state is JobState.SCHEDULED:
                if new is old or (running and not self._ahead(at)):
                    continue  # the same definition, or too close to its time: as it was
                if not backend.cancel(job_id).cancelled:
                    continue  # claimed meanwhile: it runs as it was
            elif job.state is not JobState.CANCELLED:
                continue  # running or finished
            if new is not None and new.runs_at(at):
                if not self._ahead(at):
                    log.warning("occurrence %s is too close to its time to enqueue again", job_id)
                    continue
                with contextlib.suppress(JobConflict):  # claimed after a concurrent settle
                    backend.enqueue([self._occurrence_spec(new, at, now)], on_conflict="replace")

    def _ahead(self, at: float) -> bool:
        """True while the occurrence at ``at`` is not yet due, by a margin: a job that
        is not due has not run, so replacing it cannot run the occurrence twice."""
        return self._app.clock.time() < at - _REVIVE_MARGIN

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
                self._advance(schedule, at, now, again=True)

    @staticmethod
    def _tick_spec(name: str, at: float, now: float, last: float | None = None) -> JobSpec:
        data: dict[str, Any] = {"schedule": name, "at": at}
        if last is not None:
            data["last"] = last  # the latest occurrence enqueued (overlap="skip")
        return JobSpec(
            id=tick_id(name, at),
            name=TICK_HANDLER,
            payload=json.dumps(data),
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
            misfire=schedule.misfire_of(at, now),
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
        last = payload.get("last")
        store = self.store
        record = store.get_schedule(name)
        if record is None:
            return f"schedule {name!r} was removed: the chain ends"
        decision = self._advance(
            Schedule.from_record(record),
            tick_at,
            ctx.claimed_at,
            again=ctx.attempt > 1,
            last=None if last is None else check_seconds(last, "last"),
        )
        return f"enqueued {len(decision.runs)} occurrence(s); next occurrence {decision.next_tick}"

    def _advance(
        self,
        schedule: Schedule,
        tick_at: float,
        now: float,
        *,
        again: bool = False,
        last: float | None = None,
    ) -> Plan:
        """What a tick does (``now`` on the store's clock when a worker runs it).

        ``again``: this tick may have run before (a retry, or a seed finding it
        ran). Its enqueue of occurrences and next tick is one atomic call, so
        when the next tick is there, its occurrences were enqueued too: they are
        not enqueued again (their finished records may be gone: dedup by id
        lasts only as long as the store keeps them). ``last`` is the latest
        occurrence an earlier tick enqueued (for ``overlap``).
        """
        decision = plan(schedule, tick_at, now)
        backend = self._app.backend
        runs = decision.runs
        if (
            runs
            and again
            and decision.next_tick is not None
            and backend.get(tick_id(schedule.name, decision.next_tick)) is not None
        ):
            runs = ()
        if runs and schedule.overlap != "allow":
            runs = self._overlap(schedule, runs, tick_at, last)
            last = runs[-1] if runs else last
        elif runs:
            last = runs[-1]
        if runs and now >= tick_at:
            self._supersede(schedule, tick_at, len(runs))
        specs = [self._occurrence_spec(schedule, at, now) for at in runs]
        if decision.next_tick is not None:
            specs.append(self._tick_spec(schedule.name, decision.next_tick, now, last))
        if specs:
            backend.enqueue(specs, on_conflict="keep")
        if runs:
            # An edit that committed after the schedule was read may have settled
            # before the enqueue: settle what was enqueued against the record now.
            # (The generation tells a schedule removed and created again, whose
            # record version starts again at 1.)
            latest = self.store.get_schedule(schedule.name)
            if (
                latest is None
                or latest.version != schedule.version
                or Schedule.generation_of(latest) != schedule.generation
            ):
                fresh = None if latest is None else Schedule.from_record(latest)
                self._settle(schedule, fresh, now, runs)
        return replace(decision, runs=runs)

    def _overlap(
        self, schedule: Schedule, runs: tuple[float, ...], tick_at: float, last: float | None
    ) -> tuple[float, ...]:
        """``runs`` under the schedule's overlap policy: ``skip`` drops them while the
        previous occurrence still waits or runs; ``replace`` cancels that one if it
        has not started (a running handler cannot be stopped from outside)."""
        before = [last] if last is not None else schedule.due_between(-math.inf, tick_at - 0.001, 3)
        backend = self._app.backend
        for at in before:
            job_id = occurrence_id(schedule.name, at)
            job = backend.get(job_id)
            if job is None or job.state not in _WAITING:
                continue
            if schedule.overlap == "skip":
                log.info(
                    "%s: skipped %d occurrence(s), %s is still %s",
                    schedule.name,
                    len(runs),
                    job_id,
                    job.state.value,
                )
                return ()
            if job.state is JobState.SCHEDULED:
                backend.cancel(job_id)
        return runs

    def _supersede(self, schedule: Schedule, tick_at: float, enqueued: int) -> None:
        """A late tick enqueued the latest due occurrences: cancel the earlier ones
        still waiting beyond what ``misfire`` runs (under ``latest``, the one
        before; they would otherwise run after the latest, late)."""
        missed = schedule.missed
        if missed.policy not in ("latest", "catchup"):
            return  # skip and grace: their job grace drops them by time
        earlier = schedule.due_between(-math.inf, tick_at - 0.001, min(missed.window, _SETTLE_MAX))
        extra = len(earlier) - max(0, missed.count - enqueued)
        backend = self._app.backend
        for at in earlier[: max(0, extra)]:
            job_id = occurrence_id(schedule.name, at)
            job = backend.get(job_id)
            if job is not None and job.state is JobState.SCHEDULED:
                backend.cancel(job_id)

    # -- operators ------------------------------------------------------------------------
    def run_now(self, name: object) -> str:
        """Enqueue an occurrence of the schedule due now, with its own handler,
        payload and job options and the id ``<name>@<now>``; return the job id."""
        name = check_schedule_name(name)
        record = self.store.get_schedule(name)
        if record is None:
            raise InvalidOption(f"no recurring schedule is named {name!r}")
        schedule = Schedule.from_record(record)
        now = self._app.clock.time()
        at = round(now, 3)
        spec = replace(self._occurrence_spec(schedule, at, now), run_at=now, misfire="run")
        self._app.backend.enqueue([spec], on_conflict="keep")
        return spec.id
