"""AsyncDelayQ: the same validation, errors and outcomes as DelayQ, awaited."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from delayq import AsyncDelayQ, CancelOutcome, DelayQ, JobState, RescheduleOutcome
from delayq.errors import (
    ConfigurationError,
    DelayqError,
    InvalidJobId,
    InvalidOption,
    InvalidPayload,
    JobConflict,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DelayQ]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'aio.db'}"
    with DelayQ(url) as app:
        yield app


def test_schedule_get_cancel_and_reschedule_give_the_sync_outcomes(app: DelayQ) -> None:
    aq = AsyncDelayQ(app=app)

    async def story() -> None:
        job_id = await aq.schedule("mail", {"to": "ada"}, delay=60)
        job = await aq.get(job_id)
        assert job is not None and job.payload == {"to": "ada"} and job.name == "mail"
        assert await aq.reschedule(job_id, delay=120) is RescheduleOutcome.RESCHEDULED
        assert await aq.cancel(job_id) is CancelOutcome.CANCELLED
        assert await aq.cancel(job_id) is CancelOutcome.FINISHED
        assert await aq.cancel("nope") is CancelOutcome.NOT_FOUND
        assert await aq.reschedule("nope", delay=1) is RescheduleOutcome.NOT_FOUND
        assert await aq.requeue(job_id) is False

    run(story())


def test_schedule_with_neither_delay_nor_at_is_due_now(app: DelayQ) -> None:
    aq = AsyncDelayQ(app=app)
    job_id = run(aq.schedule("mail"))
    stats = app.stats()
    assert stats.due == 1
    job = app.get(job_id)
    assert job is not None and job.state is JobState.SCHEDULED


BAD_CALLS: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("payload", {"payload": {1, 2}}, InvalidPayload),
    ("both-times", {"delay": 1, "at": 2}, InvalidOption),
    ("job-id", {"job_id": ""}, InvalidJobId),
    ("attempts", {"max_attempts": 0}, InvalidOption),
    ("conflict", {"on_conflict": "merge"}, InvalidOption),
]


@pytest.mark.parametrize(("case", "kwargs", "error"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_the_same_error_with_the_same_message(
    app: DelayQ, case: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error) as sync_error:
        app.schedule("mail", **{"payload": None, **kwargs})
    with pytest.raises(error) as async_error:
        run(AsyncDelayQ(app=app).schedule("mail", **{"payload": None, **kwargs}))
    assert str(async_error.value) == str(sync_error.value)
    assert app.list_jobs() == []


def test_a_conflicting_id_is_rejected_kept_or_replaced_as_in_sync(app: DelayQ) -> None:
    aq = AsyncDelayQ(app=app)

    async def story() -> list[Any]:
        await aq.schedule("mail", 1, job_id="j", delay=60)
        with pytest.raises(JobConflict):
            await aq.schedule("mail", 2, job_id="j", delay=60)
        await aq.schedule("mail", 3, job_id="j", delay=60, on_conflict="keep")
        kept = await aq.get("j")
        await aq.schedule("mail", 4, job_id="j", delay=60, on_conflict="replace")
        replaced = await aq.get("j")
        return [kept.payload if kept else None, replaced.payload if replaced else None]

    assert run(story()) == [1, 4]


def test_batches_dead_letters_and_inspection(app: DelayQ) -> None:
    aq = AsyncDelayQ(app=app)

    async def story() -> None:
        ids = await aq.schedule_many({"name": "mail", "payload": i} for i in range(3))
        assert [j.id for j in await aq.list_jobs(name="mail")] == ids
        (claim, *_) = app.backend.claim(limit=1, lease=30)
        app.backend.bury(claim, "boom")
        assert [j.id for j in await aq.dead_letters()] == [claim.job.id]
        assert (await aq.stats()).dead == 1
        assert await aq.requeue(claim.job.id) is True
        assert await aq.purge_dead() == 0

    run(story())


def test_calls_run_off_the_loop_with_the_callers_context(app: DelayQ) -> None:
    seen: list[object] = []
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    class Hook:
        def before_enqueue(self, specs: list[Any]) -> list[Any]:
            seen.append(var.get())
            return specs

        def after_enqueue(self, specs: Any, outcomes: Any) -> None: ...

        def after_cancel(self, job_id: str, outcome: Any) -> None: ...

    app.add_hook(Hook())

    async def story() -> None:
        var.set("request-17")
        await AsyncDelayQ(app=app).schedule("mail")

    run(story())
    assert seen == ["request-17"]


def test_an_owned_app_is_closed_and_a_given_one_is_not(tmp_path: Path) -> None:
    async def story() -> None:
        async with AsyncDelayQ(f"sqlite:///{tmp_path / 'own.db'}") as aq:
            await aq.schedule("mail")
        with pytest.raises(DelayqError, match="closed"):
            await aq.schedule("mail")

    run(story())
    with DelayQ("memory://") as app:
        run(AsyncDelayQ(app=app).close())
        app.schedule("mail")  # still open
    with pytest.raises(ConfigurationError):
        AsyncDelayQ("memory://", app=DelayQ("memory://"))


def test_a_cancelled_schedule_names_the_id_it_may_have_stored(
    app: DelayQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The id is chosen before the store is called: a cancelled await can be checked."""
    entered, release = threading.Event(), threading.Event()
    real = app.backend.enqueue

    def slow_enqueue(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(app.backend, "enqueue", slow_enqueue)

    async def story() -> tuple[asyncio.CancelledError, bool]:
        aq = AsyncDelayQ(app=app)
        task = asyncio.create_task(aq.schedule("mail", job_id="chosen"))
        assert await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            release.set()
            return exc, True
        return asyncio.CancelledError(), False

    exc, cancelled = run(story())
    assert cancelled
    assert any("'chosen'" in note for note in getattr(exc, "__notes__", []))
