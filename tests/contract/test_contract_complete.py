"""Group commit: ``Backend.complete`` finishes a batch of claims in one transaction.

Every test receives ``backend`` (one per registered factory) and the test's
``clock`` (a FakeClock). Claims always pass ``now=`` explicitly.
"""

from __future__ import annotations

import math
import threading

import pytest

from delayq.backends.base import Backend, Completion
from delayq.errors import InvalidDelay, InvalidOption, StaleClaim
from delayq.job import Claim, Job, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec
from tests.contract.test_contract import LEASE, Waiter, claim_all, claim_one, ids, state_of

needs_clock = pytest.mark.backend_features("clock")


def job_of(backend: Backend, job_id: str) -> Job:
    job = backend.get(job_id)
    assert job is not None, job_id
    return job


# -- applying a batch -----------------------------------------------------------------


def test_complete_acks_every_claim_of_a_batch(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0) for i in range(5)])
    claims = claim_all(backend, t0)
    results = backend.complete([Completion.ack(c, outcome=f"done {c.job.id}") for c in claims])
    assert results == [None] * 5
    for i in range(5):
        job = job_of(backend, f"j{i}")
        assert (job.state, job.outcome, job.lease_until) == (
            JobState.SUCCEEDED,
            f"done j{i}",
            None,
        )
    assert backend.stats().running == 0
    assert claim_all(backend, t0 + 1000) == []


def test_complete_applies_ack_skip_retry_and_bury_in_one_batch(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec(name, t0) for name in ("ok", "late", "flaky", "bad")])
    ok, late, flaky, bad = claim_all(backend, t0)
    results = backend.complete(
        [
            Completion.ack(ok),
            Completion.ack(late, state=JobState.SKIPPED, outcome="skipped: 300s late"),
            Completion.retry(flaky, t0 + 5, "HTTP 503"),
            Completion.bury(bad, "ValueError: no such order"),
        ]
    )
    assert results == [None, None, None, None]
    assert job_of(backend, "ok").state is JobState.SUCCEEDED
    skipped = job_of(backend, "late")
    assert (skipped.state, skipped.outcome) == (JobState.SKIPPED, "skipped: 300s late")
    retried = job_of(backend, "flaky")
    assert (retried.state, retried.attempts, retried.last_error) == (
        JobState.SCHEDULED,
        1,
        "HTTP 503",
    )
    assert retried.run_at == pytest.approx(t0 + 5)
    [dead] = backend.dead_letters()
    assert (dead.id, dead.last_error) == ("bad", "ValueError: no such order")
    assert claim_all(backend, t0 + 4.9) == []
    again = claim_one(backend, t0 + 5)
    assert (again.job.id, again.attempt) == ("flaky", 2)


def test_complete_of_an_empty_batch_does_nothing(backend: Backend) -> None:
    assert backend.complete([]) == []


# -- stale tokens -----------------------------------------------------------------


def test_complete_reports_a_stale_token_in_its_slot_and_applies_the_others(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0), spec("b", t0), spec("c", t0 + 5)])
    first_a, first_b = claim_all(backend, t0)  # a and b, leased until t0 + 30
    later = claim_all(backend, t0 + LEASE)  # a and b return with fresh tokens; c is due
    assert sorted(ids(later)) == ["a", "b", "c"]
    current = {c.job.id: c for c in later}
    results = backend.complete(
        [
            Completion.ack(current["c"]),
            Completion.ack(first_a),  # stale: "a" is held by a newer claim
            Completion.retry(current["b"], t0 + 100, "again"),
            Completion.bury(first_b, "too late"),  # stale too
        ]
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StaleClaim) and "'a'" in str(results[1])
    assert isinstance(results[3], StaleClaim) and "'b'" in str(results[3])
    assert state_of(backend, "c") is JobState.SUCCEEDED
    assert state_of(backend, "a") is JobState.RUNNING  # untouched by the stale ack
    assert state_of(backend, "b") is JobState.SCHEDULED  # the fresh retry applied
    assert backend.dead_letters() == []
    assert backend.complete([Completion.ack(current["a"])]) == [None]
    assert state_of(backend, "a") is JobState.SUCCEEDED


def test_a_claim_given_twice_in_one_batch_is_applied_once(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim = claim_one(backend, t0)
    first, second = backend.complete([Completion.ack(claim), Completion.bury(claim, "x")])
    assert first is None and isinstance(second, StaleClaim)
    assert state_of(backend, "j") is JobState.SUCCEEDED
    assert backend.dead_letters() == []


def test_complete_with_only_stale_claims_changes_nothing(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim = claim_one(backend, t0)
    backend.ack(claim)
    results = backend.complete([Completion.retry(claim, t0 + 5, "again")])
    assert len(results) == 1 and isinstance(results[0], StaleClaim)
    assert state_of(backend, "j") is JobState.SUCCEEDED
    assert backend.next_due() is None


# -- all or nothing ---------------------------------------------------------------


def test_an_entry_that_is_not_a_completion_rejects_the_whole_batch(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim = claim_one(backend, t0)
    with pytest.raises(InvalidOption, match="entry 1 is a Claim"):
        backend.complete([Completion.ack(claim), claim])  # type: ignore[list-item]
    assert state_of(backend, "j") is JobState.RUNNING


@pytest.mark.backend_features("inspect")
def test_a_concurrent_reader_sees_a_batch_all_applied_or_not_at_all(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    n = 200
    backend.enqueue([spec(f"j{i}", t0) for i in range(n)])
    claims = backend.claim(limit=n, lease=LEASE, now=t0)
    assert len(claims) == n
    seen: set[int] = set()
    reading = threading.Event()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(backend.stats().succeeded)
            reading.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert reading.wait(10)
    assert backend.complete([Completion.ack(c) for c in claims]) == [None] * n
    done.set()
    reader.join(10)
    seen.add(backend.stats().succeeded)
    assert seen <= {0, n}, sorted(seen)
    assert n in seen


# -- waking -----------------------------------------------------------------------


@needs_clock
def test_a_retry_in_a_batch_wakes_a_waiter_when_it_becomes_the_earliest_job(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("moved", t0), spec("far", t0 + 3600)])
    claim = claim_one(backend, t0, lease=7200)
    waiter = Waiter(backend, max_wait=7200)
    assert clock.wait_for_waiters(1)
    assert not waiter.done.is_set()
    assert backend.complete([Completion.retry(claim, t0 + 60, "again")]) == [None]
    assert waiter.finished()


# -- building completions (the value type itself) -----------------------------------


def _claim() -> Claim:
    job = Job(
        id="j",
        name="n",
        payload=None,
        run_at=0.0,
        state=JobState.RUNNING,
        attempts=1,
        max_attempts=3,
        backoff={"kind": "exponential"},
        misfire="run",
        created_at=0.0,
        updated_at=0.0,
    )
    return Claim(job, token=1, lease_until=30.0, claimed_at=0.0)


def test_completion_builders_set_the_target_state() -> None:
    claim = _claim()
    assert Completion.ack(claim).state is JobState.SUCCEEDED
    skipped = Completion.ack(claim, state=JobState.SKIPPED, outcome="late")
    assert (skipped.state, skipped.outcome) == (JobState.SKIPPED, "late")
    retry = Completion.retry(claim, 5, "boom")
    assert (retry.state, retry.run_at, retry.error) == (JobState.SCHEDULED, 5.0, "boom")
    assert isinstance(retry.run_at, float)
    assert Completion.bury(claim, "dead").state is JobState.DEAD
    assert Completion(claim, "succeeded").state is JobState.SUCCEEDED  # type: ignore[arg-type]


@pytest.mark.parametrize("state", [JobState.DEAD, JobState.RUNNING, "scheduled", None])
def test_an_ack_completion_rejects_a_state_that_is_not_a_success(state: object) -> None:
    with pytest.raises(InvalidOption, match="SUCCEEDED or SKIPPED"):
        Completion.ack(_claim(), state=state)  # type: ignore[arg-type]


@pytest.mark.parametrize("run_at", [math.nan, math.inf, True, "5", None])
def test_a_retry_completion_rejects_a_due_time_that_is_not_finite(run_at: object) -> None:
    with pytest.raises(InvalidDelay, match="run_at"):
        Completion.retry(_claim(), run_at, "boom")  # type: ignore[arg-type]


def test_a_completion_rejects_fields_that_do_not_fit_its_state() -> None:
    claim = _claim()
    with pytest.raises(InvalidOption, match="state"):
        Completion(claim, JobState.CANCELLED)
    with pytest.raises(InvalidOption, match="error text"):
        Completion.bury(claim, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="run_at is only for a retry"):
        Completion(claim, JobState.SUCCEEDED, run_at=5.0)
    with pytest.raises(InvalidOption, match="an ack takes outcome"):
        Completion(claim, JobState.SUCCEEDED, error="x")
