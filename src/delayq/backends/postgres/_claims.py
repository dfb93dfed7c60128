"""The worker side of the PostgreSQL store: claim, complete, complete-and-claim, extend.

Each call is one implicit transaction sent as one pipeline (one network round
trip): expired leases returned, then the ``SKIP LOCKED`` claim; or the batch of
completions, then the claim. These transactions commit with
``synchronous_commit`` off: they do not wait for the disk. A server crash may
forget the last fraction of a second of them, which at-least-once delivery
already covers (a forgotten claim or ack means the job runs again, fenced by
its token); the calls whose answers users rely on (enqueue, cancel,
reschedule, requeue) wait for the disk as the store's ``synchronous_commit``
option says.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg.rows import tuple_row

from delayq.backends._common import (
    check_claim_now,
    check_lease,
    check_limit,
    stale_claim,
    undecodable_error,
)
from delayq.backends.base import Completion
from delayq.backends.postgres._batch import CompletionBatch
from delayq.backends.postgres._flow_sql import FlowStatements
from delayq.backends.postgres._inspect import to_job
from delayq.backends.postgres._sql import Statements
from delayq.clock import Clock
from delayq.errors import BackendUnavailable, StaleClaim, Unsupported
from delayq.job import Claim, JobState

__all__ = ["PostgresClaims"]

_MAX_RECOVER = 1000  # expired leases returned per claim call at most
NO_DISK_WAIT = "SELECT set_config('synchronous_commit', 'off', true)"

log = logging.getLogger("delayq.postgres")

Row = tuple[Any, ...]
Cursor = psycopg.Cursor[Row]


class _Store(Protocol):
    queue: str
    _sql: Statements
    _flow_sql: FlowStatements
    _flow_seen: set[str]
    _plain_full: bool
    _clock: Clock
    _dead_ttl: float | None
    _result_ttl: float

    def _conn(self, doing: str) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...

    def _told(self, conn: psycopg.Connection[Any], at: float | None) -> None: ...

    def _purge_batch(self) -> int | None: ...

    def _note_unsure(self, keys: set[tuple[str, int]]) -> None: ...

    def _unsure_among(self, keys: set[tuple[str, int]]) -> set[tuple[str, int]]: ...

    def _purged(self, batch: int, deleted: int) -> None: ...

    def _mark(self) -> tuple[int, int] | None: ...

    def _set_hint(self, mark: tuple[int, int] | None, cur: Cursor | None) -> bool: ...

    # flow control (_flow.PostgresFlowClaims)
    def _flow_in_use(self, flagged: Cursor | None, heard: bool) -> bool: ...

    def _flow_claim(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> list[Claim]: ...

    def _flow_complete_and_claim(
        self,
        conn: psycopg.Connection[Any],
        sent: CompletionBatch,
        params: dict[str, Any],
        repeated: bool,
    ) -> tuple[list[StaleClaim | None], list[Claim]]: ...

    def _complete_sql(self, sent: CompletionBatch) -> str: ...

    def _sweep_keys(self, cur: psycopg.Cursor[Any], params: dict[str, Any]) -> None: ...


@contextmanager
def _pipeline(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Pipeline]:
    """One implicit transaction, one round trip, committed without waiting for the disk."""
    with conn.pipeline() as pipe:
        conn.execute(NO_DISK_WAIT)
        yield pipe


def _check_retry(exc: BackendUnavailable, what: str) -> None:
    """Re-raise ``exc`` unless the call is worth its one retry: a full pool sent
    nothing (and is not waited for twice); a failed connection may have lost only
    the reply."""
    if isinstance(exc.__cause__, psycopg_pool.PoolTimeout):
        raise exc
    log.info("delayq: %s failed (%s); trying again with its request id", what, exc)


class PostgresClaims:
    """``claim``, ``complete``, ``complete_and_claim`` and ``extend`` (see the module doc)."""

    def claim(self: _Store, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        """Lease due jobs. Retried once after a connection failure: the call carries a
        request id, so when the first reply was lost after the commit the retry
        returns the jobs that call claimed (their attempt is not spent for nothing)."""
        limit = check_limit(limit)
        lease = check_lease(lease)
        at = check_claim_now(now, self._clock)
        params = PostgresClaims._claim_params(self, limit, lease, at)
        try:
            return PostgresClaims._claim_once(self, params)
        except BackendUnavailable as exc:
            _check_retry(exc, "claim")
        return PostgresClaims._claimed_by(self, params) or PostgresClaims._claim_once(self, params)

    def _claimed_by(self: _Store, params: dict[str, Any]) -> list[Claim]:
        """The jobs a call with these parameters (its request id) leased and still
        holds, their leases renewed from now (the caller counts them from now)."""
        with self._conn("claiming again after a failed reply") as conn:
            cur = conn.cursor(row_factory=tuple_row)
            rows = cur.execute(self._sql.claimed_by, params).fetchall()
            return PostgresClaims._claims(self, conn, rows)

    def _claim_once(self: _Store, params: dict[str, Any]) -> list[Claim]:
        with self._conn("claiming") as conn:
            PostgresClaims._purge(self, conn, params)
            if params["flow_flag"] in self._flow_seen:
                return self._flow_claim(conn, params)
            mark = self._mark()
            committed = heard = False
            times: Cursor | None = None
            try:
                with _pipeline(conn) as pipe:
                    cur, flagged = PostgresClaims._send_claim(self, conn, params, mark)
                    if mark is not None:
                        pipe.sync()  # the claim commits: the read below sees its effect
                        committed = True
                        times = PostgresClaims._send_times(self, conn, params, mark)
            except psycopg.Error as exc:
                if not committed:
                    raise
                PostgresClaims._lost_hint(self, exc)  # the claims stand: never raise after a commit
            else:
                heard = self._set_hint(mark, times)
            claims = PostgresClaims._claims(self, conn, cur.fetchall())
            self._plain_full = len(claims) >= params["limit"]
            if not claims and self._flow_in_use(flagged, heard):
                return self._flow_claim(conn, params)  # it has just begun
            return claims

    def complete(self: _Store, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Finish every claim of ``batch`` with one statement (one transaction);
        retried once after a connection failure (a completion this call's first
        attempt applied is then answered as applied)."""
        items = Completion.batch(batch)
        if not items:
            return []
        sent = CompletionBatch(items)
        try:
            return PostgresClaims._complete_once(self, sent, repeated=False)
        except BackendUnavailable as exc:
            _check_retry(exc, "completion")
        try:
            return PostgresClaims._complete_once(self, sent, repeated=True)
        except BackendUnavailable:
            self._note_unsure(sent.keys())  # the caller's retry may find them applied
            raise

    def _complete_once(
        self: _Store, sent: CompletionBatch, *, repeated: bool
    ) -> list[StaleClaim | None]:
        with self._conn("completing claims") as conn:
            return PostgresClaims._complete_on(self, conn, sent, repeated)

    def _complete_on(
        self: _Store, conn: psycopg.Connection[Any], sent: CompletionBatch, repeated: bool
    ) -> list[StaleClaim | None]:
        with _pipeline(conn):
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute(self._complete_sql(sent), self._params(**sent.params()))
        results, at = PostgresClaims._answers(self, sent, cur.fetchall(), repeated)
        self._told(conn, at)
        return results

    def _answers(
        self: _Store, sent: CompletionBatch, rows: list[Row], repeated: bool
    ) -> tuple[list[StaleClaim | None], float | None]:
        """Each completion's answer, and the earliest due time the batch made (its
        retries and releases, and the parked jobs a freed slot gave back)."""
        keys = sent.keys() if repeated else self._unsure_among(sent.keys())
        results, at = sent.results(rows, repeated=keys, deletes_finished=self._result_ttl == 0)
        back = rows[0][7] if rows and len(rows[0]) > 7 else None  # the same in every row
        if back is not None:
            at = back if at is None else min(at, back)
        return results, at

    def complete_and_claim(
        self: _Store,
        batch: Sequence[Completion],
        *,
        limit: int,
        lease: float,
        names: Collection[str] | None = None,
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        """``complete(batch)`` then ``claim(limit=limit, lease=lease)``: one transaction,
        one round trip. If the claim part fails, the batch is completed on its own.
        No handler filter (``names``) here: the store does not declare it."""
        if names is not None:
            raise Unsupported("PostgreSQL claims do not filter by handler (handler_filter)")
        items = Completion.batch(batch)
        if limit != 0:
            limit = check_limit(limit)
        lease = check_lease(lease)
        sent = CompletionBatch(items)
        params = PostgresClaims._claim_params(self, limit, lease, None)
        try:
            return PostgresClaims._complete_and_claim_once(self, sent, params, repeated=False)
        except BackendUnavailable as exc:
            _check_retry(exc, "completion and claim")
        try:
            # The first attempt is one transaction: if it leased jobs, it committed.
            claims = PostgresClaims._claimed_by(self, params) if limit else []
            if claims:
                done = PostgresClaims._complete_once(self, sent, repeated=True) if items else []
                return done, claims
            return PostgresClaims._complete_and_claim_once(self, sent, params, repeated=True)
        except BackendUnavailable:
            self._note_unsure(sent.keys())  # the caller's retry may find them applied
            raise

    def _complete_and_claim_once(
        self: _Store, sent: CompletionBatch, params: dict[str, Any], *, repeated: bool
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        items, limit = sent.items, params["limit"]
        with self._conn("completing and claiming") as conn:
            PostgresClaims._purge(self, conn, params)
            if limit and params["flow_flag"] in self._flow_seen:
                return self._flow_complete_and_claim(conn, sent, params, repeated)
            mark = self._mark() if limit else None
            committed = heard = False
            times: Cursor | None = None
            try:
                with _pipeline(conn) as pipe:
                    done = conn.cursor(row_factory=tuple_row)
                    if items:
                        done.execute(self._complete_sql(sent), self._params(**sent.params()))
                    claimed, flagged = (
                        PostgresClaims._send_claim(self, conn, params, mark)
                        if limit
                        else (None, None)
                    )
                    if mark is not None:
                        pipe.sync()  # commit first: the read below sees its effect
                        committed = True
                        times = PostgresClaims._send_times(self, conn, params, mark)
            except psycopg.OperationalError as exc:
                if not committed:
                    raise  # nothing was applied: the caller's error handling decides
                PostgresClaims._lost_hint(self, exc)
            except psycopg.Error as exc:
                if committed:
                    PostgresClaims._lost_hint(self, exc)
                elif not limit:
                    raise
                else:
                    log.warning("delayq: claim after complete failed (%s); completing alone", exc)
                    # On this connection (its failed transaction is over): a second
                    # one from the pool could wait for this one to be returned.
                    return PostgresClaims._complete_on(self, conn, sent, repeated), []
            else:
                heard = self._set_hint(mark, times)
            results, at = (
                PostgresClaims._answers(self, sent, done.fetchall(), repeated)
                if items
                else ([], None)
            )
            claims = PostgresClaims._claims(self, conn, claimed.fetchall()) if claimed else []
            if claimed is not None:
                self._plain_full = len(claims) >= limit
            if claimed is not None and not claims and self._flow_in_use(flagged, heard):
                claims = self._flow_claim(conn, params)  # it has just begun
            self._told(conn, at)
        return results, claims

    def extend(self: _Store, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        with self._conn("extending a lease") as conn:
            with _pipeline(conn):
                cur = conn.cursor(row_factory=tuple_row)
                cur.execute(
                    self._sql.extend,
                    self._params(id=claim.job.id, token=claim.token, lease=lease),
                )
            row = cur.fetchone()
            if row is None:
                rows = conn.cursor(row_factory=tuple_row).execute(
                    self._sql.stale, {"q": self.queue, "ids": [claim.job.id]}
                )
                found = rows.fetchone()
                raise stale_claim(
                    claim,
                    None if found is None else JobState(found[1]),
                    None if found is None else found[2],
                )
        job = replace(claim.job, lease_until=row[0], updated_at=row[1])
        return replace(claim, job=job, lease_until=row[0])

    # -- parts ------------------------------------------------------------------
    def _claim_params(self: _Store, limit: int, lease: float, now: float | None) -> dict[str, Any]:
        return self._params(
            now,
            limit=limit,
            lease=lease,
            max_recover=_MAX_RECOVER,
            req=uuid.uuid4(),
            ns=f"delayq.flow.{self._sql.schema}.{self.queue}:",
        )

    def _send_claim(
        self: _Store, conn: psycopg.Connection[Any], params: dict[str, Any], mark: object
    ) -> tuple[Cursor, Cursor | None]:
        """Queue the lease recovery and the plain claim (inside a pipeline), and the
        read of the queue's flow flags; the claim's cursor and the flags' (or None).

        The flags matter only when the claim comes back short (the flag stops it
        claiming anything), so they are not read while this handle's plain claims
        come back full (a drain), nor when the schedule's read after the claim
        (``mark``: this handle listens) carries the flag."""
        conn.execute(self._sql.recover, params)
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute(self._sql.claim, params)
        if mark is not None or self._plain_full:
            return cur, None
        flagged = conn.cursor(row_factory=tuple_row)
        flagged.execute(self._sql.flow_flags, params)
        return cur, flagged

    def _lost_hint(self: _Store, exc: BaseException) -> None:
        """The read after a committed claim failed: the next wait reads the schedule itself."""
        log.debug("delayq: reading the schedule after a claim failed: %s", exc)
        self._set_hint(None, None)

    def _send_times(
        self: _Store, conn: psycopg.Connection[Any], params: dict[str, Any], mark: object
    ) -> Cursor | None:
        """Queue the read of what a waiter sleeps toward, after the claim (a hint that
        saves ``wait_for_due`` a round trip); only when this handle listens."""
        if mark is None:
            return None
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute(self._sql.wake_times, params)
        return cur

    def _claims(
        self: _Store, conn: psycopg.Connection[Any], rows: list[Row], *, ordered: bool = False
    ) -> list[Claim]:
        if not ordered:
            rows.sort(key=lambda r: (r[3], r[15]))  # (run_at, seq): RETURNING has no order
        claims: list[Claim] = []
        for row in rows:
            try:
                job = to_job(row, strict=True)
            except (ValueError, TypeError) as exc:
                # Buried with the reason instead of breaking every later claim.
                log.error("delayq: burying job %r: %s", row[0], exc)
                try:
                    conn.execute(
                        self._sql.complete,
                        self._params(
                            ids=[row[0]],
                            tokens=[row[14]],
                            kinds=["dead"],
                            run_ats=[None],
                            texts=[undecodable_error(exc)],
                        ),
                    )
                except psycopg.Error as bury_exc:  # the claim committed: never raise now
                    log.error("delayq: burying job %r failed: %s", row[0], bury_exc)
                continue
            assert job.lease_until is not None
            claims.append(Claim(job, row[14], job.lease_until, job.updated_at))
        return claims

    def _purge(self: _Store, conn: psycopg.Connection[Any], params: dict[str, Any]) -> None:
        """Delete a batch of expired finished records (and dead letters past ``dead_ttl``)
        and fold the count deltas, at most once a second; a full batch makes the next
        one twice as large and due at once, so the purge keeps up with any rate."""
        batch = self._purge_batch()
        if batch is None:
            return
        with _pipeline(conn):
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute(self._sql.purge, {**params, "batch": batch})
            dead = None
            if self._dead_ttl is not None:
                dead = conn.cursor(row_factory=tuple_row)
                dead.execute(
                    self._sql.purge_dead_letters,
                    {**params, "batch": batch, "dead_ttl": self._dead_ttl},
                )
            conn.execute(self._sql.fold_counts, params)
        self._purged(batch, max(cur.rowcount, 0 if dead is None else dead.rowcount))
        self._sweep_keys(conn.cursor(row_factory=tuple_row), params)
