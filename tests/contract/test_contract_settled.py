"""Contract: an expired lease is not "running", and outcomes say when an attempt had started.

A cancel or reschedule that takes effect answers ``done(job.attempts)``; a job
whose lease ran out is settled first (returned to the due set, or buried when
its attempts are used up), exactly as the next claim would. ``release`` keeps
the error of an earlier attempt.
"""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend
from delayq.job import CancelOutcome, JobState, RescheduleOutcome
from delayq.testing import FakeClock
from tests.contract._support import spec, started

pytestmark = pytest.mark.backend_features("definite_cancel")

LEASE = 5.0


def test_cancel_of_a_job_whose_lease_expired_takes_effect_and_says_an_attempt_started(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0)
    claim = started(backend, claim, LEASE)
    assert backend.cancel("j") is CancelOutcome.RUNNING  # the lease is live
    clock.advance(LEASE + 1)
    outcome = backend.cancel("j")
    assert outcome is CancelOutcome.CANCELLED_AFTER_ATTEMPT
    assert outcome.cancelled and outcome.attempt_started
    job = backend.get("j")
    assert job is not None and job.state is JobState.CANCELLED
    assert backend.claim(limit=1, lease=LEASE, now=clock.time()) == []
    assert backend.stats().running == 0
    del claim


def test_reschedule_of_a_job_whose_lease_expired_moves_it_and_says_an_attempt_started(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    started(backend, backend.claim(limit=1, lease=LEASE, now=t0)[0], LEASE)
    clock.advance(LEASE + 1)
    later = clock.time() + 100
    assert backend.reschedule("j", later) is RescheduleOutcome.RESCHEDULED_AFTER_ATTEMPT
    job = backend.get("j")
    assert job is not None and job.state is JobState.SCHEDULED and job.run_at == later
    assert backend.claim(limit=1, lease=LEASE, now=later - 1) == []
    [again] = backend.claim(limit=1, lease=LEASE, now=later)
    assert again.job.attempts == 2


def test_an_expired_lease_on_the_last_attempt_is_dead_so_cancel_says_finished(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0, max_attempts=1)])
    started(backend, backend.claim(limit=1, lease=LEASE, now=t0)[0], LEASE)
    clock.advance(LEASE + 1)
    assert backend.cancel("j") is CancelOutcome.FINISHED
    job = backend.get("j")
    assert job is not None and job.state is JobState.DEAD
    assert "lease expired" in (job.last_error or "")


def test_cancel_of_a_job_waiting_for_its_retry_says_an_attempt_started(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r", t0), spec("n", t0 + 50)])
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.retry(claim, t0 + 60, "boom")
    assert backend.cancel("r") is CancelOutcome.CANCELLED_AFTER_ATTEMPT
    assert backend.cancel("n") is CancelOutcome.CANCELLED
    assert backend.reschedule("n", t0 + 70) is RescheduleOutcome.FINISHED


def test_release_keeps_the_error_of_an_earlier_attempt(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    [first] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.retry(first, t0, "boom: the real error")
    [second] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.release(second)
    job = backend.get("j")
    assert job is not None and job.state is JobState.SCHEDULED and job.attempts == 1
    assert job.last_error == "boom: the real error"
