"""What the worker tells about an attempt's start: misfire and lateness at the start,
the start mark for stores that count attempts from it, ctx.token and ctx.lease_lost,
and unknown handlers handed back without using an attempt."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Sequence
from typing import Any

import pytest

from delayq.app import JobContext
from delayq.backends.memory import MemoryBackend
from delayq.errors import StaleClaim
from delayq.job import Claim, JobState
from tests._util import wait_until
from tests.unit._worker_harness import T0, TIMEOUT, Harness


class _Renewals(MemoryBackend):
    """Records the ``started`` tokens of each renewal; refuses them all once ``refuse``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.marks: list[set[int]] = []
        self.refuse = False

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        self.marks.append(set(started))
        if self.refuse:
            return [StaleClaim(f"token {c.token} is stale") for c in claims]
        return super().extend_many(claims, lease, started=started)


def test_a_prefetched_misfire_skip_job_that_waited_for_a_slot_is_skipped_at_its_start() -> None:
    h = Harness(concurrency=1, prefetch=1, lease=30.0)
    release = threading.Event()
    ran: list[str] = []
    h.app.register("slow", lambda p: (ran.append(p), release.wait(TIMEOUT)))
    h.app.register("fast", ran.append)
    h.app.schedule("slow", "slow", delay=0)
    fast = h.app.schedule("fast", "fast", delay=0, misfire="grace:0.5")
    try:
        worker = h.start()
        assert wait_until(lambda: ran == ["slow"], TIMEOUT)

        def prefetched() -> bool:
            stats = worker.stats()
            return (stats.in_flight, stats.prefetched) == (2, 1)

        assert wait_until(prefetched, TIMEOUT)  # claimed on time, waiting for the slot
        h.asleep()
        h.clock.advance(0.9)  # it waits 0.9 s for the slot (under the 1 s hand-back bound)
        release.set()
        assert wait_until(lambda: h.job(fast).state is JobState.SKIPPED, TIMEOUT)
        assert "0.900s late" in (h.job(fast).outcome or "")
        assert ran == ["slow"]
        assert worker.stats().lateness_max == 0.0  # claimed on time
    finally:
        release.set()
        h.stop()


def test_start_lateness_counts_the_wait_for_a_slot_and_claim_lateness_does_not() -> None:
    h = Harness(concurrency=1, prefetch=1, lease=30.0)
    release = threading.Event()
    started = threading.Event()
    h.app.register("slow", lambda p: (started.set(), release.wait(TIMEOUT)))
    h.app.register("next", lambda p: None)
    h.app.schedule("slow", delay=0)
    later = h.app.schedule("next", delay=0)
    try:
        worker = h.start()
        assert started.wait(TIMEOUT)

        def prefetched() -> bool:
            stats = worker.stats()
            return (stats.in_flight, stats.prefetched) == (2, 1)

        assert wait_until(prefetched, TIMEOUT)
        h.asleep()
        h.clock.advance(0.5)
        release.set()
        results = {r.job_id: r for r in (h.next_result(), h.next_result())}
        assert results[later].lateness == 0.0 and results[later].start_lateness == 0.5
        stats = worker.stats()
        assert stats.lateness_max == 0.0
        assert stats.start_lateness_max == 0.5
    finally:
        release.set()
        h.stop()


def test_a_running_handler_is_reported_started_soon_after_it_starts() -> None:
    h = Harness(_Renewals, lease=30.0)
    backend = h.backend
    assert isinstance(backend, _Renewals)
    release = threading.Event()
    tokens: list[int] = []
    h.app.register("long", lambda p, ctx: (tokens.append(ctx.token), release.wait(TIMEOUT)))
    h.app.schedule("long", delay=0)
    try:
        h.start()
        assert wait_until(lambda: bool(tokens), TIMEOUT)
        h.asleep(2)  # the dispatcher and the lease keeper
        assert backend.marks == []
        h.clock.advance(1.0)  # min(1 s, lease / 10) after its start
        h.asleep(2)
        assert backend.marks == [set(tokens)]  # one renewal, carrying the start
        h.clock.advance(10.0)  # the regular renewal, lease / 3 later, marks nothing again
        h.asleep(2)
        assert backend.marks == [set(tokens), set()]
    finally:
        release.set()
        h.stop()


def test_a_handler_sees_its_fencing_token_and_the_loss_of_its_lease() -> None:
    h = Harness(_Renewals, lease=3.0)
    backend = h.backend
    assert isinstance(backend, _Renewals)
    seen: list[JobContext] = []
    lost = threading.Event()

    def fenced(payload: Any, ctx: JobContext) -> None:
        seen.append(ctx)
        if ctx.lease_lost.wait(TIMEOUT):
            lost.set()  # stops before its side effect

    h.app.register("fenced", fenced)
    job_id = h.app.schedule("fenced", delay=0)
    try:
        h.start()
        assert wait_until(lambda: bool(seen), TIMEOUT)
        (ctx,) = seen
        assert ctx.token > 0 and not ctx.lease_lost.is_set()
        backend.refuse = True
        h.asleep(2)
        h.clock.advance(1.0)  # the renewal is refused: the lease is gone
        assert lost.wait(TIMEOUT)
        h.next_result()
        del job_id
    finally:
        h.stop()


def test_an_async_handler_is_cancelled_when_its_lease_is_lost() -> None:
    h = Harness(_Renewals, lease=3.0)
    backend = h.backend
    assert isinstance(backend, _Renewals)
    started = threading.Event()
    cancelled = threading.Event()

    async def long(payload: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    h.app.register("long", long)
    h.app.schedule("long", delay=0)
    try:
        h.start()
        assert started.wait(TIMEOUT)
        backend.refuse = True
        h.asleep(3)  # the dispatcher, the lease keeper and the timeout watcher
        h.clock.advance(1.0)
        assert cancelled.wait(TIMEOUT)
        result = h.next_result()
        assert result.outcome == "retried" and "cancelled" in (result.error or "")
    finally:
        h.stop()


def test_a_lease_lost_while_the_handler_is_handed_to_the_loop_still_cancels_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The coroutine can start before the runner stores its cancel: a lease lost in
    that window (the lease keeper finds nothing to cancel) is seen by the runner."""
    h = Harness(lease=3.0)
    started = threading.Event()
    cancelled = threading.Event()

    async def long(payload: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    handed = asyncio.run_coroutine_threadsafe

    def hand_then_lose(coro: Any, loop: asyncio.AbstractEventLoop) -> Any:
        rec = coro.cr_frame.f_locals["rec"]
        future = handed(coro, loop)
        assert started.wait(TIMEOUT)
        assert wait_until(lambda: h.worker is not None, TIMEOUT)  # set once start returns
        assert h.worker is not None
        h.worker._keeper._lose(rec)  # the lease keeper, before the runner stores the cancel
        return future

    h.app.register("long", long)
    h.app.schedule("long", delay=0)
    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hand_then_lose)
    try:
        h.start()
        assert cancelled.wait(TIMEOUT)
        result = h.next_result()
        assert result.outcome == "retried" and "cancelled" in (result.error or "")
    finally:
        h.stop()


def test_an_unknown_handler_is_handed_back_without_using_an_attempt() -> None:
    h = Harness(unknown_handler_grace=600)
    job_id = h.app.schedule("send.v2", delay=0, max_attempts=3, backoff=[1])
    try:
        h.start()
        for _ in range(5):  # a rolling deploy: five hand-backs by a worker that lacks it
            result = h.next_result()
            assert result.outcome == "retried" and "UnknownHandler" in (result.error or "")
            job = h.job(job_id)
            assert (job.state, job.attempts) == (JobState.SCHEDULED, 0)
            h.asleep()
            h.clock.advance(1)
        ran: list[tuple[int, int]] = []
        h.app.register("send.v2", lambda p, ctx: ran.append((ctx.attempt, ctx.max_attempts)))
        assert h.next_result().outcome == "succeeded"
        assert ran == [(1, 3)]  # the new worker's first run is attempt 1 of 3
        assert h.job(job_id).run_at >= T0
    finally:
        h.stop()
