"""Schedule records on PostgreSQL (the ``recurring`` feature): a small table of their own.

``schedules`` lives in delayq's schema next to ``jobs`` (migration 2), keyed by
``(queue, name)``, so schedules are as durable as the jobs and every process
sees every edit. Each write is one statement whose ``WHERE`` carries the
expected version: a compare-and-set without a read first.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import psycopg

from delayq.backends._schedules import check_schedule_args, check_schedule_name, check_version
from delayq.backends.base import ScheduleRecord

__all__ = ["PostgresSchedules"]


class _Store(Protocol):
    queue: str
    schema: str

    def _conn(self, doing: str) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def _read(self, doing: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]: ...

    def _write(self, doing: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]: ...


def _table(store: _Store) -> str:
    return f'"{store.schema}".schedules'


class PostgresSchedules:
    """``put_schedule``, ``get_schedule``, ``list_schedules``, ``delete_schedule``."""

    def put_schedule(self: _Store, name: str, data: str, *, version: int) -> int | None:
        name, data, version = check_schedule_args(name, data, version)
        params = {"q": self.queue, "name": name, "data": data, "version": version}
        if version == 0:
            query = (
                f"INSERT INTO {_table(self)} (queue, name, data, version) "
                f"VALUES (%(q)s, %(name)s, %(data)s, 1) "
                f"ON CONFLICT (queue, name) DO NOTHING RETURNING version"
            )
        else:
            query = (
                f"UPDATE {_table(self)} SET data = %(data)s, version = version + 1 "
                f"WHERE queue = %(q)s AND name = %(name)s AND version = %(version)s "
                f"RETURNING version"
            )
        rows = self._write("storing a schedule", query, params)
        return int(rows[0][0]) if rows else None

    def get_schedule(self: _Store, name: str) -> ScheduleRecord | None:
        rows = self._read(
            "reading a schedule",
            f"SELECT name, data, version FROM {_table(self)} "
            f"WHERE queue = %(q)s AND name = %(name)s",
            {"q": self.queue, "name": check_schedule_name(name)},
        )
        return ScheduleRecord(*rows[0]) if rows else None

    def list_schedules(self: _Store) -> list[ScheduleRecord]:
        rows = self._read(
            "listing schedules",
            # COLLATE "C": code point order, whatever the database's locale
            f"SELECT name, data, version FROM {_table(self)} WHERE queue = %(q)s "
            f'ORDER BY name COLLATE "C"',
            {"q": self.queue},
        )
        return [ScheduleRecord(*row) for row in rows]

    def delete_schedule(self: _Store, name: str, *, version: int | None = None) -> bool:
        rows = self._write(
            "deleting a schedule",
            f"DELETE FROM {_table(self)} WHERE queue = %(q)s AND name = %(name)s "
            f"AND (%(version)s::int IS NULL OR version = %(version)s::int) RETURNING 1",
            {
                "q": self.queue,
                "name": check_schedule_name(name),
                "version": None if version is None else check_version(version),
            },
        )
        return bool(rows)
