"""Contract: relative delays on the store's clock, checked specs, and release.

Every test runs against every registered store. ``clock`` is the store's
clock; a producer with another (skewed) clock must not move a relative delay.
"""

from __future__ import annotations

import math

import pytest

from delayq import DelayQ
from delayq.backends.base import Backend, Completion
from delayq.errors import (
    InvalidDelay,
    InvalidInput,
    InvalidJobId,
    InvalidOption,
    InvalidPayload,
    StaleClaim,
)
from delayq.job import JobSpec, JobState, RescheduleOutcome
from delayq.testing import FakeClock
from tests.contract._support import spec, started

LEASE = 30.0


# -- relative delays ------------------------------------------------------------


def test_a_relative_delay_is_due_on_the_store_clock_not_the_producer_estimate(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    skewed_estimate = t0 - 5 + 10  # a producer 5 s behind computed this run_at
    backend.enqueue([JobSpec(id="d", name="x", payload="1", run_at=skewed_estimate, delay=10.0)])
    job = backend.get("d")
    assert job is not None and job.run_at == pytest.approx(t0 + 10)
    assert backend.claim(limit=1, lease=LEASE, now=t0 + 9.9) == []
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0 + 10)
    assert claim.job.id == "d"


def test_a_negative_delay_means_due_now(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([JobSpec(id="n", name="x", payload="1", run_at=0.0, delay=-3.0)])
    job = backend.get("n")
    assert job is not None and job.run_at == pytest.approx(t0)


def test_a_producer_with_a_skewed_clock_schedules_delays_on_the_store_clock(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    producer = DelayQ(backend=backend, clock=FakeClock(t0 - 5.0))
    job_id = producer.schedule("x", None, delay=10)
    job = backend.get(job_id)
    assert job is not None and job.run_at == pytest.approx(t0 + 10)
    assert producer.reschedule(job_id, delay=20) is RescheduleOutcome.RESCHEDULED
    job = backend.get(job_id)
    assert job is not None and job.run_at == pytest.approx(t0 + 20)
    # an absolute at= stays absolute
    assert producer.reschedule(job_id, at=t0 + 50) is RescheduleOutcome.RESCHEDULED
    job = backend.get(job_id)
    assert job is not None and job.run_at == pytest.approx(t0 + 50)


def test_reschedule_with_a_delay_is_relative_to_the_store_clock(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r", t0 + 100)])
    assert backend.reschedule("r", delay=7.5) is RescheduleOutcome.RESCHEDULED
    job = backend.get("r")
    assert job is not None and job.run_at == pytest.approx(t0 + 7.5)


def test_requeue_dead_with_a_delay_is_relative_to_the_store_clock(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("q", t0)])
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.bury(claim, "boom")
    assert backend.requeue_dead("q", delay=4.0)
    job = backend.get("q")
    assert job is not None and job.state is JobState.SCHEDULED
    assert job.run_at == pytest.approx(t0 + 4.0) and job.attempts == 0


@pytest.mark.parametrize(
    ("run_at", "delay"), [(None, None), (1.0, 2.0), (None, float("nan")), (float("inf"), None)]
)
def test_reschedule_and_requeue_need_exactly_one_finite_time(
    backend: Backend, clock: FakeClock, run_at: float | None, delay: float | None
) -> None:
    backend.enqueue([spec("e", clock.time() + 5)])
    with pytest.raises(InvalidInput):
        backend.reschedule("e", run_at, delay=delay)
    with pytest.raises(InvalidInput):
        backend.requeue_dead("e", run_at, delay=delay)


# -- checked specs --------------------------------------------------------------


def _bad(**changes: object) -> JobSpec:
    fields: dict[str, object] = {"id": "bad", "name": "x", "payload": "{}", "run_at": 1.0}
    fields.update(changes)
    return JobSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (_bad(payload="{not json"), InvalidPayload),
        (_bad(payload=b"{}"), InvalidPayload),
        (_bad(id=""), InvalidJobId),
        (_bad(id="a\nb"), InvalidJobId),
        (_bad(id=7), InvalidJobId),
        (_bad(max_attempts=0), InvalidOption),
        (_bad(max_attempts=2**31), InvalidOption),
        (_bad(max_attempts=True), InvalidOption),
        (_bad(run_at=float("nan")), InvalidDelay),
        (_bad(run_at=float("inf")), InvalidDelay),
        (_bad(delay=float("inf")), InvalidDelay),
        (_bad(name=""), InvalidOption),
        (_bad(backoff="fast"), InvalidOption),
        # One checker for every store: delayq errors, never a codec or driver error.
        (_bad(name="x\ud800"), InvalidOption),
        (_bad(misfire="\udcff"), InvalidOption),
        (_bad(payload='"\ud800"'), InvalidPayload),
        (_bad(payload="[" * 100_000 + "]" * 100_000), InvalidPayload),
        (_bad(payload="NaN"), InvalidPayload),
        (_bad(backoff={"kind": object()}), InvalidOption),
        (_bad(backoff={"base": float("nan")}), InvalidOption),
        (_bad(delay=10**400), InvalidDelay),
        (_bad(run_at=10**400), InvalidDelay),
        (_bad(created_at=10**400), InvalidOption),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_enqueue_rejects_a_bad_spec_and_stores_nothing_of_the_batch(
    backend: Backend, clock: FakeClock, bad: JobSpec, error: type[Exception]
) -> None:
    t0 = clock.time()
    with pytest.raises(error):
        backend.enqueue([spec("good1", t0), bad, spec("good2", t0)])
    assert backend.stats().scheduled == 0
    assert backend.get("good1") is None


def test_the_largest_max_attempts_is_accepted(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("big", clock.time(), max_attempts=2**31 - 1)])
    job = backend.get("big")
    assert job is not None and job.max_attempts == 2**31 - 1


# -- release --------------------------------------------------------------------


def test_release_gives_the_attempt_back_and_keeps_the_due_time(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("once", t0, max_attempts=1)])
    [first] = backend.claim(limit=1, lease=LEASE, now=t0 + 1)
    backend.release(first)
    job = backend.get("once")
    assert job is not None
    assert (job.state, job.attempts, job.lease_until) == (JobState.SCHEDULED, 0, None)
    assert job.run_at == pytest.approx(t0)
    [second] = backend.claim(limit=1, lease=LEASE, now=t0 + 2)
    assert second.job.id == "once"
    assert (second.attempt, second.job.max_attempts) == (1, 1)
    assert second.token > first.token


def test_a_released_job_keeps_its_place_in_the_due_order(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0), spec("b", t0), spec("c", t0 + 1)])
    [a] = backend.claim(limit=1, lease=LEASE, now=t0 + 5)
    backend.release(a)
    claims = backend.claim(limit=3, lease=LEASE, now=t0 + 5)
    assert [c.job.id for c in claims] == ["a", "b", "c"]


def test_release_of_a_stale_claim_raises_and_changes_nothing(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("s", t0)])
    [old] = backend.claim(limit=1, lease=1.0, now=t0)
    old = started(backend, old, 1.0)
    [new] = backend.claim(limit=1, lease=LEASE, now=t0 + 2)  # the lease expired
    with pytest.raises(StaleClaim):
        backend.release(old)
    job = backend.get("s")
    assert job is not None and job.state is JobState.RUNNING and job.attempts == 2
    backend.ack(new)


def test_release_is_a_completion_of_a_batch(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r1", t0), spec("r2", t0)])
    r1, r2 = backend.claim(limit=2, lease=LEASE, now=t0)
    assert backend.complete([Completion.release(r1), Completion.ack(r2)]) == [None, None]
    r1_job, r2_job = backend.get("r1"), backend.get("r2")
    assert r1_job is not None and r1_job.state is JobState.SCHEDULED and r1_job.attempts == 0
    assert "returned unstarted" in (r1_job.last_error or "")
    assert r2_job is not None and r2_job.state is JobState.SUCCEEDED


def test_a_release_completion_takes_only_a_due_time_and_a_note() -> None:
    with pytest.raises(InvalidOption):
        Completion(None, JobState.DEAD, error="x", released=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption):
        Completion(None, JobState.SCHEDULED, outcome="x", released=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidDelay):
        Completion(None, JobState.SCHEDULED, run_at=math.nan, released=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption):
        Completion(None, JobState.SCHEDULED, error=5, released=True)  # type: ignore[arg-type]
    ok = Completion(None, JobState.SCHEDULED, run_at=1, error="n", released=True)  # type: ignore[arg-type]
    assert (ok.run_at, ok.error) == (1.0, "n")


def test_a_released_job_is_due_again_at_once(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("w", t0), spec("later", t0 + 60)])
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0)
    backend.release(claim)
    assert backend.next_due() == pytest.approx(t0)
    stats = backend.stats()
    assert (stats.scheduled, stats.running) == (2, 0)
