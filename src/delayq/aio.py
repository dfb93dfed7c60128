"""The asyncio producer API: :class:`AsyncDelayQ`, ``await``-able twin of DelayQ.

For asyncio web apps (FastAPI, aiohttp, Starlette) that schedule and manage
jobs without blocking their event loop::

    aq = AsyncDelayQ("sqlite:///jobs.db")        # or AsyncDelayQ(app=existing_delayq)
    job_id = await aq.schedule("order.cancel", {"order": 42}, delay=1800)
    outcome = await aq.cancel(job_id)           # CancelOutcome.CANCELLED

Every method has the name, arguments, validation, errors and outcomes of the
:class:`~delayq.app.DelayQ` method of the same name. On PostgreSQL,
``schedule``, ``schedule_many``, ``enqueue``, ``cancel`` and ``get`` run
natively on the loop (psycopg's ``AsyncConnection``, a pool of this object's
own: the store's ``async_producer()``) unless a producer hook is installed (hooks are sync, so
the call then runs as DelayQ's). Every other call, and every call on the other
stores (the SQLite module is synchronous; the Redis store's Lua scripts and
wake-ups are written against redis-py's sync client, the RabbitMQ store
against pika), runs the DelayQ method in a worker thread
(``asyncio.to_thread``, which carries the caller's context variables, e.g. a
trace context, along). ``schedule(connection=)`` (joining a caller's sync
database transaction) has no async twin.

Cancellation: ``schedule`` chooses the job's id before anything is sent. A
cancelled ``await aq.schedule(...)`` may still have stored the job (a thread
cannot be stopped; a statement may commit as its reply is lost): the
``CancelledError`` carries a note naming that id. To decide in code, pass
``job_id=`` (or ``build()`` then ``enqueue()``) and look the id up with
:meth:`AsyncDelayQ.get` after a cancellation; a retry with the same id and
``on_conflict="keep"`` never stores it twice.

Handlers keep being registered on the :class:`DelayQ` (``aq.app``); async
handlers run on the worker's event loop, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

from delayq._validate import check_job_id
from delayq.app import BackoffArg, DelayQ, MisfireArg, WhenArg
from delayq.errors import ConfigurationError
from delayq.job import (
    CancelOutcome,
    EnqueueOutcome,
    Job,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    Stats,
    check_on_conflict,
)
from delayq.recurring import Schedule, ScheduleStatus

__all__ = ["AsyncDelayQ"]


class AsyncDelayQ:
    """``await``-able producer API over a :class:`DelayQ` (see the module docstring).

    Give either the arguments of ``DelayQ(...)`` (this object then owns the app
    and closes it) or an existing ``app=`` (left open on :meth:`close`).
    """

    def __init__(self, url: str | None = None, *, app: DelayQ | None = None, **options: Any):
        if app is not None:
            if url is not None or options:
                raise ConfigurationError("give either DelayQ's arguments or app=, not both")
            self.app = app
            self._owns_app = False
        else:
            self.app = DelayQ(url, **options)
            self._owns_app = True
        # The store's native asyncio client (PostgreSQL), if it has one.
        maker = getattr(self.app.backend, "async_producer", None)
        self._native: Any = maker() if callable(maker) else None

    def _direct(self) -> Any:
        """The native client when this call may use it: no producer hook needs the
        sync path, and the running loop is the client's; else None (a thread)."""
        native = self._native
        if native is None or self.app._hooks or not native.serves():
            return None
        return native

    # -- producers ----------------------------------------------------------
    async def schedule(
        self,
        name: str,
        payload: Any = None,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
        job_id: str | None = None,
        on_conflict: OnConflict = "reject",
        max_attempts: int | None = None,
        backoff: BackoffArg = None,
        misfire: MisfireArg = None,
        key: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> str:
        """:meth:`DelayQ.schedule`: store one job; its id (chosen before anything is
        sent: see the module doc on cancellation)."""
        policy = check_on_conflict(on_conflict)
        spec = self.app.build(  # no I/O: validation and the id, on the loop
            name,
            payload,
            delay=delay,
            at=at,
            job_id=job_id,
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
            key=key,
            priority=priority,
            group=group,
        )
        try:
            native = self._direct()
            if native is not None:
                await native.enqueue([spec], on_conflict=policy)
                return spec.id
            return await asyncio.to_thread(
                self.app.schedule,
                name,
                payload,
                delay=delay,
                at=at,
                job_id=spec.id,
                on_conflict=policy,
                max_attempts=max_attempts,
                backoff=backoff,
                misfire=misfire,
                key=key,
                priority=priority,
                group=group,
            )
        except asyncio.CancelledError as exc:
            exc.add_note(
                f"delayq: job {spec.id!r} may have been stored before the cancellation: "
                f"look it up with get({spec.id!r}) before scheduling it again"
            )
            raise

    async def schedule_many(
        self, jobs: Iterable[Mapping[str, Any]], *, on_conflict: OnConflict = "reject"
    ) -> list[str]:
        """:meth:`DelayQ.schedule_many`: a batch, atomically; the ids in order."""
        items = list(jobs)  # a generator is read here, not in another thread
        native = self._direct()
        if native is not None:
            policy = check_on_conflict(on_conflict)
            specs = self.app._build_batch(items, self.app.clock.time())  # no I/O
            if specs:
                await native.enqueue(specs, on_conflict=policy)
            return [spec.id for spec in specs]
        return await asyncio.to_thread(self.app.schedule_many, items, on_conflict=on_conflict)

    def build(self, name: str, payload: Any = None, **options: Any) -> JobSpec:
        """:meth:`DelayQ.build` (no I/O, so not a coroutine)."""
        return self.app.build(name, payload, **options)

    async def enqueue(
        self, specs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """:meth:`DelayQ.enqueue`: store built specs; each outcome."""
        native = self._direct()
        if native is not None:
            return list(await native.enqueue(list(specs), on_conflict=on_conflict))
        return await asyncio.to_thread(self.app.enqueue, list(specs), on_conflict=on_conflict)

    async def cancel(self, job_id: str) -> CancelOutcome:
        """:meth:`DelayQ.cancel`: cancelled, running, finished or not found."""
        native = self._direct()
        if native is not None:
            return await native.cancel(check_job_id(job_id))  # type: ignore[no-any-return]
        return await asyncio.to_thread(self.app.cancel, job_id)

    async def reschedule(
        self,
        job_id: str,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
    ) -> RescheduleOutcome:
        """:meth:`DelayQ.reschedule`: move a scheduled job (one of ``delay`` / ``at``)."""
        return await asyncio.to_thread(self.app.reschedule, job_id, delay=delay, at=at)

    # -- inspection and dead letters ----------------------------------------
    async def get(self, job_id: str) -> Job | None:
        native = self._direct()
        if native is not None:
            return await native.get(check_job_id(job_id))  # type: ignore[no-any-return]
        return await asyncio.to_thread(self.app.get, job_id)

    async def result(self, job_id: str, *, timeout: float | None = 30.0) -> Any:
        """The return value of job ``job_id`` once it finished (:meth:`DelayQ.result`),
        waited for without blocking the loop."""
        return await self.app.aresult(job_id, timeout=timeout)

    async def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        due_after: WhenArg | None = None,
        due_before: WhenArg | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
        payload_contains: str | None = None,
        payload_at: tuple[str, object] | None = None,
    ) -> list[Job]:
        return await asyncio.to_thread(
            self.app.list_jobs,
            state=state,
            due_after=due_after,
            due_before=due_before,
            limit=limit,
            name=name,
            after=after,
            preview=preview,
            payload_contains=payload_contains,
            payload_at=payload_at,
        )

    async def stats(self) -> Stats:
        return await asyncio.to_thread(self.app.stats)

    async def dead_letters(self, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        return await asyncio.to_thread(self.app.dead_letters, limit=limit, preview=preview)

    async def requeue(
        self,
        job_id: str,
        *,
        delay: float | timedelta | None = None,
        at: WhenArg | None = None,
    ) -> bool:
        return await asyncio.to_thread(self.app.requeue, job_id, delay=delay, at=at)

    async def purge_dead(
        self,
        *,
        job_ids: Sequence[str] | None = None,
        older_than: float | timedelta | None = None,
    ) -> int:
        return await asyncio.to_thread(self.app.purge_dead, job_ids=job_ids, older_than=older_than)

    # -- recurring schedules -------------------------------------------------
    async def recurring(self, name: str, **definition: Any) -> Schedule:
        """:meth:`DelayQ.recurring`: store (or change) a recurring schedule."""
        return await asyncio.to_thread(self.app.recurring, name, **definition)

    async def sync_recurring(
        self, definitions: Iterable[Mapping[str, Any]], *, dry_run: bool = False
    ) -> dict[str, list[str]]:
        """:meth:`DelayQ.sync_recurring`."""
        return await asyncio.to_thread(self.app.sync_recurring, definitions, dry_run=dry_run)

    async def run_recurring_now(self, name: str) -> str:
        """:meth:`DelayQ.run_recurring_now`."""
        return await asyncio.to_thread(self.app.run_recurring_now, name)

    async def recurring_status(
        self, name: str, *, runs: int = 5, history: int = 10
    ) -> ScheduleStatus | None:
        """:meth:`DelayQ.recurring_status`."""
        return await asyncio.to_thread(self.app.recurring_status, name, runs=runs, history=history)

    async def recurring_schedules(self) -> list[Schedule]:
        return await asyncio.to_thread(self.app.recurring_schedules)

    async def get_recurring(self, name: str) -> Schedule | None:
        return await asyncio.to_thread(self.app.get_recurring, name)

    async def update_recurring(self, name: str, **changes: Any) -> Schedule:
        return await asyncio.to_thread(self.app.update_recurring, name, **changes)

    async def pause_recurring(self, name: str) -> bool:
        return await asyncio.to_thread(self.app.pause_recurring, name)

    async def resume_recurring(self, name: str) -> bool:
        return await asyncio.to_thread(self.app.resume_recurring, name)

    async def remove_recurring(self, name: str) -> bool:
        return await asyncio.to_thread(self.app.remove_recurring, name)

    # -- lifecycle ----------------------------------------------------------
    async def close(self) -> None:
        """Close the native client, and the app if this object opened it. Idempotent."""
        if self._native is not None:
            await self._native.close()
        if self._owns_app:
            await asyncio.to_thread(self.app.close)

    async def __aenter__(self) -> AsyncDelayQ:
        return self

    async def __aexit__(self, *exc: object) -> Literal[False]:
        await self.close()
        return False

    def __repr__(self) -> str:
        return f"AsyncDelayQ({self.app.url!r})"
