"""Batched renewals, and attempts counted from the handler's start (``attempt_at_start``).

See the rules "Batched renewals" and "Attempts count from the start" in
``delayq.backends.base``.
"""

from __future__ import annotations

import pytest

from delayq.backends._common import MAX_UNSTARTED
from delayq.backends.base import Backend, Completion
from delayq.errors import StaleClaim
from delayq.job import CancelOutcome, Claim, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec

needs_clock = pytest.mark.backend_features("clock")

LEASE = 30.0


def claim_all(backend: Backend, now: float, limit: int = 100, lease: float = LEASE) -> list[Claim]:
    return backend.claim(limit=limit, lease=lease, now=now)


@needs_clock
def test_extend_many_renews_each_claim_and_reports_stale_ones(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0), spec("b", t0), spec("c", t0)])
    a, b, c = claim_all(backend, t0, lease=10)
    backend.ack(b)  # b's claim is no longer current
    clock.advance(8)
    answers = backend.extend_many([a, b, c], 10)
    assert len(answers) == 3
    renewed_a, stale_b, renewed_c = answers
    assert isinstance(stale_b, StaleClaim)
    assert isinstance(renewed_a, Claim) and isinstance(renewed_c, Claim)
    assert (renewed_a.token, renewed_c.token) == (a.token, c.token)
    assert renewed_a.lease_until == pytest.approx(t0 + 18)
    assert renewed_c.lease_until == pytest.approx(t0 + 18)
    assert claim_all(backend, t0 + 15) == []  # both leases live on
    assert backend.extend_many([], 10) == []
    backend.ack(renewed_a)
    backend.ack(renewed_c)
    job = backend.get("a")
    assert job is not None and job.state is JobState.SUCCEEDED


needs_attempt_at_start = pytest.mark.backend_features("clock", "attempt_at_start")


@needs_attempt_at_start
def test_an_expired_lease_without_a_recorded_start_gives_the_attempt_back(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    [first] = claim_all(backend, t0, lease=10)
    assert first.attempt == 1
    clock.advance(20)
    [again] = claim_all(backend, t0 + 20)  # the holder never started it: no attempt used
    assert again.job.id == "j" and again.attempt == 1 and again.token > first.token
    assert again.job.run_at == t0  # due at its own time: its place kept
    assert "before the handler was recorded as started" in (again.job.last_error or "")


@needs_attempt_at_start
def test_an_expired_lease_after_a_recorded_start_counts_the_attempt(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    [first] = claim_all(backend, t0, lease=10)
    [marked] = backend.extend_many([first], 10, started={first.token})
    assert isinstance(marked, Claim)
    clock.advance(20)
    [again] = claim_all(backend, t0 + 20)
    assert again.attempt == 2
    assert "lease expired" in (again.job.last_error or "")


@needs_attempt_at_start
def test_max_attempts_1_job_whose_claim_expired_unstarted_still_runs(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("once", t0, max_attempts=1)])
    claim_all(backend, t0, lease=10)  # a prefetched claim whose worker paused past its lease
    clock.advance(20)
    [again] = claim_all(backend, t0 + 20)
    assert again.attempt == 1  # its one attempt is still there
    backend.ack(again)
    job = backend.get("once")
    assert job is not None and job.state is JobState.SUCCEEDED and job.attempts == 1


@needs_attempt_at_start
def test_a_job_whose_leases_keep_expiring_unstarted_is_buried_after_max_unstarted(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("killer", t0, max_attempts=3)])
    for _ in range(MAX_UNSTARTED):
        [claim] = claim_all(backend, clock.time(), lease=10)
        assert claim.attempt == 1
        clock.advance(20)
    assert claim_all(backend, clock.time()) == []
    job = backend.get("killer")
    assert job is not None and job.state is JobState.DEAD and job.attempts == 0
    assert f"MAX_UNSTARTED={MAX_UNSTARTED}" in (job.last_error or "")
    assert backend.requeue_dead("killer", clock.time())
    [fresh] = claim_all(backend, clock.time(), lease=10)
    clock.advance(20)
    assert [c.attempt for c in claim_all(backend, clock.time())] == [1]  # the count was reset
    del fresh


@needs_attempt_at_start
def test_cancel_of_a_job_whose_unstarted_lease_expired_says_no_attempt_started(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim_all(backend, t0, lease=10)
    clock.advance(20)
    assert backend.cancel("j") is CancelOutcome.CANCELLED


@needs_attempt_at_start
def test_release_with_run_at_and_note_is_due_then_and_keeps_the_attempt(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r", t0)])
    [claim] = claim_all(backend, t0)
    note = "unknown handler, handed back"
    assert backend.complete([Completion.release(claim, run_at=t0 + 50, note=note)]) == [None]
    job = backend.get("r")
    assert job is not None and job.state is JobState.SCHEDULED
    assert (job.run_at, job.attempts, job.last_error) == (t0 + 50, 0, note)
    assert claim_all(backend, t0 + 49) == []
    [again] = claim_all(backend, t0 + 50)
    assert again.attempt == 1


@needs_clock
def test_an_error_with_a_nul_is_stored_with_the_nul_escaped_on_every_store(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("n", t0)])
    [claim] = claim_all(backend, t0)
    backend.retry(claim, t0 + 5, "upstream said: \x00!")
    job = backend.get("n")
    assert job is not None and job.last_error == "upstream said: \\x00!"
