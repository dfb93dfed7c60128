"""Schedule records on SQLite (the ``recurring`` feature): one small table of their own.

``delayq_schedules`` lives in the jobs' database file, so schedules are as
durable as the jobs and every process opening the file sees every edit. The
table is created on first use: a database written by a delayq without
recurring jobs opens unchanged.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import TYPE_CHECKING

from delayq.backends._schedules import check_schedule_args, check_schedule_name, check_version
from delayq.backends.base import ScheduleRecord

__all__ = ["SQLiteSchedules"]

_TABLE = """
CREATE TABLE IF NOT EXISTS delayq_schedules (
    name    TEXT PRIMARY KEY,
    data    TEXT NOT NULL,      -- the definition, JSON text
    version INTEGER NOT NULL    -- 1 when created, +1 per write (compare-and-set)
)
"""


class SQLiteSchedules:
    """Mixin for :class:`~delayq.backends.sqlite.SQLiteBackend`: schedule records.

    Uses the host's ``_write`` / ``_read`` transactions (one connection, its
    lock, ``BEGIN IMMEDIATE`` for writes), so a compare-and-set is one
    transaction even across processes.
    """

    if TYPE_CHECKING:

        def _write(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    _schedules_ready_pid: int | None = None

    def _schedules_table(
        self, doing: str, *, write: bool = False
    ) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A transaction (a write one when ``write``) with the table present
        (created once per process)."""
        if self._schedules_ready_pid != os.getpid():
            with self._write("creating the schedules table") as conn:
                conn.execute(_TABLE)
            self._schedules_ready_pid = os.getpid()
        return self._write(doing) if write else self._read(doing)

    def put_schedule(self, name: str, data: str, *, version: int) -> int | None:
        name, data, version = check_schedule_args(name, data, version)
        with self._schedules_table("storing a schedule", write=True) as conn:
            row = conn.execute(
                "SELECT version FROM delayq_schedules WHERE name = ?", (name,)
            ).fetchone()
            if (0 if row is None else row[0]) != version:
                return None
            conn.execute(
                "INSERT INTO delayq_schedules (name, data, version) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET data = excluded.data, version = excluded.version",
                (name, data, version + 1),
            )
        return version + 1

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        name = check_schedule_name(name)
        with self._schedules_table("reading a schedule") as conn:
            row = conn.execute(
                "SELECT name, data, version FROM delayq_schedules WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else ScheduleRecord(*row)

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._schedules_table("listing schedules") as conn:
            rows = conn.execute(
                "SELECT name, data, version FROM delayq_schedules ORDER BY name"
            ).fetchall()
        return [ScheduleRecord(*row) for row in rows]

    def delete_schedule(self, name: str, *, version: int | None = None) -> bool:
        name = check_schedule_name(name)
        with self._schedules_table("deleting a schedule", write=True) as conn:
            if version is None:
                cur = conn.execute("DELETE FROM delayq_schedules WHERE name = ?", (name,))
            else:
                cur = conn.execute(
                    "DELETE FROM delayq_schedules WHERE name = ? AND version = ?",
                    (name, check_version(version)),
                )
            return cur.rowcount > 0
