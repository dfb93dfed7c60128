"""What an operator asks the SQLite store beyond the contract: retrying jobs, workers.

``count_retrying`` is an optional inspection method (the dashboard uses it when
a store has it): scheduled jobs that already failed at least once, counted on
the partial index ``delayq_jobs_retrying`` (:mod:`._schema`) that holds only
those rows, so the count costs what it returns.

The worker registry (:class:`~delayq.backends.base.WorkerRegistry`) is the
table ``delayq_workers``, created on first use: one row per worker, replaced
on every heartbeat in its own short write.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import TYPE_CHECKING

from delayq.backends._workers import check_worker_beat, check_worker_id
from delayq.backends.base import WORKER_FORGET_AFTER, WorkerBeat

if TYPE_CHECKING:
    from delayq.clock import Clock

__all__ = ["SQLiteInspection"]

_WORKERS = (
    "CREATE TABLE IF NOT EXISTS delayq_workers "
    "(id TEXT PRIMARY KEY, data TEXT NOT NULL, seen REAL NOT NULL)"
)


class SQLiteInspection:
    """``count_retrying``, ``handler_counts`` and the worker registry."""

    _workers_ready_pid: int | None = None

    if TYPE_CHECKING:
        _clock: Clock

        def _read(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

        def _write(
            self, doing: str, *, durable: bool = True
        ) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def handler_counts(self, now: float) -> list[tuple[str, str, int, int, float | None]]:
        """``(name, state, count, due, oldest due run_at)`` of the scheduled, running
        and dead jobs, grouped on the ``(name, state, ...)`` index in one read."""
        with self._read("counting jobs by handler") as conn:
            rows = conn.execute(
                "SELECT name, state, COUNT(*), "
                "SUM(state = 'scheduled' AND run_at <= ?), "
                "MIN(CASE WHEN state = 'scheduled' AND run_at <= ? THEN run_at END) "
                "FROM delayq_jobs INDEXED BY delayq_jobs_name "
                "WHERE state IN ('scheduled', 'running', 'dead') GROUP BY name, state",
                (now, now),
            ).fetchall()
        return [(r[0], r[1], int(r[2]), int(r[3] or 0), r[4]) for r in rows]

    def _workers_table(self) -> None:
        if self._workers_ready_pid != os.getpid():
            with self._write("creating the workers table") as conn:
                conn.execute(_WORKERS)
            self._workers_ready_pid = os.getpid()

    def beat_worker(self, worker_id: str, data: str) -> None:
        worker_id, data = check_worker_beat(worker_id, data)
        self._workers_table()
        now = self._clock.time()
        with self._write("recording a worker's heartbeat", durable=False) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO delayq_workers (id, data, seen) VALUES (?, ?, ?)",
                (worker_id, data, now),
            )
            conn.execute("DELETE FROM delayq_workers WHERE seen < ?", (now - WORKER_FORGET_AFTER,))

    def list_workers(self) -> list[WorkerBeat]:
        self._workers_table()
        with self._read("listing workers") as conn:
            rows = conn.execute(
                "SELECT id, data, seen FROM delayq_workers ORDER BY seen DESC"
            ).fetchall()
        return [WorkerBeat(r[0], r[1], r[2]) for r in rows]

    def forget_worker(self, worker_id: str) -> None:
        worker_id = check_worker_id(worker_id)
        self._workers_table()
        with self._write("forgetting a worker", durable=False) as conn:
            conn.execute("DELETE FROM delayq_workers WHERE id = ?", (worker_id,))

    def count_retrying(self) -> int:
        """Scheduled jobs with at least one failed attempt (due again after a backoff)."""
        with self._read("counting retrying jobs") as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM delayq_jobs INDEXED BY delayq_jobs_retrying "
                "WHERE state = 'scheduled' AND attempts > 0"
            ).fetchone()
        return int(row[0])
