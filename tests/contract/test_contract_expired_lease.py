"""Contract: an expired lease is not "running"; answers say when an attempt had started.

A job whose worker died keeps reading RUNNING until something ends its lease.
Cancel and reschedule end it themselves: they take effect and say that an
attempt had started (its handler may have run). Release keeps an earlier
attempt's error.
"""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend
from delayq.errors import StaleClaim
from delayq.job import CancelOutcome, JobState, RescheduleOutcome
from delayq.testing import FakeClock
from tests.contract._support import spec

pytestmark = pytest.mark.backend_features("clock", "definite_cancel")

LEASE = 10.0


def test_cancel_takes_effect_on_a_job_whose_lease_expired(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("j", clock.time())])
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    clock.advance(LEASE + 1)  # its worker died; no claim has run since
    assert backend.cancel("j") is CancelOutcome.CANCELLED_AFTER_ATTEMPT
    job = backend.get("j")
    assert job is not None and job.state is JobState.CANCELLED and job.attempts == 1
    with pytest.raises(StaleClaim):
        backend.ack(claim)
    assert backend.claim(limit=1, lease=LEASE, now=clock.time()) == []


def test_reschedule_takes_effect_on_a_job_whose_lease_expired(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("j", clock.time())])
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    clock.advance(LEASE + 1)
    later = clock.time() + 60
    assert backend.reschedule("j", later) is RescheduleOutcome.RESCHEDULED_AFTER_ATTEMPT
    job = backend.get("j")
    assert job is not None and job.state is JobState.SCHEDULED
    assert job.run_at == pytest.approx(later) and job.attempts == 1
    with pytest.raises(StaleClaim):
        backend.ack(claim)
    assert backend.claim(limit=1, lease=LEASE, now=clock.time()) == []


def test_a_live_lease_is_still_running(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time())])
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    clock.advance(LEASE - 1)
    assert backend.cancel("j") is CancelOutcome.RUNNING
    assert backend.reschedule("j", clock.time() + 60) is RescheduleOutcome.RUNNING
    backend.ack(claim)


def test_an_expired_last_attempt_is_finished_not_cancelled(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("j", clock.time(), max_attempts=1)])
    backend.claim(limit=1, lease=LEASE, now=clock.time())
    clock.advance(LEASE + 1)
    assert backend.cancel("j") is CancelOutcome.FINISHED
    job = backend.get("j")
    assert job is not None and job.state is JobState.DEAD
    assert "lease expired" in (job.last_error or "")


def test_cancel_says_whether_an_attempt_had_started(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("fresh", t0 + 60), spec("retried", t0)])
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.retry(claim, t0 + 30, "boom")
    assert backend.cancel("fresh") is CancelOutcome.CANCELLED
    assert backend.cancel("retried") is CancelOutcome.CANCELLED_AFTER_ATTEMPT
    assert not CancelOutcome.CANCELLED.attempt_started
    assert CancelOutcome.CANCELLED_AFTER_ATTEMPT.attempt_started


def test_release_keeps_the_error_of_an_earlier_attempt(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    [first] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.retry(first, t0, "ValueError: the real reason")
    [second] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.release(second)
    job = backend.get("j")
    assert job is not None and job.state is JobState.SCHEDULED and job.attempts == 1
    assert job.last_error == "ValueError: the real reason"
