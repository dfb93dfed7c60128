"""Recurring schedules: the pure model (:mod:`~delayq.recurring.model`) and the app's
side that stores, edits and runs them (:mod:`~delayq.recurring.schedules`).

The names of the model are re-exported here: ``from delayq.recurring import Schedule``.
"""

from __future__ import annotations

from delayq.recurring.model import (
    LEAD,
    MAX_CATCHUP,
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

__all__ = [
    "LEAD",
    "MAX_CATCHUP",
    "MIN_EVERY",
    "TICK_HANDLER",
    "MissedRuns",
    "Plan",
    "Schedule",
    "check_cron",
    "check_zone",
    "occurrence_id",
    "plan",
    "tick_id",
]
