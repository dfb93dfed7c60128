"""The app's side of recurring schedules: define, store, edit them, and run their ticks.

:class:`RecurringSchedules` is what ``DelayQ.recurring`` and its siblings
delegate to. The model (schedules, occurrences, the pure ``plan`` of a tick)
is :mod:`delayq.recurring.model`; this module adds the input checks (through the
app's own ``build``, so job options are checked and defaulted exactly as for
``schedule``), the compare-and-set edits of the stored record, status and
declarative sync; the jobs of the chain (ticks, occurrences, settling after an
edit) are :mod:`delayq.recurring.chain`.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from delayq._validate import (
    MAX_DELAY,
    check_datetime,
    check_duration,
    check_schedule_name,
)
from delayq.errors import BackendError, InvalidOption
from delayq.recurring.chain import _SETTLE_WINDOW, Chain, JobFactory
from delayq.recurring.model import (
    MIN_EVERY,
    OVERLAP,
    TICK_HANDLER,
    MissedRuns,
    Occurrence,
    Schedule,
    ScheduleStatus,
    check_cron,
    check_zone,
    occurrence_id,
)

__all__ = ["JobFactory", "RecurringSchedules"]

_CAS_TRIES = 20  # compare-and-set attempts of one edit racing others
_MAX_CRON_JITTER = 86400.0

_EDITABLE = (
    "cron",
    "every",
    "tz",
    "payload",
    "handler",
    "start",
    "end",
    "jitter",
    "max_attempts",
    "backoff",
    "misfire",
    "overlap",
)


class RecurringSchedules(Chain):
    """Add, list, change, pause, resume and remove schedules; run ticks.

    The jobs a schedule makes (ticks, occurrences) are delayq's own: they go to
    the store directly, past the app's producer hooks (no trace envelope around
    a tick's payload, no "scheduled" count for what no producer called).

    The app holds one (``DelayQ`` delegates to it); ``rng`` draws the jitter.
    Holds no state of its own besides the app and the rng (``random.Random`` is
    thread-safe for ``uniform``), so it is safe to share between threads.
    """

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
        overlap: object = "allow",
        now: float,
    ) -> Schedule:
        """Validate a definition into a :class:`Schedule` (not stored). Every bad
        argument is an :class:`~delayq.errors.InvalidInput` naming it."""
        name = check_schedule_name(name)
        if name != name.strip():
            raise InvalidOption(f"schedule name must not start or end with a space, got {name!r}")
        if name.startswith(TICK_HANDLER):
            raise InvalidOption(
                f"schedule name must not start with {TICK_HANDLER!r} (the ids of ticks), "
                f"got {name!r}"
            )
        if handler == TICK_HANDLER:
            raise InvalidOption(f"handler {TICK_HANDLER!r} is the built-in handler of ticks")
        if (cron is None) == (every is None):
            raise InvalidOption("give exactly one of cron= (an expression) or every= (seconds)")
        zone = check_zone(tz)
        if every is not None and zone.key != "UTC":
            raise InvalidOption(
                f"tz applies to cron= only (every= counts real seconds); got tz={tz!r} with every="
            )
        start_at = None if start is None else check_datetime(start, "start")
        end_at = None if end is None else check_datetime(end, "end")
        if start_at is not None and end_at is not None and end_at < start_at:
            raise InvalidOption(f"end must not be before start, got start={start!r} end={end!r}")
        interval = None
        if every is not None:
            interval = check_duration(every, "every")
            if not MIN_EVERY <= interval <= MAX_DELAY:
                raise InvalidOption(
                    f"every must be at least {MIN_EVERY} second and at most 100 years, "
                    f"got {every!r}"
                )
            if round(interval, 3) != interval:  # occurrences are on a millisecond grid
                raise InvalidOption(
                    f"every must be a whole number of milliseconds (the precision of job "
                    f"times), got {every!r}"
                )
        expr = None if cron is None else check_cron(cron, zone, now)
        spread = check_duration(jitter, "jitter")
        if spread < 0:
            raise InvalidOption(f"jitter must be >= 0 seconds, got {jitter!r}")
        most = _MAX_CRON_JITTER if interval is None else interval
        if spread > most:
            raise InvalidOption(
                f"jitter must be at most {'every' if interval else 'a day'} ({most:g} s), "
                f"got {jitter!r}"
            )
        if overlap not in OVERLAP:
            raise InvalidOption(f"overlap must be one of {', '.join(OVERLAP)}; got {overlap!r}")
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
        if overlap != "allow" and missed.count > 1:
            raise InvalidOption(
                f"overlap={overlap!r} runs one occurrence at a time; misfire={misfire!r} would "
                f"start {missed.count} at once (use 'latest' or a grace in seconds)"
            )
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
            overlap=str(overlap),
            not_before=now,
            anchor=anchor,
            generation=secrets.token_hex(8),
        )

    def add(self, name: object, *, conflict: object = "replace", **definition: Any) -> Schedule:
        """Store the schedule (create it, or change it to this definition); see
        :meth:`DelayQ.recurring <delayq.app.DelayQ.recurring>`. ``conflict="keep"``
        leaves a stored schedule of that name as it is (create only)."""
        if conflict not in ("replace", "keep"):
            raise InvalidOption(f"conflict must be 'replace' or 'keep', got {conflict!r}")
        now = self._app.clock.time()
        wanted = self.define(name, now=now, **definition)
        return self._write(wanted.name, lambda current: wanted, now, keep=conflict == "keep")

    def _write(
        self,
        name: str,
        build: Callable[[Schedule | None], Schedule],
        now: float,
        *,
        keep: bool = False,
    ) -> Schedule:
        """The compare-and-set edit of one record: each try reads the record and
        builds the wanted definition from what it read (so a concurrent edit is
        merged, never overwritten), then writes it only if the record is still
        that version."""
        store = self.store
        for _ in range(_CAS_TRIES):
            record = store.get_schedule(name)
            current = None if record is None else Schedule.from_record(record)
            if current is not None and keep:
                self._seed(current, now)
                return current
            wanted = build(current)
            if current is not None and current.same_definition(wanted):
                # an earlier edit that failed half-way may have left a cancelled
                # occurrence: settle again (it repairs that), and the chain
                self._settle(current, current, now)
                self._seed(current, now)  # repairs a chain that ended (a buried tick)
                return current
            new = wanted if current is None else self._changed(current, wanted, now)
            if new.next_after(max(now, new.not_before)) is None:
                raise InvalidOption(
                    f"schedule {name!r} would never run again (end={new.end!r} is past "
                    f"or before its next occurrence)"
                )
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
        raise BackendError(f"recurring schedule {name!r} kept changing under this edit")

    @staticmethod
    def _changed(current: Schedule, wanted: Schedule, now: float) -> Schedule:
        """``wanted`` replacing ``current``: the pause state and generation stay.

        The timing keeps its place unless what places the occurrences changed:
        an ``every=`` schedule keeps its anchor when only ``end`` changes, and a
        new interval counts from the last occurrence (so two definitions that
        alternate, e.g. old and new processes of a rolling deploy, keep it
        running); a cron schedule starts from now (``not_before``) when its
        expression, zone or ``start`` changes.
        """
        wanted = replace(wanted, paused=current.paused, generation=current.generation)
        if wanted.every is not None and current.every is not None:
            if wanted.start != current.start:
                return wanted  # anchored at the new start (or from now)
            if wanted.every == current.every:
                return replace(wanted, not_before=current.not_before, anchor=current.anchor)
            last = current.due_between(-math.inf, now, 1)
            anchor = (
                last[0] + wanted.every
                if last
                else min(current.anchor, wanted.anchor)  # before its first occurrence
            )
            return replace(wanted, not_before=max(now, current.not_before), anchor=anchor)
        if wanted.cron is not None and (wanted.cron, wanted.tz, wanted.start) == (
            current.cron,
            current.tz,
            current.start,
        ):
            return replace(wanted, not_before=current.not_before, anchor=current.anchor)
        return wanted

    def update(self, name: object, **changes: Any) -> Schedule:
        """Change some fields of a stored schedule (the others stay); the merge is
        made from the record each compare-and-set try reads."""
        name = check_schedule_name(name)
        if "cron" in changes and changes["cron"] is not None:
            changes.setdefault("every", None)
        if "every" in changes and changes["every"] is not None:
            changes.setdefault("cron", None)
            changes.setdefault("tz", "UTC")
        unknown = set(changes) - set(_EDITABLE)
        if unknown:
            raise InvalidOption(
                f"unknown schedule field(s) {sorted(unknown)}; accepted: {sorted(_EDITABLE)}"
            )
        now = self._app.clock.time()

        def merged(current: Schedule | None) -> Schedule:
            if current is None:
                raise InvalidOption(f"no recurring schedule is named {name!r}")
            definition = {k: getattr(current, k) for k in _EDITABLE}
            definition["payload"] = json.loads(current.payload)
            definition.update(changes)
            return self.define(name, now=now, **definition)

        if not changes:  # nothing to change: say whether it exists
            current = self.get(name)
            return merged(current) if current is None else current
        return self._write(name, merged, now)

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

    def status(self, name: object, *, runs: int = 5, history: int = 10) -> ScheduleStatus | None:
        """The schedule, its next ``runs`` run times and its latest ``history``
        occurrences with their jobs' states (newest first), or None."""
        for value, field_name in ((runs, "runs"), (history, "history")):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
                raise InvalidOption(f"{field_name} must be an int from 0 to 1000, got {value!r}")
        schedule = self.get(name)
        if schedule is None:
            return None
        now = self._app.clock.time()
        upcoming: list[float] = []
        at = schedule.next_run(now)
        while at is not None and len(upcoming) < runs:
            upcoming.append(at)
            at = schedule.next_after(at)
        backend = self._app.backend
        past: list[Occurrence] = []
        times = schedule.due_between(-math.inf, now + _SETTLE_WINDOW, history) if history else []
        for at in reversed(times):
            job_id = occurrence_id(schedule.name, at)
            job = backend.get(job_id)
            if job is None:
                past.append(Occurrence(at, job_id))
                continue
            past.append(
                Occurrence(
                    at,
                    job_id,
                    job.state.value,
                    job.attempts,
                    job.updated_at,
                    job.outcome or job.last_error,
                )
            )
        return ScheduleStatus(schedule, tuple(upcoming), tuple(past))

    def sync(
        self, definitions: Iterable[Mapping[str, Any]], *, dry_run: bool = False
    ) -> dict[str, list[str]]:
        """Make the stored schedules exactly ``definitions`` (each a mapping with
        ``name`` and :meth:`add`'s keywords): create or change each, remove every
        other stored schedule. All are checked before anything is written.
        Returns the names ``created``, ``changed``, ``unchanged`` and ``removed``."""
        now = self._app.clock.time()
        wanted: dict[str, Schedule] = {}
        for i, definition in enumerate(definitions):
            if not isinstance(definition, Mapping) or "name" not in definition:
                raise InvalidOption(
                    f"schedule {i} must be a mapping with a 'name', got {definition!r}"
                )
            fields = dict(definition)
            name = fields.pop("name")
            unknown = set(fields) - set(_EDITABLE)
            if unknown:
                raise InvalidOption(
                    f"schedule {name!r}: unknown field(s) {sorted(unknown)}; "
                    f"accepted: {sorted(_EDITABLE)}"
                )
            schedule = self.define(name, now=now, **fields)
            if schedule.name in wanted:
                raise InvalidOption(f"schedule {schedule.name!r} is defined twice")
            wanted[schedule.name] = schedule
        stored = {s.name: s for s in self.list_schedules()}
        result: dict[str, list[str]] = {
            "created": [],
            "changed": [],
            "unchanged": [],
            "removed": [],
        }
        for name, schedule in wanted.items():
            current = stored.get(name)
            kind = (
                "created"
                if current is None
                else "unchanged"
                if current.same_definition(schedule)
                else "changed"
            )
            result[kind].append(name)
            if not dry_run:
                self._write(name, lambda _current, s=schedule: s, now)  # type: ignore[misc]
        for name in sorted(set(stored) - set(wanted)):
            result["removed"].append(name)
            if not dry_run:
                self.remove(name)
        return result
