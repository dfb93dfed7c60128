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
        :func:`delayq.keyed.decide` and stored in one transaction of two round trips
        (pipeline mode): the lock and the reads, then the writes and the commit."""
        spec = check_spec(spec)
        with self._conn("scheduling a keyed job") as conn:
            flow, groups = uses_flow([spec])
            if flow:  # committed before the job: no claim of it ignores its fields
                self._mark_flow(conn, groups=groups, committed=True)
            done = None
            while done is None:  # again when a claim took the job meanwhile
                done = PostgresKeyed._transaction(self, conn, spec, policy)
            decision, earlier = done
            if earlier:
                self._told(conn, decision.run_at)
        return KeyedResult(decision.job_id, decision.outcome, decision.run_at)

    def _transaction(
        self: _Store, conn: psycopg.Connection[Any], spec: JobSpec, policy: KeyPolicy
    ) -> tuple[Decision, bool] | None:
        """Lock the key, read, decide, write, commit; the decision and whether the
        job's due time may be the new head; None when the job to update was
        claimed since the read (nothing was written: the call is decided again)."""
        s = quoted(self.schema)
        key = spec.id
        params = self._params(lock=f"delayq.keyed.{self.schema}.{self.queue}.{key}", key=key)
        with conn.pipeline(), conn.transaction():
            locked = conn.cursor(row_factory=tuple_row)
            read = conn.cursor(row_factory=tuple_row)
            # Plans the server may keep (the store's sessions force custom plans for
            # its batch statements; these read and write one key's rows by key).
            locked.execute("SET LOCAL plan_cache_mode = auto")
            locked.execute(
                f"SELECT {NOW}, %(ttl)s::float8 FROM pg_advisory_xact_lock(hashtext(%(lock)s))",
                params,
            )
            # A statement of its own, after the lock: the lock's statement reads a
            # snapshot from before it waited.
            read.execute(_READ.format(s=s), params)
            now, ttl = locked.fetchone()  # type: ignore[misc]
            found = read.fetchone()
            assert found is not None
            state = None if found[0] is None else KeyState.from_json(key, found[0])
            current = None
            if found[1] is not None and not is_expired(found[1], found[4], now - ttl):
                current = Current(JobState(found[1]), int(found[2]), float(found[3]))
            due = float(spec.run_at) if spec.delay is None else now + max(0.0, spec.delay)
            decision = decide(policy, key, state, current, now=now, due=due)
            record = {**params, "job": decision.job_id, "state": decision.state.to_json()}
            write = conn.cursor(row_factory=tuple_row)
            if decision.write and decision.create:
                known = (found[10], found[6:10])
                decision, stale = _first_free_run(
                    read, s, self.queue, decision, now=now, ttl=ttl, known=known
                )
                record.update(job=decision.job_id, state=decision.state.to_json())
                if stale:  # a record at the id past result_ttl, not purged yet
                    write.execute(
                        f"DELETE FROM {s}.jobs WHERE queue = %(q)s AND id = %(job)s", record
                    )
                payload = append_payload(None, spec.payload) if decision.append else spec.payload
                made = replace(
                    spec, id=decision.job_id, payload=payload, run_at=decision.run_at, delay=None
                )
                write.execute(
                    f"WITH w AS ({self._sql.insert}), {_RECORD.format(s=s)}",
                    {**record, **self._insert_params([made])},
                )
            elif decision.write:
                # Only while it is still open: a claim does not take the advisory lock, and
                # an update waiting on the claim's row lock would otherwise change a job
                # that is running by then. Nothing is written when it is not.
                new = append_payload(found[5], spec.payload) if decision.append else spec.payload
                write.execute(
                    f"""WITH w AS (
                        UPDATE {s}.jobs SET payload = %(payload)s, run_at = %(run_at)s,
                            updated_at = %(at)s, flow_run_at = NULL, parked = false
                        WHERE queue = %(q)s AND id = %(job)s
                          AND state = 'scheduled' AND attempts = 0 RETURNING 1),
                        {_RECORD.format(s=s)}""",
                    {**record, "payload": new, "run_at": decision.run_at, "at": now},
                )
            else:
                write.execute(f"WITH w AS (SELECT 1), {_RECORD.format(s=s)}", record)
        row = write.fetchone()
        if row is None or int(row[0]) != 1:
            return None
        earlier = decision.write and (
            decision.create or current is None or decision.run_at < current.run_at
        )
        return decision, earlier

    _key_sweep_after = ""  # where the next sweep of released key records starts

    def _sweep_keys(self: _Store, cur: psycopg.Cursor[Any], params: dict[str, Any]) -> None:
        """After a purge: drop the next batch of released key records."""
        after = getattr(self, "_key_sweep_after", "")
        self._key_sweep_after = sweep_keys(cur, self.schema, params, after)  # type: ignore[attr-defined]


# The key's record, its current job, and the job row at the id of the key's next
# run (the id a new run takes unless something holds it: read ahead, so a create
# needs no read of its own).
_READ = """
    SELECT k.state, j.state, j.attempts, j.run_at, j.updated_at, j.payload,
           n.state, n.attempts, n.run_at, n.updated_at, c.id
    FROM (SELECT CASE WHEN k0.state IS NULL THEN %(key)s
                      ELSE %(key)s || '#' || ((k0.state::json ->> 1)::int + 1) END AS id
          FROM (SELECT 1) one
          LEFT JOIN {s}.keyed k0 ON k0.queue = %(q)s AND k0.key = %(key)s) c
    LEFT JOIN {s}.keyed k ON k.queue = %(q)s AND k.key = %(key)s
    LEFT JOIN {s}.jobs j ON j.queue = %(q)s AND j.id = k.job_id
    LEFT JOIN {s}.jobs n ON n.queue = %(q)s AND n.id = c.id"""

# The key's record written when the job write ``w`` wrote a row; one row back: how
# many it wrote.
_RECORD = """k AS (
        INSERT INTO {s}.keyed (queue, key, job_id, state)
        SELECT %(q)s, %(key)s, %(job)s, %(state)s WHERE EXISTS (SELECT 1 FROM w)
        ON CONFLICT (queue, key) DO UPDATE SET job_id = excluded.job_id, state = excluded.state
        RETURNING 1)
    SELECT count(*) FROM w"""


def _job_row(cur: psycopg.Cursor[Any], s: str, queue: str, job_id: str) -> Any:
    return cur.execute(
        f"SELECT state, attempts, run_at, updated_at FROM {s}.jobs WHERE queue = %s AND id = %s",
        (queue, job_id),
    ).fetchone()


def _first_free_run(
    cur: psycopg.Cursor[Any],
    s: str,
    queue: str,
    decision: Decision,
    *,
    now: float,
    ttl: float,
    known: tuple[str | None, Any] = (None, None),
) -> tuple[Decision, bool]:
    """``decision`` moved past run ids another record still holds (a released key
    starts again at run 1; an earlier run or a plain job may hold the id), and
    whether a record past result_ttl (to delete) is at the id it lands on.
    ``known``: an id and its row (state, attempts, run_at, updated_at; the state
    None when there is none) already read."""
    state = decision.state
    while True:
        if known[0] == state.job_id:
            row = None if known[1][0] is None else known[1]
        else:
            row = _job_row(cur, s, queue, state.job_id)
        known = (None, None)
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
