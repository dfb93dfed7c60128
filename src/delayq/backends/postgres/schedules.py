"""Schedule records on PostgreSQL (the ``recurring`` feature).

``<schema>.schedules`` (migration 2 in :mod:`.schema`) holds one row per queue
and schedule name. Every call is one statement: a compare-and-set write is an
``INSERT ... ON CONFLICT DO NOTHING`` (create) or an ``UPDATE ... WHERE version
= %(v)s`` (edit), so two editors on two hosts never overwrite each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from delayq.backends._schedules import check_schedule_args, check_schedule_name, check_version
from delayq.backends.base import ScheduleRecord
from delayq.backends.postgres import schema as _schema

__all__ = ["PostgresSchedules"]


class PostgresSchedules:
    """Mixin for :class:`~delayq.backends.postgres.PostgresBackend`: schedule records.

    Uses the host's ``_read`` (retried once) and ``_write`` (never retried)
    statements, its ``queue`` and ``schema``.
    """

    if TYPE_CHECKING:
        queue: str
        schema: str

        def _read(
            self, doing: str, query: str, params: dict[str, Any]
        ) -> list[tuple[Any, ...]]: ...

        def _write(
            self, doing: str, query: str, params: dict[str, Any]
        ) -> list[tuple[Any, ...]]: ...

    def _schedules_table(self) -> str:
        return f"{_schema.quoted(self.schema)}.schedules"

    def put_schedule(self, name: str, data: str, *, version: int) -> int | None:
        name, data, version = check_schedule_args(name, data, version)
        table = self._schedules_table()
        params = {"q": self.queue, "n": name, "d": data, "v": version}
        if version == 0:
            query = (
                f"INSERT INTO {table} (queue, name, data, version) "
                f"VALUES (%(q)s, %(n)s, %(d)s, 1) ON CONFLICT DO NOTHING RETURNING version"
            )
        else:
            query = (
                f"UPDATE {table} SET data = %(d)s, version = version + 1 "
                f"WHERE queue = %(q)s AND name = %(n)s AND version = %(v)s RETURNING version"
            )
        rows = self._write("storing a schedule", query, params)
        return int(rows[0][0]) if rows else None

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        name = check_schedule_name(name)
        rows = self._read(
            "reading a schedule",
            f"SELECT name, data, version FROM {self._schedules_table()} "
            f"WHERE queue = %(q)s AND name = %(n)s",
            {"q": self.queue, "n": name},
        )
        return ScheduleRecord(*rows[0]) if rows else None

    def list_schedules(self) -> list[ScheduleRecord]:
        rows = self._read(
            "listing schedules",
            # COLLATE "C": code point order, the order of every other store
            f"SELECT name, data, version FROM {self._schedules_table()} "
            f'WHERE queue = %(q)s ORDER BY name COLLATE "C"',
            {"q": self.queue},
        )
        return [ScheduleRecord(*row) for row in rows]

    def delete_schedule(self, name: str, *, version: int | None = None) -> bool:
        name = check_schedule_name(name)
        where = "queue = %(q)s AND name = %(n)s"
        params: dict[str, Any] = {"q": self.queue, "n": name}
        if version is not None:
            where += " AND version = %(v)s"
            params["v"] = check_version(version)
        rows = self._write(
            "deleting a schedule",
            f"DELETE FROM {self._schedules_table()} WHERE {where} RETURNING 1",
            params,
        )
        return bool(rows)
