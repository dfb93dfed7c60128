"""Enqueue on PostgreSQL: with the store's own connection, or in the caller's transaction.

The common case is one ``INSERT`` of every spec (a unique violation fails it
whole, nothing stored), then, after its commit, the head check that wakes
listeners if a new job is the earliest. A conflict takes the slow path: the
existing rows locked, ``reject`` / ``keep`` / ``replace`` decided row by row,
all in one transaction. With ``connection=``, the same runs under a savepoint
of the caller's transaction and the NOTIFY is part of it: delivered on commit,
dropped on rollback.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import psycopg
from psycopg.rows import tuple_row

from delayq.backends._common import TTL_STATES, check_spec, conflict_error, resolve_conflicts
from delayq.backends.postgres._connection import caller_connection, mapped
from delayq.backends.postgres._flow import uses_flow
from delayq.backends.postgres._sql import Statements
from delayq.errors import InvalidOption, JobConflict
from delayq.job import EnqueueOutcome, JobSpec, JobState, OnConflict, check_on_conflict

__all__ = ["PostgresEnqueue"]


class _Store(Protocol):
    url: str
    queue: str
    _sql: Statements
    _channel: str

    def _conn(self, doing: str) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...

    def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None: ...

    def _same_database(self, conn: psycopg.Connection[Any]) -> None: ...

    def _mark_flow(
        self, conn: psycopg.Connection[Any], *, groups: bool, committed: bool = False
    ) -> None: ...


class PostgresEnqueue:
    """``enqueue`` (see the module docstring)."""

    def enqueue(
        self: _Store,
        jobs: Sequence[JobSpec],
        *,
        on_conflict: OnConflict = "reject",
        connection: object = None,
    ) -> list[EnqueueOutcome]:
        """Store ``jobs`` atomically (see the Backend contract).

        With ``connection=`` (a psycopg connection, a SQLAlchemy Connection /
        Session on psycopg, or Django's connection) the jobs join that
        connection's transaction: they exist if and only if it commits, and are
        invisible to workers until then.
        """
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if connection is not None:
            conn = caller_connection(connection)
            if specs:
                self._same_database(conn)
            return PostgresEnqueue._enqueue_in(self, conn, specs, on_conflict)
        if not specs:
            return []
        with self._conn("enqueueing") as conn:
            flow, groups = uses_flow(specs)
            if flow:  # committed before the jobs: no claim of them ignores their fields
                self._mark_flow(conn, groups=groups, committed=True)
            params = PostgresEnqueue._insert_params(self, specs)
            try:
                rows = conn.cursor(row_factory=tuple_row).execute(self._sql.insert, params)
                created = rows.fetchall()
                outcomes = [EnqueueOutcome.CREATED] * len(specs)
            except psycopg.errors.UniqueViolation:
                with conn.transaction():
                    outcomes, created = PostgresEnqueue._enqueue_slow(
                        self, conn, specs, on_conflict
                    )
            self._told(conn, min((r[1] for r in created), default=None))
        return outcomes

    def _enqueue_in(
        self: _Store, conn: psycopg.Connection[Any], specs: list[JobSpec], on_conflict: OnConflict
    ) -> list[EnqueueOutcome]:
        """Enqueue inside the caller's transaction, under a savepoint (all or none)."""
        if not specs:
            return []
        status = conn.info.transaction_status
        if status == psycopg.pq.TransactionStatus.INERROR:
            raise InvalidOption(
                "connection= is in a failed transaction: roll it back before scheduling"
            )
        with mapped(self.url, "enqueueing in the caller's transaction"):
            if status == psycopg.pq.TransactionStatus.IDLE and conn.autocommit:
                # No transaction of the caller's to join: ours commits at once.
                with conn.transaction():
                    return PostgresEnqueue._enqueue_joined(self, conn, specs, on_conflict)
            conn.execute("SAVEPOINT delayq_enqueue")
            try:
                outcomes = PostgresEnqueue._enqueue_joined(self, conn, specs, on_conflict)
            except BaseException:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK TO SAVEPOINT delayq_enqueue")
                    conn.execute("RELEASE SAVEPOINT delayq_enqueue")
                raise
            conn.execute("RELEASE SAVEPOINT delayq_enqueue")
            return outcomes

    def _enqueue_joined(
        self: _Store, conn: psycopg.Connection[Any], specs: list[JobSpec], on_conflict: OnConflict
    ) -> list[EnqueueOutcome]:
        flow, groups = uses_flow(specs)
        if flow:  # committed with the jobs
            self._mark_flow(conn, groups=groups)
        outcomes, created = PostgresEnqueue._enqueue_slow(self, conn, specs, on_conflict)
        at = min((r[1] for r in created), default=None)
        if at is not None:
            # Delivered when the caller commits, never on rollback. Not checked against
            # the head (it may change before that commit; listeners filter by time),
            # but sent once per transaction unless a later call schedules earlier.
            conn.execute(
                self._sql.notify,
                {"channel": self._channel, "at": at, "guc": f"delayq.{self._channel}"},
            )
        return outcomes

    def _insert_params(self: _Store, specs: Sequence[JobSpec]) -> dict[str, Any]:
        return self._params(
            ids=[s.id for s in specs],
            names=[s.name for s in specs],
            payloads=[s.payload for s in specs],
            run_ats=[float(s.run_at) if s.delay is None else 0.0 for s in specs],
            delays=[None if s.delay is None else float(s.delay) for s in specs],
            max_attempts=[s.max_attempts for s in specs],
            backoffs=[json.dumps(s.backoff, separators=(",", ":")) for s in specs],
            misfires=[s.misfire for s in specs],
            created=[float(s.created_at or 0.0) for s in specs],
            keys=[s.key for s in specs],
            priorities=[s.priority for s in specs],
            groups=[s.group for s in specs],
        )

    def _enqueue_slow(
        self: _Store, conn: psycopg.Connection[Any], specs: list[JobSpec], on_conflict: OnConflict
    ) -> tuple[list[EnqueueOutcome], list[tuple[Any, ...]]]:
        """Enqueue deciding conflicts row by row (inside a transaction: all or none).

        Only ``replace`` locks existing rows, and never a running one (it is refused
        before any lock): a caller's open transaction must not hold rows that
        workers extend, complete or claim. ``keep`` inserts with ``ON CONFLICT DO
        NOTHING``, so an id another producer creates meanwhile is kept, not an error.
        """
        cur = conn.cursor(row_factory=tuple_row)
        ids = list(dict.fromkeys(s.id for s in specs))
        existing = {
            row[0]: (JobState(row[1]), row[2])
            for row in cur.execute(self._sql.existing, self._params(ids=ids)).fetchall()
        }
        if on_conflict == "replace":
            for job_id, (now_state, _) in existing.items():
                if now_state is JobState.RUNNING:
                    raise conflict_error(job_id, now_state.value, on_conflict)
            # Locked, then read again: a row claimed while this waited is running now.
            locked = {
                row[0]: (JobState(row[1]), row[2])
                for row in cur.execute(
                    self._sql.existing_locked, self._params(ids=list(existing))
                ).fetchall()
            }
            for job_id in existing:
                if job_id not in locked:
                    raise conflict_error(job_id, JobState.RUNNING.value, on_conflict)
            existing = locked
        stored = {
            job_id: state
            for job_id, (state, old) in existing.items()
            if not (old and state in TTL_STATES)  # expired: gone
        }
        outcomes, final = resolve_conflicts(specs, stored, on_conflict)
        if not final:
            return outcomes, []
        doomed = [i for i in final if i in existing]
        if doomed:
            # replace: the locked rows; otherwise only expired finished records.
            cur.execute(
                self._sql.delete_replaced if on_conflict == "replace" else self._sql.delete_expired,
                self._params(ids=doomed),
            )
        params = PostgresEnqueue._insert_params(self, list(final.values()))
        if on_conflict == "keep":
            created = cur.execute(self._sql.insert_keep, params).fetchall()
            made = {r[0] for r in created}
            outcomes = [
                EnqueueOutcome.KEPT if o is EnqueueOutcome.CREATED and spec.id not in made else o
                for o, spec in zip(outcomes, specs, strict=True)
            ]
            return outcomes, created
        try:
            created = cur.execute(self._sql.insert, params).fetchall()
        except psycopg.errors.UniqueViolation as exc:
            raise JobConflict(
                f"a job of {sorted(final)[:5]} was created by another producer meanwhile: {exc}"
            ) from exc
        return outcomes, created
