"""DelayQ's recurring schedules: the public methods, delegated to RecurringSchedules.

A base of :class:`~delayq.app.DelayQ` (like ``AppLimits``): the app keeps its
``RecurringSchedules`` in ``_recurring``; see :mod:`delayq.recurring` for the design.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Literal

from delayq._build import BackoffArg, WhenArg
from delayq.job import Handler
from delayq.recurring.model import TICK_HANDLER, Schedule, ScheduleStatus
from delayq.recurring.schedules import RecurringSchedules

__all__ = ["AppRecurring"]


class AppRecurring:
    """``recurring`` / ``sync_recurring`` / ``*_recurring``: schedules kept in the store."""

    _recurring: RecurringSchedules

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
        misfire: str | float = "latest",
        overlap: Literal["allow", "skip", "replace"] = "allow",
        conflict: Literal["replace", "keep"] = "replace",
    ) -> Schedule:
        """Store a recurring schedule (or change the stored one to this definition).

        Give exactly one of ``cron`` (a cron expression, evaluated in ``tz``, a
        ``zoneinfo`` name) or ``every`` (seconds or a ``timedelta``, at least 1
        s). Each occurrence runs handler ``handler`` (default: ``name``) with
        ``payload`` as an ordinary job with id ``<name>@<UTC time>`` and the job
        options ``max_attempts`` / ``backoff``; ``jitter`` delays each one by a
        random 0..jitter seconds. ``start`` / ``end`` bound the occurrences.
        ``misfire`` decides what runs after downtime: ``"latest"`` (the latest
        missed occurrence, once), ``"skip"`` (none), ``"catchup:N"`` (the last
        N) or a grace in seconds (the latest, if at most that late).
        ``overlap`` decides what an occurrence does while the previous one still
        waits or runs: ``"allow"``, ``"skip"`` (it does not run) or
        ``"replace"`` (a previous one not yet started is cancelled). Calling it
        again with the same definition changes nothing (call it at every
        start-up); ``conflict="keep"`` also leaves a different stored definition
        as it is. A paused schedule stays paused. Needs a store with the
        ``recurring`` feature. See :mod:`delayq.recurring`.
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
            overlap=overlap,
            conflict=conflict,
        )

    def sync_recurring(
        self, definitions: Iterable[Mapping[str, Any]], *, dry_run: bool = False
    ) -> dict[str, list[str]]:
        """Make the stored schedules exactly ``definitions`` (mappings of ``name``
        and :meth:`recurring`'s keywords), removing every other one; all are
        checked before anything changes. Returns the names ``created``,
        ``changed``, ``unchanged`` and ``removed`` (``dry_run``: only says so)."""
        return self._recurring.sync(definitions, dry_run=dry_run)

    def run_recurring_now(self, name: str) -> str:
        """Enqueue an occurrence of schedule ``name`` due now (its handler, payload,
        options; id ``<name>@<now>``), whatever its timing or pause; return its id."""
        return self._recurring.run_now(name)

    def recurring_status(
        self, name: str, *, runs: int = 5, history: int = 10
    ) -> ScheduleStatus | None:
        """Schedule ``name`` with its next ``runs`` run times and its latest
        ``history`` occurrences and their jobs' states (newest first; a finished
        record lasts as long as the store keeps it), or None."""
        return self._recurring.status(name, runs=runs, history=history)

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
