"""Keyed calls on PostgreSQL: :func:`delayq.keyed.decide` in one transaction.

The key records live in ``keyed`` (migration 8: ``(queue, key)`` -> the key's
current job and :meth:`KeyState.to_json`). One call is one transaction: a
transaction-level advisory lock on the queue and key serializes the calls of one
key across processes (the record may not exist yet, so a row lock cannot), then
the record and its current job are read, :func:`~delayq.keyed.decide` runs here
in Python (the same code as the memory and SQLite stores, no SQL port to keep in
step) and the job and the record are written. The jobs are ordinary rows: no
other path knows about keys. The purge drops, a bounded batch at a time, the
records whose current job is gone and whose throttle window has ended (such a
record already decides nothing: ``decide`` treats it as a fresh key).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Protocol

import psycopg
from psycopg.rows import tuple_row

from delayq.backends._common import check_spec, is_expired
from delayq.backends.postgres._flow import uses_flow
from delayq.backends.postgres._schema import quoted
from delayq.backends.postgres._sql import CUTOFF, NOW, Statements
from delayq.job import Job, JobSpec, JobState
from delayq.keyed import (
    Current,
    Decision,
    KeyedResult,
    KeyPolicy,
    KeyState,
    append_payload,
    decide,
)

__all__ = ["PostgresKeyed", "key_info", "sweep_keys"]

_SWEEP = 1000  # key records looked at per purge


class _Store(Protocol):
    url: str
    queue: str
    schema: str
    _sql: Statements

    def _conn(self, doing: str) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...

    def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None: ...

    def _insert_params(self, specs: list[JobSpec]) -> dict[str, Any]: ...

    def _mark_flow(
        self, conn: psycopg.Connection[Any], *, groups: bool, committed: bool = False
    ) -> None: ...


class PostgresKeyed:
    """``enqueue_keyed`` (feature ``keyed``) on the host ``PostgresBackend``."""

    def enqueue_keyed(self: _Store, spec: JobSpec, policy: KeyPolicy) -> KeyedResult:
        """One keyed call (``spec.id`` is the key), decided by
        :func:`delayq.keyed.decide` and stored in one transaction."""
        spec = check_spec(spec)
        s = quoted(self.schema)
        key = spec.id
        with self._conn("scheduling a keyed job") as conn:
            flow, groups = uses_flow([spec])
            if flow:  # committed before the job: no claim of it ignores its fields
                self._mark_flow(conn, groups=groups, committed=True)
            with conn.transaction():
                cur = conn.cursor(row_factory=tuple_row)
                params = self._params(lock=f"delayq.keyed.{self.schema}.{self.queue}.{key}")
                now, ttl = cur.execute(
                    f"SELECT {NOW}, %(ttl)s::float8 FROM pg_advisory_xact_lock(hashtext(%(lock)s))",
                    params,
                ).fetchone()  # type: ignore[misc]
                decision = None
                while decision is None:  # again when a claim took the job meanwhile
                    decision = PostgresKeyed._decide_and_write(
                        self, cur, s, spec, policy, now=now, ttl=ttl
                    )
                cur.execute(
                    f"INSERT INTO {s}.keyed (queue, key, job_id, state) VALUES (%s, %s, %s, %s) "
                    f"ON CONFLICT (queue, key) DO UPDATE SET job_id = excluded.job_id, "
                    f"state = excluded.state",
                    (self.queue, key, decision.job_id, decision.state.to_json()),
                )
            if decision.write:
                self._told(conn, decision.run_at)
        return KeyedResult(decision.job_id, decision.outcome, decision.run_at)

    def _decide_and_write(
        self: _Store,
        cur: psycopg.Cursor[Any],
        s: str,
        spec: JobSpec,
        policy: KeyPolicy,
        *,
        now: float,
        ttl: float,
    ) -> Decision | None:
        """Read the key's record and current job, decide, write the job; None when the
        job to update was claimed since the read (the call is decided again)."""
        key = spec.id
        # the record and its current job in one read (after the lock: a read in the
        # locking statement would use a snapshot from before it)
        found = cur.execute(
            f"SELECT k.state, j.state, j.attempts, j.run_at, j.updated_at, j.payload "
            f"FROM {s}.keyed k LEFT JOIN {s}.jobs j ON j.queue = k.queue "
            f"AND j.id = k.job_id WHERE k.queue = %s AND k.key = %s",
            (self.queue, key),
        ).fetchone()
        state = None if found is None else KeyState.from_json(key, found[0])
        current = None
        if (
            found is not None
            and found[1] is not None
            and not is_expired(found[1], found[4], now - ttl)
        ):
            current = Current(JobState(found[1]), int(found[2]), float(found[3]))
        due = float(spec.run_at) if spec.delay is None else now + max(0.0, spec.delay)
        decision = decide(policy, key, state, current, now=now, due=due)
        if decision.write and decision.create:
            decision, stale = _first_free_run(cur, s, self.queue, decision, now=now, ttl=ttl)
            PostgresKeyed._create(self, cur, s, spec, decision, stale=stale)
        elif decision.write:
            assert found is not None  # an update is of the key's current, open job
            new = append_payload(found[5], spec.payload) if decision.append else spec.payload
            # Only while it is still open: a claim does not take the advisory lock, and
            # an update waiting on the claim's row lock would otherwise change a job
            # that is running by then.
            cur.execute(
                f"UPDATE {s}.jobs SET payload = %s, run_at = %s, updated_at = %s, "
                f"flow_run_at = NULL, parked = false WHERE queue = %s AND id = %s "
                f"AND state = 'scheduled' AND attempts = 0",
                (new, decision.run_at, now, self.queue, decision.job_id),
            )
            if cur.rowcount != 1:
                return None
        return decision

    _key_sweep_after = ""  # where the next sweep of released key records starts

    def _sweep_keys(self: _Store, cur: psycopg.Cursor[Any], params: dict[str, Any]) -> None:
        """After a purge: drop the next batch of released key records."""
        after = getattr(self, "_key_sweep_after", "")
        self._key_sweep_after = sweep_keys(cur, self.schema, params, after)  # type: ignore[attr-defined]

    def _create(
        self: _Store,
        cur: psycopg.Cursor[Any],
        s: str,
        spec: JobSpec,
        decision: Decision,
        *,
        stale: bool,
    ) -> None:
        if stale:  # a record at the id past result_ttl, not purged yet
            cur.execute(
                f"DELETE FROM {s}.jobs WHERE queue = %s AND id = %s", (self.queue, decision.job_id)
            )
        payload = append_payload(None, spec.payload) if decision.append else spec.payload
        made = replace(
            spec, id=decision.job_id, payload=payload, run_at=decision.run_at, delay=None
        )
        cur.execute(self._sql.insert, self._insert_params([made]))


def _job_row(cur: psycopg.Cursor[Any], s: str, queue: str, job_id: str) -> Any:
    return cur.execute(
        f"SELECT state, attempts, run_at, updated_at FROM {s}.jobs WHERE queue = %s AND id = %s",
        (queue, job_id),
    ).fetchone()


def _first_free_run(
    cur: psycopg.Cursor[Any], s: str, queue: str, decision: Decision, *, now: float, ttl: float
) -> tuple[Decision, bool]:
    """``decision`` moved past run ids another record still holds (a released key
    starts again at run 1; an earlier run or a plain job may hold the id), and
    whether a record past result_ttl (to delete) is at the id it lands on."""
    state = decision.state
    while True:
        row = _job_row(cur, s, queue, state.job_id)
        if row is None or is_expired(row[0], row[3], now - ttl):
            break
        state = replace(state, runs=state.runs + 1)
    stale = row is not None
    if state is decision.state:
        return decision, stale
    return replace(decision, state=state, job_id=state.job_id), stale


def key_info(conn: psycopg.Connection[Any], schema: str, queue: str, job: Job) -> Job:
    """``job`` with its key's mode and counters when it is its key's current run."""
    row = conn.execute(
        f"SELECT key, state FROM {quoted(schema)}.keyed WHERE queue = %s AND job_id = %s",
        (queue, job.id),
    ).fetchone()
    if row is None:
        return job
    return replace(job, keyed=KeyState.from_json(row[0], row[1]).info())


def sweep_keys(cur: psycopg.Cursor[Any], schema: str, params: dict[str, Any], after: str) -> str:
    """Drop the released records among the next :data:`_SWEEP` keys after ``after``
    (their current job gone or past result_ttl, their window ended); returns where
    the next sweep starts ('' after the last key)."""
    s = quoted(schema)
    rows = cur.execute(
        f"""
        WITH batch AS (
            SELECT key, job_id, state FROM {s}.keyed
            WHERE queue = %(q)s AND key > %(after)s ORDER BY key LIMIT %(sweep)s),
        gone AS (
            DELETE FROM {s}.keyed k USING batch b
            WHERE k.queue = %(q)s AND k.key = b.key
              AND ((b.state::json ->> 3)::float8) <= {NOW}
              AND NOT EXISTS (
                  SELECT 1 FROM {s}.jobs j WHERE j.queue = %(q)s AND j.id = b.job_id
                    AND NOT (j.state IN ('succeeded', 'cancelled', 'skipped')
                             AND j.updated_at <= {CUTOFF}))
            RETURNING 1)
        SELECT max(key), count(*), (SELECT count(*) FROM gone) FROM batch""",
        {**params, "after": after, "sweep": _SWEEP},
    ).fetchone()
    last, seen = (rows[0], int(rows[1])) if rows is not None else (None, 0)
    return "" if last is None or seen < _SWEEP else str(last)
