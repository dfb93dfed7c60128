"""The SQL of flow control on PostgreSQL (see :mod:`._flow`), built once per schema."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from delayq.backends.postgres._schema import quoted
from delayq.backends.postgres._sql import FLOW_JOB, PARKED_AT
from delayq.flow import Limit

__all__ = ["AT", "FlowStatements", "limit_of"]

AT = "coalesce(%(now)s::float8, extract(epoch FROM transaction_timestamp())::float8)"
"""The time of a flow claim: the caller's ``now`` or the server's time when its
transaction began, one value for every statement of it (and never later than
the real time, so "due" is never early)."""


@functools.lru_cache(maxsize=256)
def limit_of(data: str) -> Limit:
    """A stored limit (parsed once per distinct text)."""
    return Limit.from_json(data)


@dataclass(frozen=True, slots=True)
class FlowStatements:
    """The flow-control statements of one schema (see the module docstring)."""

    mark: str
    now: str
    limits: str
    parked_keys: str
    unpark: str
    candidates: str
    group_candidates: str
    lock_keys: str
    try_lock_keys: str
    key_state: str
    lock_rows: str
    hold: str
    lease: str
    save_rates: str
    save_served: str
    put_new: str
    put_version: str
    get: str
    list: str
    delete: str

    @classmethod
    def build(cls, schema: str) -> FlowStatements:
        s = quoted(schema)
        jobs, meta = f"{s}.jobs", f"{s}.meta"
        cols = "id, flow_key, coalesce(flow_group, '') AS grp, priority, run_at, seq"
        due = f"queue = %(q)s AND state = 'scheduled' AND run_at <= {AT}"
        lock_id = "hashtextextended(%(ns)s || k, 0)"
        return cls(
            # the queue's flags, written once (a committed flag is not waited on)
            mark=f"""
                INSERT INTO {meta} (key, value)
                SELECT k, '1' FROM unnest(%(flags)s::text[]) AS k
                WHERE NOT EXISTS (SELECT 1 FROM {meta} m WHERE m.key = k)
                ON CONFLICT (key) DO NOTHING""",
            # the claim's time, and whether the queue's jobs have groups
            now=f"SELECT {AT}, EXISTS (SELECT 1 FROM {meta} WHERE key = %(groups_flag)s)",
            limits=f"SELECT data FROM {s}.limits WHERE queue = %(q)s",
            # the keys with parked jobs (a loose index scan: one probe per key) and
            # their live leases
            parked_keys=f"""
                WITH RECURSIVE k AS (
                    (SELECT flow_key FROM {jobs} WHERE queue = %(q)s AND parked
                     ORDER BY flow_key LIMIT 1)
                    UNION ALL
                    SELECT (SELECT flow_key FROM {jobs} WHERE queue = %(q)s AND parked
                            AND flow_key > k.flow_key ORDER BY flow_key LIMIT 1)
                    FROM k WHERE k.flow_key IS NOT NULL)
                SELECT k.flow_key, (SELECT count(*) FROM {jobs} r WHERE r.queue = %(q)s
                                    AND r.state = 'running' AND r.flow_key = k.flow_key)
                FROM k WHERE k.flow_key IS NOT NULL""",
            # up to ``room`` parked jobs of each key back to the due set (NULL: all)
            unpark=f"""
                UPDATE {jobs} j SET run_at = j.flow_run_at, flow_run_at = NULL, parked = false
                FROM (SELECT w.id FROM unnest(%(keys)s::text[], %(rooms)s::int[]) AS v(k, room)
                      CROSS JOIN LATERAL (
                          SELECT id FROM {jobs}
                          WHERE queue = %(q)s AND parked AND flow_key = v.k
                          ORDER BY priority DESC, flow_run_at, seq LIMIT v.room
                          FOR UPDATE SKIP LOCKED) w) b
                WHERE j.queue = %(q)s AND j.id = b.id""",
            # due candidates by (priority, due order): the flow jobs through
            # jobs_flow_due, the others through jobs_due
            candidates=f"""
                SELECT * FROM (
                    (SELECT {cols} FROM {jobs} WHERE {due} AND {FLOW_JOB}
                     ORDER BY priority DESC, run_at, seq LIMIT %(n)s)
                    UNION ALL
                    (SELECT {cols} FROM {jobs} WHERE {due} AND NOT {FLOW_JOB}
                     ORDER BY run_at, seq LIMIT %(n)s)) c
                ORDER BY priority DESC, run_at, seq LIMIT %(n)s""",
            # with groups: each group's first n, and the group's claims so far (the
            # turns are ordered in Python)
            group_candidates=f"""
                SELECT c.*, coalesce(g.served, 0) FROM (
                    SELECT {cols}, row_number() OVER (
                        PARTITION BY coalesce(flow_group, '')
                        ORDER BY priority DESC, run_at, seq) AS rn
                    FROM {jobs} WHERE {due}) c
                LEFT JOIN {s}.flow_groups g ON g.queue = %(q)s AND g.grp = c.grp
                WHERE c.rn <= %(n)s""",
            # the keys' locks in one order (hash order) ...
            lock_keys=f"""
                SELECT pg_advisory_xact_lock({lock_id})::text
                FROM (SELECT k FROM unnest(%(keys)s::text[]) AS k ORDER BY {lock_id}) o""",
            # ... or those that are free now
            try_lock_keys=f"""
                SELECT k FROM unnest(%(keys)s::text[]) AS k
                WHERE pg_try_advisory_xact_lock({lock_id})""",
            # read after the lock: the live leases and the rate state of each key
            key_state=f"""
                SELECT v.k, (SELECT count(*) FROM {jobs} r WHERE r.queue = %(q)s
                             AND r.state = 'running' AND r.flow_key = v.k), f.tat, f.promised
                FROM unnest(%(keys)s::text[]) AS v(k)
                LEFT JOIN {s}.flow_keys f ON f.queue = %(q)s AND f.key = v.k""",
            lock_rows=f"""
                SELECT id FROM {jobs} WHERE {due} AND id = ANY(%(ids)s)
                FOR UPDATE SKIP LOCKED""",
            # held back: parked (no time) or throttled until its next allowed time
            hold=f"""
                UPDATE {jobs} j SET flow_run_at = coalesce(j.flow_run_at, j.run_at),
                    run_at = coalesce(v.at, {PARKED_AT}), parked = v.at IS NULL
                FROM unnest(%(ids)s::text[], %(ats)s::float8[]) AS v(id, at)
                WHERE j.queue = %(q)s AND j.id = v.id""",
            lease=f"""
                UPDATE {jobs} j SET
                    state = 'running', attempts = j.attempts + 1,
                    token = nextval('{s}.tokens'), claim_req = %(req)s,
                    lease_until = {AT} + %(lease)s, updated_at = {AT},
                    run_at = coalesce(j.flow_run_at, j.run_at), flow_run_at = NULL
                WHERE j.queue = %(q)s AND j.id = ANY(%(ids)s)
                RETURNING j.id, j.name, j.payload, j.run_at, j.state, j.attempts,
                          j.max_attempts, j.backoff, j.misfire, j.created_at, j.updated_at,
                          j.last_error, j.outcome, j.lease_until, j.token, j.seq,
                          j.flow_key, j.priority, j.flow_group, j.flow_run_at, j.parked,
                          j.result""",
            save_rates=f"""
                INSERT INTO {s}.flow_keys (queue, key, tat, promised)
                SELECT %(q)s, * FROM unnest(%(keys)s::text[], %(tats)s::float8[],
                                            %(promised)s::float8[])
                ON CONFLICT (queue, key) DO UPDATE SET tat = excluded.tat,
                    promised = excluded.promised""",
            # in group order: concurrent claimers lock these rows in one order
            save_served=f"""
                INSERT INTO {s}.flow_groups (queue, grp, served)
                SELECT %(q)s, g, n FROM unnest(%(groups)s::text[], %(counts)s::int8[]) AS v(g, n)
                ORDER BY g
                ON CONFLICT (queue, grp) DO UPDATE
                    SET served = flow_groups.served + excluded.served""",
            put_new=f"""
                INSERT INTO {s}.limits (queue, pattern, data, version)
                VALUES (%(q)s, %(pattern)s, %(data)s, 1)
                ON CONFLICT (queue, pattern) DO NOTHING RETURNING version""",
            put_version=f"""
                UPDATE {s}.limits SET data = %(data)s, version = version + 1
                WHERE queue = %(q)s AND pattern = %(pattern)s AND version = %(version)s
                RETURNING version""",
            get=f"SELECT data, version FROM {s}.limits WHERE queue = %(q)s "
            f"AND pattern = %(pattern)s",
            # COLLATE "C": code point order, whatever the database's locale
            list=f"SELECT data, version FROM {s}.limits WHERE queue = %(q)s "
            f'ORDER BY pattern COLLATE "C"',
            delete=f"""
                DELETE FROM {s}.limits WHERE queue = %(q)s AND pattern = %(pattern)s
                  AND (%(version)s::int IS NULL OR version = %(version)s::int) RETURNING 1""",
        )
