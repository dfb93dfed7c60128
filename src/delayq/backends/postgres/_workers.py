"""Worker heartbeats on the PostgreSQL store (:class:`~delayq.backends.base.WorkerRegistry`).

One row per worker in ``workers`` (migration 7), keyed by ``(queue, id)`` and
stamped with the server's clock (the clock every host shares), so the dashboard
and ``delayq workers`` of any process see the same workers. A heartbeat is one
upsert that also drops its queue's records not renewed for
:data:`~delayq.backends.base.WORKER_FORGET_AFTER`; it is idempotent, so it is
retried once after a connection failure like a read.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from delayq.backends._workers import check_worker_beat, check_worker_id
from delayq.backends.base import WORKER_FORGET_AFTER, WorkerBeat
from delayq.backends.postgres._schema import quoted
from delayq.backends.postgres._sql import NOW
from delayq.errors import BackendUnavailable

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresWorkers"]


class PostgresWorkers:
    """``beat_worker``, ``list_workers``, ``forget_worker`` (mixed into the store)."""

    if TYPE_CHECKING:
        schema: str

        def _conn(self, doing: str) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _read(
            self, doing: str, query: str, params: dict[str, Any]
        ) -> list[tuple[Any, ...]]: ...

        def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...

    def _workers_table(self) -> str:
        return f"{quoted(self.schema)}.workers"

    def _run_idempotent(self, doing: str, query: str, params: dict[str, Any]) -> None:
        for attempt in (1, 2):
            try:
                with self._conn(doing) as conn:
                    conn.execute(query, params)
                return
            except BackendUnavailable:
                if attempt == 2:
                    raise

    def beat_worker(self, worker_id: str, data: str) -> None:
        worker_id, data = check_worker_beat(worker_id, data)
        table = self._workers_table()
        self._run_idempotent(
            "recording a worker's heartbeat",
            f"""WITH gone AS (
                    DELETE FROM {table} WHERE queue = %(q)s AND id <> %(id)s
                    AND seen < {NOW} - %(forget)s)
                INSERT INTO {table} (queue, id, data, seen)
                VALUES (%(q)s, %(id)s, %(data)s, {NOW})
                ON CONFLICT (queue, id) DO UPDATE SET data = excluded.data, seen = excluded.seen""",
            self._params(id=worker_id, data=data, forget=WORKER_FORGET_AFTER),
        )

    def list_workers(self) -> list[WorkerBeat]:
        rows = self._read(
            "listing workers",
            f"SELECT id, data, seen FROM {self._workers_table()} WHERE queue = %(q)s "
            f"AND seen >= {NOW} - %(forget)s ORDER BY seen DESC",
            self._params(forget=WORKER_FORGET_AFTER),
        )
        return [WorkerBeat(r[0], r[1], float(r[2])) for r in rows]

    def forget_worker(self, worker_id: str) -> None:
        worker_id = check_worker_id(worker_id)
        self._run_idempotent(
            "forgetting a worker",
            f"DELETE FROM {self._workers_table()} WHERE queue = %(q)s AND id = %(id)s",
            self._params(id=worker_id),
        )
