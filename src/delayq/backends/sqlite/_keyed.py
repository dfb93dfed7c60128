"""Keyed calls on the SQLite store: :func:`delayq.keyed.decide` in one write transaction.

The key records live in ``delayq_keyed`` (created with the schema: key -> its
current job and :meth:`KeyState.to_json`);
the jobs are ordinary rows, so no other path knows about keys, except the purge
of finished and dead records, which releases the records of the keys whose
current run it deleted (``_ops.release_keys``): the table holds the keys in use,
not every key ever called.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import replace

from delayq.backends._common import check_spec, encode_backoff
from delayq.backends.sqlite import _ops as ops
from delayq.backends.sqlite._flow import mark_flow_used
from delayq.backends.sqlite._schema import INSERT
from delayq.clock import Clock
from delayq.errors import JobConflict
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


class SQLiteKeyed:
    """Keyed calls (feature ``keyed``) on the host ``SQLiteBackend``."""

    _clock: Clock

    def _write(
        self, doing: str, *, durable: bool = True
    ) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _cutoff(self, now: float) -> float:
        raise NotImplementedError

    def _wake_after(self, heads: ops.Heads) -> None:
        raise NotImplementedError

    def enqueue_keyed(self, spec: JobSpec, policy: KeyPolicy) -> KeyedResult:
        """One keyed call (``spec.id`` is the key), decided by
        :func:`delayq.keyed.decide` and stored in one transaction."""
        spec = check_spec(spec)
        with self._write("scheduling a keyed job") as conn:
            now = self._clock.time()
            cutoff = self._cutoff(now)
            heads = ops.Heads(conn)
            heads.read([spec.name])
            key = spec.id
            found = conn.execute("SELECT state FROM delayq_keyed WHERE key = ?", (key,)).fetchone()
            state = None if found is None else KeyState.from_json(key, found[0])
            current = None
            if state is not None:
                current = _current(conn, state.job_id, cutoff)
            due = float(spec.run_at) if spec.delay is None else now + max(0.0, spec.delay)
            decision = decide(policy, key, state, current, now=now, due=due)
            if decision.write and decision.create:
                decision = _first_free_run(conn, decision, cutoff)
                _insert(
                    conn,
                    spec,
                    job_id=decision.job_id,
                    run_at=decision.run_at,
                    now=now,
                    cutoff=cutoff,
                    append=decision.append,
                )
            elif decision.write:
                (payload,) = conn.execute(
                    "SELECT payload FROM delayq_jobs WHERE id = ?", (decision.job_id,)
                ).fetchone()
                new = append_payload(payload, spec.payload) if decision.append else spec.payload
                conn.execute(
                    "UPDATE delayq_jobs SET payload = ?, run_at = ?, updated_at = ?, "
                    "flow_run_at = NULL, parked = 0 WHERE id = ?",
                    (new, decision.run_at, now, decision.job_id),
                )
            conn.execute(
                "INSERT INTO delayq_keyed (key, job_id, state) VALUES (?, ?, ?) ON CONFLICT (key) "
                "DO UPDATE SET job_id = excluded.job_id, state = excluded.state",
                (key, decision.job_id, decision.state.to_json()),
            )
        if decision.write:
            heads.scheduled(spec.name, decision.run_at)
            self._wake_after(heads)
        return KeyedResult(decision.job_id, decision.outcome, decision.run_at)


def _first_free_run(conn: sqlite3.Connection, decision: Decision, cutoff: float) -> Decision:
    """``decision`` moved past the run ids another record still holds: a key
    released by the purge starts again at run 1, and an earlier run (a dead letter,
    or still running past ``result_ttl``) or a plain job may hold that id; none is
    ever overwritten."""
    state = decision.state
    while True:
        row = conn.execute(
            "SELECT state, updated_at FROM delayq_jobs WHERE id = ?", (state.job_id,)
        ).fetchone()
        if row is None or ops.is_expired(row[0], row[1], cutoff):
            break
        state = replace(state, runs=state.runs + 1)
    if state is decision.state:
        return decision
    return replace(decision, state=state, job_id=state.job_id)


def _current(conn: sqlite3.Connection, job_id: str, cutoff: float) -> Current | None:
    row = conn.execute(
        "SELECT state, attempts, run_at, updated_at FROM delayq_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    if row is None or ops.is_expired(row[0], row[3], cutoff):
        return None
    return Current(JobState(row[0]), int(row[1]), float(row[2]))


def _insert(
    conn: sqlite3.Connection,
    spec: JobSpec,
    *,
    job_id: str,
    run_at: float,
    now: float,
    cutoff: float,
    append: bool,
) -> None:
    old = conn.execute(
        "SELECT state, updated_at FROM delayq_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    if old is not None:
        if not ops.is_expired(old[0], old[1], cutoff) and old[0] in ("scheduled", "running"):
            raise JobConflict(f"job {job_id!r} exists ({old[0]}) and is not a run of its key")
        conn.execute("DELETE FROM delayq_jobs WHERE id = ?", (job_id,))
    payload = append_payload(None, spec.payload) if append else spec.payload
    conn.execute(
        INSERT,
        (
            job_id, spec.name, payload, run_at, spec.max_attempts, encode_backoff(spec.backoff),
            spec.misfire, now, now, spec.key, spec.priority, spec.group,
        ),
    )  # fmt: skip
    if spec.key is not None or spec.priority or spec.group is not None:
        mark_flow_used(conn, groups=spec.group is not None)


def with_key_info(conn: sqlite3.Connection, job: Job) -> Job:
    """``job`` with its key's mode and counters when it is its key's current run."""
    row = conn.execute("SELECT key, state FROM delayq_keyed WHERE job_id = ?", (job.id,)).fetchone()
    if row is None:
        return job
    return replace(job, keyed=KeyState.from_json(row[0], row[1]).info())
