"""Native asyncio for the PostgreSQL store's producer calls (used by ``AsyncDelayQ``).

:class:`AsyncProducer` runs ``enqueue``, ``cancel`` and ``get`` on the event loop
with psycopg's ``AsyncConnection`` from its own ``AsyncConnectionPool`` (opened
on first use, on the loop that uses it; closed by :meth:`AsyncProducer.close`):
no thread, no executor. The statements, parameters, settings and outcomes are
the store's own (``_sql``, ``_enqueue``, ``_store``), so a call answers exactly
as its sync twin. What is rare or slow stays there: an enqueue that meets an
existing id (the row-by-row conflict path) runs the sync store's ``enqueue`` in
a thread, which decides it from scratch (the fast insert stored nothing).

Nothing raises after a commit here either: the wake-up after an enqueue is
logged when it fails, never reported as a failed call.

Lock rule: ``_lock`` guards ``_pool`` and ``_loop``; no query runs under it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg.rows import tuple_row

from delayq.backends._common import check_spec
from delayq.backends.postgres._connection import mapped
from delayq.backends.postgres._inspect import to_job
from delayq.backends.postgres._sql import Statements
from delayq.backends.postgres._wake import Listener
from delayq.errors import BackendUnavailable, QueueClosed
from delayq.job import CancelOutcome, EnqueueOutcome, Job, JobSpec, OnConflict, check_on_conflict

__all__ = ["AsyncProducer"]

log = logging.getLogger("delayq.postgres")


class _Store(Protocol):
    """What this module uses of :class:`~delayq.backends.postgres.PostgresBackend`."""

    url: str
    queue: str
    _sql: Statements
    _channel: str
    _closed: bool
    _conninfo: str
    _kwargs: dict[str, Any]
    _pool_size: int
    _timeout: float
    _listener: Listener | None

    def _params(self, now: float | None = None, **more: Any) -> dict[str, Any]: ...

    def _session_settings(self) -> tuple[str, list[str]] | None: ...

    def _insert_params(self, specs: Sequence[JobSpec]) -> dict[str, Any]: ...

    def _flow_marked(self, specs: Sequence[JobSpec]) -> bool: ...

    def _verdict(self, row: tuple[Any, ...] | None) -> str | None: ...

    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]: ...


class AsyncProducer:
    """The producer calls of one :class:`PostgresBackend` on asyncio (see the module doc)."""

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def serves(self) -> bool:
        """Whether calls from the running loop can be served here (one loop per
        producer: its pool belongs to the loop that opened it)."""
        with self._lock:
            return not self._closed and self._loop in (None, asyncio.get_running_loop())

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        settings = self._store._session_settings()
        if settings:
            await conn.execute(*settings)

    async def _open(self) -> psycopg_pool.AsyncConnectionPool[Any]:
        store = self._store
        with self._lock:
            if self._closed or store._closed:
                raise QueueClosed(f"{store!r} is closed")
            pool = self._pool
            if pool is None:
                pool = self._pool = psycopg_pool.AsyncConnectionPool(
                    store._conninfo,
                    kwargs=store._kwargs,
                    min_size=1,
                    max_size=store._pool_size,
                    open=False,
                    configure=self._configure,
                    timeout=store._timeout,
                    name=f"delayq-async-{store.queue}",
                )
                self._loop = asyncio.get_running_loop()
                opening = True
            else:
                opening = False
        if opening:
            # Concurrent first calls see the pool open at once: an uncontended
            # open() marks it open before it first yields (tested).
            await pool.open(wait=False)
        return pool

    @asynccontextmanager
    async def _conn(self, doing: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        store = self._store
        pool = await self._open()
        try:
            with mapped(store.url, doing):
                async with pool.connection() as conn:
                    yield conn
        except BackendUnavailable as exc:
            if not isinstance(exc.__cause__, psycopg_pool.PoolTimeout):
                await pool.check()  # a connection failed: drop the pool's broken ones
            raise
        except psycopg_pool.PoolClosed as exc:
            raise QueueClosed(f"{store!r} is closed") from exc

    async def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """The store's ``enqueue`` (without ``connection=``), on the loop."""
        store = self._store
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if not specs:
            return []
        if not store._flow_marked(specs):  # the queue's flow flags first: the sync path
            return await asyncio.to_thread(store.enqueue, specs, on_conflict=on_conflict)
        params = store._insert_params(specs)
        async with self._conn("enqueueing") as conn:
            cur = conn.cursor(row_factory=tuple_row)
            try:
                await cur.execute(store._sql.insert, params)
            except psycopg.errors.UniqueViolation:
                pass  # nothing was stored: conflicts are decided row by row (below)
            else:
                created = await cur.fetchall()
                await self._told(conn, min((r[1] for r in created), default=None))
                return [EnqueueOutcome.CREATED] * len(specs)
        return await asyncio.to_thread(store.enqueue, specs, on_conflict=on_conflict)

    async def _told(self, conn: psycopg.AsyncConnection[Any], at: float | None) -> None:
        """The store's ``_told`` after a commit: best effort, never raised."""
        store = self._store
        if at is None:
            return
        listener = store._listener
        if listener is not None:
            listener.heard(at)
        try:
            await conn.execute(
                store._sql.head_check, {"q": store.queue, "at": at, "channel": store._channel}
            )
        except psycopg.Error as exc:
            log.warning("delayq: waking workers after a commit failed: %s", exc)

    async def cancel(self, job_id: str) -> CancelOutcome:
        """The store's ``cancel``, on the loop."""
        store = self._store
        async with self._conn("cancelling") as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(store._sql.cancel, store._params(id=job_id))
            row = await cur.fetchone()
        verdict = store._verdict(row)
        if verdict is not None:
            return CancelOutcome(verdict)
        assert row is not None
        return CancelOutcome.done(row[1])

    async def get(self, job_id: str) -> Job | None:
        """The store's ``get``, on the loop."""
        store = self._store
        async with self._conn("reading a job") as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(store._sql.get, store._params(id=job_id))
            rows = await cur.fetchall()
        return to_job(rows[0]) if rows else None

    async def close(self) -> None:
        """Close the pool (if one was opened). Idempotent."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
