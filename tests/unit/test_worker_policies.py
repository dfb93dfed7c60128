"""Prefetch, timeouts, paused workers and failures around recording, on a FakeClock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.errors import BackendUnavailable, InvalidOption, StaleClaim
from delayq.job import Claim, JobContext, JobState
from delayq.worker import JobResult, Worker
from tests._util import wait_until
from tests.unit._worker_harness import T0, TIMEOUT, Harness


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.stop()


# -- prefetch ---------------------------------------------------------------------------
def test_under_a_backlog_a_few_jobs_are_claimed_ahead_of_free_slots() -> None:
    h = Harness(concurrency=2, prefetch=2)
    release = threading.Event()
    started: list[Any] = []
    h.app.register("block", lambda p: (started.append(p), release.wait(TIMEOUT)))
    for i in range(10):
        h.app.schedule("block", i, delay=0)
    try:
        worker = h.start()
        assert wait_until(lambda: len(started) == 2 and worker.stats().in_flight == 4, TIMEOUT)
        assert worker.stats().prefetched == 2  # claimed, waiting for a slot
        assert h.app.stats().running == 4 and h.app.stats().scheduled == 6
        assert len(started) == 2
        release.set()
        assert sorted(h.next_result().outcome for _ in range(10)) == ["succeeded"] * 10
        assert sorted(started) == list(range(10))
    finally:
        release.set()
        h.stop()


def test_without_a_backlog_nothing_is_prefetched(h: Harness) -> None:
    release = threading.Event()
    started = threading.Event()
    h.app.register("block", lambda p: (started.set(), release.wait(TIMEOUT)))
    h.options.update(concurrency=2, prefetch=4)
    h.app.schedule("block", delay=0)
    worker = h.start()
    try:
        assert started.wait(TIMEOUT)
        h.asleep()  # one job claimed (fewer than asked for), waiting for more
        assert worker.stats().in_flight == 1 and worker.stats().prefetched == 0
    finally:
        release.set()


def test_stop_hands_back_prefetched_jobs_at_once_with_their_attempt() -> None:
    h = Harness(concurrency=1, prefetch=2, grace=3600.0)
    release = threading.Event()
    h.app.register("block", lambda p: release.wait(TIMEOUT))
    ids = [h.app.schedule("block", i, delay=0) for i in range(3)]
    try:
        worker = h.start()
        assert wait_until(lambda: worker.stats().prefetched == 2, TIMEOUT)
        worker.stop(wait=False)
        # Handed back while the running handler still has its grace period.
        returned = sorted(h.next_result().job_id for _ in range(2))
        assert returned == sorted(ids[1:])
        for job_id in ids[1:]:
            job = h.job(job_id)
            assert (job.state, job.attempts, job.run_at) == (JobState.SCHEDULED, 0, T0)
        assert worker.running and h.job(ids[0]).state is JobState.RUNNING
        release.set()
        assert h.next_result().outcome == "succeeded"
        assert worker.join(TIMEOUT)
        assert worker.stats().returned == 2
    finally:
        release.set()
        h.stop()


class _NoRenewals(MemoryBackend):
    """A store that cannot renew leases (as seen by a process that was paused)."""

    def extend(self, claim: Claim, lease: float) -> Claim:
        raise BackendUnavailable("paused")

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        raise BackendUnavailable("paused")


def test_a_claim_whose_lease_ran_out_before_its_handler_started_is_handed_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(_NoRenewals, concurrency=1, prefetch=1, lease=3.0)
    release = threading.Event()
    runs: list[tuple[str, float]] = []

    def block(payload: Any, ctx: JobContext) -> None:
        runs.append((payload, ctx.claimed_at))
        if payload == "first":
            release.wait(TIMEOUT)

    h.app.register("block", block)
    h.app.schedule("block", "first", delay=0)
    second = h.app.schedule("block", "second", delay=0)
    try:
        worker = h.start()
        assert wait_until(lambda: bool(runs) and worker.stats().prefetched == 1, TIMEOUT)
        h.clock.advance(3.5)  # the whole lease passes without a renewal: a paused process
        release.set()
        # The expired claim is handed back (or found stale, if a claim already took
        # the job back), in either order with the run under a fresh claim. (The
        # first job's lease ran out too: it may be found stale and run again.)
        outcomes: list[str] = []
        while "succeeded" not in outcomes or len(outcomes) < 2:
            result = h.next_result()
            if result.job_id == second:
                outcomes.append(result.outcome)
        assert sorted(outcomes) in (["returned", "succeeded"], ["stale", "succeeded"])
        assert wait_until(lambda: h.job(second).state is JobState.SUCCEEDED, TIMEOUT)
        # The second job never ran under the claim whose lease had run out.
        assert [at for payload, at in runs if payload == "second"] == [T0 + 3.5]
    finally:
        release.set()
        h.stop()


# -- timeouts ---------------------------------------------------------------------------
def test_a_sync_handler_past_its_timeout_frees_its_slot_and_is_retried_once_its_thread_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(concurrency=1, prefetch=0, max_abandoned=4)
    release = threading.Event()
    starts: list[int] = []

    @h.app.handler("slow", timeout=5)
    def slow(payload: Any, ctx: JobContext) -> None:
        starts.append(ctx.attempt)
        release.wait(TIMEOUT)

    h.app.register("fast", lambda p: None)
    slow_id = h.app.schedule("slow", delay=0, backoff=[10])
    try:
        worker = h.start()
        assert wait_until(lambda: starts == [1], TIMEOUT)
        h.asleep(2)  # the timeout watcher and the lease keeper (the dispatcher too, soon)
        h.clock.advance(5)
        assert wait_until(lambda: "ran past its timeout" in caplog.text, TIMEOUT)
        # The stuck thread still runs the handler, yet the slot is free for the next job.
        fast_id = h.app.schedule("fast", delay=0)
        assert h.next_result().job_id == fast_id
        assert worker.stats().abandoned == 1
        # Its retry waits for the thread: the job stays held (its lease renewed), so no
        # worker can start attempt 2 beside attempt 1, however long the thread runs.
        for _ in range(3):
            h.asleep(2)  # the dispatcher and the lease keeper
            h.clock.advance(10)
        job = h.job(slow_id)
        assert job.state is JobState.RUNNING and job.lease_until > h.clock.time()
        assert starts == [1] and h.results.empty()
        release.set()  # the thread ends: the timeout's retry is recorded, its result ignored
        result = h.next_result()
        assert (result.job_id, result.outcome, result.retry_at) == (slow_id, "retried", T0 + 15)
        assert "ran past its timeout of 5s" in (result.error or "")
        assert "its result is ignored" in caplog.text
        # Due at once (it is past T0 + 15): attempt 2 starts only now.
        assert h.next_result().outcome == "succeeded" and starts == [1, 2]
        stats = worker.stats()
        assert (stats.timeouts, stats.retried, stats.abandoned) == (1, 1, 0)
    finally:
        release.set()
        h.stop()


def test_past_max_abandoned_hung_handlers_the_worker_stops_claiming_until_one_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(concurrency=2, prefetch=0, max_abandoned=1)
    release = threading.Event()
    started = threading.Event()

    @h.app.handler("hangs", timeout=1)
    def hangs(payload: Any) -> None:
        started.set()
        release.wait(TIMEOUT)

    h.app.register("fast", lambda p: None)
    h.app.schedule("hangs", delay=0, max_attempts=1)
    try:
        worker = h.start()
        assert started.wait(TIMEOUT)
        h.asleep(2)  # the timeout watcher and the lease keeper (the dispatcher too, soon)
        h.clock.advance(1)
        assert h.next_result().outcome == "dead"  # a last attempt is recorded at once
        assert wait_until(lambda: "max_abandoned=1" in caplog.text, TIMEOUT)
        assert worker.stats().abandoned == 1
        fast_id = h.app.schedule("fast", delay=0)
        h.asleep()
        assert h.job(fast_id).state is JobState.SCHEDULED  # at the cap: nothing is claimed
        release.set()  # the hung thread ends: under the cap again
        assert h.next_result().job_id == fast_id
        assert worker.stats().abandoned == 0
    finally:
        release.set()
        h.stop()


def test_an_async_handler_past_the_worker_timeout_is_cancelled() -> None:
    h = Harness(timeout=2.0)
    cancelled = threading.Event()
    started = threading.Event()

    async def hangs(payload: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)  # the loop's own clock: only a cancel ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    h.app.register("hangs", hangs)
    job_id = h.app.schedule("hangs", delay=0, max_attempts=1)
    try:
        h.start()
        assert started.wait(TIMEOUT)
        h.asleep(2)  # the timeout watcher and the lease keeper (the dispatcher too, soon)
        h.clock.advance(2)
        result = h.next_result()
        assert (result.outcome, result.duration) == ("dead", 2.0)
        assert cancelled.wait(TIMEOUT)
        assert "ran past its timeout of 2s" in h.job(job_id).last_error
        assert h.results.empty()
    finally:
        h.stop()


def test_a_handler_timeout_overrides_the_worker_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(timeout=100.0)
    release = threading.Event()
    started = threading.Event()
    h.app.register("x", lambda p: (started.set(), release.wait(TIMEOUT)), timeout=1.0)
    h.app.schedule("x", delay=0)
    try:
        h.start()
        assert started.wait(TIMEOUT)  # its timeout is armed
        h.asleep(3)  # the dispatcher, the lease keeper and the timeout watcher
        assert h.clock.next_deadline() == h.clock.monotonic() + 1.0
        h.clock.advance(1.0)
        assert wait_until(lambda: "ran past its timeout" in caplog.text, TIMEOUT)
        release.set()  # its retry is recorded once its thread ends
        assert h.next_result().outcome == "retried"
    finally:
        release.set()
        h.stop()


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "5s", True])
def test_a_bad_timeout_is_rejected_where_it_is_given(h: Harness, bad: Any) -> None:
    with pytest.raises(InvalidOption, match="timeout"):
        h.app.register("x", lambda p: None, timeout=bad)
    with pytest.raises(InvalidOption, match="timeout"):
        h.app.handler("y", timeout=bad)
    with pytest.raises(InvalidOption, match="timeout"):
        Worker(h.app, timeout=bad)


# -- recording --------------------------------------------------------------------------
class _GatedComplete(MemoryBackend):
    """Holds its first ``complete`` call until ``gate`` is set."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        self.entered.set()
        self.gate.wait(TIMEOUT)
        return super().complete(batch)


def test_an_on_result_callback_raising_system_exit_strands_no_finished_job() -> None:
    calls: list[JobResult] = []

    def exits(result: JobResult) -> None:
        calls.append(result)
        raise SystemExit(1)

    h = Harness(_GatedComplete, concurrency=4, on_result=exits)
    backend = h.backend
    assert isinstance(backend, _GatedComplete)
    release = threading.Event()
    h.app.register("first", lambda p: None)
    h.app.register("rest", lambda p: release.wait(TIMEOUT))
    h.app.schedule("first", delay=0)
    for _ in range(3):
        h.app.schedule("rest", delay=0)
    try:
        worker = h.start()
        assert backend.entered.wait(TIMEOUT)
        release.set()  # three results queue behind the commit in progress
        assert wait_until(lambda: len(worker._committer._finished) == 3, TIMEOUT)
        backend.gate.set()
        assert wait_until(lambda: h.app.stats().succeeded == 4, TIMEOUT)
        assert wait_until(lambda: worker.stats().in_flight == 0, TIMEOUT)
        assert wait_until(lambda: len(calls) == 4, TIMEOUT)  # reported after recording
        assert h.app.stats().running == 0 and worker.running
    finally:
        backend.gate.set()
        release.set()
        h.stop()


class _FirstBuryFails(MemoryBackend):
    """A store that fails the first commit holding a bury."""

    failed = False

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        if not self.failed and any(c.state is JobState.DEAD for c in batch):
            self.failed = True
            raise BackendUnavailable("the store is unreachable")
        return super().complete(batch)


def test_when_the_final_bury_fails_the_real_error_still_reaches_the_dead_letter() -> None:
    h = Harness(_FirstBuryFails, lease=3.0)

    def broken(payload: Any) -> None:
        raise ValueError("the real cause")

    h.app.register("broken", broken)
    job_id = h.app.schedule("broken", delay=0, max_attempts=1)
    try:
        worker = h.start()
        backend = h.backend
        assert isinstance(backend, _FirstBuryFails)
        assert wait_until(lambda: backend.failed, TIMEOUT)
        # Time passes beyond the lease: the lease is renewed while the commit is retried.
        for _ in range(8):
            h.asleep()
            h.clock.advance(0.5)
            if not h.results.empty():
                break
        assert h.next_result().outcome == "dead"
        job = h.job(job_id)
        assert job.state is JobState.DEAD
        assert "ValueError: the real cause" in job.last_error
        assert "lease expired" not in job.last_error
        assert worker.stats().errors == 1
    finally:
        h.stop()


# -- one round trip for recording and claiming ------------------------------------------
class _OneTrip(MemoryBackend):
    """A store with its own complete_and_claim (records the limits it was asked for)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.combined: list[int] = []
        self.plain_claims = 0

    def claim(self, **kwargs: Any) -> list[Claim]:
        self.plain_claims += 1
        return super().claim(**kwargs)

    def complete_and_claim(
        self, batch: Sequence[Completion], *, limit: int, lease: float
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        self.combined.append(limit)
        answers = super().complete(batch)
        return answers, (MemoryBackend.claim(self, limit=limit, lease=lease) if limit else [])


def test_under_a_backlog_results_are_recorded_and_slots_refilled_in_one_call() -> None:
    h = Harness(_OneTrip, concurrency=4, prefetch=4)
    backend = h.backend
    assert isinstance(backend, _OneTrip)
    h.app.register("x", lambda p: None)
    for i in range(200):
        h.app.schedule("x", i, delay=0)
    try:
        worker = h.start()
        assert sorted(h.next_result().outcome for _ in range(200)) == ["succeeded"] * 200
        assert h.app.stats().succeeded == 200
        assert backend.combined and all(limit >= 2 for limit in backend.combined)
        # Most claims rode along with a commit.
        assert sum(backend.combined) > 100 and backend.plain_claims < len(backend.combined)
        assert worker.stats().in_flight == 0
    finally:
        h.stop()


def test_a_store_with_the_default_complete_and_claim_is_claimed_by_the_dispatcher() -> None:
    h = Harness(concurrency=4, prefetch=4)
    assert h.backend.complete_and_claim  # the default two-call version from _common
    worker = Worker(h.app, **h.options)
    assert not worker._committer.combines
