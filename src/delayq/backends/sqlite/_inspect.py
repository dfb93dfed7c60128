"""What an operator asks the SQLite store beyond the contract: retrying jobs.

``count_retrying`` is an optional inspection method (the dashboard uses it when
a store has it): scheduled jobs that already failed at least once, counted on
the partial index ``delayq_jobs_retrying`` (:mod:`._schema`) that holds only
those rows, so the count costs what it returns.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING

__all__ = ["SQLiteInspection"]


class SQLiteInspection:
    """``count_retrying``."""

    if TYPE_CHECKING:

        def _read(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def count_retrying(self) -> int:
        """Scheduled jobs with at least one failed attempt (due again after a backoff)."""
        with self._read("counting retrying jobs") as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM delayq_jobs INDEXED BY delayq_jobs_retrying "
                "WHERE state = 'scheduled' AND attempts > 0"
            ).fetchone()
        return int(row[0])
