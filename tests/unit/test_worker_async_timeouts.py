"""Async handlers and timeouts: a blocked loop, a coroutine that ignores its cancel.

On the memory store and a FakeClock; the loop's own waits are real but tiny and
only inside handlers, never in the test's assertions.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from delayq.job import JobState
from tests._util import wait_until
from tests.unit._worker_harness import TIMEOUT, Harness


def test_a_handler_blocking_the_loop_is_reported_and_the_others_keep_their_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    blocker = threading.Event()
    blocking = threading.Event()
    ran: list[str] = []

    @h.app.handler("blocks")
    async def blocks(payload: Any) -> None:
        blocking.set()
        blocker.wait(TIMEOUT)  # sync I/O inside async def: the loop stands still

    @h.app.handler("quick", timeout=0.5)
    async def quick(payload: Any) -> None:
        ran.append(payload)

    h.app.schedule("blocks", delay=0)
    try:
        worker = h.start()
        assert blocking.wait(TIMEOUT)
        quick_id = h.app.schedule("quick", "q", delay=0)
        assert wait_until(lambda: worker.stats().in_flight == 2, TIMEOUT)
        h.asleep(3)  # the dispatcher, the lease keeper and the timeout watcher
        h.clock.advance(1.0)  # past quick's timeout, had it started: it has not
        h.asleep(3)
        h.clock.advance(1.0)
        assert wait_until(lambda: "has not run for" in caplog.text, TIMEOUT)
        assert worker.stats().loop_blocked == 1
        assert h.results.empty() and h.job(quick_id).state is JobState.RUNNING
        blocker.set()
        outcomes = {h.next_result().outcome, h.next_result().outcome}
        assert outcomes == {"succeeded"} and ran == ["q"]
        assert h.job(quick_id).state is JobState.SUCCEEDED
        assert wait_until(lambda: "runs again after" in caplog.text, TIMEOUT)
    finally:
        blocker.set()
        h.stop()


def test_a_coroutine_swallowing_its_cancel_is_abandoned_work_and_its_retry_waits_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(max_abandoned=4)
    release = threading.Event()
    starts: list[int] = []
    swallowed = threading.Event()

    @h.app.handler("stubborn", timeout=2)
    async def stubborn(payload: Any, ctx: Any) -> None:
        starts.append(ctx.attempt)
        if ctx.attempt > 1:
            return
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()
        while not release.is_set():  # goes on after its cancel
            await asyncio.sleep(0.001)

    job_id = h.app.schedule("stubborn", delay=0, backoff=[1])
    try:
        worker = h.start()
        assert wait_until(lambda: starts == [1], TIMEOUT)
        h.asleep(3)  # the dispatcher, the lease keeper and the timeout watcher
        h.clock.advance(2)
        assert swallowed.wait(TIMEOUT)
        assert wait_until(lambda: worker.stats().abandoned == 1, TIMEOUT)
        job = h.job(job_id)
        assert job.state is JobState.RUNNING and h.results.empty()  # the retry waits
        release.set()  # the coroutine really ends: its retry is recorded now
        result = h.next_result()
        assert result.outcome == "retried" and "ran past its timeout" in (result.error or "")
        assert worker.stats().abandoned == 0
        h.asleep()
        h.clock.advance(1)
        assert h.next_result().outcome == "succeeded" and starts == [1, 2]
    finally:
        release.set()
        h.stop()
