"""The SQL of the PostgreSQL store, one named statement per operation.

Statements are built once per schema (:class:`Statements`) and take named
parameters. ``%(q)s`` is always the queue. ``%(now)s`` is the caller's time
(an injected test clock, or ``claim(now=...)``) or NULL, in which case
:data:`NOW` is the server's clock: one clock decides "due" for every worker.

The hot statements (claim, recover, complete, enqueue, head) and the
dashboard's (get, list, stats, dead letters) search an index, never scan the
table; ``tests/integration/test_postgres_store.py`` checks their plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from delayq.backends.postgres._schema import quoted
from delayq.backends.postgres._search import SEARCH, list_columns

__all__ = ["COLUMNS", "CUTOFF", "FLOW_JOB", "NOW", "PARKED_AT", "Statements"]

NOW = "coalesce(%(now)s::float8, extract(epoch FROM statement_timestamp())::float8)"
"""The time of a statement: the caller's ``now`` or the server's statement time.

``statement_timestamp()`` is stable within a statement, so it can bound an index
search (``clock_timestamp()`` is volatile and could not)."""

CUTOFF = f"({NOW} - %(ttl)s::float8)"
"""Finished records (succeeded, cancelled, skipped) updated at or before this are gone."""

COLUMNS = (
    "id, name, payload, run_at, state, attempts, max_attempts, backoff, misfire, "
    "created_at, updated_at, last_error, outcome, lease_until, token, seq, "
    "flow_key, priority, flow_group, flow_run_at, parked, result"
)
"""The columns every job-reading statement returns, in :func:`_rows.to_job` order."""

_TTL = "('succeeded', 'cancelled', 'skipped')"

PARKED_AT = "1e300::float8"
"""``run_at`` of a parked job (its key is at its concurrency limit): past every
real time, so the head and due reads never reach it (its due time is
``flow_run_at``), yet below the open end of a listing's window (as on SQLite)."""

FLOW_JOB = "(priority <> 0 OR flow_key IS NOT NULL OR flow_group IS NOT NULL)"
"""A job that uses flow control: the predicate of the partial index ``jobs_flow_due``."""


# The lease-expiry messages of _common.lease_expired_error / lease_expired_note,
# built by the server (format_time: ISO 8601 UTC with milliseconds). ``p`` is the
# table alias the columns are read from.
def _at(p: str) -> str:
    return (
        f"to_char(to_timestamp({p}lease_until) AT TIME ZONE 'UTC', "
        f'\'YYYY-MM-DD"T"HH24:MI:SS.MS"+00:00"\')'
    )


def _expired_error(p: str) -> str:
    return (
        f"format('lease expired at %%s after %%s attempts (max_attempts=%%s): the worker "
        f"holding it stopped or hung', {_at(p)}, {p}attempts, {p}max_attempts)"
    )


def _expired_note(p: str) -> str:
    return (
        f"format('lease expired at %%s during attempt %%s: the worker holding it stopped or "
        f"hung; returned to the due set', {_at(p)}, {p}attempts)"
    )


# cancel / reschedule take effect on a scheduled job, and on a running one whose
# lease ran out (it is not running any more) while it has attempts left...
_TAKES_EFFECT = (
    f"(t.state = 'scheduled' OR (t.state = 'running' AND t.lease_until <= {NOW} "
    "AND t.attempts < t.max_attempts))"
)
# ...and with none left, it is buried as the next claim would have (then "finished").
_BURY_EXPIRED = f"""b AS (
                    UPDATE {{jobs}} j SET state = 'dead', last_error = {_expired_error("t.")},
                        lease_until = NULL, updated_at = {NOW}
                    FROM t
                    WHERE j.queue = %(q)s AND j.id = t.id AND t.state = 'running'
                      AND t.lease_until <= {NOW} AND t.attempts >= t.max_attempts
                    RETURNING j.id)"""


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of the store for one schema (see the module docstring)."""

    schema: str
    insert: str
    insert_keep: str
    existing: str
    existing_locked: str
    delete_expired: str
    delete_replaced: str
    head_check: str
    notify: str
    recover: str
    claim: str
    flow_flags: str
    claimed_by: str
    purge: str
    purge_dead_letters: str
    complete: str
    complete_keyed: str
    stale: str
    extend: str
    cancel: str
    reschedule: str
    requeue: str
    get: str
    list_by_state: str
    list_by_name: str
    head: str
    wake_times: str
    stats: str
    fold_counts: str
    past_restart: str
    due_count: str
    dead_letters: str
    purge_dead: str

    @classmethod
    def build(cls, schema: str) -> Statements:
        jobs = f"{quoted(schema)}.jobs"
        tokens = f"{quoted(schema)}.tokens"
        counts = f"{quoted(schema)}.counts"
        meta = f"{quoted(schema)}.meta"
        not_expired = f"NOT (state IN {_TTL} AND updated_at <= {CUTOFF})"
        listed = list_columns(COLUMNS)
        # list_jobs' keyset cursor: the job after (run_at, seq) of the cursor's job;
        # gone, its seq counts as 0 (a page may repeat, never skip).
        after_cursor = f"""AND (%(after_id)s::text IS NULL OR (run_at, seq) > (
                      %(low)s, coalesce((SELECT seq FROM {jobs}
                                         WHERE queue = %(q)s AND id = %(after_id)s::text), 0)))"""
        insert = f"""
                INSERT INTO {jobs} (queue, id, name, payload, run_at, state, max_attempts,
                                    backoff, misfire, created_at, updated_at,
                                    flow_key, priority, flow_group)
                SELECT %(q)s, v.id, v.name, v.payload,
                       CASE WHEN v.delay IS NULL THEN v.run_at
                            ELSE {NOW} + greatest(v.delay, 0) END,
                       'scheduled', v.max_attempts, v.backoff, v.misfire,
                       CASE WHEN v.created_at > 0 THEN v.created_at ELSE {NOW} END, {NOW},
                       v.flow_key, v.priority, v.flow_group
                FROM unnest(%(ids)s::text[], %(names)s::text[], %(payloads)s::text[],
                            %(run_ats)s::float8[], %(delays)s::float8[],
                            %(max_attempts)s::int[], %(backoffs)s::text[],
                            %(misfires)s::text[], %(created)s::float8[],
                            %(keys)s::text[], %(priorities)s::int[], %(groups)s::text[])
                     WITH ORDINALITY AS v(id, name, payload, run_at, delay, max_attempts,
                                          backoff, misfire, created_at, flow_key, priority,
                                          flow_group, ord)
                ORDER BY v.ord"""
        existing = (
            f"SELECT id, state, state IN {_TTL} AND updated_at <= {CUTOFF} FROM {jobs} "
            f"WHERE queue = %(q)s AND id = ANY(%(ids)s)"
        )
        return cls(
            schema=schema,
            # enqueue: the specs as parallel arrays, due at run_at or NOW + delay. A
            # unique violation fails the whole statement (nothing stored); the store
            # then decides reject / keep / replace row by row.
            insert=insert + " RETURNING id, run_at",
            # keep: an id created by another producer meanwhile is kept, not an error
            insert_keep=insert + " ON CONFLICT (queue, id) DO NOTHING RETURNING id, run_at",
            # the slow path's read of the ids that exist (no lock: see enqueue.py) ...
            existing=existing,
            # ... and replace's lock on the rows it replaces (never a running one)
            existing_locked=existing + " AND state <> 'running' FOR UPDATE",
            delete_expired=f"""
                DELETE FROM {jobs} WHERE queue = %(q)s AND id = ANY(%(ids)s)
                  AND state IN {_TTL} AND updated_at <= {CUTOFF}""",
            delete_replaced=f"""
                DELETE FROM {jobs} WHERE queue = %(q)s AND id = ANY(%(ids)s)
                  AND state <> 'running'""",
            # After a commit that scheduled something due at %(at)s: wake the
            # listeners if nothing scheduled is earlier (they sleep until the head).
            # The NOTIFY's own transaction does not wait for the disk: a wake-up
            # lost in a server crash costs nothing (waiters re-read on reconnect).
            head_check=f"""
                SELECT set_config('synchronous_commit', 'off', true),
                       pg_notify(%(channel)s, %(at)s::text)
                WHERE NOT EXISTS (SELECT 1 FROM {jobs}
                                  WHERE queue = %(q)s AND state = 'scheduled'
                                    AND run_at < %(at)s)""",
            # Inside a caller's transaction: fires on its commit, never on rollback.
            # One wake-up per transaction unless a later call schedules earlier (the
            # earliest due time notified so far is a transaction-local setting).
            notify="""
                SELECT pg_notify(%(channel)s, %(at)s::text), set_config(%(guc)s, %(at)s::text, true)
                WHERE coalesce(nullif(current_setting(%(guc)s, true), '')::float8,
                               'Infinity'::float8) > %(at)s::float8""",
            # Expired leases: back to the due set at their lease end, or buried when
            # their attempts are used up. Bounded per call; SKIP LOCKED so two
            # workers never wait on each other here.
            recover=f"""
                UPDATE {jobs} j SET
                    state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead'
                                 ELSE 'scheduled' END,
                    run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                                  ELSE j.lease_until END,
                    last_error = CASE WHEN j.attempts >= j.max_attempts
                                      THEN {_expired_error("j.")}
                                      ELSE {_expired_note("j.")} END,
                    lease_until = NULL,
                    updated_at = {NOW}
                WHERE (j.queue, j.id) IN (
                    SELECT queue, id FROM {jobs}
                    WHERE queue = %(q)s AND state = 'running' AND lease_until <= {NOW}
                    ORDER BY lease_until LIMIT %(max_recover)s
                    FOR UPDATE SKIP LOCKED)""",
            # The claim: due jobs in (run_at, seq) order, locked with SKIP LOCKED and
            # leased with a fresh fencing token in the same statement. Not in a queue
            # that uses flow control (its meta flag): _flow.py claims there.
            claim=f"""
                WITH due AS (
                    SELECT id FROM {jobs}
                    WHERE queue = %(q)s AND state = 'scheduled' AND run_at <= {NOW}
                      AND NOT EXISTS (SELECT 1 FROM {meta} WHERE key = %(flow_flag)s)
                    ORDER BY run_at, seq
                    LIMIT %(limit)s
                    FOR UPDATE SKIP LOCKED)
                UPDATE {jobs} j SET
                    state = 'running', attempts = j.attempts + 1,
                    token = nextval('{tokens}'), claim_req = %(req)s,
                    lease_until = {NOW} + %(lease)s, updated_at = {NOW}
                FROM due
                WHERE j.queue = %(q)s AND j.id = due.id
                RETURNING j.id, j.name, j.payload, j.run_at, j.state, j.attempts,
                          j.max_attempts, j.backoff, j.misfire, j.created_at, j.updated_at,
                          j.last_error, j.outcome, j.lease_until, j.token, j.seq""",
            # (no flow columns: with the flag unset, no job of the queue has flow fields)
            # Whether the queue uses flow control, read after the claim (its flags in
            # meta are never removed: the claim above saw them unless this sees them).
            flow_flags=f"SELECT key FROM {meta} WHERE key IN (%(flow_flag)s, %(groups_flag)s)",
            # The jobs one claim call (its request id) leased and still holds, their
            # leases renewed: its retry after a lost reply returns them instead of
            # leaving them leased to nobody (the running rows, through jobs_lease).
            claimed_by=f"""
                UPDATE {jobs} SET lease_until = {NOW} + %(lease)s, updated_at = {NOW}
                WHERE queue = %(q)s AND state = 'running' AND lease_until > {NOW}
                  AND claim_req = %(req)s
                RETURNING {COLUMNS}""",
            # Finished records past result_ttl (dead letters past dead_ttl), a
            # bounded batch at a time.
            purge=f"""
                DELETE FROM {jobs}
                WHERE (queue, id) IN (
                    SELECT queue, id FROM {jobs}
                    WHERE queue = %(q)s AND state IN {_TTL} AND updated_at <= {CUTOFF}
                    LIMIT %(batch)s FOR UPDATE SKIP LOCKED)""",
            purge_dead_letters=f"""
                DELETE FROM {jobs}
                WHERE (queue, id) IN (
                    SELECT queue, id FROM {jobs}
                    WHERE queue = %(q)s AND state = 'dead'
                      AND updated_at <= {NOW} - %(dead_ttl)s::float8
                    LIMIT %(batch)s FOR UPDATE SKIP LOCKED)""",
            complete=_complete(jobs, keyed=False),
            complete_keyed=_complete(jobs, keyed=True),
            stale=f"SELECT id, state, token FROM {jobs} WHERE queue = %(q)s AND id = ANY(%(ids)s)",
            extend=f"""
                UPDATE {jobs} SET lease_until = {NOW} + %(lease)s, updated_at = {NOW}
                WHERE queue = %(q)s AND id = %(id)s AND token = %(token)s AND state = 'running'
                RETURNING lease_until, updated_at""",
            # cancel / reschedule: the row locked, then changed only if it is
            # scheduled or running under an expired lease (then it is not running).
            cancel=f"""
                WITH t AS (
                    SELECT id, state, attempts, max_attempts, lease_until, updated_at
                    FROM {jobs} WHERE queue = %(q)s AND id = %(id)s FOR UPDATE),
                u AS (
                    UPDATE {jobs} j SET state = 'cancelled', outcome = 'cancelled',
                        run_at = coalesce(j.flow_run_at, j.run_at), flow_run_at = NULL,
                        parked = false, lease_until = NULL, updated_at = {NOW}
                    FROM t
                    WHERE j.queue = %(q)s AND j.id = t.id AND {_TAKES_EFFECT}
                    RETURNING j.id),
                {_BURY_EXPIRED.format(jobs=jobs)}
                SELECT t.state, t.attempts, t.state IN {_TTL} AND t.updated_at <= {CUTOFF},
                       EXISTS (SELECT 1 FROM u), EXISTS (SELECT 1 FROM b) FROM t""",
            reschedule=f"""
                WITH t AS (
                    SELECT id, state, attempts, max_attempts, lease_until, updated_at
                    FROM {jobs} WHERE queue = %(q)s AND id = %(id)s FOR UPDATE),
                u AS (
                    UPDATE {jobs} j SET state = 'scheduled',
                        run_at = coalesce(%(run_at)s::float8, {NOW} + %(delay)s::float8),
                        flow_run_at = NULL, parked = false,
                        last_error = CASE WHEN t.state = 'running'
                                          THEN {_expired_note("t.")}
                                          ELSE j.last_error END,
                        lease_until = NULL, updated_at = {NOW}
                    FROM t
                    WHERE j.queue = %(q)s AND j.id = t.id AND {_TAKES_EFFECT}
                    RETURNING j.run_at),
                {_BURY_EXPIRED.format(jobs=jobs)}
                SELECT t.state, t.attempts, t.state IN {_TTL} AND t.updated_at <= {CUTOFF},
                       (SELECT run_at FROM u), EXISTS (SELECT 1 FROM b) FROM t""",
            requeue=f"""
                UPDATE {jobs} SET state = 'scheduled', attempts = 0,
                    run_at = coalesce(%(run_at)s::float8, {NOW} + %(delay)s::float8),
                    outcome = NULL, lease_until = NULL, updated_at = {NOW}
                WHERE queue = %(q)s AND id = %(id)s AND state = 'dead'
                RETURNING run_at""",
            get=f"SELECT {COLUMNS} FROM {jobs} WHERE queue = %(q)s AND id = %(id)s "
            f"AND {not_expired}",
            # list_jobs of one state (the dashboard's list of every state is a
            # merge of these, one index range each).
            list_by_state=f"""
                SELECT {listed} FROM {jobs}
                WHERE queue = %(q)s AND state = %(state)s
                  AND run_at >= %(low)s AND run_at < %(high)s AND {not_expired}
                  {after_cursor}{SEARCH}
                ORDER BY run_at, seq LIMIT %(limit)s""",
            # ... of one handler: its own index range (jobs_name), not a filter
            # over every handler's jobs of the state.
            list_by_name=f"""
                SELECT {listed} FROM {jobs}
                WHERE queue = %(q)s AND name = %(name)s AND state = %(state)s
                  AND run_at >= %(low)s AND run_at < %(high)s AND {not_expired}
                  {after_cursor}{SEARCH}
                ORDER BY run_at, seq LIMIT %(limit)s""",
            head=f"""
                SELECT run_at FROM {jobs} WHERE queue = %(q)s AND state = 'scheduled'
                  AND run_at < {PARKED_AT}
                ORDER BY run_at, seq LIMIT 1""",
            # What a waiter sleeps toward: the head, the next lease end, and "now"; and
            # whether the queue uses flow control (a claim's read after it tells).
            wake_times=f"""
                SELECT (SELECT run_at FROM {jobs} WHERE queue = %(q)s AND state = 'scheduled'
                        AND run_at < {PARKED_AT} ORDER BY run_at, seq LIMIT 1),
                       (SELECT lease_until FROM {jobs} WHERE queue = %(q)s
                        AND state = 'running' ORDER BY lease_until LIMIT 1),
                       {NOW},
                       EXISTS (SELECT 1 FROM {meta} WHERE key = %(flow_flag)s)""",
            # The counts kept by the triggers on jobs (schema.py), less the finished
            # records past result_ttl that the purge has not deleted yet (a range
            # of jobs_finished: small while the purge keeps up).
            # One round trip: a row per state, then 'due' (the due backlog, a range
            # of jobs_due) and 'next_due' (the head), all as float8.
            stats=" UNION ALL ".join(
                [
                    f"SELECT '{state}', (coalesce((SELECT sum(n) FROM {counts} "
                    f"WHERE queue = %(q)s AND state = '{state}'), 0)"
                    + (
                        f" - (SELECT count(*) FROM {jobs} WHERE queue = %(q)s "
                        f"AND state = '{state}' AND updated_at <= {CUTOFF})"
                        if state in ("succeeded", "cancelled", "skipped")
                        else ""
                    )
                    + ")::float8"
                    for state in (
                        "scheduled",
                        "running",
                        "succeeded",
                        "dead",
                        "cancelled",
                        "skipped",
                    )
                ]
                + [
                    f"SELECT 'due', (SELECT count(*) FROM {jobs} WHERE queue = %(q)s "
                    f"AND state = 'scheduled' AND run_at <= {NOW})::float8",
                    f"SELECT 'next_due', (SELECT run_at FROM {jobs} WHERE queue = %(q)s "
                    f"AND state = 'scheduled' AND run_at < {PARKED_AT} "
                    f"ORDER BY run_at, seq LIMIT 1)",
                ]
            ),
            # After a server start: the token sequence past the server's clock (µs).
            past_restart=f"""
                WITH started AS (
                    INSERT INTO {quoted(schema)}.meta (key, value)
                    VALUES ('tokens_moved_at_start', pg_postmaster_start_time()::text)
                    ON CONFLICT (key) DO UPDATE SET value = excluded.value
                    WHERE meta.value IS DISTINCT FROM excluded.value
                    RETURNING 1)
                SELECT setval('{tokens}', greatest(
                    (SELECT last_value FROM {tokens}),
                    (extract(epoch FROM clock_timestamp()) * 1e6)::bigint))
                FROM started""",
            # The count deltas of a queue summed into one row per state.
            fold_counts=f"""
                WITH d AS (DELETE FROM {counts} WHERE queue = %(q)s RETURNING state, n)
                INSERT INTO {counts} (queue, state, n)
                SELECT %(q)s, state, sum(n) FROM d GROUP BY state HAVING sum(n) <> 0""",
            due_count=f"""
                SELECT count(*) FROM {jobs}
                WHERE queue = %(q)s AND state = 'scheduled' AND run_at <= {NOW}""",
            dead_letters=f"""
                SELECT {listed} FROM {jobs} WHERE queue = %(q)s AND state = 'dead'
                ORDER BY updated_at DESC, seq DESC LIMIT %(limit)s""",
            # A bounded batch (one transaction each), counted on the server.
            purge_dead=f"""
                WITH gone AS (
                    DELETE FROM {jobs} WHERE (queue, id) IN (
                        SELECT queue, id FROM {jobs}
                        WHERE queue = %(q)s AND state = 'dead' AND updated_at < %(older_than)s
                          AND (%(all)s OR id = ANY(%(ids)s))
                        LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
                    RETURNING 1)
                SELECT count(*) FROM gone""",
        )


def _complete(jobs: str, *, keyed: bool) -> str:
    """A batch of completions; kind is succeeded / skipped (ack), dead (bury), retry
    or release. Applied only where the fencing token is current. Every entry comes
    back: (id, token, due time, kind, applied, state and token of the row as this
    statement found it), so a stale entry needs no second read after the commit.
    With result_ttl 0 a finished job is deleted instead of kept.

    ``keyed`` (a batch with jobs of a flow key): each lease of a key that ends frees
    a slot, and as many of the key's parked jobs go back to the due set, in claim
    order; the earliest of their due times comes back as an eighth column."""
    returning = "j.id, j.token, j.run_at" + (", j.flow_key" if keyed else "")
    freed = (
        f""",
                freed AS (SELECT flow_key, count(*) AS n FROM done
                          WHERE flow_key IS NOT NULL GROUP BY flow_key),
                back AS (
                    UPDATE {jobs} p SET run_at = p.flow_run_at, flow_run_at = NULL,
                        parked = false
                    FROM (SELECT w.id FROM freed CROSS JOIN LATERAL (
                              SELECT id FROM {jobs}
                              WHERE queue = %(q)s AND parked AND flow_key = freed.flow_key
                              ORDER BY priority DESC, flow_run_at, seq LIMIT freed.n
                              FOR UPDATE SKIP LOCKED) w) b
                    WHERE p.queue = %(q)s AND p.id = b.id
                    RETURNING p.run_at)"""
        if keyed
        else ""
    )
    return f"""
                WITH v AS (
                    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::int8[],
                                         %(kinds)s::text[], %(run_ats)s::float8[],
                                         %(texts)s::text[], %(results)s::text[])
                        AS v(id, token, kind, run_at, text, result)),
                gone AS (
                    DELETE FROM {jobs} j USING v
                    WHERE %(ttl)s::float8 <= 0 AND v.kind IN ('succeeded', 'skipped')
                      AND j.queue = %(q)s AND j.id = v.id AND j.token = v.token
                      AND j.state = 'running'
                    RETURNING {returning}),
                u AS (
                UPDATE {jobs} j SET
                    state = CASE WHEN v.kind IN ('retry', 'release') THEN 'scheduled'
                                 ELSE v.kind END,
                    run_at = CASE WHEN v.kind = 'retry' THEN v.run_at ELSE j.run_at END,
                    attempts = CASE WHEN v.kind = 'release' THEN greatest(j.attempts - 1, 0)
                                    ELSE j.attempts END,
                    last_error = CASE WHEN v.kind IN ('succeeded', 'skipped') THEN j.last_error
                                      -- a release keeps an earlier attempt's error
                                      WHEN v.kind = 'release' AND j.last_error IS NOT NULL
                                      THEN j.last_error
                                      ELSE v.text END,
                    outcome = CASE WHEN v.kind IN ('succeeded', 'skipped') THEN v.text
                                   ELSE j.outcome END,
                    result = CASE WHEN v.kind = 'succeeded' THEN v.result ELSE j.result END,
                    lease_until = NULL,
                    updated_at = {NOW}
                FROM v
                WHERE j.queue = %(q)s AND j.id = v.id AND j.token = v.token
                  AND j.state = 'running'
                  AND NOT (%(ttl)s::float8 <= 0 AND v.kind IN ('succeeded', 'skipped'))
                RETURNING {returning}),
                done AS (SELECT * FROM u UNION ALL SELECT * FROM gone){freed}
                SELECT v.id, v.token, done.run_at, v.kind, done.id IS NOT NULL, j.state, j.token
                       {", (SELECT min(run_at) FROM back)" if keyed else ""}
                FROM v LEFT JOIN done ON done.id = v.id AND done.token = v.token
                       LEFT JOIN {jobs} j ON j.queue = %(q)s AND j.id = v.id"""
