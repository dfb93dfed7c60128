"""A result the store refuses, and what a stopping worker leaves behind.

On the memory store and a FakeClock; the worker's progress is observed through
its store calls and results, never by sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.errors import BackendError, BackendUnavailable, StaleClaim
from delayq.job import JobState
from delayq.worker._commit import SPLIT_AFTER
from delayq.worker._dispatcher import STOPPED_NOTE
from tests._util import wait_until
from tests.unit._worker_harness import TIMEOUT, Harness


class _RefusesPoison(MemoryBackend):
    """Refuses (a non-transient error) every batch holding an error that says "poison"."""

    refused = 0

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        if any("poison" in (item.error or "") for item in batch):
            self.refused += 1
            raise BackendError("value too long for the store's column (refused)")
        return super().complete(batch)


def test_a_result_the_store_keeps_refusing_is_dead_lettered_with_the_stores_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(_RefusesPoison)
    backend = h.backend
    assert isinstance(backend, _RefusesPoison)

    def poisoned(payload: Any) -> None:
        raise ValueError("poison")

    h.app.register("poisoned", poisoned)
    h.app.register("fine", lambda p: None)
    job_id = h.app.schedule("poisoned", delay=0, backoff=[1])
    try:
        h.start()
        for n in range(1, SPLIT_AFTER + 1):  # the batch fails; retried at 0.1, 0.2, 0.4 s

            def failed(n: int = n) -> bool:
                return caplog.text.count("recording 1 result(s) failed; trying again") == n

            assert wait_until(failed, TIMEOUT)
            h.asleep(2)  # the dispatcher (waiting for the retry) and the lease keeper
            h.clock.advance(0.1 * 2 ** (n - 1) + 0.001)
        result = h.next_result()  # tried alone, refused again: dead-lettered instead
        assert result.job_id == job_id and result.outcome == "dead"
        assert backend.refused == SPLIT_AFTER + 1
        job = h.job(job_id)
        assert job.state is JobState.DEAD
        assert "the store refused to record this attempt's result (retried)" in job.last_error
        assert "value too long" in job.last_error
        fine = h.app.schedule("fine", delay=0)  # the slot is free again
        assert h.next_result().job_id == fine
    finally:
        h.stop()


class _FailsSingleCommits(MemoryBackend):
    """While ``failing``, refuses (unreachable) every commit of a single result."""

    failing = False
    refused = 0

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        if self.failing and len(batch) == 1:
            self.refused += 1
            raise BackendUnavailable("store unreachable")
        return super().complete(batch)


def test_at_the_end_of_the_grace_period_running_jobs_are_released_and_results_recorded() -> None:
    h = Harness(_FailsSingleCommits, grace=5.0)
    backend = h.backend
    assert isinstance(backend, _FailsSingleCommits)
    release = threading.Event()
    started = threading.Event()
    h.app.register("stuck", lambda p: (started.set(), release.wait(TIMEOUT)))
    h.app.register("quick", lambda p: None)
    stuck = h.app.schedule("stuck", delay=0, max_attempts=1)
    try:
        worker = h.start()
        assert started.wait(TIMEOUT)
        backend.failing = True
        quick = h.app.schedule("quick", delay=0)  # runs, but its result cannot be recorded
        assert wait_until(lambda: backend.refused == 1, TIMEOUT)
        worker.stop(wait=False)
        h.clock.advance(5.0)  # the grace period ends: one last call hands everything back
        assert worker.join(TIMEOUT)
        done = h.job(quick)
        assert done.state is JobState.SUCCEEDED  # the finished result, recorded at exit
        left = h.job(stuck)
        assert (left.state, left.attempts) == (JobState.SCHEDULED, 0)  # its one run is still there
        assert left.last_error == STOPPED_NOTE
    finally:
        release.set()
        h.stop()


class _HangingComplete(MemoryBackend):
    """``complete`` hangs until ``release`` is set."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.entered = threading.Event()
        self.release = threading.Event()

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        self.entered.set()
        self.release.wait(TIMEOUT)
        return super().complete(batch)


def test_the_health_snapshot_shows_a_stuck_commit_and_the_result_waiting_for_it() -> None:
    h = Harness(_HangingComplete, max_abandoned=3)
    backend = h.backend
    assert isinstance(backend, _HangingComplete)
    h.app.register("x", lambda p: None)
    try:
        worker = h.start()
        idle = worker.health_snapshot()
        assert (idle.abandoned, idle.abandoned_cap, idle.in_flight) == (0, 3, 0)
        # The dispatcher may be inside its claim at this instant: a call under way,
        # not a stuck one (its age on the unmoved fake clock is 0).
        assert all(idle.now - began == 0 for began in idle.stuck_calls.values())
        assert "committer" not in idle.stuck_calls and idle.oldest_result_waiting is None
        h.app.schedule("x", delay=0)
        assert backend.entered.wait(TIMEOUT)
        h.clock.advance(20)
        health = worker.health_snapshot()
        assert health.now - health.stuck_calls["committer"] == 20  # over lease / 3: stuck
        assert health.oldest_result_waiting is not None
        assert health.now - health.oldest_result_waiting == 20
        assert health.loop_blocked_since is None and "dispatcher" in health.beats
        backend.release.set()
        assert h.next_result().outcome == "succeeded"
        assert wait_until(lambda: worker.health_snapshot().stuck_calls == {}, TIMEOUT)
    finally:
        backend.release.set()
        h.stop()


class _ReportingStore(MemoryBackend):
    """A store with a part of its own (like RabbitMQ's consumer thread) that went deaf."""

    def health(self) -> dict[str, object]:
        return {"alive": False, "resubscribes": 2}


def test_the_health_snapshot_carries_what_the_store_reports_of_its_own_parts() -> None:
    h = Harness(_ReportingStore)
    plain = Harness(MemoryBackend)
    try:
        assert h.start().health_snapshot().store == {"alive": False, "resubscribes": 2}
        assert plain.start().health_snapshot().store == {}
    finally:
        h.stop()
        plain.stop()
