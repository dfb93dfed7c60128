"""The PostgreSQL store's schema: created and migrated by delayq, versioned, serialized.

Everything delayq keeps lives in its own schema (``delayq`` unless configured):

* ``jobs``: one row per job, every queue of the schema in one table (the
  ``queue`` column), primary key ``(queue, id)``.
* ``tokens``: the sequence fencing tokens come from.
* ``schedules``: recurring schedules by ``(queue, name)`` (migration 2).
* ``counts``: job counts by queue and state as appended deltas, kept by
  statement triggers on ``jobs`` and summed up now and then (migration 3).
* ``meta``: the server start the token sequence was last moved past (migration 3).
* ``jobs.claim_req``: the request id of the claim call that leased a job (migration 4).
* ``jobs_name``: an index for listing one handler's jobs by state and due time, built
  with ``CREATE INDEX CONCURRENTLY`` (migration 5).
* flow control (migration 6, :mod:`._flow`): the jobs' ``flow_key``, ``priority``,
  ``flow_group``, ``flow_run_at`` and ``parked`` columns and their partial indexes;
  ``limits`` (limit records), ``flow_keys`` (each key's rate state) and
  ``flow_groups`` (each group's claims so far); each queue's flags in ``meta``.
* ``workers``: worker heartbeats by ``(queue, id)`` (migration 7).
* ``keyed``: keyed calls' key records by ``(queue, key)`` (migration 8, :mod:`._keyed`).
* ``jobs.result``: a succeeded job's return value, JSON text (migration 9).
* ``versions``: one row per applied migration (the recorded schema version) and
  the oldest version whose delayq still runs on the schema.

:func:`migrate` applies the missing migrations in order, each in one
transaction under a transaction-level advisory lock keyed on the schema name
(a run holds the same lock for its session from its first migration to its
last, concurrent steps included), with ``lock_timeout`` set (a lock that is not
granted in time is given up and retried, instead of queueing every claim behind
the migration); steps that
cannot run in a transaction (``CREATE INDEX CONCURRENTLY``) run after it, one
by one, still under the run's lock; an index such a build left invalid (its
process died or was cancelled mid-build) is dropped and built again by the next
:func:`migrate`, which checks the indexes of the applied migrations on every call
(one catalog query). Any number of processes may run it at once (``delayq migrate``, or
every store opening with ``migrate=True``): they take turns, the first applies,
the others find the work done. Migrations are additive and keep the previous
version's delayq working (rolling deploys); a schema newer than this delayq is
used only when its recorded ``oldest_reader`` allows it, and refused otherwise.
``delayq migrate --sql`` prints what would run, for a review or a DBA.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from delayq.errors import ConfigurationError, InvalidOption

__all__ = [
    "DEFAULT_SCHEMA",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "check_schema_name",
    "migrate",
    "pending_sql",
]

DEFAULT_SCHEMA = "delayq"

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")
_NOT_OURS = frozenset({"public", "information_schema"})

_LOCK_TIMEOUT = "5s"  # a migration's wait for a table lock, then retried
_ATTEMPTS = 20  # tries of one migration whose locks were not granted in time
_PAUSE = 1.0  # seconds between them
_SESSION_WAIT = 900.0  # seconds a run waits for another run of the same schema to finish
_SESSION_PAUSE = 0.1  # seconds between tries of the migration lock
_INDEX = re.compile(r"CREATE INDEX CONCURRENTLY IF NOT EXISTS (\w+) ")


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: ``steps`` run in one transaction (``{s}`` is the quoted
    schema), then each of ``concurrent`` outside any transaction (idempotent:
    ``... IF NOT EXISTS``). ``oldest_reader``: the oldest schema version whose
    delayq still works on the schema once this is applied (additive changes keep
    the previous one working)."""

    steps: tuple[str, ...]
    concurrent: tuple[str, ...] = ()
    oldest_reader: int = 1


# The job counts by state: each statement on ``jobs`` appends its deltas (no row
# is updated, so no transaction waits on another's counter row, and a caller's
# uncommitted enqueue is not counted); ``Statements.fold_counts`` sums them up.
_COUNT_FUNCTION = """CREATE OR REPLACE FUNCTION {s}.count_jobs() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO {s}.counts (queue, state, n)
            SELECT queue, state, count(*) FROM new_rows GROUP BY 1, 2;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO {s}.counts (queue, state, n)
            SELECT queue, state, -count(*) FROM old_rows GROUP BY 1, 2;
        ELSE
            INSERT INTO {s}.counts (queue, state, n)
            SELECT queue, state, sum(d) FROM (
                SELECT queue, state, 1 AS d FROM new_rows
                UNION ALL SELECT queue, state, -1 FROM old_rows) AS x
            GROUP BY 1, 2 HAVING sum(d) <> 0;
        END IF;
        RETURN NULL;
    END $$"""

# Each migration is applied in order and never edited once released: a change is
# a new migration.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        (
            "CREATE SEQUENCE IF NOT EXISTS {s}.tokens",
            """CREATE TABLE IF NOT EXISTS {s}.jobs (
            queue        text NOT NULL,
            id           text NOT NULL,
            seq          bigint GENERATED ALWAYS AS IDENTITY,  -- enqueue order: FIFO ties
            name         text NOT NULL,
            payload      text NOT NULL,            -- JSON text
            run_at       double precision NOT NULL, -- epoch seconds, the server's clock
            state        text NOT NULL,
            attempts     integer NOT NULL DEFAULT 0,
            max_attempts integer NOT NULL,
            backoff      text NOT NULL,            -- JSON object
            misfire      text NOT NULL,
            created_at   double precision NOT NULL,
            updated_at   double precision NOT NULL, -- final states: when the job finished
            last_error   text,
            outcome      text,
            lease_until  double precision,
            token        bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (queue, id)
        )""",
            # claim, next_due, stats, list_jobs by state and due window
            "CREATE INDEX IF NOT EXISTS jobs_due ON {s}.jobs (queue, state, run_at, seq)",
            # expired leases, on every claim (only running rows are in it)
            "CREATE INDEX IF NOT EXISTS jobs_lease ON {s}.jobs (queue, lease_until) "
            "WHERE state = 'running'",
            # result_ttl purge, dead letters newest first, purge_dead(older_than=)
            "CREATE INDEX IF NOT EXISTS jobs_finished ON {s}.jobs (queue, state, updated_at, seq) "
            "WHERE state IN ('succeeded', 'cancelled', 'skipped', 'dead')",
        )
    ),
    Migration(
        (
            # recurring schedules (ScheduleStore): definitions with a compare-and-set version
            """CREATE TABLE IF NOT EXISTS {s}.schedules (
            queue   text NOT NULL,
            name    text NOT NULL,
            data    text NOT NULL,     -- the definition, JSON text
            version integer NOT NULL,  -- 1 when created, +1 per write
            PRIMARY KEY (queue, name)
        )""",
        ),
        oldest_reader=1,
    ),
    Migration(
        (
            "ALTER TABLE {s}.versions ADD COLUMN IF NOT EXISTS oldest_reader integer",
            "CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL)",
            # Room on each page for the new version of a row (the same page keeps
            # the heap compact between vacuums), and vacuum after a small share of
            # the table changed rather than a fifth of it.
            "ALTER TABLE {s}.jobs SET (fillfactor = 85, autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02, "
            "autovacuum_vacuum_cost_delay = 0)",
            "CREATE TABLE IF NOT EXISTS {s}.counts (queue text NOT NULL, state text NOT NULL, "
            "n bigint NOT NULL)",
            "CREATE INDEX IF NOT EXISTS counts_queue ON {s}.counts (queue, state)",
            _COUNT_FUNCTION,
            "DROP TRIGGER IF EXISTS count_inserts ON {s}.jobs",
            "CREATE TRIGGER count_inserts AFTER INSERT ON {s}.jobs "
            "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
            "EXECUTE FUNCTION {s}.count_jobs()",
            "DROP TRIGGER IF EXISTS count_updates ON {s}.jobs",
            "CREATE TRIGGER count_updates AFTER UPDATE ON {s}.jobs "
            "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT "
            "EXECUTE FUNCTION {s}.count_jobs()",
            "DROP TRIGGER IF EXISTS count_deletes ON {s}.jobs",
            "CREATE TRIGGER count_deletes AFTER DELETE ON {s}.jobs "
            "REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT "
            "EXECUTE FUNCTION {s}.count_jobs()",
            # The triggers hold off writers until this commits: the counts start exact.
            "DELETE FROM {s}.counts",
            "INSERT INTO {s}.counts (queue, state, n) "
            "SELECT queue, state, count(*) FROM {s}.jobs GROUP BY 1, 2",
        ),
        oldest_reader=2,
    ),
    Migration(
        (
            # The request id of the claim call that leased the job, so that call's
            # retry after a lost reply finds what it claimed (not indexed: a claim's
            # update stays as cheap as before). Metadata only: no table rewrite.
            "ALTER TABLE {s}.jobs ADD COLUMN IF NOT EXISTS claim_req uuid",
        ),
        oldest_reader=3,
    ),
    Migration(
        (),
        concurrent=(
            # list_jobs(name=...): the dashboard's and the CLI's jobs of one handler,
            # one index range per state instead of a filter over the queue's range.
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_name "
            "ON {s}.jobs (queue, name, state, run_at, seq)",
        ),
        oldest_reader=4,
    ),
    Migration(
        (
            # Flow control (_flow.py). New columns without a table rewrite (no default,
            # or a constant one: metadata only); a job without flow fields keeps them
            # NULL / 0 / false.
            "ALTER TABLE {s}.jobs ADD COLUMN IF NOT EXISTS flow_key text, "
            "ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0, "
            "ADD COLUMN IF NOT EXISTS flow_group text, "
            # the due time of a job held back (run_at then says when to look again)
            "ADD COLUMN IF NOT EXISTS flow_run_at double precision, "
            "ADD COLUMN IF NOT EXISTS parked boolean NOT NULL DEFAULT false",
            # limit records (LimitStore): delayq.flow.Limit.to_json() with a version
            """CREATE TABLE IF NOT EXISTS {s}.limits (
            queue   text NOT NULL,
            pattern text NOT NULL,
            data    text NOT NULL,
            version integer NOT NULL,  -- 1 when created, +1 per write
            PRIMARY KEY (queue, pattern)
        )""",
            # each key's rate state (the cell rate algorithm), written under the key's lock
            """CREATE TABLE IF NOT EXISTS {s}.flow_keys (
            queue    text NOT NULL,
            key      text NOT NULL,
            tat      double precision,  -- theoretical arrival time
            promised double precision,  -- next moment to give a throttled job
            PRIMARY KEY (queue, key)
        )""",
            # each group's claims so far (the groups' turns)
            """CREATE TABLE IF NOT EXISTS {s}.flow_groups (
            queue  text NOT NULL,
            grp    text NOT NULL,
            served bigint NOT NULL,
            PRIMARY KEY (queue, grp)
        )""",
        ),
        concurrent=(
            # A job without flow fields is in none of these: a queue that never uses
            # flow control pays nothing for them.
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_flow_due "
            "ON {s}.jobs (queue, priority DESC, run_at, seq) WHERE state = 'scheduled' "
            "AND (priority <> 0 OR flow_key IS NOT NULL OR flow_group IS NOT NULL)",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_flow_running "
            "ON {s}.jobs (queue, flow_key) WHERE state = 'running' AND flow_key IS NOT NULL",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_parked "
            "ON {s}.jobs (queue, flow_key, priority DESC, flow_run_at, seq) WHERE parked",
        ),
        oldest_reader=4,
    ),
    Migration(
        (
            # Worker heartbeats (WorkerRegistry): one row per live worker, stamped
            # with the server's clock; a handful of rows per queue.
            """CREATE TABLE IF NOT EXISTS {s}.workers (
            queue text NOT NULL,
            id    text NOT NULL,
            data  text NOT NULL,              -- the worker's JSON record
            seen  double precision NOT NULL,  -- its last heartbeat, epoch seconds
            PRIMARY KEY (queue, id)
        )""",
        ),
        oldest_reader=4,
    ),
    Migration(
        (
            # Keyed calls (_keyed.py): key -> its current job and KeyState.to_json().
            """CREATE TABLE IF NOT EXISTS {s}.keyed (
            queue  text NOT NULL,
            key    text NOT NULL,
            job_id text NOT NULL,  -- the key's current run
            state  text NOT NULL,  -- JSON: mode, runs, first_at, window_end, counters
            PRIMARY KEY (queue, key)
        )""",
            # a job's key record, for get (Job.keyed)
            "CREATE INDEX IF NOT EXISTS keyed_job ON {s}.keyed (queue, job_id)",
        ),
        oldest_reader=4,
    ),
    Migration(
        (
            # A succeeded job's return value (JSON text), kept with its finished
            # record (feature results). Metadata only: no table rewrite.
            "ALTER TABLE {s}.jobs ADD COLUMN IF NOT EXISTS result text",
        ),
        oldest_reader=4,
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this delayq reads and writes."""


def check_schema_name(name: object) -> str:
    """A schema name delayq may create: lower-case letters, digits, ``_`` (max 48)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidOption(
            f"schema must be a lower-case SQL name ([a-z_][a-z0-9_]*, at most 48 "
            f"characters), got {name!r}"
        )
    if name in _NOT_OURS or name.startswith("pg_"):
        raise InvalidOption(
            f"schema must be one delayq owns, not {name!r} (the database's own or the "
            f"application's): leave the default 'delayq' or name a new one"
        )
    return name


def quoted(schema: str) -> str:
    """The schema as an SQL identifier (already checked: quoting cannot be escaped)."""
    return f'"{check_schema_name(schema)}"'


def lock_key(schema: str) -> str:
    """The advisory-lock key text of a schema's migrations (hashed by the server)."""
    return f"delayq.migrate.{schema}"


def current_version(conn: Any, schema: str) -> int | None:
    """The recorded version of ``schema`` (None when delayq never migrated it)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{quoted(schema)}.versions",)
    ).fetchone()
    if not row[0]:
        return None
    row = conn.execute(f"SELECT max(version) FROM {quoted(schema)}.versions").fetchone()
    return 0 if row[0] is None else int(row[0])


def migrate(conn: Any, schema: str) -> tuple[int, int]:
    """Bring ``schema`` up to :data:`SCHEMA_VERSION` on ``conn`` (a psycopg
    connection in autocommit mode); returns ``(version before, version after)``.

    Each migration runs in one transaction holding ``pg_advisory_xact_lock`` on
    the schema's key (concurrent callers serialize; a failure leaves that
    migration undone), with ``lock_timeout`` set: a lock not granted in time
    rolls it back and it is tried again (:data:`_ATTEMPTS` times).
    """
    before = current_version(conn, schema)
    indexes = tuple(st for m in MIGRATIONS[:SCHEMA_VERSION] for st in m.concurrent)
    if before is not None and before >= SCHEMA_VERSION:
        _check_readable(conn, schema, before)
        if not _invalid_indexes(conn, schema, indexes):
            return before, before  # the common case: no lock, three index reads
        if not _lock_session(conn, schema, wait=False):
            return before, before  # another run holds it (building them now, maybe)
    else:
        _lock_session(conn, schema)
    try:
        found: int | None = None
        while True:
            done = _migrate_one(conn, schema)
            found = done if found is None else found
            if done >= SCHEMA_VERSION:
                # an index a run that died mid-build left invalid or missing
                _build_indexes(conn, schema, indexes)
                if before is not None and before >= SCHEMA_VERSION:
                    return before, before
                return found, SCHEMA_VERSION  # found under the lock: a concurrent run did it
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock_key(schema),))


def _lock_session(conn: Any, schema: str, *, wait: bool = True) -> bool:
    """Hold the schema's migration lock for the whole run, concurrent steps included.

    A ``CREATE INDEX CONCURRENTLY`` waits for every transaction older than its
    snapshot, so another run's migration transaction waiting for a lock (its
    ``ALTER TABLE`` behind the index build) would deadlock with it. The lock is
    therefore taken by trying, between tries holding no transaction and no
    snapshot that the index build would wait for.
    """
    deadline = time.monotonic() + _SESSION_WAIT
    while True:
        row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (lock_key(schema),))
        if row.fetchone()[0]:
            return True
        if not wait:
            return False
        if time.monotonic() >= deadline:
            raise psycopg.errors.LockNotAvailable(
                f"another process has been migrating schema {schema!r} for "
                f"{_SESSION_WAIT:.0f}s: try again when it is done"
            )
        threading.Event().wait(_SESSION_PAUSE)  # (no clock here: a real pause between tries)


def _migrate_one(conn: Any, schema: str) -> int:
    """Apply the next missing migration (if any); the version found before it."""
    s = quoted(schema)
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (_LOCK_TIMEOUT,))
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_key(schema),))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.versions (version integer PRIMARY KEY, "
                    f"applied_at timestamptz NOT NULL DEFAULT now())"
                )
                row = conn.execute(f"SELECT max(version) FROM {s}.versions").fetchone()
                found = 0 if row[0] is None else int(row[0])
                if found >= SCHEMA_VERSION:
                    _check_readable(conn, schema, found)
                    return found
                step = MIGRATIONS[found]
                for statement in step.steps:
                    conn.execute(statement.format(s=s))
                conn.execute(f"INSERT INTO {s}.versions (version) VALUES (%s)", (found + 1,))
                if found + 1 >= 3:  # the column exists from version 3 on
                    conn.execute(
                        f"UPDATE {s}.versions SET oldest_reader = %s WHERE version = %s",
                        (step.oldest_reader, found + 1),
                    )
            if step.concurrent:
                _build_indexes(conn, schema, step.concurrent)
            return found
        except psycopg.errors.LockNotAvailable:
            if attempt == _ATTEMPTS:
                raise
            threading.Event().wait(_PAUSE)  # (no clock here: a real pause between tries)
    raise AssertionError("unreachable")  # pragma: no cover


def _invalid_indexes(conn: Any, schema: str, statements: tuple[str, ...]) -> set[str]:
    """The indexes ``statements`` build that are missing or invalid (an interrupted
    ``CREATE INDEX CONCURRENTLY`` leaves an invalid index that the planner never uses
    and that ``IF NOT EXISTS`` would keep)."""
    names = [m.group(1) for m in map(_INDEX.match, statements) if m is not None]
    if not names:
        return set()
    rows = conn.execute(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = ANY(%s) AND i.indisvalid AND i.indisready",
        (schema, names),
    ).fetchall()
    return set(names) - {r[0] for r in rows}


def _build_indexes(conn: Any, schema: str, statements: tuple[str, ...]) -> None:
    """Run ``CREATE INDEX CONCURRENTLY`` steps under the run's lock (a build in
    progress looks invalid too: only the lock holder may drop one), skipping the
    indexes that exist and are valid, dropping first what an interrupted build
    left invalid."""
    s = quoted(schema)
    wanted = _invalid_indexes(conn, schema, statements)
    for statement in statements:
        match = _INDEX.match(statement)
        if match is not None and match.group(1) not in wanted:
            continue  # built and valid
        if match is not None:
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {s}.{match.group(1)}")
        conn.execute(statement.format(s=s))


def _check_readable(conn: Any, schema: str, found: int) -> None:
    """Refuse a schema newer than this delayq unless it says this version still works."""
    if found <= SCHEMA_VERSION:
        return
    row = conn.execute(
        f"SELECT oldest_reader FROM {quoted(schema)}.versions WHERE version = %s", (found,)
    ).fetchone()
    if row is None or row[0] is None or int(row[0]) > SCHEMA_VERSION:
        raise ConfigurationError(
            f"PostgreSQL schema {schema!r} is at delayq schema version {found}; this "
            f"delayq knows versions up to {SCHEMA_VERSION}: upgrade delayq"
        )


def pending_sql(conn: Any, schema: str) -> list[str]:
    """The statements :func:`migrate` would run on ``schema`` now, in order (each a
    complete SQL statement; the transactional ones of one migration between
    ``BEGIN`` and ``COMMIT``)."""
    s = quoted(schema)
    found = current_version(conn, schema) or 0
    out: list[str] = []
    if found == 0:
        out += [
            "BEGIN",
            f"CREATE SCHEMA IF NOT EXISTS {s}",
            f"CREATE TABLE IF NOT EXISTS {s}.versions (version integer PRIMARY KEY, "
            f"applied_at timestamptz NOT NULL DEFAULT now())",
            "COMMIT",
        ]
    for version in range(found + 1, SCHEMA_VERSION + 1):
        step = MIGRATIONS[version - 1]
        out += ["BEGIN", f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'"]
        out += [statement.format(s=s) for statement in step.steps]
        out.append(f"INSERT INTO {s}.versions (version) VALUES ({version})")
        if version >= 3:
            out.append(
                f"UPDATE {s}.versions SET oldest_reader = {step.oldest_reader} "
                f"WHERE version = {version}"
            )
        out.append("COMMIT")
        out += [statement.format(s=s) for statement in step.concurrent]
    return out


def check_version(conn: Any, schema: str) -> None:
    """Refuse a schema that is missing or at another version (``migrate=False``)."""
    found = current_version(conn, schema)
    if found is not None and found > SCHEMA_VERSION:
        _check_readable(conn, schema, found)
        return
    if found != SCHEMA_VERSION:
        state = "does not exist" if found is None else f"is at version {found}"
        raise ConfigurationError(
            f"delayq schema {schema!r} {state}; this delayq needs version {SCHEMA_VERSION}: "
            f"run `delayq migrate` (or open the store with migrate=True)"
        )
