"""The backend contract (``delayq.backends.base``), checked against every registered store.

Every test receives ``backend`` (one per registered factory) and the test's
``clock`` (a FakeClock). Claims always pass ``now=`` explicitly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from delayq.backends.base import Backend
from delayq.errors import InvalidOption, JobConflict, QueueClosed, StaleClaim
from delayq.job import CancelOutcome, Claim, EnqueueOutcome, JobState, RescheduleOutcome
from delayq.testing import FakeClock
from tests.contract._support import spec, started

needs_clock = pytest.mark.backend_features("clock")

LEASE = 30.0


def claim_all(backend: Backend, now: float, limit: int = 100) -> list[Claim]:
    return backend.claim(limit=limit, lease=LEASE, now=now)


def claim_one(backend: Backend, now: float, lease: float = LEASE) -> Claim:
    claims = backend.claim(limit=1, lease=lease, now=now)
    assert len(claims) == 1, claims
    return claims[0]


def ids(claims: list[Claim]) -> list[str]:
    return [c.job.id for c in claims]


def state_of(backend: Backend, job_id: str) -> JobState | None:
    job = backend.get(job_id)
    return None if job is None else job.state


# -- enqueue and get ----------------------------------------------------------------


def test_enqueued_job_reads_back_with_every_field(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    payload = {"order": 42, "items": ["a", "ü"], "nested": {"ok": True, "n": None, "x": 1.5}}
    [outcome] = backend.enqueue(
        [spec("j1", t0 + 60, name="order.cancel", payload=payload, max_attempts=7, created_at=t0)]
    )
    assert outcome is EnqueueOutcome.CREATED
    job = backend.get("j1")
    assert job is not None
    assert (job.id, job.name, job.payload) == ("j1", "order.cancel", payload)
    assert job.run_at == pytest.approx(t0 + 60)
    assert job.state is JobState.SCHEDULED
    assert (job.attempts, job.max_attempts) == (0, 7)
    assert job.backoff == {"kind": "exponential"}
    assert job.misfire == "run"
    assert job.created_at == pytest.approx(t0)
    assert job.last_error is None and job.lease_until is None


def test_get_of_unknown_id_returns_none(backend: Backend) -> None:
    assert backend.get("nope") is None


def test_enqueue_returns_one_created_outcome_per_job(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    outcomes = backend.enqueue([spec(f"j{i}", t0 + i) for i in range(5)])
    assert outcomes == [EnqueueOutcome.CREATED] * 5
    assert backend.stats().scheduled == 5


def test_enqueue_of_an_empty_batch_stores_nothing(backend: Backend) -> None:
    assert backend.enqueue([]) == []
    assert backend.stats().scheduled == 0


def test_reject_conflict_raises_and_stores_nothing_of_the_batch(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("dup", t0 + 5)])
    with pytest.raises(JobConflict, match="dup"):
        backend.enqueue([spec("new1", t0), spec("dup", t0 + 1), spec("new2", t0)])
    assert backend.get("new1") is None and backend.get("new2") is None
    job = backend.get("dup")
    assert job is not None and job.run_at == pytest.approx(t0 + 5)


def test_reject_is_the_default_on_conflict(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("a", clock.time())])
    with pytest.raises(JobConflict):
        backend.enqueue([spec("a", clock.time())])


def test_a_repeated_id_within_one_batch_conflicts_with_itself(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    with pytest.raises(JobConflict):
        backend.enqueue([spec("x", t0), spec("x", t0 + 1)])
    assert backend.get("x") is None
    outcomes = backend.enqueue([spec("x", t0), spec("x", t0 + 1)], on_conflict="keep")
    assert outcomes == [EnqueueOutcome.CREATED, EnqueueOutcome.KEPT]
    job = backend.get("x")
    assert job is not None and job.run_at == pytest.approx(t0)


def test_keep_leaves_the_existing_job_untouched(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("k", t0 + 5, payload={"v": 1})])
    outcomes = backend.enqueue(
        [spec("k", t0 + 99, payload={"v": 2}), spec("other", t0)], on_conflict="keep"
    )
    assert outcomes == [EnqueueOutcome.KEPT, EnqueueOutcome.CREATED]
    job = backend.get("k")
    assert job is not None
    assert job.run_at == pytest.approx(t0 + 5)
    assert job.payload == {"v": 1}


def test_keep_leaves_a_finished_job_finished(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("k", t0)])
    backend.ack(claim_one(backend, t0))
    assert backend.enqueue([spec("k", t0)], on_conflict="keep") == [EnqueueOutcome.KEPT]
    assert state_of(backend, "k") is JobState.SUCCEEDED
    assert claim_all(backend, t0 + 1) == []


def test_replace_overwrites_a_scheduled_job_and_resets_attempts(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r", t0, payload={"v": 1})])
    backend.retry(claim_one(backend, t0), t0 + 100, "boom")
    outcomes = backend.enqueue([spec("r", t0 + 10, payload={"v": 2})], on_conflict="replace")
    assert outcomes == [EnqueueOutcome.REPLACED]
    job = backend.get("r")
    assert job is not None
    assert (job.state, job.attempts, job.payload) == (JobState.SCHEDULED, 0, {"v": 2})
    assert job.run_at == pytest.approx(t0 + 10)
    assert job.last_error is None
    assert claim_all(backend, t0 + 9) == []
    assert ids(claim_all(backend, t0 + 10)) == ["r"]


def test_replace_of_a_running_job_raises_conflict_and_stores_nothing_of_the_batch(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("run", t0)])
    claim = claim_one(backend, t0)
    with pytest.raises(JobConflict, match="run"):
        backend.enqueue([spec("fresh", t0), spec("run", t0 + 50)], on_conflict="replace")
    assert backend.get("fresh") is None
    assert state_of(backend, "run") is JobState.RUNNING
    backend.ack(claim)  # the claim is still current


def test_replace_of_a_finished_job_schedules_it_again(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("f", t0)])
    backend.ack(claim_one(backend, t0))
    assert backend.enqueue([spec("f", t0 + 1)], on_conflict="replace") == [EnqueueOutcome.REPLACED]
    assert state_of(backend, "f") is JobState.SCHEDULED
    assert ids(claim_all(backend, t0 + 1)) == ["f"]


def test_unknown_on_conflict_is_rejected(backend: Backend, clock: FakeClock) -> None:
    with pytest.raises(InvalidOption, match="on_conflict"):
        backend.enqueue([spec("a", clock.time())], on_conflict="overwrite")  # type: ignore[arg-type]
    assert backend.get("a") is None


# -- claim ------------------------------------------------------------------------


def test_claim_never_returns_a_job_before_its_due_time(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("later", t0 + 10)])
    assert claim_all(backend, t0) == []
    assert claim_all(backend, t0 + 9.999) == []
    assert ids(claim_all(backend, t0 + 10)) == ["later"]


def test_claims_come_in_run_at_order_with_fifo_ties(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("c", t0 + 3), spec("tie1", t0 + 1), spec("a", t0 + 0.5)])
    backend.enqueue([spec("tie2", t0 + 1)])
    backend.enqueue([spec("tie3", t0 + 1), spec("b", t0 + 2)])
    assert ids(claim_all(backend, t0 + 5)) == ["a", "tie1", "tie2", "tie3", "b", "c"]


def test_claim_returns_at_most_limit_jobs_earliest_first(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0 + i / 10) for i in range(7)])
    first = backend.claim(limit=3, lease=LEASE, now=t0 + 1)
    assert ids(first) == ["j0", "j1", "j2"]
    assert ids(backend.claim(limit=10, lease=LEASE, now=t0 + 1)) == ["j3", "j4", "j5", "j6"]


def test_claim_moves_the_job_to_running_under_a_lease(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim = claim_one(backend, t0 + 2, lease=15)
    assert claim.job.state is JobState.RUNNING
    assert claim.attempt == 1
    assert claim.claimed_at == pytest.approx(t0 + 2)
    assert claim.lease_until == pytest.approx(t0 + 17)
    job = backend.get("j")
    assert job is not None and job.state is JobState.RUNNING and job.attempts == 1
    assert job.lease_until == pytest.approx(t0 + 17)


def test_a_claimed_job_is_not_claimed_again_while_its_lease_lives(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim_one(backend, t0, lease=10)
    assert claim_all(backend, t0 + 9.9) == []


def test_fencing_tokens_increase_with_every_claim(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0) for i in range(3)])
    tokens = [c.token for c in claim_all(backend, t0)]
    backend.enqueue([spec("late", t0)])
    tokens.append(claim_one(backend, t0).token)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(set(tokens))


def test_claim_rejects_bad_limit_and_lease(backend: Backend, clock: FakeClock) -> None:
    with pytest.raises(InvalidOption, match="limit"):
        backend.claim(limit=0, lease=LEASE, now=clock.time())
    with pytest.raises(InvalidOption, match="lease"):
        backend.claim(limit=1, lease=0, now=clock.time())


# -- leases and fencing -----------------------------------------------------------


def test_an_expired_lease_returns_the_job_with_a_fresh_token(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("crashy", t0, max_attempts=3)])
    first = started(backend, claim_one(backend, t0, lease=10), 10)
    second = claim_one(backend, t0 + 10)
    assert second.job.id == "crashy"
    assert second.token > first.token
    assert second.attempt == 2
    assert second.job.last_error is not None and "lease expired" in second.job.last_error


def test_expired_lease_with_attempts_used_up_buries_the_job(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("doomed", t0, max_attempts=2)])
    started(backend, claim_one(backend, t0, lease=10), 10)
    clock.advance(10)
    started(backend, claim_one(backend, t0 + 10, lease=10), 10)
    assert claim_all(backend, t0 + 20) == []
    job = backend.get("doomed")
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error is not None
    assert "lease expired" in job.last_error and "after 2 attempts" in job.last_error
    assert [j.id for j in backend.dead_letters()] == ["doomed"]


@pytest.mark.parametrize("operation", ["ack", "retry", "bury", "extend"])
def test_a_stale_token_is_rejected(backend: Backend, clock: FakeClock, operation: str) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    stale = claim_one(backend, t0, lease=10)
    current = claim_one(backend, t0 + 10)
    calls: dict[str, Callable[[], object]] = {
        "ack": lambda: backend.ack(stale),
        "retry": lambda: backend.retry(stale, t0 + 100, "late"),
        "bury": lambda: backend.bury(stale, "late"),
        "extend": lambda: backend.extend(stale, 10),
    }
    with pytest.raises(StaleClaim, match="'j'"):
        calls[operation]()
    job = backend.get("j")
    assert job is not None and job.state is JobState.RUNNING
    backend.ack(current)
    assert state_of(backend, "j") is JobState.SUCCEEDED


@pytest.mark.parametrize("operation", ["ack", "retry", "bury", "extend"])
def test_a_finished_claim_cannot_be_used_again(
    backend: Backend, clock: FakeClock, operation: str
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim = claim_one(backend, t0)
    backend.ack(claim)
    calls: dict[str, Callable[[], object]] = {
        "ack": lambda: backend.ack(claim),
        "retry": lambda: backend.retry(claim, t0 + 100, "again"),
        "bury": lambda: backend.bury(claim, "again"),
        "extend": lambda: backend.extend(claim, 10),
    }
    with pytest.raises(StaleClaim):
        calls[operation]()
    assert state_of(backend, "j") is JobState.SUCCEEDED


def test_ack_after_the_lease_ran_out_is_accepted_while_nobody_else_claimed(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("slow", t0)])
    claim = claim_one(backend, t0, lease=5)
    clock.advance(10)
    backend.ack(claim)
    assert state_of(backend, "slow") is JobState.SUCCEEDED
    assert claim_all(backend, t0 + 100) == []


@needs_clock
def test_extend_keeps_the_lease_alive(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("long", t0)])
    claim = claim_one(backend, t0, lease=10)
    clock.advance(8)
    extended = backend.extend(claim, 10)
    assert extended.token == claim.token
    assert extended.lease_until == pytest.approx(t0 + 18)
    assert claim_all(backend, t0 + 15) == []
    backend.ack(extended)
    assert state_of(backend, "long") is JobState.SUCCEEDED


def test_extend_rejects_a_bad_lease(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time())])
    claim = claim_one(backend, clock.time())
    with pytest.raises(InvalidOption, match="lease"):
        backend.extend(claim, -1)


# -- finishing a claim ------------------------------------------------------------


def test_ack_marks_the_job_succeeded_with_its_outcome(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    backend.ack(claim_one(backend, t0), outcome="done in 3 ms")
    job = backend.get("j")
    assert job is not None
    assert (job.state, job.outcome, job.lease_until) == (JobState.SUCCEEDED, "done in 3 ms", None)
    assert claim_all(backend, t0 + 1000) == []


def test_ack_as_skipped_records_the_misfire_note(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    backend.ack(claim_one(backend, t0 + 300), state=JobState.SKIPPED, outcome="skipped: 300s late")
    job = backend.get("j")
    assert job is not None and (job.state, job.outcome) == (JobState.SKIPPED, "skipped: 300s late")


def test_ack_rejects_a_state_that_is_not_a_success(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time())])
    claim = claim_one(backend, clock.time())
    with pytest.raises(InvalidOption):
        backend.ack(claim, state=JobState.DEAD)
    assert state_of(backend, "j") is JobState.RUNNING


def test_retry_reschedules_the_job_with_its_error_recorded(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("flaky", t0)])
    backend.retry(claim_one(backend, t0), t0 + 5, "HTTP 503")
    job = backend.get("flaky")
    assert job is not None
    assert (job.state, job.attempts, job.last_error) == (JobState.SCHEDULED, 1, "HTTP 503")
    assert job.run_at == pytest.approx(t0 + 5)
    assert claim_all(backend, t0 + 4.9) == []
    again = claim_one(backend, t0 + 5)
    assert again.attempt == 2


def test_bury_moves_the_job_to_the_dead_letters_with_its_error(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("bad", t0), spec("good", t0 + 1)])
    backend.bury(claim_one(backend, t0), "ValueError: no such order\nTraceback ...")
    dead = backend.dead_letters()
    assert [j.id for j in dead] == ["bad"]
    assert dead[0].state is JobState.DEAD
    assert dead[0].last_error == "ValueError: no such order\nTraceback ..."
    assert ids(claim_all(backend, t0 + 1000)) == ["good"]


# -- dead letters -----------------------------------------------------------------


def bury_at(backend: Backend, clock: FakeClock, job_id: str) -> None:
    backend.enqueue([spec(job_id, clock.time())])
    backend.bury(claim_one(backend, clock.time()), f"{job_id} failed")


@needs_clock
def test_dead_letters_come_most_recently_buried_first(backend: Backend, clock: FakeClock) -> None:
    for name in ("d1", "d2", "d3"):
        bury_at(backend, clock, name)
        clock.advance(1)
    assert [j.id for j in backend.dead_letters()] == ["d3", "d2", "d1"]
    assert [j.id for j in backend.dead_letters(limit=2)] == ["d3", "d2"]


def test_requeue_dead_schedules_the_job_again_with_attempts_reset(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    bury_at(backend, clock, "d")
    assert backend.requeue_dead("d", t0 + 5) is True
    job = backend.get("d")
    assert job is not None and (job.state, job.attempts) == (JobState.SCHEDULED, 0)
    assert backend.dead_letters() == []
    assert claim_all(backend, t0 + 4) == []
    assert claim_one(backend, t0 + 5).attempt == 1


def test_requeue_dead_is_false_for_a_job_that_is_not_dead(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("alive", clock.time())])
    assert backend.requeue_dead("alive", clock.time()) is False
    assert backend.requeue_dead("missing", clock.time()) is False
    assert state_of(backend, "alive") is JobState.SCHEDULED


def test_purge_dead_deletes_all_dead_jobs_and_nothing_else(
    backend: Backend, clock: FakeClock
) -> None:
    bury_at(backend, clock, "d1")
    bury_at(backend, clock, "d2")
    backend.enqueue([spec("live", clock.time() + 10)])
    assert backend.purge_dead() == 2
    assert backend.get("d1") is None and backend.get("d2") is None
    assert state_of(backend, "live") is JobState.SCHEDULED


def test_purge_dead_by_ids_deletes_only_those(backend: Backend, clock: FakeClock) -> None:
    bury_at(backend, clock, "d1")
    bury_at(backend, clock, "d2")
    backend.enqueue([spec("live", clock.time() + 10)])
    assert backend.purge_dead(job_ids=["d1", "live", "missing"]) == 1
    assert [j.id for j in backend.dead_letters()] == ["d2"]
    assert state_of(backend, "live") is JobState.SCHEDULED


@needs_clock
def test_purge_dead_older_than_keeps_recent_dead_letters(
    backend: Backend, clock: FakeClock
) -> None:
    bury_at(backend, clock, "old")
    clock.advance(100)
    bury_at(backend, clock, "new")
    assert backend.purge_dead(older_than=clock.time() - 50) == 1
    assert [j.id for j in backend.dead_letters()] == ["new"]


# -- cancel and reschedule ----------------------------------------------------------


def test_cancel_of_a_scheduled_job_cancels_it(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("c", t0 + 5)])
    assert backend.cancel("c") is CancelOutcome.CANCELLED
    assert state_of(backend, "c") is JobState.CANCELLED
    assert claim_all(backend, t0 + 100) == []
    assert backend.next_due() is None


def test_cancel_after_claim_reports_running(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("c", clock.time())])
    claim = claim_one(backend, clock.time())
    assert backend.cancel("c") is CancelOutcome.RUNNING
    backend.ack(claim)


@pytest.mark.parametrize("ending", ["ack", "bury", "cancel"])
def test_cancel_of_a_finished_job_reports_finished(
    backend: Backend, clock: FakeClock, ending: str
) -> None:
    backend.enqueue([spec("c", clock.time())])
    if ending == "cancel":
        backend.cancel("c")
    else:
        claim = claim_one(backend, clock.time())
        backend.ack(claim) if ending == "ack" else backend.bury(claim, "x")
    assert backend.cancel("c") is CancelOutcome.FINISHED


def test_cancel_of_an_unknown_job_reports_not_found(backend: Backend) -> None:
    assert backend.cancel("ghost") is CancelOutcome.NOT_FOUND


def test_reschedule_moves_a_scheduled_job_later(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r", t0 + 5)])
    assert backend.reschedule("r", t0 + 50) is RescheduleOutcome.RESCHEDULED
    assert claim_all(backend, t0 + 49) == []
    assert ids(claim_all(backend, t0 + 50)) == ["r"]


def test_reschedule_moves_a_scheduled_job_earlier(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("r", t0 + 500)])
    assert backend.reschedule("r", t0 + 1) is RescheduleOutcome.RESCHEDULED
    assert backend.next_due() == pytest.approx(t0 + 1)
    assert ids(claim_all(backend, t0 + 1)) == ["r"]


def test_reschedule_reports_running_finished_and_not_found(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("run", t0), spec("done", t0 + 1)])
    claim_one(backend, t0)
    backend.ack(claim_one(backend, t0 + 1))
    assert backend.reschedule("run", t0 + 99) is RescheduleOutcome.RUNNING
    assert backend.reschedule("done", t0 + 99) is RescheduleOutcome.FINISHED
    assert backend.reschedule("ghost", t0 + 99) is RescheduleOutcome.NOT_FOUND
    assert state_of(backend, "done") is JobState.SUCCEEDED


# -- inspection -------------------------------------------------------------------


def test_stats_count_every_state(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0 + i) for i in range(8)])
    backend.ack(claim_one(backend, t0))  # j0 succeeded
    backend.ack(claim_one(backend, t0 + 1), state=JobState.SKIPPED)  # j1 skipped
    backend.bury(claim_one(backend, t0 + 2), "x")  # j2 dead
    claim_one(backend, t0 + 3)  # j3 running
    backend.cancel("j4")
    stats = backend.stats()
    assert (stats.scheduled, stats.running) == (3, 1)
    assert (stats.succeeded, stats.skipped, stats.dead, stats.cancelled) == (1, 1, 1, 1)
    assert stats.next_due == pytest.approx(t0 + 5)


@needs_clock
def test_stats_count_due_jobs_on_the_backend_clock(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0 - 1), spec("b", t0), spec("c", t0 + 1)])
    assert backend.stats().due == 2
    clock.advance(1)
    assert backend.stats().due == 3


def test_stats_of_an_empty_store_are_zero(backend: Backend) -> None:
    stats = backend.stats()
    assert stats.as_dict() == {
        "scheduled": 0,
        "due": 0,
        "running": 0,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
        "skipped": 0,
        "next_due": None,
    }


def test_list_jobs_filters_by_state_in_run_at_order(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("c", t0 + 3), spec("a", t0 + 1), spec("b", t0 + 2), spec("z", t0)])
    claim_one(backend, t0)  # z running
    assert [j.id for j in backend.list_jobs(state=JobState.SCHEDULED)] == ["a", "b", "c"]
    assert [j.id for j in backend.list_jobs(state=JobState.RUNNING)] == ["z"]
    assert [j.id for j in backend.list_jobs()] == ["z", "a", "b", "c"]
    assert backend.list_jobs(state=JobState.DEAD) == []


def test_list_jobs_filters_by_a_half_open_due_window(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0 + i) for i in range(6)])
    window = backend.list_jobs(due_after=t0 + 1, due_before=t0 + 4)
    assert [j.id for j in window] == ["j1", "j2", "j3"]
    assert [j.id for j in backend.list_jobs(due_after=t0 + 4)] == ["j4", "j5"]
    assert [j.id for j in backend.list_jobs(due_before=t0 + 1)] == ["j0"]


def test_list_jobs_respects_limit(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0 + i) for i in range(6)])
    assert [j.id for j in backend.list_jobs(limit=2)] == ["j0", "j1"]


def test_next_due_is_the_earliest_scheduled_job(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    assert backend.next_due() is None
    backend.enqueue([spec("b", t0 + 20), spec("a", t0 + 10)])
    assert backend.next_due() == pytest.approx(t0 + 10)
    claim_one(backend, t0 + 10)
    assert backend.next_due() == pytest.approx(t0 + 20)
    backend.cancel("b")
    assert backend.next_due() is None


# -- waiting ----------------------------------------------------------------------


class Waiter:
    """Runs ``backend.wait_for_due(max_wait)`` on a thread."""

    def __init__(self, backend: Backend, max_wait: float) -> None:
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(backend, max_wait), daemon=True)
        self.thread.start()

    def _run(self, backend: Backend, max_wait: float) -> None:
        backend.wait_for_due(max_wait)
        self.done.set()

    def finished(self, timeout: float = 10.0) -> bool:
        return self.done.wait(timeout)


@needs_clock
def test_wait_for_due_returns_when_an_earlier_job_is_enqueued_from_another_thread(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("far", clock.time() + 3600)])
    waiter = Waiter(backend, max_wait=7200)
    assert clock.wait_for_waiters(1)
    assert not waiter.done.is_set()
    backend.enqueue([spec("near", clock.time() + 60)])
    assert waiter.finished()


@needs_clock
@pytest.mark.parametrize("change", ["reschedule", "retry", "requeue_dead"])
def test_wait_for_due_returns_when_a_job_becomes_earlier(
    backend: Backend,
    clock: FakeClock,
    change: str,
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("moved", t0), spec("far", t0 + 3600)])
    if change == "reschedule":
        backend.reschedule("moved", t0 + 1800)
    claim = claim_one(backend, t0, lease=7200) if change != "reschedule" else None
    if claim is not None and change == "requeue_dead":
        backend.bury(claim, "x")
    waiter = Waiter(backend, max_wait=7200)
    assert clock.wait_for_waiters(1)
    assert not waiter.done.is_set()
    if change == "reschedule":
        backend.reschedule("moved", t0 + 60)
    elif change == "retry":
        assert claim is not None
        backend.retry(claim, t0 + 60, "again")
    else:
        backend.requeue_dead("moved", t0 + 60)
    assert waiter.finished()


@needs_clock
def test_wait_for_due_returns_on_interrupt(backend: Backend, clock: FakeClock) -> None:
    waiter = Waiter(backend, max_wait=3600)
    assert clock.wait_for_waiters(1)
    backend.interrupt()
    assert waiter.finished()


@needs_clock
def test_wait_for_due_sleeps_until_the_next_due_time(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time() + 30)])
    waiter = Waiter(backend, max_wait=3600)
    assert clock.wait_for_waiters(1)
    clock.advance(29)
    assert not waiter.finished(timeout=0.05)
    clock.advance(1)
    assert waiter.finished()


@needs_clock
def test_wait_for_due_wakes_when_a_lease_expires(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time())])
    claim_one(backend, clock.time(), lease=20)
    waiter = Waiter(backend, max_wait=3600)
    assert clock.wait_for_waiters(1)
    clock.advance(20)
    assert waiter.finished()


@needs_clock
def test_wait_for_due_returns_after_max_wait(backend: Backend, clock: FakeClock) -> None:
    waiter = Waiter(backend, max_wait=5)
    assert clock.wait_for_waiters(1)
    clock.advance(5)
    assert waiter.finished()


def test_wait_for_due_returns_at_once_when_a_job_is_due(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time() - 1)])
    waiter = Waiter(backend, max_wait=3600)
    assert waiter.finished()


# -- finished records -------------------------------------------------------------


@needs_clock
def test_finished_records_are_kept_for_result_ttl_then_purged(
    open_backend: Callable[..., Backend], clock: FakeClock
) -> None:
    backend = open_backend(result_ttl=60)
    t0 = clock.time()
    backend.enqueue([spec("done", t0), spec("gone", t0 + 1)])
    backend.ack(claim_one(backend, t0))
    backend.cancel("gone")
    clock.advance(59)
    assert state_of(backend, "done") is JobState.SUCCEEDED
    assert backend.cancel("done") is CancelOutcome.FINISHED
    clock.advance(2)
    backend.claim(limit=1, lease=LEASE, now=clock.time())
    assert backend.get("done") is None and backend.get("gone") is None
    assert backend.cancel("done") is CancelOutcome.NOT_FOUND
    assert backend.stats().succeeded == 0
    assert backend.enqueue([spec("done", clock.time())]) == [EnqueueOutcome.CREATED]


@needs_clock
def test_dead_letters_outlive_result_ttl(
    open_backend: Callable[..., Backend], clock: FakeClock
) -> None:
    backend = open_backend(result_ttl=60)
    bury_at(backend, clock, "dead")
    clock.advance(3600)
    backend.claim(limit=1, lease=LEASE, now=clock.time())
    assert state_of(backend, "dead") is JobState.DEAD


# -- several handles, durability, closing -------------------------------------------


@pytest.mark.backend_features("shared")
def test_two_handles_never_hold_one_job_under_two_live_leases(
    open_another: Callable[..., Backend], clock: FakeClock
) -> None:
    one, two = open_another(), open_another()
    t0 = clock.time()
    one.enqueue([spec(f"j{i}", t0) for i in range(10)])
    a = one.claim(limit=6, lease=LEASE, now=t0)
    b = two.claim(limit=6, lease=LEASE, now=t0)
    assert len(a) == 6 and len(b) == 4
    assert not set(ids(a)) & set(ids(b))
    two.ack(a[0])  # any handle may finish a claim
    assert state_of(one, "j0") is JobState.SUCCEEDED


@pytest.mark.backend_features("durable")
def test_a_reopened_store_keeps_its_jobs(
    open_another: Callable[..., Backend], clock: FakeClock
) -> None:
    first = open_another()
    first.enqueue([spec("kept", clock.time() + 5)])
    first.close()
    again = open_another()
    job = again.get("kept")
    assert job is not None and job.state is JobState.SCHEDULED


def test_the_store_implements_the_backend_protocol(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.url, str) and "://" in backend.url


def test_close_is_idempotent_and_a_closed_store_refuses_calls_clearly(
    backend: Backend, clock: FakeClock
) -> None:
    backend.close()
    backend.close()
    with pytest.raises(QueueClosed):
        backend.enqueue([spec("late", clock.time())])
    with pytest.raises(QueueClosed):
        backend.claim(limit=1, lease=LEASE, now=clock.time())
    with pytest.raises(QueueClosed):
        backend.get("late")
