"""The worker, on the memory store and a FakeClock: no real sleeps.

Tests wait for the worker through its ``on_result`` reports (a queue with a
real timeout that only fires when something is broken) and through
``FakeClock.wait_for_waiters`` (the worker is asleep on the clock).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.errors import BackendUnavailable, InvalidOption, StaleClaim
from delayq.job import Claim, JobContext, JobState
from delayq.worker import JobResult, Worker, percentile
from tests._util import wait_until
from tests.unit._worker_harness import T0, TIMEOUT, Harness


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.stop()


# -- running jobs --------------------------------------------------------------------
def test_a_due_job_runs_and_succeeds(h: Harness) -> None:
    seen: list[Any] = []
    h.app.register("greet", seen.append)
    job_id = h.app.schedule("greet", {"who": "ada"}, delay=0)
    h.start()
    result = h.next_result()
    assert (result.job_id, result.outcome, result.attempt) == (job_id, "succeeded", 1)
    assert seen == [{"who": "ada"}]
    assert h.job(job_id).state is JobState.SUCCEEDED


def test_a_job_does_not_run_before_its_due_time(h: Harness) -> None:
    h.app.register("x", lambda p: None)
    job_id = h.app.schedule("x", delay=10)
    h.start()
    h.asleep()
    h.clock.advance(9.999)
    h.asleep()
    assert h.results.empty()
    assert h.job(job_id).state is JobState.SCHEDULED
    h.clock.advance(0.001)
    assert h.next_result().outcome == "succeeded"


def test_an_earlier_job_wakes_the_sleeping_worker_at_once(h: Harness) -> None:
    h.app.register("x", lambda p: None)
    h.app.schedule("x", delay=3600)
    h.start()
    h.asleep()
    job_id = h.app.schedule("x", delay=0)  # the clock does not move
    result = h.next_result()
    assert result.job_id == job_id and result.lateness == 0.0


def test_the_handler_gets_a_context_with_the_attempt(h: Harness) -> None:
    seen: list[JobContext] = []
    h.app.register("x", lambda p, ctx: seen.append(ctx))
    job_id = h.app.schedule("x", delay=5)
    h.clock.advance(7)
    h.start()
    h.next_result()
    (ctx,) = seen
    assert (ctx.id, ctx.name, ctx.attempt, ctx.max_attempts) == (job_id, "x", 1, 5)
    assert ctx.run_at == T0 + 5 and ctx.claimed_at == T0 + 7 and ctx.lateness == 2


def test_an_async_handler_runs_on_the_event_loop(h: Harness) -> None:
    seen: list[tuple[Any, str]] = []

    async def handler(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0)
        seen.append((payload, threading.current_thread().name))

    h.app.register("a", handler)
    job_id = h.app.schedule("a", [1, 2], delay=0)
    h.start()
    assert h.next_result().outcome == "succeeded"
    assert seen == [([1, 2], "delayq-worker-asyncio")]
    assert h.job(job_id).state is JobState.SUCCEEDED


def test_a_failing_async_handler_is_retried(h: Harness) -> None:
    async def handler(payload: Any) -> None:
        raise ValueError("async boom")

    h.app.register("a", handler)
    job_id = h.app.schedule("a", delay=0, backoff=[3])
    h.start()
    result = h.next_result()
    assert result.outcome == "retried" and "async boom" in (result.error or "")
    assert h.job(job_id).run_at == T0 + 3


# -- failures -----------------------------------------------------------------------
def test_a_failure_is_retried_after_the_jobs_backoff(h: Harness) -> None:
    calls: list[int] = []

    def flaky(payload: Any, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"webhook down (attempt {ctx.attempt})")

    h.app.register("webhook", flaky)
    job_id = h.app.schedule("webhook", delay=0, backoff="2s,5s,10s,20s")
    h.start()
    first = h.next_result()
    assert first.outcome == "retried" and first.retry_at == T0 + 2
    job = h.job(job_id)
    assert job.state is JobState.SCHEDULED and job.run_at == T0 + 2
    assert "ConnectionError: webhook down (attempt 1)" in job.last_error
    h.asleep()
    h.clock.advance(2)
    assert h.next_result().retry_at == T0 + 2 + 5
    h.asleep()
    h.clock.advance(5)
    assert h.next_result().outcome == "succeeded"
    assert calls == [1, 2, 3]
    assert h.job(job_id).state is JobState.SUCCEEDED


def test_the_last_failure_dead_letters_with_error_and_traceback(h: Harness) -> None:
    def broken(payload: Any) -> None:
        raise KeyError("missing-field")

    h.app.register("broken", broken)
    job_id = h.app.schedule("broken", delay=0, max_attempts=2, backoff=[1])
    h.start()
    assert h.next_result().outcome == "retried"
    h.asleep()
    h.clock.advance(1)
    result = h.next_result()
    assert (result.outcome, result.attempt) == ("dead", 2)
    job = h.job(job_id)
    assert job.state is JobState.DEAD and job.attempts == 2
    assert "Traceback (most recent call last)" in job.last_error
    assert "KeyError: 'missing-field'" in job.last_error
    assert "in broken" in job.last_error
    assert [j.id for j in h.app.dead_letters()] == [job_id]


def test_a_handler_raising_system_exit_counts_as_a_failure(h: Harness) -> None:
    def quits(payload: Any) -> None:
        raise SystemExit(3)

    h.app.register("q", quits)
    job_id = h.app.schedule("q", delay=0, max_attempts=1)
    h.start()
    assert h.next_result().outcome == "dead"
    assert "SystemExit: 3" in h.job(job_id).last_error
    assert h.worker is not None and h.worker.stats().in_flight == 0


def test_an_unknown_handler_name_is_dead_lettered_with_the_reason_after_its_grace(
    h: Harness,
) -> None:
    h.options["unknown_handler_grace"] = 0.0
    h.app.register("known", lambda p: None)
    job_id = h.app.schedule("order.refund", delay=0)
    h.start()
    assert h.next_result().outcome == "dead"
    job = h.job(job_id)
    assert job.state is JobState.DEAD
    assert "no handler is registered under 'order.refund'" in job.last_error
    assert "registered: known" in job.last_error
    assert "unknown_handler_grace=0s" in job.last_error


def test_an_unknown_handler_name_is_retried_by_its_backoff_within_the_grace(
    h: Harness,
) -> None:
    """A rolling deploy: new producers schedule a name the old workers do not know yet."""
    h.options["unknown_handler_grace"] = 10.0
    h.app.register("known", lambda p: None)
    job_id = h.app.schedule("order.refund", delay=0, backoff=[4], max_attempts=2)
    h.start()
    first = h.next_result()
    assert (first.outcome, first.retry_at) == ("retried", T0 + 4)
    assert "retried until" in h.job(job_id).last_error
    h.asleep()
    h.clock.advance(4)
    second = h.next_result()  # max_attempts does not end it early: the grace does
    assert (second.outcome, second.retry_at) == ("retried", T0 + 8)
    h.asleep()
    h.clock.advance(4)
    # The last retry lands at the end of the grace (10 s after the job was due).
    assert h.next_result().retry_at == T0 + 10
    h.asleep()
    h.clock.advance(2)
    assert h.next_result().outcome == "dead"
    job = h.job(job_id)
    assert job.state is JobState.DEAD and "still unknown 10.0s after" in job.last_error


def test_a_job_whose_handler_appears_within_the_grace_runs(h: Harness) -> None:
    h.options["unknown_handler_grace"] = 60.0
    ran: list[Any] = []
    job_id = h.app.schedule("late.deploy", "x", delay=0, backoff=[5])
    h.start()
    assert h.next_result().outcome == "retried"
    h.app.register("late.deploy", ran.append)  # the new code is deployed
    h.asleep()
    h.clock.advance(5)
    assert h.next_result().outcome == "succeeded"
    assert ran == ["x"] and h.job(job_id).state is JobState.SUCCEEDED


# -- misfire ------------------------------------------------------------------------
def test_an_overdue_job_with_misfire_skip_is_skipped_with_a_note(h: Harness) -> None:
    ran: list[Any] = []
    h.app.register("x", ran.append)
    job_id = h.app.schedule("x", delay=10, misfire="skip")
    h.clock.advance(10 + 300)  # the worker was down
    h.start()
    assert h.next_result().outcome == "skipped"
    job = h.job(job_id)
    assert job.state is JobState.SKIPPED
    assert job.outcome == "skipped: 300.000s late (misfire policy skip)"
    assert ran == []


def test_misfire_grace_runs_a_job_within_the_grace(h: Harness) -> None:
    h.app.register("x", lambda p: None)
    within = h.app.schedule("x", delay=0, misfire=60)
    beyond = h.app.schedule("x", delay=0, misfire="grace:5")
    h.clock.advance(30)
    h.start()
    outcomes = {r.job_id: r.outcome for r in (h.next_result(), h.next_result())}
    assert outcomes == {within: "succeeded", beyond: "skipped"}
    assert h.job(within).outcome == "ran 30.000s late (misfire policy grace:60.0)"


def test_misfire_run_runs_any_overdue_job(h: Harness) -> None:
    h.app.register("x", lambda p: None)
    job_id = h.app.schedule("x", delay=0)
    h.clock.advance(86400)
    h.start()
    assert h.next_result().outcome == "succeeded"
    assert h.job(job_id).state is JobState.SUCCEEDED


# -- slots, batches, leases ---------------------------------------------------------
def test_without_prefetch_only_as_many_jobs_are_claimed_as_there_are_free_slots() -> None:
    h = Harness(concurrency=2, batch=10, prefetch=0)
    release = threading.Event()
    started: list[Any] = []
    h.app.register("block", lambda p: (started.append(p), release.wait(TIMEOUT)))
    for i in range(5):
        h.app.schedule("block", i, delay=0)
    try:
        h.start()
        assert wait_until(lambda: len(started) == 2, TIMEOUT)
        stats = h.app.stats()
        assert (stats.running, stats.scheduled) == (2, 3)
        release.set()
        outcomes = [h.next_result().outcome for _ in range(5)]
        assert outcomes == ["succeeded"] * 5
        assert sorted(started) == [0, 1, 2, 3, 4]
    finally:
        release.set()
        h.stop()


class _RecordingClaims(MemoryBackend):
    """Records the ``limit`` of every claim that returned jobs."""

    limits: list[int]

    def claim(self, **kwargs: Any) -> list[Claim]:
        claims = super().claim(**kwargs)
        if claims:
            self.limits = [*getattr(self, "limits", []), kwargs["limit"]]
        return claims


def test_under_backlog_a_freed_slot_waits_briefly_for_company_before_claiming() -> None:
    h = Harness(_RecordingClaims, concurrency=4, batch=4, prefetch=0)
    backend = h.backend
    assert isinstance(backend, _RecordingClaims)
    gates = {i: threading.Event() for i in range(10)}
    started: list[int] = []
    h.app.register("gated", lambda i: (started.append(i), gates[i].wait(TIMEOUT)))
    for i in range(10):
        h.app.schedule("gated", i, delay=0)
    try:
        h.start()
        assert wait_until(lambda: len(started) == 4, TIMEOUT)
        gates[started[0]].set()
        gather_deadline = h.clock.monotonic() + 0.002
        assert wait_until(lambda: h.clock.next_deadline() == gather_deadline, TIMEOUT)
        assert backend.limits == [4]  # one slot free: not claimed alone
        gates[started[1]].set()
        assert wait_until(lambda: len(started) == 6, TIMEOUT)
        assert backend.limits == [4, 2]  # two slots, one claim
    finally:
        for gate in gates.values():
            gate.set()
        h.stop()


def test_a_long_handler_keeps_its_lease_by_renewing_it(h: Harness) -> None:
    release = threading.Event()
    started = threading.Event()
    h.app.register("long", lambda p: (started.set(), release.wait(TIMEOUT)))
    job_id = h.app.schedule("long", delay=0)
    h.options["lease"] = 3.0
    h.start()
    assert started.wait(TIMEOUT)
    for _ in range(10):  # 15 s: five leases' worth
        h.asleep(2)  # the dispatcher and the lease keeper
        h.clock.advance(1.5)
    h.asleep(2)
    job = h.job(job_id)
    assert job.state is JobState.RUNNING and job.attempts == 1
    assert job.lease_until >= h.clock.time()
    release.set()
    assert h.next_result().outcome == "succeeded"
    assert h.job(job_id).attempts == 1


class _StaleAck(MemoryBackend):
    """A store whose acks (single or in a ``complete`` batch) always find the lease gone."""

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        results: list[StaleClaim | None] = []
        for item in batch:
            if item.state in (JobState.SUCCEEDED, JobState.SKIPPED):
                claim = item.claim
                results.append(StaleClaim(f"token {claim.token} of job {claim.job.id} is stale"))
            else:
                results += super().complete([item])
        return results


def test_a_stale_claim_on_ack_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(_StaleAck)
    h.app.register("x", lambda p: None)
    h.app.schedule("x", 1, delay=0)
    h.app.schedule("x", 2, delay=0)
    try:
        h.start()
        assert [h.next_result().outcome for _ in range(2)] == ["stale", "stale"]
        assert h.worker is not None and h.worker.running
        assert h.worker.stats().stale == 2
        assert "lease expired before the result was recorded" in caplog.text
    finally:
        h.stop()


class _GatedComplete(MemoryBackend):
    """Holds its first ``complete`` call until ``gate`` is set; records every batch size."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.sizes: list[int] = []
        self.entered = threading.Event()
        self.gate = threading.Event()

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        items = list(batch)
        self.sizes.append(len(items))
        self.entered.set()
        self.gate.wait(TIMEOUT)
        return super().complete(items)


def test_results_that_finish_during_a_commit_are_recorded_together_in_one_call() -> None:
    h = Harness(_GatedComplete, concurrency=4)
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
        assert backend.entered.wait(TIMEOUT)  # "first" is being recorded, alone
        release.set()
        # The other three finish meanwhile and only queue their results.
        assert wait_until(lambda: len(worker._committer._finished) == 3, TIMEOUT)
        backend.gate.set()
        assert [h.next_result().outcome for _ in range(4)] == ["succeeded"] * 4
        assert backend.sizes == [1, 3]
        assert h.app.stats().succeeded == 4
    finally:
        backend.gate.set()
        release.set()
        h.stop()


class _FailingComplete(MemoryBackend):
    """A store whose first ``complete`` call fails as unreachable."""

    failures = 1

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("the store is unreachable")
        return super().complete(batch)


def test_a_store_error_while_recording_a_result_is_logged_and_the_commit_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(_FailingComplete)
    h.app.register("x", lambda p: None)
    first = h.app.schedule("x", delay=0)
    try:
        worker = h.start()
        assert wait_until(lambda: "recording 1 result(s) failed" in caplog.text, TIMEOUT)
        assert h.job(first).state is JobState.RUNNING  # held, its lease kept
        assert h.results.empty()
        retry_deadline = h.clock.monotonic() + 0.1  # the first pause before trying again
        assert wait_until(lambda: h.clock.next_deadline() == retry_deadline, TIMEOUT)
        h.clock.advance(0.1)
        assert h.next_result().outcome == "succeeded"
        assert h.job(first).state is JobState.SUCCEEDED
        h.app.schedule("x", delay=0)
        assert h.next_result().outcome == "succeeded"
        assert worker.running and worker.stats().errors == 1
    finally:
        h.stop()


class _FailingWait(MemoryBackend):
    """A store whose first ``wait_for_due`` fails (as SQLite does after its busy timeout)."""

    failures = 1

    def wait_for_due(self, max_wait: float) -> None:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("database is locked (busy_timeout=10.0s)")
        super().wait_for_due(max_wait)


def test_a_store_error_while_waiting_for_due_jobs_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(_FailingWait)
    h.app.register("x", lambda p: None)
    try:
        worker = h.start()
        h.asleep()  # backing off on the clock, not crashed
        assert "waiting for due jobs failed" in caplog.text
        assert worker.running
        h.clock.advance(0.1)
        h.app.schedule("x", delay=0)
        assert h.next_result().outcome == "succeeded"
        assert worker.running
    finally:
        h.stop()


class _StaleExtend(MemoryBackend):
    """A store that refuses every lease renewal as stale."""

    extends = 0

    def extend(self, claim: Claim, lease: float) -> Claim:
        self.extends += 1
        raise StaleClaim(f"token {claim.token} of job {claim.job.id} is stale")

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        answers: list[Claim | StaleClaim] = []
        for claim in claims:
            try:
                answers.append(self.extend(claim, lease))
            except StaleClaim as exc:
                answers.append(exc)
        return answers


def test_a_lost_lease_is_logged_and_the_worker_sleeps_instead_of_spinning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(_StaleExtend, lease=3.0)
    backend = h.backend
    assert isinstance(backend, _StaleExtend)
    release = threading.Event()
    started = threading.Event()
    h.app.register("long", lambda p: (started.set(), release.wait(TIMEOUT)))
    h.app.schedule("long", delay=0)
    try:
        h.start()
        assert started.wait(TIMEOUT)
        h.asleep(2)  # the dispatcher and the lease keeper
        h.clock.advance(1.5)  # renewal due: refused
        assert wait_until(lambda: "lost the lease of job" in caplog.text, TIMEOUT)
        h.asleep()
        h.clock.advance(1.4)  # nothing left to renew: no second call (the lease ends at 3 s)
        h.asleep()
        assert backend.extends == 1
        release.set()
        assert h.next_result().outcome == "succeeded"
    finally:
        release.set()
        h.stop()


def test_an_on_result_callback_error_does_not_stop_the_worker() -> None:
    calls: list[JobResult] = []

    def bad_callback(result: JobResult) -> None:
        calls.append(result)
        raise ValueError("callback bug")

    h = Harness(on_result=bad_callback)
    h.app.register("x", lambda p: None)
    h.app.schedule("x", delay=0)
    h.app.schedule("x", delay=0)
    try:
        h.start()
        assert wait_until(lambda: len(calls) == 2, TIMEOUT)
        assert h.worker is not None and h.worker.running
    finally:
        h.stop()


def test_worker_stats_count_outcomes_and_lateness(h: Harness) -> None:
    h.app.register("ok", lambda p: None)
    h.app.schedule("ok", delay=0)
    h.app.schedule("ok", delay=1)
    h.app.schedule("nobody", delay=0)
    h.clock.advance(3)
    h.options["unknown_handler_grace"] = 0.0
    worker = h.start()
    for _ in range(3):
        h.next_result()
    stats = worker.stats()
    assert (stats.claimed, stats.succeeded, stats.dead) == (3, 2, 1)
    assert stats.lateness_max == 3.0
    assert stats.lateness_p50 == pytest.approx(3.0, rel=0.045)  # a histogram bucket
    assert stats.as_dict()["claimed"] == 3
    assert stats.in_flight == 0 and stats.prefetched == 0


# -- stopping -----------------------------------------------------------------------
def test_stop_lets_an_in_flight_handler_finish(h: Harness) -> None:
    release = threading.Event()
    started = threading.Event()
    h.app.register("x", lambda p: (started.set(), release.wait(TIMEOUT)))
    job_id = h.app.schedule("x", delay=0)
    h.app.schedule("x", delay=0)
    h.options["concurrency"] = 1
    worker = h.start()
    assert started.wait(TIMEOUT)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    assert wait_until(lambda: worker.stopping, TIMEOUT)
    release.set()
    stopper.join(TIMEOUT)
    assert not worker.running
    assert h.job(job_id).state is JobState.SUCCEEDED
    assert h.app.stats().scheduled == 1  # the second job was never claimed


def test_stop_abandons_a_handler_still_running_after_the_grace_period(h: Harness) -> None:
    release = threading.Event()
    started = threading.Event()
    threads: list[threading.Thread] = []

    def hang(payload: Any) -> None:
        threads.append(threading.current_thread())
        started.set()
        release.wait(TIMEOUT)

    h.app.register("x", hang)
    job_id = h.app.schedule("x", delay=0)
    worker = h.start()
    assert started.wait(TIMEOUT)
    worker.stop(grace=5, wait=False)
    assert wait_until(lambda: worker.stopping, TIMEOUT)
    h.asleep()
    h.clock.advance(5)
    assert worker.join(TIMEOUT)
    job = h.job(job_id)
    # Handed back with its attempt before the worker returned: another worker runs it.
    assert (job.state, job.attempts) == (JobState.SCHEDULED, 0)
    release.set()
    threads[0].join(TIMEOUT)  # the abandoned handler returned and its thread is done
    assert not threads[0].is_alive()
    assert h.results.empty()  # its late result is neither recorded nor reported
    assert h.job(job_id).state is JobState.SCHEDULED


class _StopOnClaim(MemoryBackend):
    """Requests a stop right after handing out claims (before their handlers start)."""

    worker: Worker

    def claim(self, **kwargs: Any) -> list[Claim]:
        claims = super().claim(**kwargs)
        if claims:
            self.worker.stop(wait=False)
        return claims


def test_claims_not_started_at_stop_are_returned_at_their_due_time() -> None:
    h = Harness(_StopOnClaim)
    backend = h.backend
    assert isinstance(backend, _StopOnClaim)
    h.app.register("x", lambda p: None)
    job_id = h.app.schedule("x", delay=0)
    h.clock.advance(2)
    backend.worker = worker = Worker(h.app, **h.options)
    worker.start()
    assert worker.join(TIMEOUT)
    assert h.next_result().outcome == "returned"
    job = h.job(job_id)
    assert job.state is JobState.SCHEDULED and job.run_at == T0
    assert "returned unstarted" in job.last_error


def test_the_worker_stops_when_its_store_is_closed(h: Harness) -> None:
    worker = h.start()
    h.asleep()
    h.backend.close()
    assert worker.join(TIMEOUT)


def test_sigterm_stops_run_gracefully() -> None:
    h = Harness()
    h.app.register("x", lambda p: None)
    worker = Worker(h.app, **h.options)
    before = signal.getsignal(signal.SIGTERM)

    def send_sigterm() -> None:
        assert wait_until(lambda: worker.running, TIMEOUT)
        h.asleep()
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send_sigterm)
    sender.start()
    worker.run()  # returns once the signal stopped it
    sender.join(TIMEOUT)
    assert not worker.running
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_in_the_main_thread_freezes_the_startup_heap_until_it_returns() -> None:
    h = Harness()
    worker = Worker(h.app, **h.options)
    frozen_while_running: list[int] = []

    def stop_when_running() -> None:
        assert wait_until(lambda: worker.running, TIMEOUT)
        frozen_while_running.append(gc.get_freeze_count())
        worker.stop(grace=0, wait=False)

    assert gc.get_freeze_count() == 0
    stopper = threading.Thread(target=stop_when_running)
    stopper.start()
    worker.run()
    stopper.join(TIMEOUT)
    assert frozen_while_running[0] > 0  # the heap built before run() was frozen
    assert gc.get_freeze_count() == 0  # and given back to the collector afterwards


def test_a_worker_started_in_the_background_leaves_the_collector_alone(h: Harness) -> None:
    h.start()
    assert wait_until(lambda: h.worker is not None and h.worker.running, TIMEOUT)
    assert gc.get_freeze_count() == 0


def test_a_worker_cannot_be_started_twice(h: Harness) -> None:
    worker = h.start()
    with pytest.raises(Exception, match="already started"):
        worker.start()


def test_the_worker_as_a_context_manager_starts_and_stops(h: Harness) -> None:
    h.app.register("x", lambda p: None)
    h.app.schedule("x", delay=0)
    with Worker(h.app, **h.options) as worker:
        assert h.next_result().outcome == "succeeded"
    assert not worker.running


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("concurrency", 0),
        ("concurrency", True),
        ("batch", 0),
        ("lease", 0),
        ("lease", float("nan")),
        ("grace", -1),
        ("idle_wait", "1s"),
        ("prefetch", -1),
        ("prefetch", 1.5),
        ("unknown_handler_grace", -1),
        ("unknown_handler_grace", float("inf")),
    ],
)
def test_bad_worker_options_are_rejected(h: Harness, option: str, value: Any) -> None:
    with pytest.raises(InvalidOption, match=option):
        Worker(h.app, **{option: value})


def test_percentile_uses_the_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 50) == 50.0
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 100) == 100.0
    assert percentile([], 50) != percentile([], 50)  # NaN


# -- async handlers that misbehave ---------------------------------------------------
@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_an_async_handler_raising_a_base_exception_fails_and_the_loop_goes_on(
    h: Harness, error: BaseException
) -> None:
    async def quits(payload: Any) -> None:
        raise error

    async def fine(payload: Any) -> None:
        await asyncio.sleep(0)

    h.app.register("quits", quits)
    h.app.register("fine", fine)
    job_id = h.app.schedule("quits", delay=0, max_attempts=1)
    h.start()
    assert h.next_result().outcome == "dead"
    job = h.job(job_id)
    assert job.state is JobState.DEAD and type(error).__name__ in job.last_error
    second = h.app.schedule("fine", delay=0)
    assert h.next_result().outcome == "succeeded"
    assert h.job(second).state is JobState.SUCCEEDED
    assert h.worker is not None and h.worker.stats().in_flight == 0


def test_an_async_handler_stopping_the_event_loop_does_not_strand_jobs(h: Harness) -> None:
    async def stops_the_loop(payload: Any) -> None:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0)

    async def fine(payload: Any) -> None:
        await asyncio.sleep(0)

    h.app.register("stops", stops_the_loop)
    h.app.register("fine", fine)
    first = h.app.schedule("stops", delay=0)
    h.start()
    assert h.next_result().outcome == "succeeded"
    second = h.app.schedule("fine", delay=0)
    assert h.next_result().outcome == "succeeded"
    assert h.job(first).state is h.job(second).state is JobState.SUCCEEDED


def test_a_closed_event_loop_is_replaced_for_the_next_async_job(h: Harness) -> None:
    async def fine(payload: Any) -> None:
        await asyncio.sleep(0)

    h.app.register("fine", fine)
    h.app.schedule("fine", delay=0)
    worker = h.start()
    assert h.next_result().outcome == "succeeded"
    dead_loop = worker._runner._loop
    assert dead_loop is not None
    dead_loop.shutdown()  # the loop thread ends and closes the loop
    assert wait_until(dead_loop.loop.is_closed, TIMEOUT)
    job_id = h.app.schedule("fine", delay=0)
    assert h.next_result().outcome == "succeeded"
    assert h.job(job_id).state is JobState.SUCCEEDED


def _traced(fn: Any) -> Any:
    """A typical sync decorator (logging, tracing) that hides an async function."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def test_an_async_handler_behind_a_sync_decorator_is_awaited(h: Harness) -> None:
    seen: list[Any] = []

    @_traced
    async def handler(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0)
        seen.append((payload, ctx.attempt))

    entry = h.app.register("a", handler)
    assert entry.is_async and entry.takes_context
    job_id = h.app.schedule("a", [1], delay=0)
    h.start()
    assert h.next_result().outcome == "succeeded"
    assert seen == [([1], 1)]
    assert h.job(job_id).state is JobState.SUCCEEDED


def test_a_sync_handler_returning_a_coroutine_has_it_awaited(h: Harness) -> None:
    seen: list[Any] = []

    async def body(payload: Any) -> None:
        await asyncio.sleep(0)
        if payload == "bad":
            raise ValueError("inner boom")
        seen.append(payload)

    def starts_body(payload: Any) -> Any:  # sync: returns the coroutine
        return body(payload)

    h.app.register("a", starts_body)
    assert not h.app.handlers["a"].is_async
    ok = h.app.schedule("a", "good", delay=0)
    h.start()
    assert h.next_result().outcome == "succeeded"
    assert seen == ["good"] and h.job(ok).state is JobState.SUCCEEDED
    bad = h.app.schedule("a", "bad", delay=0, max_attempts=1)
    assert h.next_result().outcome == "dead"
    assert "ValueError: inner boom" in h.job(bad).last_error


def test_a_claim_is_out_of_flight_before_its_lock_is_released_after_the_ack(h: Harness) -> None:
    """A lease renewal waiting for the claim's lock must find the job finished, not
    extend an acked claim (and log a false "lost the lease")."""
    worker_box: list[Worker] = []
    released_in_flight: list[bool] = []

    class WatchedLock:
        def __init__(self, rec: Any) -> None:
            self._lock = threading.Lock()
            self._rec = rec

        def acquire(self, *args: Any) -> bool:
            return self._lock.acquire(*args)

        def release(self) -> None:
            inflight = list(worker_box[0]._table.records.values())
            released_in_flight.append(any(r is self._rec for r in inflight))
            self._lock.release()

        def __enter__(self) -> bool:
            return self.acquire()

        def __exit__(self, *exc: object) -> None:
            self.release()

    def handler(payload: Any) -> None:
        for rec in list(worker_box[0]._table.records.values()):
            if rec.claim.job.id == payload:
                rec.lock = WatchedLock(rec)  # type: ignore[assignment]

    h.app.register("x", handler)
    job_id = h.app.schedule("x", delay=0, job_id="watched", payload="watched")
    h.worker = Worker(h.app, **h.options)
    worker_box.append(h.worker)
    h.worker.start()
    assert h.next_result().outcome == "succeeded"
    assert h.job(job_id).state is JobState.SUCCEEDED
    assert released_in_flight == [False]
