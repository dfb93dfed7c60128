"""The SQLite backend: durable delayed jobs in one file, the embedded default.

One table, ``delayq_jobs``, holds every job; a job's ``state`` column moves it
through its life. Claiming reads the due-time index ``(state, run_at, seq)``,
so it costs O(log n): the same with 10 jobs pending or 10 million.

Concurrency
-----------
* **Threads.** A backend object owns ONE connection, guarded by a lock; its
  threads take turns. SQLite runs one writer at a time anyway, and a Python
  lock hands over in microseconds where SQLite's busy handler sleeps for
  milliseconds, so this is also the fast choice.
* **Processes.** Any number of processes may open the same file. Every write
  (claims included) runs in ``BEGIN IMMEDIATE``, which takes the database's
  write lock before reading, so two processes can never both see a job as due
  and claim it: a job is never held by two live leases. Waiting for the lock is
  bounded by ``busy_timeout``. The database runs in WAL mode, so readers never
  block the writer.
* **Fork.** A process forked after the backend was opened gets a fresh
  connection (SQLite connections must not cross ``fork``).

Durability: ``synchronous="full"`` (the default) or ``"normal"``
------------------------------------------------------------------
With ``"full"`` every commit is fsynced before ``enqueue`` (or ``ack`` ...)
returns, so a job whose ``enqueue`` returned survives a power cut or an OS
crash: the contract's "nothing lost" holds unconditionally, which is why it
is the default. With ``"normal"`` (in WAL mode) a commit is safe from a crash
of the process (SIGKILL included) and the file never corrupts, but the last
transactions before a power loss or kernel crash may roll back. It is several
times faster for single-job writes; batched writes (``schedule_many``) pay
one fsync per batch either way.

Waking
------
``wait_for_due`` sleeps until the earliest due time or lease expiry. In the
same process an earlier job wakes it at once (a condition variable); other
processes wake it within about a millisecond through unix datagram sockets
next to the database (see :mod:`delayq.backends._wake`), never by polling the
table.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    PURGE_BATCH,
    RELEASED_NOTE,
    TTL_STATES,
    CompletesInBatches,
    check_lease,
    check_limit,
    check_max_wait,
    check_result_ttl,
    check_run_at,
    check_spec,
    check_when,
    lease_expired_error,
    lease_expired_note,
    readable_json,
    stale_claim,
    undecodable_error,
)
from delayq.backends._sqlite_schedules import SQLiteSchedules
from delayq.backends._wake import WakeChannel
from delayq.backends.base import Completion
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.codec import decode_payload
from delayq.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    InvalidOption,
    JobConflict,
    QueueClosed,
    StaleClaim,
)
from delayq.job import (
    CancelOutcome,
    Claim,
    EnqueueOutcome,
    Job,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    Stats,
    check_on_conflict,
)

__all__ = ["DEFAULT_BUSY_TIMEOUT", "SCHEMA_VERSION", "SQLiteBackend", "Synchronous"]

Synchronous = Literal["normal", "full"]

DEFAULT_BUSY_TIMEOUT = 10.0
"""Seconds a write waits for another process's write lock before failing."""

SCHEMA_VERSION = 1

FALLBACK_POLL = 0.05
"""Where wake sockets are unavailable, ``wait_for_due`` re-checks
``PRAGMA data_version`` this often (seconds)."""

_PURGE_EVERY = 1.0  # seconds of backend time between lazy purges of finished records
_CHUNK = 500  # ids per "IN (...)" query, well under SQLite's parameter limit

_SCHEMA = """
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
    token        INTEGER NOT NULL DEFAULT 0
);
-- claim, next_due, list by state and due window: O(log n)
CREATE INDEX IF NOT EXISTS delayq_jobs_due ON delayq_jobs (state, run_at, seq);
-- expired leases on every claim
CREATE INDEX IF NOT EXISTS delayq_jobs_lease ON delayq_jobs (state, lease_until);
-- result_ttl purge, dead letters newest first, purge_dead(older_than=)
CREATE INDEX IF NOT EXISTS delayq_jobs_finished ON delayq_jobs (state, updated_at);
-- list_jobs without a state filter: walks the due order instead of sorting the table
CREATE INDEX IF NOT EXISTS delayq_jobs_run_at ON delayq_jobs (run_at, seq);
CREATE TABLE IF NOT EXISTS delayq_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('token', 0);
"""

_COLUMNS = (
    "seq, id, name, payload, run_at, state, attempts, max_attempts, backoff, misfire, "
    "created_at, updated_at, last_error, outcome, lease_until, token"
)
_SELECT = f"SELECT {_COLUMNS} FROM delayq_jobs"
_INSERT = (
    "INSERT INTO delayq_jobs (id, name, payload, run_at, state, max_attempts, backoff, "
    "misfire, created_at, updated_at) VALUES (?, ?, ?, ?, 'scheduled', ?, ?, ?, ?, ?)"
)
# The hot queries, named so tests can EXPLAIN them (they must search an index, never scan).
_CLAIM_DUE = f"{_SELECT} WHERE state = 'scheduled' AND run_at <= ? ORDER BY run_at, seq LIMIT ?"
_HEAD = "SELECT run_at FROM delayq_jobs WHERE state = 'scheduled' ORDER BY run_at LIMIT 1"
_EXPIRED_LEASES = (
    "SELECT seq, attempts, max_attempts, lease_until FROM delayq_jobs "
    "WHERE state = 'running' AND lease_until <= ?"
)
_NEXT_LEASE = (
    "SELECT lease_until FROM delayq_jobs WHERE state = 'running' ORDER BY lease_until LIMIT 1"
)
# How complete() finishes a claim: SET clauses of ack, retry and bury.
_ACK = "state = ?, outcome = ?, lease_until = NULL, updated_at = ?"
_RETRY = "state = 'scheduled', run_at = ?, last_error = ?, lease_until = NULL, updated_at = ?"
_RELEASE = (
    "state = 'scheduled', attempts = MAX(attempts - 1, 0), last_error = ?, lease_until = NULL, "
    "updated_at = ?"
)
_BURY = "state = 'dead', last_error = ?, lease_until = NULL, updated_at = ?"
_TTL_STATE_VALUES = tuple(sorted(s.value for s in TTL_STATES))
_NOT_EXPIRED = (
    f"NOT (state IN ({', '.join(repr(v) for v in _TTL_STATE_VALUES)}) AND updated_at <= ?)"
)

Row = tuple[Any, ...]


def _to_job(row: Row, *, strict: bool = False) -> Job:
    """The job of a row. ``strict`` (claim) raises on a payload or backoff that does
    not decode; otherwise (inspection) such a field is returned as its raw text."""
    return Job(
        id=row[1],
        name=row[2],
        payload=decode_payload(row[3]) if strict else readable_json(row[3]),
        run_at=row[4],
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
    )


def _check_synchronous(value: object) -> Synchronous:
    if isinstance(value, str) and value.lower() in ("normal", "full"):
        return "normal" if value.lower() == "normal" else "full"
    raise InvalidOption(f"synchronous must be 'normal' or 'full', got {value!r}")


def _check_busy_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise InvalidOption(f"busy_timeout must be a number of seconds >= 0, got {value!r}")
    return float(value)


class SQLiteBackend(SQLiteSchedules, CompletesInBatches):
    """The :class:`~delayq.backends.base.Backend` on a SQLite file (see the module docstring).

    ``SQLiteBackend("jobs.db")`` or ``open_backend("sqlite:///jobs.db")``;
    ``":memory:"`` keeps the jobs in this object only.

    Options (keyword-only):

    * ``clock``: decides "now" when a method is not given ``now=``.
    * ``synchronous``: ``"full"`` (default: every commit survives power loss) or
      ``"normal"`` (survives a process crash; faster single writes).
    * ``busy_timeout``: seconds to wait for another process's write lock
      (default 10) before raising :class:`~delayq.errors.BackendUnavailable`.
    * ``result_ttl``: seconds finished records are kept (default 7 days).

    Lock rule: ``_db_lock`` (reentrant) guards ``_conn``, ``_pid``,
    ``_last_purge`` and ``_closed``; no user code and no
    waiting happens under it. ``_cond`` (its own lock) guards ``_wake_gen`` and is
    notified when the schedule moved earlier, on :meth:`interrupt` and on close.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {"clock", "shared", "durable", "definite_cancel", "inspect", "recurring"}
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = SYSTEM_CLOCK,
        synchronous: Synchronous = "full",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        result_ttl: float = DEFAULT_RESULT_TTL,
        url: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.url = url if url is not None else f"sqlite:///{self.path}"
        self._clock = clock
        self._synchronous = _check_synchronous(synchronous)
        self._busy_timeout = _check_busy_timeout(busy_timeout)
        self._result_ttl = check_result_ttl(result_ttl)
        self._memory = self.path == ":memory:" or self.path.startswith("file::memory:")
        self._db_lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._wake_gen = 0
        self._closed = False
        self._last_purge = float("-inf")
        self._pid = os.getpid()
        self._wake: WakeChannel | None = None
        self._conn = self._connect()
        if not self._memory:
            self._wake = WakeChannel(self.path, self._woken)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteBackend:
        """Open ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite:///:memory:``.

        Query parameters ``synchronous``, ``busy_timeout`` and ``result_ttl`` set
        options (``sqlite:///jobs.db?synchronous=normal``); keyword options win.
        """
        parts = urlsplit(url)
        if parts.scheme != "sqlite":
            raise ConfigurationError(f"SQLiteBackend needs a sqlite:// URL, got {url!r}")
        if parts.netloc:
            raise ConfigurationError(
                f"sqlite URL {url!r} has a host part {parts.netloc!r}; use three slashes for "
                f"a relative path (sqlite:///jobs.db) or four for an absolute one "
                f"(sqlite:////var/lib/jobs.db)"
            )
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ConfigurationError(f"sqlite URL {url!r} names no file, e.g. sqlite:///jobs.db")
        from_query: dict[str, Any] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key == "synchronous":
                from_query[key] = value
            elif key in ("busy_timeout", "result_ttl"):
                try:
                    from_query[key] = float(value)
                except ValueError:
                    raise ConfigurationError(
                        f"sqlite URL option {key}={value!r} is not a number of seconds"
                    ) from None
            else:
                raise ConfigurationError(
                    f"unknown sqlite URL option {key!r}; known: synchronous, busy_timeout, "
                    f"result_ttl"
                )
        return cls(path, url=url, **{**from_query, **options})

    def __repr__(self) -> str:
        return f"SQLiteBackend(url={self.url!r}, synchronous={self._synchronous!r})"

    # -- connection -----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # guarded by _db_lock
                uri=self.path.startswith("file:"),
            )
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            if not self._memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise ConfigurationError(
                        f"SQLite database {self.path!r} cannot use WAL mode (got {mode!r}); "
                        f"it needs a local file system"
                    )
            conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
            version = conn.execute(
                "SELECT value FROM delayq_meta WHERE key = 'schema_version'"
            ).fetchone()[0]
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._wrap(exc, "opening") from exc
            raise
        if version != SCHEMA_VERSION:
            conn.close()
            raise ConfigurationError(
                f"SQLite database {self.path!r} has delayq schema version {version}; "
                f"this delayq reads version {SCHEMA_VERSION}"
            )
        return conn

    def _wrap(self, exc: sqlite3.Error, doing: str) -> BackendError:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and (
            "locked" in text or "busy" in text or "unable to open" in text
        ):
            return BackendUnavailable(
                f"SQLite database {self.path!r} unavailable while {doing}: {text} "
                f"(busy_timeout={self._busy_timeout}s)"
            )
        return BackendError(f"SQLite error while {doing} on {self.path!r}: {text}")

    def _connection(self) -> sqlite3.Connection:
        """The connection (call with ``_db_lock`` held); reopened after ``fork``."""
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")
        if self._pid != os.getpid():
            # Inherited across fork: never touch the parent's connection or sockets.
            self._pid = os.getpid()
            self._conn = self._connect()
            if self._wake is not None:
                self._wake = WakeChannel(self.path, self._woken)
        return self._conn

    def _write(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error."""
        return self._transaction("BEGIN IMMEDIATE", doing)

    def _read(self, doing: str) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for several statements."""
        return self._transaction("BEGIN", doing)

    @contextlib.contextmanager
    def _transaction(self, begin: str, doing: str) -> Iterator[sqlite3.Connection]:
        with self._db_lock:
            conn = self._connection()
            try:
                conn.execute(begin)
            except sqlite3.Error as exc:
                raise self._wrap(exc, doing) from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._wrap(exc, doing) from exc
                raise

    # -- helpers (inside a transaction) ------------------------------------------
    @staticmethod
    def _head(conn: sqlite3.Connection) -> float | None:
        row = conn.execute(_HEAD).fetchone()
        return None if row is None else float(row[0])

    @staticmethod
    def _next_lease_expiry(conn: sqlite3.Connection) -> float | None:
        row = conn.execute(_NEXT_LEASE).fetchone()
        return None if row is None else float(row[0])

    def _cutoff(self, now: float) -> float:
        """Finished records with ``updated_at <= cutoff`` are past ``result_ttl``."""
        return now - self._result_ttl

    def _is_expired(self, state: str, updated_at: float, now: float) -> bool:
        return state in _TTL_STATE_VALUES and updated_at <= self._cutoff(now)

    def _purge_finished(self, conn: sqlite3.Connection, now: float) -> None:
        """Delete at most ``PURGE_BATCH`` records past ``result_ttl`` per state.

        Bounded so one claim never holds the write lock for a long purge (a
        lowered ``result_ttl`` on a large store); when a batch was full the next
        claim goes on at once. Reads never see the rest (``_NOT_EXPIRED``).
        """
        if self._last_purge <= now < self._last_purge + _PURGE_EVERY:
            return
        full = False
        for state in _TTL_STATE_VALUES:
            deleted = conn.execute(
                "DELETE FROM delayq_jobs WHERE seq IN (SELECT seq FROM delayq_jobs "
                "WHERE state = ? AND updated_at <= ? LIMIT ?)",
                (state, self._cutoff(now), PURGE_BATCH),
            ).rowcount
            full = full or deleted >= PURGE_BATCH
        self._last_purge = float("-inf") if full else now

    def _expire_leases(self, conn: sqlite3.Connection, now: float) -> None:
        expired = conn.execute(_EXPIRED_LEASES, (now,)).fetchall()
        for seq, attempts, max_attempts, lease_until in expired:
            if attempts >= max_attempts:
                conn.execute(
                    "UPDATE delayq_jobs SET state = 'dead', last_error = ?, lease_until = NULL, "
                    "updated_at = ? WHERE seq = ?",
                    (lease_expired_error(lease_until, attempts, max_attempts), now, seq),
                )
            else:
                # Due again from the moment the lease ran out: lateness (and the
                # misfire policy) is measured from there, not from the first due time.
                conn.execute(
                    "UPDATE delayq_jobs SET state = 'scheduled', run_at = ?, last_error = ?, "
                    "lease_until = NULL, updated_at = ? WHERE seq = ?",
                    (lease_until, lease_expired_note(lease_until, attempts), now, seq),
                )

    def _finish_claim(
        self, conn: sqlite3.Connection, claim: Claim, assignments: str, params: tuple[Any, ...]
    ) -> None:
        """Apply ``assignments`` to the claimed job, or raise StaleClaim."""
        cur = conn.execute(
            f"UPDATE delayq_jobs SET {assignments} "
            f"WHERE id = ? AND state = 'running' AND token = ?",
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

    # -- waking -------------------------------------------------------------------
    def _woken(self) -> None:
        with self._cond:
            self._wake_gen += 1
            self._cond.notify_all()

    def _wake_if_earlier(self, run_at: float | None, head: float | None) -> None:
        """After a commit: wake waiters here and in other processes if the head moved earlier."""
        if run_at is None or (head is not None and run_at >= head):
            return
        self._woken()
        if self._wake is not None:
            self._wake.notify()

    # -- producers --------------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if not specs:
            return []
        with self._write("enqueueing") as conn:
            now = self._clock.time()
            existing: dict[str, JobState] = {}
            stale_rows: set[str] = set()  # rows to delete before inserting (replaced, expired)
            unique_ids = list(dict.fromkeys(s.id for s in specs))
            for i in range(0, len(unique_ids), _CHUNK):
                chunk = unique_ids[i : i + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                for job_id, state, updated_at in conn.execute(
                    f"SELECT id, state, updated_at FROM delayq_jobs WHERE id IN ({marks})", chunk
                ):
                    stale_rows.add(job_id)
                    if not self._is_expired(state, updated_at, now):
                        existing[job_id] = JobState(state)
            outcomes: list[EnqueueOutcome] = []
            final: dict[str, JobSpec] = {}  # id -> the spec that ends up stored
            for spec in specs:
                current = existing.get(spec.id)
                if current is None:
                    outcomes.append(EnqueueOutcome.CREATED)
                elif on_conflict == "keep":
                    outcomes.append(EnqueueOutcome.KEPT)
                    continue
                elif on_conflict == "reject":
                    raise JobConflict(
                        f"job {spec.id!r} already exists ({current.value}); pass "
                        f"on_conflict='keep' or 'replace' to accept an existing id"
                    )
                elif current is JobState.RUNNING:
                    raise JobConflict(
                        f"job {spec.id!r} is running and cannot be replaced; wait for it to finish"
                    )
                else:
                    outcomes.append(EnqueueOutcome.REPLACED)
                existing[spec.id] = JobState.SCHEDULED
                final.pop(spec.id, None)  # re-inserted at its latest position (FIFO)
                final[spec.id] = spec
            if not final:
                return outcomes
            head = self._head(conn)
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
                    json.dumps(s.backoff, separators=(",", ":")),
                    s.misfire,
                    s.created_at or now,
                    now,
                )
                for s in final.values()
            ]
            conn.executemany(_INSERT, rows)
            earliest = min(row[3] for row in rows)
        self._wake_if_earlier(earliest, head)
        return outcomes

    def _scheduled_seq(
        self, conn: sqlite3.Connection, job_id: str, now: float
    ) -> tuple[int | None, str]:
        """The row of a SCHEDULED job, or None and why not: ``running``,
        ``finished`` or ``not_found`` (the values Cancel/RescheduleOutcome share)."""
        row = conn.execute(
            "SELECT seq, state, updated_at FROM delayq_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        if row is None or self._is_expired(row[1], row[2], now):
            return None, "not_found"
        state = JobState(row[1])
        if state is JobState.RUNNING:
            return None, "running"
        if state is not JobState.SCHEDULED:
            return None, "finished"
        return int(row[0]), "scheduled"

    def cancel(self, job_id: str) -> CancelOutcome:
        with self._write("cancelling") as conn:
            now = self._clock.time()
            seq, verdict = self._scheduled_seq(conn, job_id, now)
            if seq is None:
                return CancelOutcome(verdict)
            conn.execute(
                "UPDATE delayq_jobs SET state = 'cancelled', outcome = 'cancelled', "
                "updated_at = ? WHERE seq = ?",
                (now, seq),
            )
            return CancelOutcome.CANCELLED

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        at, after = check_when(run_at, delay)
        with self._write("rescheduling") as conn:
            now = self._clock.time()
            run_at = now + after if after is not None else at
            assert run_at is not None
            seq, verdict = self._scheduled_seq(conn, job_id, now)
            if seq is None:
                return RescheduleOutcome(verdict)
            head = self._head(conn)
            conn.execute(
                "UPDATE delayq_jobs SET run_at = ?, updated_at = ? WHERE seq = ?",
                (run_at, now, seq),
            )
        self._wake_if_earlier(run_at, head)
        return RescheduleOutcome.RESCHEDULED

    # -- workers ----------------------------------------------------------------
    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        limit = check_limit(limit)
        lease = check_lease(lease)
        with self._write("claiming") as conn:
            at = self._clock.time() if now is None else check_run_at(now, "now")
            self._purge_finished(conn, at)
            self._expire_leases(conn, at)
            rows = conn.execute(_CLAIM_DUE, (at, limit)).fetchall()
            if not rows:
                return []
            lease_until = at + lease
            # Decode before committing: a row that cannot be read is buried with
            # the reason inside this transaction instead of breaking the claim.
            jobs: list[tuple[int, Job]] = []
            for row in rows:
                try:
                    job = replace(
                        _to_job(row, strict=True),
                        state=JobState.RUNNING,
                        attempts=row[6] + 1,
                        lease_until=lease_until,
                        updated_at=at,
                    )
                except (ValueError, TypeError) as exc:
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
            conn.execute(
                "UPDATE delayq_meta SET value = ? WHERE key = 'token'", (last + len(jobs),)
            )
            conn.executemany(
                "UPDATE delayq_jobs SET state = 'running', attempts = attempts + 1, token = ?, "
                "lease_until = ?, updated_at = ? WHERE seq = ?",
                [(last + 1 + i, lease_until, at, seq) for i, (seq, _job) in enumerate(jobs)],
            )
        return [Claim(job, last + 1 + i, lease_until, at) for i, (_seq, job) in enumerate(jobs)]

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Finish every claim of ``batch`` in one ``BEGIN IMMEDIATE`` transaction.

        With ``synchronous="full"`` that is one fsync for the whole batch instead
        of one per job: the worker's group commit relies on it.
        """
        items = Completion.batch(batch)
        if not items:
            return []
        results: list[StaleClaim | None] = []
        earliest: float | None = None
        head: float | None = None
        with self._write("completing claims") as conn:
            now = self._clock.time()
            if any(item.state is JobState.SCHEDULED for item in items):  # retry or release
                head = self._head(conn)
            for item in items:
                if item.released:
                    assignments = _RELEASE
                    params: tuple[Any, ...] = (RELEASED_NOTE, now)
                elif item.state is JobState.SCHEDULED:
                    assert item.run_at is not None
                    assignments = _RETRY
                    params = (item.run_at, item.error, now)
                elif item.state is JobState.DEAD:
                    assignments = _BURY
                    params = (item.error, now)
                else:
                    assignments = _ACK
                    params = (item.state.value, item.outcome, now)
                try:
                    self._finish_claim(conn, item.claim, assignments, params)
                except StaleClaim as exc:
                    results.append(exc)
                    continue
                results.append(None)
                run_at = item.claim.job.run_at if item.released else item.run_at
                if run_at is not None:
                    earliest = run_at if earliest is None else min(earliest, run_at)
        self._wake_if_earlier(earliest, head)
        return results

    def extend(self, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        with self._write("extending a lease") as conn:
            now = self._clock.time()
            self._finish_claim(conn, claim, "lease_until = ?, updated_at = ?", (now + lease, now))
        job = replace(claim.job, lease_until=now + lease, updated_at=now)
        return replace(claim, job=job, lease_until=now + lease)

    def wait_for_due(self, max_wait: float) -> None:
        """Sleep until a job is due, a lease expires, the schedule moves earlier
        (here or in another process), :meth:`interrupt`, or ``max_wait`` seconds."""
        max_wait = check_max_wait(max_wait)
        clock = self._clock
        try:
            with self._db_lock:
                self._connection()  # reopens (and re-creates the wake channel) after fork
        except QueueClosed:
            return
        wake = self._wake
        # Listen BEFORE reading the schedule: a change committed after the read
        # then always reaches us as a wake-up.
        listening = wake.listen() if wake is not None else True
        with self._cond:
            gen = self._wake_gen
        deadline = clock.monotonic() + max_wait
        seen_version: int | None = None  # fallback only: PRAGMA data_version at the start
        while True:
            try:
                with self._read("waiting") as conn:
                    times = [
                        t
                        for t in (self._head(conn), self._next_lease_expiry(conn))
                        if t is not None
                    ]
                    version = None if listening else conn.execute("PRAGMA data_version").fetchone()
            except QueueClosed:
                return
            if version is not None:
                if seen_version is not None and version[0] != seen_version:
                    return  # another connection committed: look again
                seen_version = version[0]
            with self._cond:
                if self._closed or self._wake_gen != gen:
                    return
                left = deadline - clock.monotonic()
                if left <= 0:
                    return
                if times:
                    until = min(times) - clock.time()
                    if until <= 0:
                        return
                    left = min(left, until)
                if not listening:
                    left = min(left, FALLBACK_POLL)
                clock.wait(self._cond, left)
                if self._closed or self._wake_gen != gen:
                    return

    def interrupt(self) -> None:
        self._woken()

    # -- inspection and dead letters -------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with self._read("reading a job") as conn:
            row = conn.execute(
                f"{_SELECT} WHERE id = ? AND {_NOT_EXPIRED}",
                (job_id, self._cutoff(self._clock.time())),
            ).fetchone()
        return None if row is None else _to_job(row)

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """Jobs in ``run_at`` order (FIFO ties), due in ``due_after <= run_at < due_before``."""
        limit = check_limit(limit)
        where = [_NOT_EXPIRED]
        params: list[Any] = [self._cutoff(self._clock.time())]
        if state is not None:
            where.append("state = ?")
            params.append(JobState(state).value)
        if due_after is not None:
            where.append("run_at >= ?")
            params.append(check_run_at(due_after, "due_after"))
        if due_before is not None:
            where.append("run_at < ?")
            params.append(check_run_at(due_before, "due_before"))
        with self._read("listing jobs") as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY run_at, seq LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [_to_job(r) for r in rows]

    def next_due(self) -> float | None:
        with self._read("reading the next due time") as conn:
            return self._head(conn)

    def stats(self) -> Stats:
        now = self._clock.time()
        with self._read("counting jobs") as conn:
            counts = dict(
                conn.execute(
                    f"SELECT state, COUNT(*) FROM delayq_jobs WHERE {_NOT_EXPIRED} GROUP BY state",
                    (self._cutoff(now),),
                ).fetchall()
            )
            due = conn.execute(
                "SELECT COUNT(*) FROM delayq_jobs WHERE state = 'scheduled' AND run_at <= ?",
                (now,),
            ).fetchone()[0]
            head = self._head(conn)
        return Stats(
            scheduled=counts.get("scheduled", 0),
            due=due,
            running=counts.get("running", 0),
            succeeded=counts.get("succeeded", 0),
            dead=counts.get("dead", 0),
            cancelled=counts.get("cancelled", 0),
            skipped=counts.get("skipped", 0),
            next_due=head,
        )

    def dead_letters(self, *, limit: int = 100) -> list[Job]:
        limit = check_limit(limit)
        with self._read("listing dead letters") as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE state = 'dead' ORDER BY updated_at DESC, seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [_to_job(r) for r in rows]

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        at, after = check_when(run_at, delay)
        with self._write("requeueing a dead job") as conn:
            now = self._clock.time()
            run_at = now + after if after is not None else at
            assert run_at is not None
            head = self._head(conn)
            cur = conn.execute(
                "UPDATE delayq_jobs SET state = 'scheduled', attempts = 0, run_at = ?, "
                "outcome = NULL, lease_until = NULL, updated_at = ? "
                "WHERE id = ? AND state = 'dead'",
                (run_at, now, job_id),
            )
            requeued = cur.rowcount == 1
        if requeued:
            self._wake_if_earlier(run_at, head)
        return requeued

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``."""
        where = "state = 'dead'"
        params: list[Any] = []
        if older_than is not None:
            where += " AND updated_at < ?"
            params.append(check_run_at(older_than, "older_than"))
        with self._write("purging dead letters") as conn:
            if job_ids is None:
                return conn.execute(f"DELETE FROM delayq_jobs WHERE {where}", params).rowcount
            wanted = list(dict.fromkeys(job_ids))
            total = 0
            for i in range(0, len(wanted), _CHUNK):
                chunk = wanted[i : i + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                total += conn.execute(
                    f"DELETE FROM delayq_jobs WHERE {where} AND id IN ({marks})",
                    (*params, *chunk),
                ).rowcount
            return total

    def close(self) -> None:
        """Close the connection and the wake socket; wake every waiter. Idempotent."""
        with self._db_lock:
            if self._closed:
                return
            self._closed = True
            # After fork the connection and wake socket belong to the parent: leave them.
            ours = self._pid == os.getpid()
            if ours:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
            wake = self._wake if ours else None
        if wake is not None:
            wake.close()
        self._woken()
