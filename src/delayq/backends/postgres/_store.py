"""The PostgreSQL store's contract methods: producers, workers, waiting.

Inspection (get, list_jobs, stats, dead letters) is in :mod:`._inspect`; the
SQL in :mod:`._sql`; schema and migrations in :mod:`._schema`; waiting in
:mod:`._wake`. See the package docstring for the design.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row

import delayq.backends.postgres._schema as schemas
from delayq._validate import check_int, check_seconds
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    PURGE_BATCH,
    CompletesInBatches,
    check_dead_ttl,
    check_max_wait,
    check_queue_name,
    check_result_ttl,
    check_when,
)
from delayq.backends._urls import UrlOptions, keyword_defaults
from delayq.backends.postgres._aio import AsyncProducer
from delayq.backends.postgres._claims import PostgresClaims
from delayq.backends.postgres._connection import (
    check_idle,
    connect_error,
    mapped,
    mask,
    split_url,
)
from delayq.backends.postgres._enqueue import PostgresEnqueue
from delayq.backends.postgres._flow import PostgresFlowClaims, PostgresLimits, flags
from delayq.backends.postgres._flow_sql import FlowStatements
from delayq.backends.postgres._inspect import PostgresInspection
from delayq.backends.postgres._keyed import PostgresKeyed
from delayq.backends.postgres._schedules import PostgresSchedules
from delayq.backends.postgres._sql import Statements
from delayq.backends.postgres._wake import FALLBACK_WAIT, Listener, channel_name
from delayq.backends.postgres._workers import PostgresWorkers
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import (
    BackendUnavailable,
    InvalidOption,
    QueueClosed,
)
from delayq.job import (
    CancelOutcome,
    RescheduleOutcome,
)

__all__ = ["DEFAULT_QUEUE", "PostgresBackend"]

DEFAULT_QUEUE = "default"

_HINT_MAX_AGE = 0.5  # seconds a claim's read of the schedule may stand in for a wait's
_PURGE_EVERY = 1.0  # seconds (of the store's clock) between purges of finished records
_PURGE_MOST = 64_000  # rows one purge deletes at most (a backlog doubles it up to this)
_UNSURE_MOST = 10_000  # completions of unknown outcome remembered (see _note_unsure)
# The listener's TCP keepalives (unless the URL sets them): a half-open connection
# is noticed in about 25 s instead of the kernel's default two hours.
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 25_000,
}
_IDENTITY = "SELECT current_database(), (SELECT system_identifier FROM pg_control_system())"

log = logging.getLogger("delayq.postgres")


class PostgresBackend(
    PostgresEnqueue,
    PostgresClaims,
    PostgresFlowClaims,
    PostgresSchedules,
    PostgresLimits,
    CompletesInBatches,
    PostgresInspection,
    PostgresWorkers,
    PostgresKeyed,
):
    """The :class:`~delayq.backends.base.Backend` on PostgreSQL (see the package docstring).

    ``PostgresBackend("postgresql://user@host/db?queue=orders")`` or
    ``open_backend(url)``. Options (keyword-only, or URL query parameters):

    * ``queue``: the queue's name (default ``"default"``); queues of one schema
      share its table.
    * ``schema``: the PostgreSQL schema delayq owns (default ``"delayq"``).
    * ``migrate``: create / migrate the schema when opening (default True);
      with False, a schema at another version is refused (run ``delayq migrate``).
    * ``result_ttl``: seconds finished records are kept (default 7 days).
    * ``dead_ttl``: seconds dead letters are kept (default None: until purged or
      requeued, as the contract says; set it to bound the dead-letter table).
    * ``pool_size``: most connections this handle opens (default 8), plus one
      for LISTEN once it waits for jobs.
    * ``clock``: for tests only. When given, its time replaces the server's
      clock wherever a call is not given ``now=``.
    * ``connect_timeout``: seconds to wait for a connection (default 10).
    * ``pgbouncer``: True behind PgBouncer in transaction pooling (default
      False): no session settings and no server-side prepared statements, and
      no LISTEN (it needs a session): waits poll (``poll_interval``). Set
      ``lock_timeout`` on the database role instead (``ALTER ROLE ... SET``).
    * ``listen``: False waits by polling the schedule every ``poll_interval``
      seconds (default 0.5) instead of LISTEN/NOTIFY (default True, False
      with ``pgbouncer``); a wait still ends at the next due time.
    * ``lock_timeout``: seconds a statement of the store waits for a row lock
      before it fails with :class:`~delayq.errors.BackendError` (default 5): a
      caller's long transaction never stalls claims, renewals or acks for long.
    * ``synchronous_commit``: ``"on"`` (default: a call returns after its commit
      is on disk, so a job survives a server crash or power loss) or ``"off"``
      (the server's setting of that name for delayq's sessions: several times
      more single-call writes per second; a server crash may lose the last
      fraction of a second of commits, a client crash still loses nothing).

    Lock rule: ``_lock`` guards ``_listener``, ``_closed``, ``_last_purge``,
    ``_purge_size`` and ``_unsure``. ``_flow_seen`` (only grows) and
    ``_plain_full`` are hints written without it: a stale read costs at most one
    claim that comes back empty.
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
            "payload_search",
            "transactional_enqueue",
            "recurring",
            "flow_control",
            "keyed",
            "results",
        }
    )

    def __init__(
        self,
        url: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        *,
        queue: str = DEFAULT_QUEUE,
        schema: str = schemas.DEFAULT_SCHEMA,
        migrate: bool = True,
        result_ttl: float = DEFAULT_RESULT_TTL,
        dead_ttl: float | None = None,
        pool_size: int = 8,
        clock: Clock | None = None,
        connect_timeout: float = 10.0,
        application_name: str = "delayq",
        synchronous_commit: str = "on",
        lock_timeout: float = 5.0,
        pgbouncer: bool = False,
        listen: bool | None = None,
        poll_interval: float = FALLBACK_WAIT,
    ) -> None:
        conninfo, options = split_url(url)
        given = UrlOptions(url, options, _KEYWORD_DEFAULTS)
        queue = check_queue_name(given.pick("queue", queue))
        schema = schemas.check_schema_name(given.pick("schema", schema))
        migrate = given.pick("migrate", migrate)
        pool_size = given.pick("pool_size", pool_size)
        synchronous_commit = given.pick("synchronous_commit", synchronous_commit)
        if synchronous_commit not in ("on", "off"):
            raise InvalidOption(
                f"synchronous_commit must be 'on' or 'off', got {synchronous_commit!r}"
            )
        check_int(pool_size, "pool_size", minimum=1)
        self._pool_size = pool_size
        dead_ttl = given.pick("dead_ttl", dead_ttl)
        self.url = mask(url)
        self.queue = queue
        self.schema = schema
        self._result_ttl = check_result_ttl(given.pick("result_ttl", result_ttl))
        self._dead_ttl = check_dead_ttl(dead_ttl)
        self._clock = SYSTEM_CLOCK if clock is None else clock
        self._fake = self._clock is not SYSTEM_CLOCK
        self._sql = Statements.build(schema)
        self._flow_sql = FlowStatements.build(schema)
        self._flow_seen: set[str] = set()  # this queue's flow flags known committed (_flow)
        self._flags = flags(queue)
        self._plain_full = False  # this handle's last plain claim came back full (_claims)
        self._channel = channel_name(schema, queue)
        self._timeout = check_seconds(connect_timeout, "connect_timeout")
        lock_timeout = check_seconds(given.pick("lock_timeout", lock_timeout), "lock_timeout")
        pgbouncer = given.pick("pgbouncer", pgbouncer)
        listen = given.pick("listen", listen)
        if not isinstance(pgbouncer, bool):
            raise InvalidOption(f"pgbouncer must be True or False, got {pgbouncer!r}")
        if listen is not None and not isinstance(listen, bool):
            raise InvalidOption(f"listen must be True, False or None, got {listen!r}")
        self._listen = (not pgbouncer) if listen is None else listen
        self._poll = check_seconds(given.pick("poll_interval", poll_interval), "poll_interval")
        if self._poll <= 0:
            raise InvalidOption(f"poll_interval must be > 0 seconds, got {self._poll!r}")
        self._pgbouncer = pgbouncer
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": application_name,
            "connect_timeout": max(1, math.ceil(self._timeout)),
        }
        if pgbouncer:
            self._kwargs["prepare_threshold"] = None  # no server-side prepared statements
        # Set on each new session (not in the start-up packet, which keeps the
        # URL's and PGOPTIONS' own options). Custom plans always: a generic plan of
        # the batch UPDATE (arrays of unknown length) walks every row of the queue.
        self._settings = {
            "synchronous_commit": synchronous_commit,
            "plan_cache_mode": "force_custom_plan",
            "lock_timeout": f"{max(1, round(lock_timeout * 1000))}ms",
        }
        self._conninfo = conninfo
        in_url = conninfo_to_dict(conninfo)
        self._listen_kwargs = {
            **{k: v for k, v in _KEEPALIVES.items() if k not in in_url},
            **self._kwargs,
        }
        self._callers: weakref.WeakKeyDictionary[psycopg.Connection[Any], bool] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._listener: Listener | None = None
        self._closed = False
        self._last_purge = float("-inf")
        self._purge_size = PURGE_BATCH
        self._unsure: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._waiter_ids = itertools.count()
        self._hint = threading.local()  # per thread: what its last claim read (see _set_hint)
        try:
            # One connection first, so a refusal is reported as the server gave it.
            first = psycopg.connect(conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise connect_error(self.url, exc) from exc
        with first, mapped(self.url, "preparing the schema"):
            self._configure(first, schema_ready=False)
            row = first.execute(_IDENTITY).fetchone()
            assert row is not None
            self._identity = (row[0], row[1])
            if migrate:
                schemas.migrate(first, schema)
            else:
                schemas.check_version(first, schema)
            self._after_restart(first)
        self._pool = psycopg_pool.ConnectionPool(
            conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=pool_size,
            open=False,
            configure=self._configure,
            check=check_idle,
            timeout=self._timeout,
            name=f"delayq-{queue}",
        )
        self._pool.open(wait=False)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """Open ``postgresql://user[:password]@host:port/db[?queue=...&schema=...]``."""
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"PostgresBackend(url={self.url!r}, queue={self.queue!r}, schema={self.schema!r})"

    # -- connections ------------------------------------------------------------
    def _configure(self, conn: psycopg.Connection[Any], *, schema_ready: bool = True) -> None:
        """The store's settings on a new session (see ``__init__``); then, once the
        schema exists, the token sequence moved past a server restart."""
        settings = self._session_settings()
        if settings:
            conn.execute(*settings)
        if schema_ready:
            self._after_restart(conn)

    def _session_settings(self) -> tuple[str, list[str]] | None:
        """The statement that sets the store's settings on a session, with its
        parameters; None behind PgBouncer (settings do not survive transaction pooling)."""
        if self._pgbouncer:
            return None
        return (
            "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in self._settings),
            [x for pair in self._settings.items() for x in pair],
        )

    def async_producer(self) -> AsyncProducer:
        """A native asyncio client for this store's producer calls (its own pool,
        opened on first use; close it with ``await producer.close()``)."""
        return AsyncProducer(self)

    def _after_restart(self, conn: psycopg.Connection[Any]) -> None:
        """Fencing tokens stay unique across a server crash: claims commit without
        waiting for the disk, so a crash may take the token sequence back below
        tokens that live workers hold. The first session after each server start
        moves it past the server's clock in microseconds (a sequence is never
        drawn faster than that), once: the row lock on ``meta`` serializes them."""
        conn.execute(self._sql.past_restart)

    def _same_database(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse a caller's connection to another database or server (checked once
        per connection): a job written there would wait where no worker looks."""
        if self._callers.get(conn):
            return
        with mapped(self.url, "checking the caller's connection"):
            row = conn.execute(_IDENTITY).fetchone()
        if row is None or (row[0], row[1]) != self._identity:
            info = conn.info
            raise InvalidOption(
                f"connection= is to database {info.dbname!r} on {info.host}:{info.port}, "
                f"not the store's ({self.url}): its jobs would never run"
            )
        self._callers[conn] = True

    @contextmanager
    def _conn(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; psycopg errors become delayq errors. After a
        connection failure the pool drops its broken connections (a restart)."""
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")
        try:
            with mapped(self.url, doing), self._pool.connection() as conn:
                yield conn
        except BackendUnavailable as exc:
            if not self._closed and not isinstance(exc.__cause__, psycopg_pool.PoolTimeout):
                self._pool.check()  # a connection failed: drop the pool's broken ones
            raise
        except psycopg_pool.PoolClosed as exc:
            raise QueueClosed(f"{self!r} is closed") from exc

    def _read(self, doing: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run a read-only statement, retried once on a fresh connection."""
        for attempt in (1, 2):
            try:
                with self._conn(doing) as conn:
                    return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()
            except BackendUnavailable as exc:
                if attempt == 2 or isinstance(exc.__cause__, psycopg_pool.PoolTimeout):
                    raise  # a full pool is not retried: that would wait twice
        raise AssertionError("unreachable")  # pragma: no cover

    def _write(self, doing: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run one statement that changes rows (never retried: its outcome would be unknown)."""
        with self._conn(doing) as conn:
            return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]:
        """The parameters every statement shares: queue, ``now`` (None: the server's)."""
        if now is None and self._fake:
            now = self._clock.time()
        return {"q": self.queue, "now": now, "ttl": self._result_ttl, **self._flags, **more}

    def _purge_batch(self) -> int | None:
        """The size of the purge that is due now, or None (see ``PostgresClaims._purge``)."""
        mono = self._clock.monotonic()
        with self._lock:
            if mono - self._last_purge < _PURGE_EVERY:
                return None
            self._last_purge = mono
            return self._purge_size

    def _purged(self, batch: int, deleted: int) -> None:
        """After a purge of ``batch`` rows that deleted ``deleted``: a full one is
        followed at once by one twice as large (a backlog), else back to normal."""
        with self._lock:
            if deleted >= batch:
                self._purge_size = min(2 * batch, _PURGE_MOST)
                self._last_purge = float("-inf")
            else:
                self._purge_size = PURGE_BATCH

    def _note_unsure(self, keys: set[tuple[str, int]]) -> None:
        """Completions whose outcome is unknown (their call failed after its retry):
        when the caller sends them again, one the row shows as done by its claim
        was applied by that call (answered applied, not stale). The newest
        :data:`_UNSURE_MOST` are kept."""
        with self._lock:
            for key in keys:
                self._unsure[key] = None
                self._unsure.move_to_end(key)
            while len(self._unsure) > _UNSURE_MOST:
                self._unsure.popitem(last=False)

    def _unsure_among(self, keys: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """The ``keys`` noted unsure (forgotten now: they are being answered)."""
        with self._lock:
            if not self._unsure:
                return set()
            found = {key for key in keys if key in self._unsure}
            for key in found:
                del self._unsure[key]
            return found

    def _mark(self) -> tuple[int, int] | None:
        """The listener's log position before a claim reads the schedule (no listener: None)."""
        listener = self._listener
        return None if listener is None else listener.mark()

    def _set_hint(self, mark: tuple[int, int] | None, cur: psycopg.Cursor[Any] | None) -> bool:
        """Keep, for this thread's next wait, what a claim read after claiming;
        whether that read says the queue uses flow control."""
        row = None if cur is None else cur.fetchone()
        self._hint.value = (
            None
            if mark is None or row is None
            else (
                mark,
                row[:3],
                self._clock.monotonic(),
            )
        )
        return row is not None and bool(row[3])

    def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None:
        """After a commit that scheduled a job due at ``at``: wake waiters if it is
        the earliest now (here at once, elsewhere through NOTIFY)."""
        if at is None:
            return
        listener = self._listener
        if listener is not None:
            listener.heard(at)
        try:
            conn.execute(
                self._sql.head_check, {"q": self.queue, "at": at, "channel": self._channel}
            )
        except psycopg.Error as exc:
            # The change is committed: it must not be reported as failed (a retry
            # would do it twice). Other processes' waiters find it by their next read.
            log.warning("delayq: waking workers after a commit failed: %s", exc)

    # -- producers --------------------------------------------------------------
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
        return psycopg.connect(self._conninfo, **self._listen_kwargs)

    def _get_listener(self) -> Listener:
        with self._lock:
            if self._closed:
                raise QueueClosed(f"{self!r} is closed")
            if self._listener is None:
                self._listener = Listener(
                    self._connect_listener, self._channel, enabled=self._listen
                )
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
        hint = getattr(self._hint, "value", None)
        self._hint.value = None
        with listener.cond:
            gen = listener.gen
            listener.waiters[key] = math.inf  # any notification wakes it while it reads
        try:
            if hint is not None and clock.monotonic() - hint[2] < _HINT_MAX_AGE:
                # The claim just read the schedule: no second round trip, but what
                # was heard since that read counts as if this waiter had listened.
                mark, (head, lease_end, now), taken = hint
                now += clock.monotonic() - taken
                until = min((t for t in (head, lease_end) if t is not None), default=math.inf)
                with listener.cond:
                    if listener.heard_since(mark, until):
                        return
            else:
                try:
                    head, lease_end, now, flow = self._read(
                        "reading the next due time", self._sql.wake_times, self._params()
                    )[0]
                    if flow:  # the next claim takes the flow path
                        self._flow_seen.add(self._flags["flow_flag"])
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
                    left = min(left, FALLBACK_WAIT if self._listen else self._poll)
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
            return schemas.migrate(conn, self.schema)


_KEYWORD_DEFAULTS = keyword_defaults(PostgresBackend.__init__)
"""A keyword at its default counts as not given next to a URL option (backends._urls)."""
