"""The SQLite store's schema, its named queries and how a row becomes a job."""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
from typing import Any, Literal

from delayq.backends._common import TTL_STATES, readable_json
from delayq.backends.sqlite._flow import FLOW_COLUMNS, add_flow_schema
from delayq.codec import decode_payload
from delayq.errors import ConfigurationError, InvalidOption
from delayq.job import Job, JobState

Synchronous = Literal["normal", "full"]

DEFAULT_BUSY_TIMEOUT = 5.0
"""Seconds a write waits for another process's write lock before failing."""

SCHEMA_VERSION = 1

FALLBACK_POLL = 0.05
"""Where wake sockets are unavailable, ``wait_for_due`` re-checks
``PRAGMA data_version`` this often (seconds)."""

WAKE_CHECK_EVERY = 1.0
"""While wake-ups are expected, ``wait_for_due`` still re-reads the schedule this
often (seconds): the most a wake-up lost for an unknown reason can cost."""

PURGE_EVERY = 1.0  # seconds of backend time between lazy purges of finished records
CHUNK = 500  # ids per "IN (...)" query, well under SQLite's parameter limit

KEYED_TABLE = (
    "CREATE TABLE IF NOT EXISTS delayq_keyed (key TEXT PRIMARY KEY, job_id TEXT NOT NULL, "
    "state TEXT NOT NULL) WITHOUT ROWID"
)  # keyed calls: key -> its current job and KeyState.to_json() (backends/sqlite/_keyed.py)
KEYED_INDEX = "CREATE INDEX IF NOT EXISTS delayq_keyed_job ON delayq_keyed (job_id)"

SCHEMA = """
CREATE TABLE IF NOT EXISTS delayq_jobs (
    seq          INTEGER PRIMARY KEY,  -- enqueue order: breaks run_at ties (FIFO)
    id           TEXT NOT NULL UNIQUE,
    name         TEXT NOT NULL,
    payload      TEXT NOT NULL,        -- JSON text
    run_at       REAL NOT NULL,        -- epoch seconds
    state        TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    backoff      TEXT NOT NULL,        -- JSON object
    misfire      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,        -- for final states: when the job finished
    last_error   TEXT,
    outcome      TEXT,
    lease_until  REAL,
    token        INTEGER NOT NULL DEFAULT 0,
    started      INTEGER NOT NULL DEFAULT 0,  -- the current claim's handler is known to run
    unstarted    INTEGER NOT NULL DEFAULT 0   -- leases that ran out with no recorded start
);
-- claim, next_due, list by state and due window: O(log n)
CREATE INDEX IF NOT EXISTS delayq_jobs_due ON delayq_jobs (state, run_at, seq);
-- expired leases on every claim
CREATE INDEX IF NOT EXISTS delayq_jobs_lease ON delayq_jobs (state, lease_until);
-- result_ttl purge, dead letters newest first, purge_dead(older_than=)
CREATE INDEX IF NOT EXISTS delayq_jobs_finished ON delayq_jobs (state, updated_at);
-- list_jobs without a state filter: walks the due order instead of sorting the table
CREATE INDEX IF NOT EXISTS delayq_jobs_run_at ON delayq_jobs (run_at, seq);
-- list_jobs(name=): one handler's jobs of one state in due order, never a table walk
CREATE INDEX IF NOT EXISTS delayq_jobs_name ON delayq_jobs (name, state, run_at, seq);
-- count_retrying: only the scheduled jobs that failed before
CREATE INDEX IF NOT EXISTS delayq_jobs_retrying ON delayq_jobs (run_at)
    WHERE state = 'scheduled' AND attempts > 0;
CREATE TABLE IF NOT EXISTS delayq_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('token', 0);
-- wake-ups some process could not deliver: waiters seeing it grow poll instead
INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('wake_failures', 0);
"""

# Jobs per state, kept by triggers in the same transaction as every change, so
# stats() reads seven rows instead of counting the table (10M rows: seconds).
# Triggers live in the file: every writer keeps them, whatever its version.
COUNTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS delayq_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL) "
    "WITHOUT ROWID"
)
COUNT_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS delayq_count_insert AFTER INSERT ON delayq_jobs BEGIN
        UPDATE delayq_counts SET n = n + 1 WHERE state = new.state;
    END""",
    """CREATE TRIGGER IF NOT EXISTS delayq_count_delete AFTER DELETE ON delayq_jobs BEGIN
        UPDATE delayq_counts SET n = n - 1 WHERE state = old.state;
    END""",
    """CREATE TRIGGER IF NOT EXISTS delayq_count_update AFTER UPDATE OF state ON delayq_jobs
    WHEN old.state != new.state BEGIN
        UPDATE delayq_counts SET n = n - 1 WHERE state = old.state;
        UPDATE delayq_counts SET n = n + 1 WHERE state = new.state;
    END""",
)

COLUMNS = (
    "seq, id, name, payload, run_at, state, attempts, max_attempts, backoff, misfire, "
    f"created_at, updated_at, last_error, outcome, lease_until, token, {FLOW_COLUMNS}, result"
)
SELECT = f"SELECT {COLUMNS} FROM delayq_jobs"
INSERT = (
    "INSERT INTO delayq_jobs (id, name, payload, run_at, state, max_attempts, backoff, "
    "misfire, created_at, updated_at, flow_key, priority, flow_group) "
    "VALUES (?, ?, ?, ?, 'scheduled', ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The hot queries, named so tests can EXPLAIN them (they must search an index, never scan).
CLAIM_DUE = f"{SELECT} WHERE state = 'scheduled' AND run_at <= ? ORDER BY run_at, seq LIMIT ?"
HEAD = (  # a parked job (run_at = _flow.PARKED_AT) waits for a slot, not a time
    "SELECT run_at FROM delayq_jobs WHERE state = 'scheduled' AND run_at < 1e300 "
    "ORDER BY run_at LIMIT 1"
)
# The handler filter: one handler's due jobs and head, on the index delayq_jobs_name.
CLAIM_DUE_OF = (
    f"SELECT * FROM ({SELECT} WHERE name = ? AND state = 'scheduled' AND run_at <= ? "
    "ORDER BY run_at, seq LIMIT ?)"
)
HEAD_OF = (
    "SELECT run_at FROM delayq_jobs WHERE name = ? AND state = 'scheduled' AND run_at < 1e300 "
    "ORDER BY run_at LIMIT 1"
)
EXPIRED_LEASES = (
    "SELECT seq, attempts, max_attempts, lease_until, started, unstarted FROM delayq_jobs "
    "WHERE state = 'running' AND lease_until <= ?"
)
NEXT_LEASE = (
    "SELECT lease_until FROM delayq_jobs WHERE state = 'running' ORDER BY lease_until LIMIT 1"
)
# How complete() finishes a claim: SET clauses of ack, retry and bury.
ACK = "state = ?, outcome = ?, result = ?, lease_until = NULL, updated_at = ?"
RETRY = "state = 'scheduled', run_at = ?, last_error = ?, lease_until = NULL, updated_at = ?"
# A release keeps an earlier attempt's error; the note only fills an empty last_error.
RELEASE = (
    "state = 'scheduled', attempts = MAX(attempts - 1, 0), "
    "last_error = CASE WHEN last_error IS NULL OR last_error = ? THEN ? ELSE last_error END, "
    "lease_until = NULL, updated_at = ?"
)
# A release with a due time and a note (an unknown handler's hand-back, a stop).
RELEASE_AT = (
    "state = 'scheduled', attempts = MAX(attempts - 1, 0), run_at = COALESCE(?, run_at), "
    "last_error = CASE WHEN ? IS NOT NULL THEN ? "
    "WHEN last_error IS NULL OR last_error = ? THEN ? ELSE last_error END, "
    "lease_until = NULL, updated_at = ?"
)
BURY = "state = 'dead', last_error = ?, lease_until = NULL, updated_at = ?"
EXTEND = "lease_until = ?, updated_at = ?"
EXTEND_STARTED = "lease_until = ?, updated_at = ?, started = 1"
# Columns added after the first release, added to an older file when it is opened.
ADDED_COLUMNS = (
    ("started", "INTEGER NOT NULL DEFAULT 0"),
    ("unstarted", "INTEGER NOT NULL DEFAULT 0"),
    ("result", "TEXT"),  # a succeeded job's return value, JSON text (feature results)
)
TTL_STATE_VALUES = tuple(sorted(s.value for s in TTL_STATES))
NOT_EXPIRED = f"NOT (state IN ({', '.join(repr(v) for v in TTL_STATE_VALUES)}) AND updated_at <= ?)"

Row = tuple[Any, ...]


@functools.lru_cache(maxsize=64)
def _flat_backoff(text: str) -> tuple[tuple[str, Any], ...] | None:
    """A stored backoff's items when they are all scalars (the usual spec), parsed
    once per distinct text; None for nested specs (parsed every time)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"backoff is not a JSON object: {text!r}")
    items = tuple(value.items())
    return None if any(isinstance(v, dict | list) for _, v in items) else items


def decode_backoff(text: str) -> dict[str, Any]:
    """A stored backoff as a fresh dict (raises ValueError or TypeError when unreadable)."""
    items = _flat_backoff(text)
    return dict(items) if items is not None else dict(json.loads(text))


def claimed_job(row: Row, at: float, lease_until: float) -> Job:
    """The job of a row being claimed at ``at``: RUNNING, one more attempt.
    Raises ValueError (or TypeError) when its payload or backoff do not decode."""
    return Job(
        id=row[1],
        name=row[2],
        payload=decode_payload(row[3]),
        run_at=row[4] if row[19] is None else row[19],
        state=JobState.RUNNING,
        attempts=row[6] + 1,
        max_attempts=row[7],
        backoff=decode_backoff(row[8]),
        misfire=row[9],
        created_at=row[10],
        updated_at=at,
        last_error=row[12],
        outcome=row[13],
        lease_until=lease_until,
        key=row[16],
        priority=row[17],
        group=row[18],
    )


def to_job(row: Row, *, strict: bool = False) -> Job:
    """The job of a row. ``strict`` (claim) raises on a payload or backoff that does
    not decode; otherwise (inspection) such a field is returned as its raw text."""
    return Job(
        id=row[1],
        name=row[2],
        payload=decode_payload(row[3]) if strict else readable_json(row[3]),
        run_at=row[4] if row[19] is None else row[19],
        state=JobState(row[5]),
        attempts=row[6],
        max_attempts=row[7],
        backoff=json.loads(row[8]) if strict else readable_json(row[8]),
        misfire=row[9],
        created_at=row[10],
        updated_at=row[11],
        last_error=row[12],
        outcome=row[13],
        lease_until=row[14],
        key=row[16],
        priority=row[17],
        group=row[18],
        throttled_until=row[4] if row[19] is not None and not row[20] else None,
        result=row[21],
    )


def check_synchronous(value: object) -> Synchronous:
    if isinstance(value, str) and value.lower() in ("normal", "full"):
        return "normal" if value.lower() == "normal" else "full"
    raise InvalidOption(f"synchronous must be 'normal' or 'full', got {value!r}")


def check_busy_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise InvalidOption(f"busy_timeout must be a number of seconds >= 0, got {value!r}")
    return float(value)


WAL_SIZE_LIMIT = 4 * 1024 * 1024
"""``journal_size_limit``: after a checkpoint resets the WAL, SQLite truncates
the file back to this size (bytes), so it does not stay as big as the largest
burst it ever held (the default checkpoint runs at 1000 pages, ~4 MiB)."""


def _create_counts(conn: sqlite3.Connection) -> None:
    """Create the per-state counts and their triggers (inside the schema
    transaction); a file from before them is counted once, here."""
    if conn.execute("SELECT 1 FROM delayq_meta WHERE key = 'counts_ready'").fetchone() is not None:
        return
    conn.execute(COUNTS_TABLE)
    conn.execute("DELETE FROM delayq_counts")
    conn.executemany(
        "INSERT INTO delayq_counts (state, n) VALUES (?, 0)", [(s.value,) for s in JobState]
    )
    conn.execute(
        "UPDATE delayq_counts SET n = (SELECT COUNT(*) FROM delayq_jobs "
        "WHERE delayq_jobs.state = delayq_counts.state)"
    )
    for trigger in COUNT_TRIGGERS:
        conn.execute(trigger)
    conn.execute("INSERT INTO delayq_meta (key, value) VALUES ('counts_ready', 1)")


def open_connection(
    path: str, *, memory: bool, busy_timeout: float, synchronous: Synchronous
) -> sqlite3.Connection:
    """Open ``path`` in WAL mode and create (or check) the schema.

    Raises :class:`sqlite3.Error` for the backend to wrap, and
    :class:`~delayq.errors.ConfigurationError` for a file delayq cannot use.
    """
    conn = sqlite3.connect(
        path,
        timeout=busy_timeout,
        isolation_level=None,  # the backend issues BEGIN IMMEDIATE / COMMIT itself
        check_same_thread=False,  # guarded by the backend's lock
        uri=path.startswith("file:"),
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        if not memory:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigurationError(
                    f"SQLite database {path!r} cannot use WAL mode (got {mode!r}); "
                    f"it needs a local file system"
                )
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        conn.execute("BEGIN IMMEDIATE")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        present = {row[1] for row in conn.execute("PRAGMA table_info(delayq_jobs)")}
        for column, definition in ADDED_COLUMNS:
            if column not in present:
                conn.execute(f"ALTER TABLE delayq_jobs ADD COLUMN {column} {definition}")
        _create_counts(conn)
        add_flow_schema(conn)
        conn.execute(KEYED_TABLE)
        conn.execute(KEYED_INDEX)
        conn.execute(
            "INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('schema_version', ?)",
            (SCHEMA_VERSION,),
        )
        version = conn.execute(
            "SELECT value FROM delayq_meta WHERE key = 'schema_version'"
        ).fetchone()[0]
        conn.execute("COMMIT")
        if version != SCHEMA_VERSION:
            raise ConfigurationError(
                f"SQLite database {path!r} has delayq schema version {version}; "
                f"this delayq reads version {SCHEMA_VERSION}"
            )
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        raise
    return conn
