"""Test mode: due jobs run inline with a worker's rules (delayq.testing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from delayq import DelayQ, JobState
from delayq.errors import ConfigurationError
from delayq.testing import FakeClock, InlineApp, advance, inline, run_due


def test_an_async_handler_runs_inline_also_from_async_code() -> None:
    app = InlineApp()

    @app.task(name="double", store_result=True)
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    first = double.schedule(2)
    assert [r.outcome for r in app.run_due()] == ["succeeded"]

    async def from_a_loop() -> int:
        second = double.schedule(5)
        assert [r.outcome for r in app.run_due()] == ["succeeded"]
        return await second

    assert asyncio.run(from_a_loop()) == 10
    assert first.result() == 4
    app.close()


def test_misfire_unknown_handlers_and_unstorable_results_follow_the_worker_s_rules() -> None:
    app = InlineApp()
    app.register("late", lambda payload: None)
    app.register("set", lambda payload: {1}, store_result=True)
    skipped = app.schedule("late", delay=10, misfire=5)
    app.clock.advance(60)  # one jump: it is 50 s late when it runs
    unknown = app.schedule("nobody")
    bad = app.schedule("set", max_attempts=3)
    outcomes = {r.job_id: r.outcome for r in app.run_due()}
    assert outcomes == {skipped: "skipped", unknown: "retried", bad: "dead"}
    job = app.get(unknown)
    assert job is not None and "no handler is registered" in (job.last_error or "").lower()
    app.close()


def test_advance_stops_at_each_due_time_and_ends_at_its_target() -> None:
    app = InlineApp()
    seen: list[float] = []
    app.register("tick", lambda payload: seen.append(app.clock.time()))
    t0 = app.clock.time()
    for delay in (30, 10, 20):
        app.schedule("tick", delay=delay)
    assert len(app.advance(25)) == 2
    assert [t - t0 for t in seen] == [10, 20]
    assert app.clock.time() == t0 + 25
    assert len(app.advance(5)) == 1


def test_run_due_stops_at_its_limit() -> None:
    app = InlineApp()
    app.register("x", lambda payload: None)
    for _ in range(3):
        app.schedule("x")
    assert len(app.run_due(limit=2)) == 2
    assert len(app.run_due()) == 1


def test_inline_moves_an_app_to_a_test_store_and_back() -> None:
    app = DelayQ("memory://")
    own_store, own_clock = app.backend, app.clock
    results: list[Any] = []

    @app.task(name="t", store_result=True)
    def t(n: int) -> int:
        return n + 1

    with inline(app) as clock:
        assert isinstance(clock, FakeClock) and app.clock is clock
        handle = t.options(delay=5).schedule(1)
        results += advance(app, 5)
        assert handle.result() == 2
        assert run_due(app) == []
    assert (app.backend, app.clock) == (own_store, own_clock)
    assert app.get(handle) is None
    assert [r.outcome for r in results] == ["succeeded"]
    app.close()


def test_advance_needs_a_fake_clock() -> None:
    with DelayQ("memory://") as app, pytest.raises(ConfigurationError, match="FakeClock"):
        advance(app, 1)


def test_the_pytest_fixtures_give_an_inline_app_on_the_clock(
    delayq_app: InlineApp, delayq_clock: FakeClock
) -> None:
    assert delayq_app.clock is delayq_clock
    job_id = delayq_app.schedule("anything", delay=1)
    delayq_clock.advance(1)
    delayq_app.register("anything", lambda payload: None)
    assert [r.outcome for r in delayq_app.run_due()] == ["succeeded"]
    job = delayq_app.get(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED


def test_an_inline_app_says_at_once_that_a_job_is_not_finished() -> None:
    from delayq.errors import ResultTimeout  # noqa: PLC0415

    app = InlineApp()
    app.register("later", lambda payload: 7, store_result=True)
    job_id = app.schedule("later", delay=60)
    with pytest.raises(ResultTimeout, match="advances the clock"):
        app.result(job_id)
    with pytest.raises(ResultTimeout, match="advances the clock"):
        asyncio.run(app.aresult(job_id))
    app.advance(60)
    assert app.result(job_id) == 7
    app.close()
