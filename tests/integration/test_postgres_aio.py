"""AsyncDelayQ on PostgreSQL: schedule, enqueue, cancel and get on the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from delayq import AsyncDelayQ, CancelOutcome, DelayQ, JobState
from delayq.backends.postgres import PostgresBackend
from delayq.errors import JobConflict
from delayq.job import EnqueueOutcome
from tests.postgres_support import POSTGRES_URL, admin, app_name, pg_schema

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def app() -> Iterator[DelayQ]:
    with (
        pg_schema() as schema,
        DelayQ(POSTGRES_URL, schema=schema, application_name=app_name(schema)) as app,
    ):
        yield app


def _no_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a thread was used for {args[0]!r}")

    monkeypatch.setattr(asyncio, "to_thread", refuse)


def test_schedule_get_and_cancel_run_on_the_loop_with_the_sync_outcomes(
    app: DelayQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def story() -> None:
        async with AsyncDelayQ(app=app) as aq:
            job_id = await aq.schedule("order.cancel", {"order": 42}, delay=1800)
            job = await aq.get(job_id)
            assert (
                job is not None and job.state is JobState.SCHEDULED and job.name == "order.cancel"
            )
            spec = aq.build("order.cancel", {"order": 7}, job_id="fixed", delay=60)
            assert await aq.enqueue([spec]) == [EnqueueOutcome.CREATED]
            many = await aq.schedule_many([{"name": "t", "delay": 60}, {"name": "t"}])
            assert [j.state for j in [app.get(i) for i in many] if j] == [JobState.SCHEDULED] * 2
            assert await aq.cancel(job_id) is CancelOutcome.CANCELLED
            assert await aq.cancel("no-such-job") is CancelOutcome.NOT_FOUND
            assert await aq.get("no-such-job") is None

    _no_threads(monkeypatch)
    asyncio.run(story())
    job = app.get("fixed")
    assert job is not None and job.state is JobState.SCHEDULED  # the sync API sees it


def test_an_existing_id_is_decided_as_the_sync_store_decides(app: DelayQ) -> None:
    async def story() -> None:
        async with AsyncDelayQ(app=app) as aq:
            await aq.schedule("t", job_id="same", delay=60)
            with pytest.raises(JobConflict):
                await aq.schedule("t", job_id="same", delay=60)
            assert await aq.schedule("t", job_id="same", on_conflict="keep") == "same"
            spec = aq.build("t", job_id="same", delay=120)
            assert await aq.enqueue([spec], on_conflict="replace") == [EnqueueOutcome.REPLACED]

    asyncio.run(story())


def test_schedule_returns_its_id_when_the_wake_up_after_its_commit_fails(app: DelayQ) -> None:
    backend = app.backend
    assert isinstance(backend, PostgresBackend)
    backend._sql = dataclasses.replace(backend._sql, head_check="SELECT 1 / 0")

    async def story() -> str:
        async with AsyncDelayQ(app=app) as aq:
            return await aq.schedule("t", delay=60)

    job_id = asyncio.run(story())
    job = app.get(job_id)
    assert job is not None and job.state is JobState.SCHEDULED


def test_a_cancelled_schedule_names_the_id_it_may_have_stored(app: DelayQ) -> None:
    """The id is chosen before the call, so a cancelled await can be checked."""
    backend = app.backend
    assert isinstance(backend, PostgresBackend)
    blocker = admin()
    # An uncommitted row with the same id: the store's insert waits for it.
    blocker.execute("BEGIN")
    spec = app.build("t", job_id="held", delay=60)
    blocker.execute(
        f'INSERT INTO "{backend.schema}".jobs (queue, id, name, payload, run_at, state, '
        f"max_attempts, backoff, misfire, created_at, updated_at) "
        f"VALUES ('default', 'held', 't', 'null', 0, 'scheduled', 1, '{{}}', 'run', 0, 0)"
    )

    async def story() -> asyncio.CancelledError:
        async with AsyncDelayQ(app=app) as aq:
            task = asyncio.create_task(aq.schedule("t", job_id=spec.id, delay=60))
            deadline = asyncio.get_running_loop().time() + 30
            while not _waiting_on_a_lock(backend.schema):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.02)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as exc:
                return exc
            raise AssertionError("not cancelled")

    try:
        exc = asyncio.run(story())
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert any("'held'" in note for note in getattr(exc, "__notes__", []))


def _waiting_on_a_lock(schema: str) -> bool:
    with admin() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (app_name(schema),),
        ).fetchone()
    return bool(row and row[0])


def test_concurrent_first_calls_share_one_pool(app: DelayQ) -> None:
    async def story() -> list[str]:
        async with AsyncDelayQ(app=app) as aq:
            return await asyncio.gather(*(aq.schedule("t", delay=60) for _ in range(20)))

    ids = asyncio.run(story())
    assert len(set(ids)) == 20 and all(app.get(i) is not None for i in ids)
