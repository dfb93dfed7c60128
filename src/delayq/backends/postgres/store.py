"""The PostgreSQL store's contract methods: producers, workers, waiting.

Inspection (get, list_jobs, stats, dead letters) is in :mod:`.inspect`; the
SQL in :mod:`.sql`; schema and migrations in :mod:`.schema`; waiting in
:mod:`.wake`. See the package docstring for the design.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg
import psycopg_pool
from psycopg.rows import tuple_row

from delayq._validate import check_seconds
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    TTL_STATES,
    CompletesInBatches,
    check_max_wait,
    check_result_ttl,
    check_spec,
    check_when,
)
from delayq.backends.postgres import schema as _schema
from delayq.backends.postgres.claims import Claiming
from delayq.backends.postgres.connection import caller_connection, mapped, mask, split_url
from delayq.backends.postgres.inspect import Inspection
from delayq.backends.postgres.sql import CUTOFF, Statements
from delayq.backends.postgres.wake import FALLBACK_WAIT, Listener, channel_name
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import (
    BackendUnavailable,
    InvalidOption,
    JobConflict,
    QueueClosed,
)
from delayq.job import (
    CancelOutcome,
    EnqueueOutcome,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    check_on_conflict,
)

__all__ = ["DEFAULT_DEAD_TTL", "DEFAULT_QUEUE", "PostgresBackend"]

DEFAULT_QUEUE = "default"
DEFAULT_DEAD_TTL = 30 * 24 * 3600.0
"""Dead letters are deleted this long after they were buried (30 days); None keeps them."""

_PURGE_EVERY = 1.0  # seconds (of the store's clock) between purges of finished records

log = logging.getLogger("delayq.postgres")


class PostgresBackend(Claiming, CompletesInBatches, Inspection):
    """The :class:`~delayq.backends.base.Backend` on PostgreSQL (see the package docstring).

    ``PostgresBackend("postgresql://user@host/db?queue=orders")`` or
    ``open_backend(url)``. Options (keyword-only, or URL query parameters):

    * ``queue``: the queue's name (default ``"default"``); queues of one schema
      share its table.
    * ``schema``: the PostgreSQL schema delayq owns (default ``"delayq"``).
    * ``migrate``: create / migrate the schema when opening (default True);
      with False, a schema at another version is refused (run ``delayq migrate``).
    * ``result_ttl``: seconds finished records are kept (default 7 days).
    * ``dead_ttl``: seconds dead letters are kept (default 30 days; None: forever).
    * ``pool_size``: most connections this handle opens (default 8), plus one
      for LISTEN once it waits for jobs.
    * ``clock``: for tests only. When given, its time replaces the server's
      clock wherever a call is not given ``now=``.
    * ``connect_timeout``: seconds to wait for a connection (default 10).
    * ``synchronous_commit``: ``"on"`` (default: a call returns after its commit
      is on disk, so a job survives a server crash or power loss) or ``"off"``
      (the server's setting of that name for delayq's sessions: several times
      more single-call writes per second; a server crash may lose the last
      fraction of a second of commits, a client crash still loses nothing).

    Lock rule: ``_lock`` guards ``_listener``, ``_closed`` and ``_last_purge``.
    The pool and the listener are thread-safe; no query runs under ``_lock``.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {
            "clock",
            "shared",
            "durable",
            "server_clock",
            "definite_cancel",
            "inspect",
            "transactional_enqueue",
        }
    )

    def __init__(
        self,
        url: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        *,
        queue: str = DEFAULT_QUEUE,
        schema: str = _schema.DEFAULT_SCHEMA,
        migrate: bool = True,
        result_ttl: float = DEFAULT_RESULT_TTL,
        dead_ttl: float | None = DEFAULT_DEAD_TTL,
        pool_size: int = 8,
        clock: Clock | None = None,
        connect_timeout: float = 10.0,
        application_name: str = "delayq",
        synchronous_commit: str = "on",
    ) -> None:
        conninfo, options = split_url(url)
        queue = options.get("queue", queue)
        schema = _schema.check_schema_name(options.get("schema", schema))
        migrate = options.get("migrate", migrate)
        pool_size = options.get("pool_size", pool_size)
        synchronous_commit = options.get("synchronous_commit", synchronous_commit)
        if synchronous_commit not in ("on", "off"):
            raise InvalidOption(
                f"synchronous_commit must be 'on' or 'off', got {synchronous_commit!r}"
            )
        if not isinstance(queue, str) or not queue or len(queue) > 200:
            raise InvalidOption(f"queue must be a non-empty str (at most 200), got {queue!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidOption(f"pool_size must be an int >= 1, got {pool_size!r}")
        dead_ttl = options.get("dead_ttl", dead_ttl)
        self.url = mask(url)
        self.queue = queue
        self.schema = schema
        self._result_ttl = check_result_ttl(options.get("result_ttl", result_ttl))
        self._dead_ttl = None if dead_ttl is None else check_result_ttl(dead_ttl)
        self._clock = SYSTEM_CLOCK if clock is None else clock
        self._fake = self._clock is not SYSTEM_CLOCK
        self._sql = Statements.build(schema)
        self._channel = channel_name(schema, queue)
        self._timeout = check_seconds(connect_timeout, "connect_timeout")
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": application_name,
            "connect_timeout": max(1, math.ceil(self._timeout)),
            "options": f"-c synchronous_commit={synchronous_commit}",
        }
        self._conninfo = conninfo
        self._lock = threading.Lock()
        self._listener: Listener | None = None
        self._closed = False
        self._last_purge = float("-inf")
        self._waiter_ids = itertools.count()
        self._pool = psycopg_pool.ConnectionPool(
            conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=self._timeout,
            name=f"delayq-{queue}",
        )
        try:
            with mapped(self.url, "connecting"):
                self._pool.open(wait=True, timeout=self._timeout)
            with self._conn("preparing the schema") as conn:
                if migrate:
                    _schema.migrate(conn, schema)
                else:
                    _schema.check_version(conn, schema)
        except BaseException:
            self._pool.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """Open ``postgresql://user[:password]@host:port/db[?queue=...&schema=...]``."""
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"PostgresBackend(url={self.url!r}, queue={self.queue!r}, schema={self.schema!r})"

    # -- connections ------------------------------------------------------------
    @contextmanager
    def _conn(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; psycopg errors become delayq errors. After a
        connection failure the pool drops its broken connections (a restart)."""
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")
        try:
            with mapped(self.url, doing), self._pool.connection() as conn:
                yield conn
        except BackendUnavailable:
            if not self._closed:
                self._pool.check()
            raise
        except psycopg_pool.PoolClosed as exc:
            raise QueueClosed(f"{self!r} is closed") from exc

    def _read(self, doing: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run a read-only statement, retried once on a fresh connection."""
        for attempt in (1, 2):
            try:
                with self._conn(doing) as conn:
                    return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()
            except BackendUnavailable:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _write(self, doing: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run one statement that changes rows (never retried: its outcome would be unknown)."""
        with self._conn(doing) as conn:
            return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]:
        """The parameters every statement shares: queue, ``now`` (None: the server's)."""
        if now is None and self._fake:
            now = self._clock.time()
        return {"q": self.queue, "now": now, "ttl": self._result_ttl, **more}

    def _purge_due(self) -> bool:
        """True at most once per ``_PURGE_EVERY`` seconds: time to purge finished records."""
        mono = self._clock.monotonic()
        with self._lock:
            if mono - self._last_purge < _PURGE_EVERY:
                return False
            self._last_purge = mono
            return True

    def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None:
        """After a commit that scheduled a job due at ``at``: wake waiters if it is
        the earliest now (here at once, elsewhere through NOTIFY)."""
        if at is None:
            return
        conn.execute(self._sql.head_check, {"q": self.queue, "at": at, "channel": self._channel})
        listener = self._listener
        if listener is not None:
            listener.heard(at)

    # -- producers --------------------------------------------------------------
    def enqueue(
        self,
        jobs: Sequence[JobSpec],
        *,
        on_conflict: OnConflict = "reject",
        connection: object = None,
    ) -> list[EnqueueOutcome]:
        """Store ``jobs`` atomically (see the Backend contract).

        With ``connection=`` (a psycopg connection, or a SQLAlchemy Connection /
        Session on psycopg) the jobs join that connection's transaction: they
        exist if and only if it commits, and are invisible to workers until then.
        """
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if connection is not None:
            return self._enqueue_in(caller_connection(connection), specs, on_conflict)
        if not specs:
            return []
        with self._conn("enqueueing") as conn:
            params = self._insert_params(specs)
            try:
                rows = conn.cursor(row_factory=tuple_row).execute(self._sql.insert, params)
                created = rows.fetchall()
                outcomes = [EnqueueOutcome.CREATED] * len(specs)
            except psycopg.errors.UniqueViolation:
                with conn.transaction():
                    outcomes, created = self._enqueue_slow(conn, specs, on_conflict)
            self._told(conn, min((r[1] for r in created), default=None))
        return outcomes

    def _enqueue_in(
        self, conn: psycopg.Connection[Any], specs: list[JobSpec], on_conflict: OnConflict
    ) -> list[EnqueueOutcome]:
        """Enqueue inside the caller's transaction, under a savepoint (all or none)."""
        if not specs:
            return []
        status = conn.info.transaction_status
        if status == psycopg.pq.TransactionStatus.INERROR:
            raise InvalidOption(
                "connection= is in a failed transaction: roll it back before scheduling"
            )
        with mapped(self.url, "enqueueing in the caller's transaction"):
            if status == psycopg.pq.TransactionStatus.IDLE and conn.autocommit:
                # No transaction of the caller's to join: ours commits at once.
                with conn.transaction():
                    return self._enqueue_joined(conn, specs, on_conflict)
            conn.execute("SAVEPOINT delayq_enqueue")
            try:
                outcomes = self._enqueue_joined(conn, specs, on_conflict)
            except BaseException:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK TO SAVEPOINT delayq_enqueue")
                    conn.execute("RELEASE SAVEPOINT delayq_enqueue")
                raise
            conn.execute("RELEASE SAVEPOINT delayq_enqueue")
            return outcomes

    def _enqueue_joined(
        self, conn: psycopg.Connection[Any], specs: list[JobSpec], on_conflict: OnConflict
    ) -> list[EnqueueOutcome]:
        outcomes, created = self._enqueue_slow(conn, specs, on_conflict)
        at = min((r[1] for r in created), default=None)
        if at is not None:
            # Delivered when the caller commits, never on rollback. Unconditional:
            # the head may change before that commit; listeners filter by time.
            conn.execute(self._sql.notify, {"channel": self._channel, "at": at})
        return outcomes

    def _insert_params(self, specs: Sequence[JobSpec]) -> dict[str, Any]:
        return self._params(
            ids=[s.id for s in specs],
            names=[s.name for s in specs],
            payloads=[s.payload for s in specs],
            run_ats=[float(s.run_at) if s.delay is None else 0.0 for s in specs],
            delays=[None if s.delay is None else float(s.delay) for s in specs],
            max_attempts=[s.max_attempts for s in specs],
            backoffs=[json.dumps(s.backoff, separators=(",", ":")) for s in specs],
            misfires=[s.misfire for s in specs],
            created=[float(s.created_at or 0.0) for s in specs],
        )

    def _enqueue_slow(
        self, conn: psycopg.Connection[Any], specs: list[JobSpec], on_conflict: OnConflict
    ) -> tuple[list[EnqueueOutcome], list[tuple[Any, ...]]]:
        """Enqueue deciding conflicts row by row (inside a transaction: all or none)."""
        cur = conn.cursor(row_factory=tuple_row)
        q = self._sql.schema
        ids = list(dict.fromkeys(s.id for s in specs))
        existing = {
            row[0]: (JobState(row[1]), row[2])
            for row in cur.execute(
                f'SELECT id, state, updated_at <= {CUTOFF} FROM "{q}".jobs '
                f"WHERE queue = %(q)s AND id = ANY(%(ids)s) FOR UPDATE",
                self._params(ids=ids),
            ).fetchall()
        }
        outcomes: list[EnqueueOutcome] = []
        seen: dict[str, JobState] = {}
        final: dict[str, JobSpec] = {}
        for spec in specs:
            state = seen.get(spec.id)
            if state is None and spec.id in existing:
                found, old = existing[spec.id]
                state = None if old and found in TTL_STATES else found  # expired: gone
            if state is None:
                outcomes.append(EnqueueOutcome.CREATED)
            elif on_conflict == "keep":
                outcomes.append(EnqueueOutcome.KEPT)
                continue
            elif on_conflict == "reject":
                raise JobConflict(
                    f"job {spec.id!r} already exists ({state.value}); pass "
                    f"on_conflict='keep' or 'replace' to accept an existing id"
                )
            elif state is JobState.RUNNING:
                raise JobConflict(
                    f"job {spec.id!r} is running and cannot be replaced; "
                    f"cancel is not possible either: wait for it to finish"
                )
            else:
                outcomes.append(EnqueueOutcome.REPLACED)
            seen[spec.id] = JobState.SCHEDULED
            final[spec.id] = spec
        if not final:
            return outcomes, []
        doomed = [i for i in final if i in existing]
        if doomed:
            cur.execute(
                f'DELETE FROM "{q}".jobs WHERE queue = %(q)s AND id = ANY(%(ids)s)',
                {"q": self.queue, "ids": doomed},
            )
        try:
            created = cur.execute(
                self._sql.insert, self._insert_params(list(final.values()))
            ).fetchall()
        except psycopg.errors.UniqueViolation as exc:
            raise JobConflict(
                f"a job of {sorted(final)[:5]} was created by another producer meanwhile: {exc}"
            ) from exc
        return outcomes, created

    def cancel(self, job_id: str) -> CancelOutcome:
        with self._conn("cancelling") as conn:
            row = (
                conn.cursor(row_factory=tuple_row)
                .execute(self._sql.cancel, self._params(id=job_id))
                .fetchone()
            )
        verdict = self._verdict(row)
        if verdict is not None:
            return CancelOutcome(verdict)
        assert row is not None
        return CancelOutcome.done(row[1])

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        at, after = check_when(run_at, delay)
        with self._conn("rescheduling") as conn:
            row = (
                conn.cursor(row_factory=tuple_row)
                .execute(self._sql.reschedule, self._params(id=job_id, run_at=at, delay=after))
                .fetchone()
            )
            verdict = self._verdict(row)
            if verdict is None:
                assert row is not None
                self._told(conn, row[3])
        if verdict is not None:
            return RescheduleOutcome(verdict)
        assert row is not None
        return RescheduleOutcome.done(row[1])

    @staticmethod
    def _verdict(row: tuple[Any, ...] | None) -> str | None:
        """None when a cancel/reschedule took effect, else why not (an outcome value).

        ``row`` is (state before, attempts, expired finished record, applied,
        buried: a running job whose last lease ran out).
        """
        if row is None or row[2]:
            return "not_found"
        if row[4]:
            return "finished"
        if row[3] is not None and row[3] is not False:  # cancel: True; reschedule: run_at
            return None
        return "running" if row[0] == "running" else "finished"

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        at, after = check_when(run_at, delay)
        with self._conn("requeueing a dead job") as conn:
            row = (
                conn.cursor(row_factory=tuple_row)
                .execute(self._sql.requeue, self._params(id=job_id, run_at=at, delay=after))
                .fetchone()
            )
            if row is not None:
                self._told(conn, row[0])
        return row is not None

    # -- waiting ----------------------------------------------------------------
    def _connect_listener(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self._conninfo, **self._kwargs)

    def _get_listener(self) -> Listener:
        with self._lock:
            if self._closed:
                raise QueueClosed(f"{self!r} is closed")
            if self._listener is None:
                self._listener = Listener(self._connect_listener, self._channel)
            return self._listener

    def wait_for_due(self, max_wait: float) -> None:
        """Sleep until the head of the due set or the next lease end (on the store's
        clock), an earlier job commits anywhere, :meth:`interrupt`, or ``max_wait``.

        An unreachable server is not an error here: the wait is cut short and
        the caller's next claim reports it.
        """
        max_wait = check_max_wait(max_wait)
        listener = self._get_listener()
        listening = listener.start()
        clock = self._clock
        deadline = clock.monotonic() + max_wait
        key = next(self._waiter_ids)
        with listener.cond:
            gen = listener.gen
            listener.waiters[key] = math.inf  # any notification wakes it while it reads
        try:
            try:
                head, lease_end, now = self._read(
                    "reading the next due time", self._sql.wake_times, self._params()
                )[0]
            except BackendUnavailable as exc:
                log.debug("wait_for_due: %s; pausing", exc)
                head = lease_end = None
                now = 0.0
                listening = False
            except QueueClosed:
                return
            times = [t for t in (head, lease_end) if t is not None]
            with listener.cond:
                if listener.closed or listener.gen != gen:
                    return
                left = deadline - clock.monotonic()
                if times:
                    listener.waiters[key] = min(times)
                    left = min(left, min(times) - now)
                if not (listening and listener.listening):
                    left = min(left, FALLBACK_WAIT)
                if left > 0:
                    clock.wait(listener.cond, left)
        finally:
            with listener.cond:
                listener.waiters.pop(key, None)

    def interrupt(self) -> None:
        listener = self._listener
        if listener is not None:
            listener.wake()

    # -- lifecycle ----------------------------------------------------------------
    def close(self) -> None:
        """Close the pool and the listener; wake every waiter. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listener = self._listener
        if listener is not None:
            listener.close()
        self._pool.close()

    def migrate(self) -> tuple[int, int]:
        """Bring the schema to this delayq's version; ``(before, after)``."""
        with self._conn("migrating") as conn:
            return _schema.migrate(conn, self.schema)
