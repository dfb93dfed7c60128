"""The PostgreSQL store's schema: created and migrated by delayq, versioned, serialized.

Everything delayq keeps lives in its own schema (``delayq`` unless configured):

* ``jobs``: one row per job, every queue of the schema in one table (the
  ``queue`` column), primary key ``(queue, id)``.
* ``tokens``: the sequence fencing tokens come from.
* ``schedules``: recurring schedules by ``(queue, name)`` (migration 2).
* ``versions``: one row per applied migration (the recorded schema version).

:func:`migrate` applies the missing migrations in one transaction under a
transaction-level advisory lock keyed on the schema name, so any number of
processes may run it at once (``delayq migrate``, or every store opening with
``migrate=True``): they take turns, the first applies, the others find the
work done. A database already at a newer version than this delayq knows is
refused instead of being used with the wrong SQL.
"""

from __future__ import annotations

import re
from typing import Any

from delayq.errors import ConfigurationError, InvalidOption

__all__ = ["DEFAULT_SCHEMA", "MIGRATIONS", "SCHEMA_VERSION", "check_schema_name", "migrate"]

DEFAULT_SCHEMA = "delayq"

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")

# Each migration is a list of statements; ``{s}`` is the quoted schema name.
# Applied in order, never edited once released: a change is a new migration.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
    ),
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

    Runs in one transaction holding ``pg_advisory_xact_lock`` on the schema's
    key: concurrent callers serialize, and a failure leaves nothing half-done.
    """
    s = quoted(schema)
    before = current_version(conn, schema)
    if before == SCHEMA_VERSION:
        return before, before  # the common case: no lock, two index reads
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_key(schema),))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.versions ("
            f"version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        row = conn.execute(f"SELECT max(version) FROM {s}.versions").fetchone()
        found = 0 if row[0] is None else int(row[0])
        if found > SCHEMA_VERSION:
            raise ConfigurationError(
                f"PostgreSQL schema {schema!r} is at delayq schema version {found}; this "
                f"delayq knows versions up to {SCHEMA_VERSION}: upgrade delayq"
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement.format(s=s))
            conn.execute(f"INSERT INTO {s}.versions (version) VALUES (%s)", (version,))
    return found, SCHEMA_VERSION  # found under the lock: a concurrent run may have done it


def check_version(conn: Any, schema: str) -> None:
    """Refuse a schema that is missing or at another version (``migrate=False``)."""
    found = current_version(conn, schema)
    if found != SCHEMA_VERSION:
        state = "does not exist" if found is None else f"is at version {found}"
        raise ConfigurationError(
            f"delayq schema {schema!r} {state}; this delayq needs version {SCHEMA_VERSION}: "
            f"run `delayq migrate` (or open the store with migrate=True)"
        )
