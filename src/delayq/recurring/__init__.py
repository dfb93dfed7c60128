"""Recurring schedules: the pure model (:mod:`~delayq.recurring.model`) and the app's
side that stores, edits and runs them (:mod:`~delayq.recurring.schedules`).

The names of the model are re-exported here: ``from delayq.recurring import Schedule``.
"""

from __future__ import annotations

from delayq.recurring.model import (
    LEAD,
    MACROS,
    MAX_CATCHUP,
    MIN_EVERY,
    OVERLAP,
    TICK_HANDLER,
    MissedRuns,
    Occurrence,
    Plan,
    Schedule,
    ScheduleStatus,
    check_cron,
    check_zone,
    expand_cron,
    occurrence_id,
    occurrence_time,
    plan,
    tick_id,
)

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
