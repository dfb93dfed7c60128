"""The SQLite store: connection, transactions in turns, waking, the contract methods.

See the package docstring (:mod:`delayq.backends.sqlite`) for the design. This
module is the one class a user holds: the contract's twenty-odd methods, each
a short transaction around a row operation of :mod:`._ops`; group commit lives
in :mod:`._group`, turns in :mod:`._turns`, the schema in :mod:`._schema`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import delayq.backends.sqlite._ops as ops
from delayq._validate import check_handler_names
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    PURGE_BATCH,
    CompletesInBatches,
    check_claim_now,
    check_dead_ttl,
    check_lease,
    check_limit,
    check_list_cursor,
    check_max_wait,
    check_payload_at,
    check_payload_contains,
    check_preview,
    check_result_ttl,
    check_run_at,
    check_spec,
    check_when,
)
from delayq.backends._urls import merge_options, split_url
from delayq.backends.base import Completion
from delayq.backends.sqlite._finished import FinishChannel
from delayq.backends.sqlite._flow import SQLiteLimits
from delayq.backends.sqlite._group import EnqueueRequest, GroupCommit
from delayq.backends.sqlite._inspect import SQLiteInspection
from delayq.backends.sqlite._keyed import SQLiteKeyed, with_key_info
from delayq.backends.sqlite._readers import ReadConnections
from delayq.backends.sqlite._schedules import SQLiteSchedules
from delayq.backends.sqlite._schema import (
    CHUNK,
    DEFAULT_BUSY_TIMEOUT,
    EXTEND,
    EXTEND_STARTED,
    FALLBACK_POLL,
    NOT_EXPIRED,
    PURGE_EVERY,
    SELECT,
    TTL_STATE_VALUES,
    WAKE_CHECK_EVERY,
    Synchronous,
    check_busy_timeout,
    check_synchronous,
    open_connection,
    to_job,
)
from delayq.backends.sqlite._search import listed_job, payload_filters, preview_select
from delayq.backends.sqlite._turns import TurnTimeout, WriteTurns, open_turns
from delayq.backends.sqlite._wake import WakeChannel
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    DelayqError,
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

__all__ = ["SQLiteBackend"]

log = logging.getLogger("delayq.sqlite")


def _seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError("not a number of seconds") from None


_URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "synchronous": str,
    "busy_timeout": _seconds,
    "result_ttl": _seconds,
    "dead_ttl": _seconds,
}
"""Query parameters of a sqlite:// URL (there is no driver to pass others to)."""


class SQLiteBackend(
    SQLiteSchedules, SQLiteLimits, SQLiteInspection, SQLiteKeyed, CompletesInBatches
):
    """The :class:`~delayq.backends.base.Backend` on a SQLite file (see the package docstring).

    ``SQLiteBackend("jobs.db")`` or ``open_backend("sqlite:///jobs.db")``;
    ``":memory:"`` keeps the jobs in this object only. A relative path is
    made absolute once, here, so a process that later changes its working
    directory (a daemon's ``chdir("/")``) keeps using the same file.

    Options (keyword-only):

    * ``clock``: decides "now" when a method is not given ``now=``.
    * ``synchronous``: ``"full"`` (default: every commit survives power loss) or
      ``"normal"`` (survives a process crash; faster single writes).
    * ``busy_timeout``: seconds a write waits for its turn (another process
      writing) before raising :class:`~delayq.errors.BackendUnavailable` (default 5:
      under a third of the worker's default 30 s lease, so a stalled write fails
      before leases lapse).
    * ``result_ttl``: seconds finished records are kept (default 7 days).
    * ``dead_ttl``: seconds dead letters are kept (default None: until purged
      or requeued).

    Lock rules: ``_db_lock`` (reentrant) guards ``_conn``, ``_turns``, ``_pid``,
    ``_last_purge``, ``_wake_failures_seen``, ``_wake_distrusted`` and
    ``_closed``; no user code runs under it, and the only waiting under it is
    for the write turn (bounded by ``busy_timeout``).
    ``_cond`` (its own lock) guards ``_wake_gen`` and is notified when the
    schedule moved earlier, on :meth:`interrupt` and on close. ``_group`` (the
    enqueue group commit, :mod:`._group`) has its own lock, never held while
    committing.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {
            "attempt_at_start",
            "clock",
            "keyed",
            "shared",
            "durable",
            "definite_cancel",
            "inspect",
            "payload_search",
            "recurring",
            "flow_control",
            "results",
            "handler_filter",
        }
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = SYSTEM_CLOCK,
        synchronous: Synchronous = "full",
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        result_ttl: float = DEFAULT_RESULT_TTL,
        dead_ttl: float | None = None,
        url: str | None = None,
    ) -> None:
        path = os.fspath(path)
        self._memory = path == ":memory:" or path.startswith("file::memory:")
        # Resolved once: a later chdir (a daemonising fork) must not open another file.
        self.path = path if self._memory or path.startswith("file:") else os.path.abspath(path)
        self.url = url if url is not None else f"sqlite:///{self.path}"
        self._clock = clock
        self._synchronous = check_synchronous(synchronous)
        self._busy_timeout = check_busy_timeout(busy_timeout)
        self._result_ttl = check_result_ttl(result_ttl)
        self._dead_ttl = check_dead_ttl(dead_ttl)
        self._db_lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._wake_gen = 0
        self._group = GroupCommit(self._commit_group)
        self._closed = False
        self._last_purge = float("-inf")
        self._pid = os.getpid()
        self._wake: WakeChannel | None = None
        self._finished: FinishChannel | None = None  # tells other processes of results
        self._wake_failures_seen: int | None = None
        self._wake_distrusted = False
        self._turns: WriteTurns | None = None
        self._conn = self._connect()
        self._readers: ReadConnections | None = None
        if not self._memory:
            self._readers = ReadConnections(self.path, busy_timeout=self._busy_timeout)
            self._turns = open_turns(self.path)
            self._wake = WakeChannel(self.path, self._woken, self._wake_undelivered)
            self._finished = FinishChannel(self.path)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteBackend:
        """Open ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite:///:memory:``.

        Query parameters ``synchronous``, ``busy_timeout``, ``result_ttl`` and
        ``dead_ttl`` set options (``sqlite:///jobs.db?synchronous=normal``); one
        given both ways with different values is an ``InvalidOption``.
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
        _, from_query = split_url(url, _URL_OPTIONS, store="sqlite", strict=True)
        return cls(path, url=url, **merge_options(url, from_query, options))

    def __repr__(self) -> str:
        return f"SQLiteBackend(url={self.url!r}, synchronous={self._synchronous!r})"

    # -- connection and transactions ----------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            return open_connection(
                self.path,
                memory=self._memory,
                busy_timeout=self._busy_timeout,
                synchronous=self._synchronous,
            )
        except sqlite3.Error as exc:
            if "unable to open" in str(exc):
                raise BackendUnavailable(
                    f"cannot open SQLite database {self.path!r}: {exc}"
                ) from exc
            raise self._wrap(exc, "opening") from exc

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
            # Inherited across fork: never touch the parent's connection, locks or sockets.
            self._pid = os.getpid()
            self._conn = self._connect()
            if self._turns is not None:
                self._turns.forget()
                self._turns = open_turns(self.path)
            if self._wake is not None:
                self._wake = WakeChannel(self.path, self._woken, self._wake_undelivered)
            if self._finished is not None:
                self._finished = FinishChannel(self.path)
        return self._conn

    def _write(
        self, doing: str, *, durable: bool = True
    ) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction in this writer's turn: committed on
        success, rolled back on error.

        ``durable=False`` (a worker's claims, acks, retries, lease renewals) does
        not wait for the disk even on ``synchronous="full"``: a power loss may
        forget the last of them, which at-least-once delivery covers (the job
        runs again after its lease). The next durable commit (a ``schedule``,
        a ``cancel``) fsyncs them along with itself: the WAL is one file.
        """
        return self._transaction("BEGIN IMMEDIATE", doing, lazy=not durable)

    @contextlib.contextmanager
    def _read(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for several statements, on
        this thread's read-only connection (:mod:`._readers`): no turn and no
        ``_db_lock``, so a long read never holds off a claim or a commit."""
        readers = self._readers
        if readers is None:  # in memory: the one connection holds the data
            with self._transaction("BEGIN", doing) as conn:
                yield conn
            return
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")
        try:
            with readers.transaction() as conn:
                yield conn
        except sqlite3.Error as exc:
            if self._closed:
                raise QueueClosed(f"{self!r} is closed") from exc
            raise self._wrap(exc, doing) from exc

    @contextlib.contextmanager
    def _transaction(
        self, begin: str, doing: str, *, lazy: bool = False
    ) -> Iterator[sqlite3.Connection]:
        with self._db_lock:
            conn = self._connection()
            turns = self._turns if begin != "BEGIN" else None
            lazy = lazy and self._synchronous == "full"
            if turns is not None:
                try:
                    turns.acquire(self._busy_timeout)
                except TurnTimeout as exc:
                    raise BackendUnavailable(
                        f"SQLite database {self.path!r} unavailable while {doing}: another "
                        f"process kept writing (or stopped while writing) for longer than "
                        f"busy_timeout={self._busy_timeout}s"
                    ) from exc
                except OSError as exc:
                    raise BackendUnavailable(
                        f"SQLite database {self.path!r} unavailable while {doing}: cannot "
                        f"take the write turn on {turns.lock_path!r}: {exc}"
                    ) from exc
            try:
                try:
                    if lazy:
                        conn.execute("PRAGMA synchronous = NORMAL")
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
            finally:
                if lazy:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("PRAGMA synchronous = FULL")
                if turns is not None:
                    turns.release()

    def _cutoff(self, now: float) -> float:
        """Finished records with ``updated_at <= cutoff`` are past ``result_ttl``."""
        return now - self._result_ttl

    def _housekeeping(self, conn: sqlite3.Connection, now: float) -> None:
        """Inside a claim: purge a bounded batch of expired records (about once a
        second, at once again while batches come back full) and end expired leases."""
        if not self._last_purge <= now < self._last_purge + PURGE_EVERY:
            full = ops.purge_finished(conn, self._cutoff(now), now)
            if self._dead_ttl is not None:
                full = ops.purge_dead_batch(conn, now - self._dead_ttl, now) or full
            self._last_purge = float("-inf") if full else now
        ops.expire_leases(conn, now)

    # -- waking -------------------------------------------------------------------
    def _woken(self) -> None:
        with self._cond:
            self._wake_gen += 1
            self._cond.notify_all()

    def _wake_after(self, heads: ops.Heads) -> None:
        """After a commit: wake waiters here and in other processes if a job became
        the earliest of its handler (``ops.Heads``). Never raises: the change is
        committed, and a caller that saw an error would retry it (a duplicate); a
        failed wake-up is logged and counted by the wake channel, and waiters fall
        back to a bounded wait."""
        if heads.wake:
            self._wake_all()

    def _wake_all(self) -> None:
        self._woken()
        wake = self._wake
        if wake is None:
            return
        try:
            wake.notify()
        except Exception:
            log.exception("delayq sqlite %s: waking other processes failed", self.path)

    # -- producers ----------------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """Store ``jobs`` atomically (all or nothing) and report each outcome.

        Group commit: calls that arrive from other threads while a commit is in
        progress wait for it, then go together in the next transaction (one
        ``BEGIN IMMEDIATE``, one fsync); a rejected id fails only its own call
        (outcomes are decided before any row of a call is written). Every call returns after the
        commit that stored it.
        """
        policy = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if not specs:
            return []
        return self._group.run(EnqueueRequest(specs, policy))

    def _commit_group(self, group: list[EnqueueRequest]) -> None:
        """Store every request of ``group`` in one transaction (see :meth:`enqueue`)."""
        heads: ops.Heads | None = None
        try:
            with self._write("enqueueing") as conn:
                now = self._clock.time()
                cutoff = self._cutoff(now)
                heads = ops.Heads(conn)
                heads.read(spec.name for request in group for spec in request.specs)
                for request in group:
                    try:
                        # Decides every outcome before writing a row: a conflict
                        # leaves nothing of its call behind (no savepoint needed).
                        outcomes, first = ops.insert_specs(
                            conn, request.specs, request.on_conflict, now, cutoff
                        )
                    except DelayqError as exc:
                        request.error = exc
                        continue
                    request.outcomes = outcomes
                    for name, run_at in first:
                        heads.scheduled(name, run_at)
        except BaseException as exc:
            for request in group:
                request.outcomes = None
                if request.error is None:
                    request.error, request.shared = exc, True
            if not isinstance(exc, Exception):
                raise
            return
        self._wake_after(heads)

    def cancel(self, job_id: str) -> CancelOutcome:
        with self._write("cancelling") as conn:
            now = self._clock.time()
            seq, verdict, attempts = ops.find_changeable(conn, job_id, now, self._cutoff(now))
            if seq is None:
                return CancelOutcome(verdict)
            conn.execute(
                "UPDATE delayq_jobs SET state = 'cancelled', outcome = 'cancelled', "
                "updated_at = ? WHERE seq = ?",
                (now, seq),
            )
            return CancelOutcome.done(attempts)

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        at, after = check_when(run_at, delay)
        with self._write("rescheduling") as conn:
            now = self._clock.time()
            run_at = now + after if after is not None else at
            assert run_at is not None
            seq, verdict, attempts = ops.find_changeable(conn, job_id, now, self._cutoff(now))
            if seq is None:
                return RescheduleOutcome(verdict)
            heads = ops.Heads(conn)
            (name,) = conn.execute("SELECT name FROM delayq_jobs WHERE seq = ?", (seq,)).fetchone()
            heads.read([name])
            heads.scheduled(name, run_at)
            conn.execute(
                "UPDATE delayq_jobs SET run_at = ?, updated_at = ?, flow_run_at = NULL, "
                "parked = 0 WHERE seq = ?",
                (run_at, now, seq),
            )
        self._wake_after(heads)
        return RescheduleOutcome.done(attempts)

    # -- workers ------------------------------------------------------------------
    def claim(
        self,
        *,
        limit: int,
        lease: float,
        now: float | None = None,
        names: Collection[str] | None = None,
    ) -> list[Claim]:
        limit = check_limit(limit)
        lease = check_lease(lease)
        chosen = check_handler_names(names)
        with self._write("claiming", durable=False) as conn:
            claimed_now = check_claim_now(now, self._clock)
            at = self._clock.time() if claimed_now is None else claimed_now
            self._housekeeping(conn, at)
            return ops.claim_due(conn, at, limit, lease, chosen)

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Finish every claim of ``batch`` in one ``BEGIN IMMEDIATE`` transaction.

        With ``synchronous="full"`` that is one fsync for the whole batch instead
        of one per job: the worker's group commit relies on it.
        """
        results, _claims = self.complete_and_claim(batch, limit=0, lease=1.0)
        return results

    def complete_and_claim(
        self,
        batch: Sequence[Completion],
        *,
        limit: int,
        lease: float,
        names: Collection[str] | None = None,
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        """``complete(batch)`` then ``claim(limit=limit, lease=lease, names=names)``
        in ONE transaction (one turn, one fsync); ``limit=0`` claims nothing."""
        items = Completion.batch(batch)
        if limit != 0:
            limit = check_limit(limit)
        lease = check_lease(lease)
        chosen = check_handler_names(names)
        if not items and not limit:
            return [], []
        with self._write("completing claims" if items else "claiming", durable=False) as conn:
            now = self._clock.time()
            heads = ops.Heads(conn)
            heads.read(item.claim.job.name for item in items if item.state is JobState.SCHEDULED)
            results = ops.complete_items(conn, items, now, heads)
            claims: list[Claim] = []
            if limit:
                self._housekeeping(conn, now)
                claims = ops.claim_due(conn, now, limit, lease, chosen)
        self._wake_after(heads)
        self._tell_results(items, results)
        return results, claims

    def _tell_results(self, items: Sequence[Completion], answers: Sequence[object]) -> None:
        """After the commit: tell result waiters in other processes (``_finished``)."""
        finished = self._finished
        if finished is None:
            return
        ids = [
            item.claim.job.id
            for item, stale in zip(items, answers, strict=True)
            if item.result is not None and stale is None
        ]
        if ids:
            finished.send(ids)

    def listen_for_finishes(self, on_finished: Callable[[list[str]], None]) -> bool:
        """Hear the results other processes record (``TellsFinishes``, ``_finished``)."""
        finished = self._finished
        return finished is not None and finished.listen(on_finished)

    def extend(self, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        with self._write("extending a lease", durable=False) as conn:
            now = self._clock.time()
            ops.finish_claim(conn, claim, EXTEND, (now + lease, now))
        job = replace(claim.job, lease_until=now + lease, updated_at=now)
        return replace(claim, job=job, lease_until=now + lease)

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        lease = check_lease(lease)
        if not claims:
            return []
        answers: list[Claim | StaleClaim] = []
        with self._write("extending leases", durable=False) as conn:
            now = self._clock.time()
            for claim in claims:
                try:
                    assignments = EXTEND_STARTED if claim.token in started else EXTEND
                    ops.finish_claim(conn, claim, assignments, (now + lease, now))
                except StaleClaim as exc:
                    answers.append(exc)
                    continue
                job = replace(claim.job, lease_until=now + lease, updated_at=now)
                answers.append(replace(claim, job=job, lease_until=now + lease))
        return answers

    def wait_for_due(self, max_wait: float, *, names: Collection[str] | None = None) -> None:
        """Sleep until a job (of ``names`` if given) is due, a lease expires, the
        schedule moves earlier (here or in another process), :meth:`interrupt`,
        or ``max_wait`` seconds."""
        max_wait = check_max_wait(max_wait)
        chosen = check_handler_names(names)
        clock = self._clock
        try:
            with self._db_lock:
                self._connection()  # reopens (and re-creates the wake channel) after fork
        except QueueClosed:
            return
        wake = self._wake
        # The generation first, then listen, then read the schedule: a change
        # committed after the read always reaches us as a wake-up, also one that
        # arrives while listen() binds and checks its socket.
        with self._cond:
            gen = self._wake_gen
        listening = wake.listen() if wake is not None else True
        deadline = clock.monotonic() + max_wait
        seen_version: int | None = None  # fallback only: PRAGMA data_version at the start
        while True:
            try:
                with self._read("waiting") as conn:
                    head = ops.head(conn) if chosen is None else ops.head_of(conn, chosen)
                    times = [t for t in (head, ops.next_lease_expiry(conn)) if t is not None]
                    if wake is not None and listening:
                        listening = self._wake_trusted(ops.wake_failures(conn))
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
                # Listening, a look at the table every WAKE_CHECK_EVERY still bounds
                # what a lost wake-up could cost; without wake-ups, every 50 ms.
                left = min(left, WAKE_CHECK_EVERY if listening else FALLBACK_POLL)
                clock.wait(self._cond, left)
                if self._closed or self._wake_gen != gen:
                    return

    def _wake_trusted(self, failures: int) -> bool:
        """False once any process recorded an undelivered wake-up (``failures``
        grew since this backend first looked): its waits are bounded from then on.
        Call with ``_db_lock`` held."""
        if self._wake_distrusted:
            return False
        if self._wake_failures_seen is None or failures <= self._wake_failures_seen:
            self._wake_failures_seen = failures
            return True
        self._wake_distrusted = True
        log.warning(
            "delayq sqlite %s: a process could not deliver a wake-up to a waiting process "
            "(sockets of another user?); waiting here re-checks the database every %s s",
            self.path,
            FALLBACK_POLL,
        )
        return False

    def _wake_undelivered(self) -> None:
        """Tell every waiter (through the database) that a wake-up was lost."""
        with self._write("recording an undelivered wake-up", durable=False) as conn:
            conn.execute("UPDATE delayq_meta SET value = value + 1 WHERE key = 'wake_failures'")

    @property
    def wake_failures(self) -> int:
        """Wake-ups this process could not deliver to other processes' sockets."""
        wake = self._wake
        return 0 if wake is None else wake.failures

    def interrupt(self) -> None:
        self._woken()

    # -- inspection and dead letters -------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with self._read("reading a job") as conn:
            row = conn.execute(
                f"{SELECT} WHERE id = ? AND {NOT_EXPIRED}",
                (job_id, self._cutoff(self._clock.time())),
            ).fetchone()
            return None if row is None else with_key_info(conn, to_job(row))

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
        payload_contains: str | None = None,
        payload_at: tuple[str, object] | None = None,
    ) -> list[Job]:
        """Jobs in ``run_at`` order (FIFO ties), due in ``due_after <= run_at < due_before``.

        Walks ``(state, run_at, seq)`` or ``(run_at, seq)`` from the cursor; a
        ``name`` filter walks ``(name, state, run_at, seq)``: one range per state
        (at most ``limit`` rows each) merged here, so a rare name costs no more
        than a common one. A payload search filters those rows in SQL, and a
        preview selects only the payload's first characters (:mod:`._search`).
        """
        limit = check_limit(limit)
        cursor = check_list_cursor(after)
        preview = check_preview(preview)
        searched, search_params = payload_filters(
            check_payload_contains(payload_contains), check_payload_at(payload_at)
        )
        where = [NOT_EXPIRED, *searched]
        params: list[Any] = [self._cutoff(self._clock.time()), *search_params]
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if cursor is not None:
            # The cursor job's seq breaks run_at ties; gone, it is 0 (the page
            # starts at run_at: it may repeat a job, never skip one).
            where.append(
                "(run_at, seq) > (?, COALESCE((SELECT seq FROM delayq_jobs WHERE id = ?), 0))"
            )
            params.extend(cursor)
        if due_after is not None:
            where.append("run_at >= ?")
            params.append(check_run_at(due_after, "due_after"))
        if due_before is not None:
            where.append("run_at < ?")
            params.append(check_run_at(due_before, "due_before"))
        if state is not None:
            states: list[str | None] = [JobState(state).value]
        else:
            states = [s.value for s in JobState] if name is not None else [None]
        index = "INDEXED BY delayq_jobs_name " if name is not None else ""
        select, cut = (SELECT, []) if preview is None else (preview_select(), [preview])
        rows: list[Any] = []
        with self._read("listing jobs") as conn:
            for one in states:
                clause = where if one is None else [*where, "state = ?"]
                rows += conn.execute(
                    f"{select} {index}WHERE {' AND '.join(clause)} ORDER BY run_at, seq LIMIT ?",
                    (*cut, *params, *([] if one is None else [one]), limit),
                ).fetchall()
        if len(states) > 1:
            rows.sort(key=lambda r: (r[4], r[0]))  # run_at, seq (COLUMNS)
        return [listed_job(r, preview) for r in rows[:limit]]

    def next_due(self) -> float | None:
        with self._read("reading the next due time") as conn:
            return ops.head(conn)

    def stats(self) -> Stats:
        """Counts per state from ``delayq_counts`` (kept by triggers: no table
        scan at any size), less the finished records past their TTL that are
        not purged yet (an index range, normally empty); ``due`` is an index
        range of the due jobs."""
        now = self._clock.time()
        with self._read("counting jobs") as conn:
            counts = dict(conn.execute("SELECT state, n FROM delayq_counts").fetchall())
            cutoff = self._cutoff(now)
            for state in TTL_STATE_VALUES:
                counts[state] = counts.get(state, 0) - ops.count_finished_before(
                    conn, state, cutoff
                )
            due = conn.execute(
                "SELECT COUNT(*) FROM delayq_jobs WHERE state = 'scheduled' AND run_at <= ?",
                (now,),
            ).fetchone()[0]
            head = ops.head(conn)
        return Stats.from_counts(counts, due=due, next_due=head)

    def dead_letters(self, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        limit = check_limit(limit)
        preview = check_preview(preview)
        select, cut = (SELECT, []) if preview is None else (preview_select(), [preview])
        with self._read("listing dead letters") as conn:
            rows = conn.execute(
                f"{select} WHERE state = 'dead' ORDER BY updated_at DESC, seq DESC LIMIT ?",
                (*cut, limit),
            ).fetchall()
        return [listed_job(r, preview) for r in rows]

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        at, after = check_when(run_at, delay)
        with self._write("requeueing a dead job") as conn:
            now = self._clock.time()
            run_at = now + after if after is not None else at
            assert run_at is not None
            heads = ops.Heads(conn)
            row = conn.execute(
                "SELECT name FROM delayq_jobs WHERE id = ? AND state = 'dead'", (job_id,)
            ).fetchone()
            if row is not None:
                heads.read([row[0]])
                heads.scheduled(row[0], run_at)
            cur = conn.execute(
                "UPDATE delayq_jobs SET state = 'scheduled', attempts = 0, unstarted = 0, "
                "run_at = ?, outcome = NULL, lease_until = NULL, updated_at = ? "
                "WHERE id = ? AND state = 'dead'",
                (run_at, now, job_id),
            )
            requeued = cur.rowcount == 1
        if requeued:
            self._wake_after(heads)
        return requeued

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``.

        In transactions of at most ``PURGE_BATCH`` rows, each in its own write
        turn, so purging a large dead-letter set never holds off producers and
        workers for long.
        """
        where = "state = 'dead'"
        params: list[Any] = []
        if older_than is not None:
            where += " AND updated_at < ?"
            params.append(check_run_at(older_than, "older_than"))
        total = 0
        if job_ids is None:
            while True:
                with self._write("purging dead letters") as conn:
                    now = self._clock.time()
                    deleted = ops.delete_batch(conn, where, params, PURGE_BATCH, now=now)
                total += deleted
                if deleted < PURGE_BATCH:
                    return total
        wanted = list(dict.fromkeys(job_ids))
        for i in range(0, len(wanted), CHUNK):
            chunk = wanted[i : i + CHUNK]
            marks = ", ".join("?" * len(chunk))
            with self._write("purging dead letters") as conn:
                gone = [
                    row[0]
                    for row in conn.execute(
                        f"DELETE FROM delayq_jobs WHERE {where} AND id IN ({marks}) RETURNING id",
                        (*params, *chunk),
                    )
                ]
                ops.release_keys(conn, gone, self._clock.time())
                total += len(gone)
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
                if self._turns is not None:
                    self._turns.close()
            if self._readers is not None:
                self._readers.close()
            wake = self._wake if ours else None
            finished = self._finished if ours else None
        if wake is not None:
            wake.close()
        if finished is not None:
            finished.close()
        self._woken()
