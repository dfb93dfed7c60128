"""What each SQLite transaction does: functions of an open connection.

Each function runs inside a transaction the backend opened (``BEGIN IMMEDIATE``
for the writing ones) and only reads and writes rows; taking turns, committing
and waking other processes are the backend's business
(:mod:`delayq.backends.sqlite._store`). Keeping the row logic here lets one
transaction combine several steps (a group of enqueues, "complete these and
claim the next").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from delayq.backends._common import (
    MAX_UNSTARTED,
    PURGE_BATCH,
    RELEASED_NOTE,
    clip_error,
    encode_backoff,
    is_expired,
    lease_expired_error,
    lease_expired_note,
    resolve_conflicts,
    stale_claim,
    undecodable_error,
    unstarted_expired_error,
    unstarted_expired_note,
)
from delayq.backends.base import Completion
from delayq.backends.sqlite._flow import flow_claim_rows, flow_in_use, flow_rows, mark_flow_used
from delayq.backends.sqlite._schema import (
    ACK,
    BURY,
    CHUNK,
    CLAIM_DUE,
    CLAIM_DUE_OF,
    COLUMNS,
    EXPIRED_LEASES,
    HEAD,
    HEAD_OF,
    INSERT,
    NEXT_LEASE,
    RELEASE,
    RELEASE_AT,
    RETRY,
    TTL_STATE_VALUES,
    claimed_job,
)
from delayq.errors import StaleClaim
from delayq.job import Claim, EnqueueOutcome, Job, JobSpec, JobState

__all__ = [
    "claim_due",
    "complete_items",
    "count_finished_before",
    "delete_batch",
    "expire_leases",
    "find_changeable",
    "Heads",
    "head",
    "head_of",
    "insert_specs",
    "is_expired",
    "next_lease_expiry",
    "purge_dead_batch",
    "purge_finished",
    "release_keys",
    "wake_failures",
]


def head(conn: sqlite3.Connection) -> float | None:
    """The earliest due time of a scheduled job."""
    row = conn.execute(HEAD).fetchone()
    return None if row is None else float(row[0])


def head_of(conn: sqlite3.Connection, names: Collection[str]) -> float | None:
    """The earliest due time of a scheduled job of one of ``names`` (a filtered
    waiter's head): one index lookup per name."""
    times = [row[0] for name in names if (row := conn.execute(HEAD_OF, (name,)).fetchone())]
    return None if not times else float(min(times))


class Heads:
    """Each handler's head, read before a write, to tell after it whether a job
    became the earliest of its handler: a waiter filtered to that handler sleeps
    toward it, so it must be woken then (also when the queue's head is earlier).
    That is a superset of "earlier than the queue's head", which wakes the
    unfiltered waiters. Read through the write's connection, before its writes."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._by_name: dict[str, float | None] = {}
        self.wake = False

    def read(self, names: Iterable[str]) -> None:
        for name in names:
            if name not in self._by_name:
                self._by_name[name] = head_of(self._conn, (name,))

    def scheduled(self, name: str, run_at: float) -> None:
        """A job of ``name`` is due at ``run_at`` after the write (its head read first)."""
        head = self._by_name[name]
        if head is None or run_at < head:
            self.wake = True


def next_lease_expiry(conn: sqlite3.Connection) -> float | None:
    row = conn.execute(NEXT_LEASE).fetchone()
    return None if row is None else float(row[0])


def wake_failures(conn: sqlite3.Connection) -> int:
    """How many wake-ups processes recorded as undelivered (see ``_wake``)."""
    row = conn.execute("SELECT value FROM delayq_meta WHERE key = 'wake_failures'").fetchone()
    return 0 if row is None else int(row[0])


def count_finished_before(conn: sqlite3.Connection, state: str, cutoff: float) -> int:
    """Records of final ``state`` finished at or before ``cutoff`` (an index range)."""
    return int(
        conn.execute(
            "SELECT COUNT(*) FROM delayq_jobs WHERE state = ? AND updated_at <= ?",
            (state, cutoff),
        ).fetchone()[0]
    )


def purge_finished(conn: sqlite3.Connection, cutoff: float, now: float) -> bool:
    """Delete at most ``PURGE_BATCH`` records past ``result_ttl`` per state (and
    release the keys whose current run they were: :func:`release_keys`).

    Bounded so one transaction never holds the write lock for a long purge (a
    lowered ``result_ttl`` on a large store). Returns True when a batch was
    full (more are left: the caller purges again soon).
    """
    full = False
    for state in TTL_STATE_VALUES:
        gone = [
            row[0]
            for row in conn.execute(
                "DELETE FROM delayq_jobs WHERE seq IN (SELECT seq FROM delayq_jobs "
                "WHERE state = ? AND updated_at <= ? LIMIT ?) RETURNING id",
                (state, cutoff, PURGE_BATCH),
            )
        ]
        release_keys(conn, gone, now)
        full = full or len(gone) >= PURGE_BATCH
    return full


def delete_batch(
    conn: sqlite3.Connection,
    where: str,
    params: Sequence[Any],
    limit: int = PURGE_BATCH,
    *,
    now: float,
) -> int:
    """Delete at most ``limit`` rows matching ``where`` (releasing their keys);
    return how many."""
    gone = [
        row[0]
        for row in conn.execute(
            f"DELETE FROM delayq_jobs WHERE seq IN (SELECT seq FROM delayq_jobs WHERE {where} "
            f"LIMIT ?) RETURNING id",
            (*params, limit),
        )
    ]
    release_keys(conn, gone, now)
    return len(gone)


def purge_dead_batch(conn: sqlite3.Connection, cutoff: float, now: float) -> bool:
    """Delete at most ``PURGE_BATCH`` dead letters buried at or before ``cutoff``
    (``dead_ttl``); True when the batch was full."""
    where = "state = 'dead' AND updated_at <= ?"
    return delete_batch(conn, where, (cutoff,), now=now) >= PURGE_BATCH


def release_keys(conn: sqlite3.Connection, job_ids: Sequence[str], now: float) -> None:
    """Drop the key records (``delayq_keyed``) whose current run is one of the deleted
    ``job_ids``: with its run gone a key's record decides nothing any more, except a
    throttle window still open, which is kept (its ``job_id`` set to ``''``) until it
    ends; the next call of a released key starts again at run 1. Then a bounded
    sweep of such records whose window has ended. Nothing to do in a store that
    never had a keyed call."""
    if conn.execute("SELECT 1 FROM delayq_keyed LIMIT 1").fetchone() is None:
        return
    for i in range(0, len(job_ids), CHUNK):
        chunk = job_ids[i : i + CHUNK]
        marks = ", ".join("?" * len(chunk))
        conn.execute(
            f"DELETE FROM delayq_keyed WHERE job_id IN ({marks}) "
            f"AND json_extract(state, '$[3]') <= ?",
            (*chunk, now),
        )
        conn.execute(f"UPDATE delayq_keyed SET job_id = '' WHERE job_id IN ({marks})", chunk)
    conn.execute(
        "DELETE FROM delayq_keyed WHERE key IN (SELECT key FROM delayq_keyed "
        "WHERE job_id = '' AND json_extract(state, '$[3]') <= ? LIMIT ?)",
        (now, PURGE_BATCH),
    )


def _expire_lease(
    conn: sqlite3.Connection, lease: tuple[int, int, int, float, int, int], now: float
) -> tuple[JobState, int]:
    """Apply the end of one expired lease ``(seq, attempts, max_attempts, lease_until,
    started, unstarted)``: buried after its last attempt, else due again; with no
    recorded start it was no attempt (``attempt_at_start``). Returns the new state
    and attempts."""
    seq, attempts, max_attempts, lease_until, started, unstarted = lease
    if not started:
        attempts, unstarted = max(0, attempts - 1), unstarted + 1
        if unstarted >= MAX_UNSTARTED:
            conn.execute(
                "UPDATE delayq_jobs SET state = 'dead', attempts = ?, unstarted = ?, "
                "last_error = ?, lease_until = NULL, updated_at = ? WHERE seq = ?",
                (attempts, unstarted, unstarted_expired_error(lease_until, unstarted), now, seq),
            )
            return JobState.DEAD, attempts
        # Its place kept (its own run_at), like a release.
        conn.execute(
            "UPDATE delayq_jobs SET state = 'scheduled', attempts = ?, unstarted = ?, "
            "last_error = ?, lease_until = NULL, updated_at = ? WHERE seq = ?",
            (attempts, unstarted, unstarted_expired_note(lease_until), now, seq),
        )
        return JobState.SCHEDULED, attempts
    if attempts >= max_attempts:
        conn.execute(
            "UPDATE delayq_jobs SET state = 'dead', last_error = ?, lease_until = NULL, "
            "updated_at = ? WHERE seq = ?",
            (lease_expired_error(lease_until, attempts, max_attempts), now, seq),
        )
        return JobState.DEAD, attempts
    # Due again from the moment the lease ran out: lateness (and the misfire
    # policy) is measured from there, not from the first due time.
    conn.execute(
        "UPDATE delayq_jobs SET state = 'scheduled', run_at = ?, last_error = ?, "
        "lease_until = NULL, updated_at = ? WHERE seq = ?",
        (lease_until, lease_expired_note(lease_until, attempts), now, seq),
    )
    return JobState.SCHEDULED, attempts


def expire_leases(conn: sqlite3.Connection, now: float) -> None:
    """End every lease that ran out by ``now`` (see :func:`_expire_lease`)."""
    for row in conn.execute(EXPIRED_LEASES, (now,)).fetchall():
        _expire_lease(conn, (row[0], row[1], row[2], row[3], row[4], row[5]), now)


def insert_specs(
    conn: sqlite3.Connection,
    specs: Sequence[JobSpec],
    on_conflict: str,
    now: float,
    cutoff: float,
) -> tuple[list[EnqueueOutcome], list[tuple[str, float]]]:
    """Store checked ``specs``; return each outcome and the handler name and due
    time of each job stored.

    Raises :class:`JobConflict` for a rejected id or a running job that
    ``replace`` would overwrite, always before writing anything (a group commit
    relies on it: the other calls of the transaction go on).
    """
    existing: dict[str, JobState] = {}
    stale_rows: set[str] = set()  # rows to delete before inserting (replaced, expired)
    unique_ids = list(dict.fromkeys(s.id for s in specs))
    for i in range(0, len(unique_ids), CHUNK):
        chunk = unique_ids[i : i + CHUNK]
        marks = ", ".join("?" * len(chunk))
        for job_id, state, updated_at in conn.execute(
            f"SELECT id, state, updated_at FROM delayq_jobs WHERE id IN ({marks})", chunk
        ):
            stale_rows.add(job_id)
            if not is_expired(state, updated_at, cutoff):
                existing[job_id] = JobState(state)
    outcomes, final = resolve_conflicts(specs, existing, on_conflict)
    if not final:
        return outcomes, []
    doomed = [(job_id,) for job_id in final if job_id in stale_rows]
    if doomed:
        conn.executemany("DELETE FROM delayq_jobs WHERE id = ?", doomed)
    rows = [
        (
            s.id,
            s.name,
            s.payload,
            float(s.run_at) if s.delay is None else now + max(0.0, s.delay),
            s.max_attempts,
            encode_backoff(s.backoff),
            s.misfire,
            s.created_at or now,
            now,
            s.key,
            s.priority,
            s.group,
        )
        for s in final.values()
    ]
    if flow_rows(list(final.values())):
        mark_flow_used(conn, groups=any(s.group is not None for s in final.values()))
    conn.executemany(INSERT, rows)
    return outcomes, [(row[1], row[3]) for row in rows]


def find_changeable(
    conn: sqlite3.Connection, job_id: str, now: float, cutoff: float
) -> tuple[int | None, str, int]:
    """The row a cancel or reschedule may change: ``(seq, "scheduled", attempts)``,
    or ``(None, why not, attempts)`` with why in ``running``, ``finished`` and
    ``not_found`` (the values Cancel/RescheduleOutcome share).

    A RUNNING job whose lease has expired is not running: its lease ends here
    first (as the next claim would end it), so it is due again (changeable, the
    attempt reported) or, after its last attempt, dead (finished).
    """
    row = conn.execute(
        "SELECT seq, state, updated_at, attempts, max_attempts, lease_until, started, "
        "unstarted FROM delayq_jobs WHERE id = ?",
        (job_id,),
    ).fetchone()
    if row is None or is_expired(row[1], row[2], cutoff):
        return None, "not_found", 0
    seq, state, attempts = int(row[0]), JobState(row[1]), int(row[3])
    if state is JobState.RUNNING:
        lease_until = row[5]
        if lease_until is None or lease_until > now:
            return None, "running", attempts
        state, attempts = _expire_lease(
            conn, (seq, attempts, int(row[4]), float(lease_until), row[6], row[7]), now
        )
    if state is not JobState.SCHEDULED:
        return None, "finished", attempts
    return seq, "scheduled", attempts


def claim_due(
    conn: sqlite3.Connection,
    at: float,
    limit: int,
    lease: float,
    names: frozenset[str] | None = None,
) -> list[Claim]:
    """Lease up to ``limit`` due jobs (``run_at <= at``) in due order, only of
    the handlers ``names`` when given.

    A row that cannot be decoded is buried with the reason inside this
    transaction instead of breaking the claim.
    """
    flow, groups = flow_in_use(conn)
    if flow:  # limits, priorities or groups apply (_flow)
        rows = flow_claim_rows(conn, COLUMNS, at, limit, groups=groups, names=names)
    elif names is None:
        rows = conn.execute(CLAIM_DUE, (at, limit)).fetchall()
    else:
        # Each name's first ``limit`` due rows from the name index, merged: a claim
        # reads at most ``limit`` rows per name and none of the other handlers'.
        ordered = sorted(names)
        union = " UNION ALL ".join([CLAIM_DUE_OF] * len(ordered))
        rows = conn.execute(
            f"SELECT * FROM ({union}) ORDER BY run_at, seq LIMIT ?",
            [*(p for name in ordered for p in (name, at, limit)), limit],
        ).fetchall()
    if not rows:
        return []
    lease_until = at + lease
    jobs: list[tuple[int, Job]] = []
    for row in rows:
        try:
            job = claimed_job(row, at, lease_until)
        except (ValueError, TypeError, RecursionError) as exc:
            conn.execute(
                "UPDATE delayq_jobs SET state = 'dead', last_error = ?, "
                "lease_until = NULL, updated_at = ? WHERE seq = ?",
                (undecodable_error(exc), at, row[0]),
            )
            continue
        jobs.append((row[0], job))
    if not jobs:
        return []
    last = conn.execute("SELECT value FROM delayq_meta WHERE key = 'token'").fetchone()[0]
    conn.execute("UPDATE delayq_meta SET value = ? WHERE key = 'token'", (last + len(jobs),))
    conn.executemany(
        "UPDATE delayq_jobs SET state = 'running', attempts = attempts + 1, started = 0, "
        "token = ?, lease_until = ?, updated_at = ?, run_at = COALESCE(flow_run_at, run_at), "
        "flow_run_at = NULL WHERE seq = ?",
        [(last + 1 + i, lease_until, at, seq) for i, (seq, _job) in enumerate(jobs)],
    )
    return [Claim(job, last + 1 + i, lease_until, at) for i, (_seq, job) in enumerate(jobs)]


def finish_claim(
    conn: sqlite3.Connection, claim: Claim, assignments: str, params: tuple[Any, ...]
) -> None:
    """Apply ``assignments`` to the claimed job, or raise StaleClaim."""
    cur = conn.execute(
        f"UPDATE delayq_jobs SET {assignments} WHERE id = ? AND state = 'running' AND token = ?",
        (*params, claim.job.id, claim.token),
    )
    if cur.rowcount == 1:
        return
    row = conn.execute(
        "SELECT state, token FROM delayq_jobs WHERE id = ?", (claim.job.id,)
    ).fetchone()
    raise stale_claim(
        claim, None if row is None else JobState(row[0]), None if row is None else row[1]
    )


def complete_items(
    conn: sqlite3.Connection, items: Sequence[Completion], now: float, heads: Heads
) -> list[StaleClaim | None]:
    """Finish each claim of ``items``; return the stale ones (None where it
    took effect). ``heads`` (read for the retried and released jobs' handlers)
    learns the due time each retry or release set; a keyed job's end, whose key
    may have parked jobs of any handler, wakes every waiter."""
    results: list[StaleClaim | None] = []
    for item in items:
        if item.released:
            if item.run_at is None and item.error is None:
                assignments = RELEASE
                params: tuple[Any, ...] = (RELEASED_NOTE, RELEASED_NOTE, now)
            else:
                assignments = RELEASE_AT
                note = clip_error(item.error)
                params = (item.run_at, note, note, RELEASED_NOTE, RELEASED_NOTE, now)
        elif item.state is JobState.SCHEDULED:
            assert item.run_at is not None
            assignments = RETRY
            params = (item.run_at, clip_error(item.error), now)
        elif item.state is JobState.DEAD:
            assignments = BURY
            params = (clip_error(item.error), now)
        else:
            assignments = ACK
            params = (item.state.value, item.outcome, item.result, now)
        try:
            finish_claim(conn, item.claim, assignments, params)
        except StaleClaim as exc:
            results.append(exc)
            continue
        results.append(None)
        if item.claim.job.key is not None:  # a slot freed: a job parked for it may go now
            heads.wake = True
        if item.state is JobState.SCHEDULED:
            run_at = item.run_at if item.run_at is not None else item.claim.job.run_at
            heads.scheduled(item.claim.job.name, run_at)
    return results
