"""Random operation sequences against every backend, checked against a tiny model.

Times are on a millisecond grid, and a rule steps the clock to 1 ms before, at and
after the next due time or lease expiry, so a claim a fraction of a second early or
a lease that outlives its expiry is caught, not averaged away.

The model is the contract in a few dozen lines: a dict of jobs with a state,
a due time, attempts and the current fencing token. Hypothesis drives enqueue
(with every ``on_conflict``), cancel, reschedule, claim, ack, retry, bury,
batches of those three through ``complete``, requeue and the passage of time,
and after every step the backend must agree with the model on every outcome and
every job's state.

Ties in ``run_at`` may be broken differently after a retry or a lease expiry,
so a claim is accepted when it is *a* valid choice: only due jobs, in
``run_at`` order, and no unclaimed job due strictly earlier than one claimed.
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from delayq.backends.base import Backend, Completion
from delayq.errors import JobConflict, StaleClaim
from delayq.job import CancelOutcome, Claim, EnqueueOutcome, JobState, RescheduleOutcome
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory
from tests.contract._support import spec

IDS = ["a", "b", "c", "d", "e"]
LEASE_CHOICES = [5.0, 10.0]
RETRY_AFTER = 2.0015  # off the millisecond grid: a store rounding due times shows
OFFSETS = st.integers(min_value=-3000, max_value=20_000).map(lambda ms: ms / 1000)
"""Due-time offsets from "now": a millisecond grid over -3 s .. 20 s."""
FINISH_ACTIONS = st.sampled_from(["ack", "retry", "bury"])
EDGE_STEPS = [-0.001, -0.0002, 0.0, 0.0002, 0.001]
"""Where ``advance_to_an_edge`` lands, relative to the next due time or lease expiry."""
EXAMPLES = {"memory": 400, "sqlite": 300}
"""Examples per store (the local stores are cheap; server stores keep the default)."""
OnConflict = Literal["reject", "keep", "replace"]


@dataclass
class ModelJob:
    state: JobState
    run_at: float
    attempts: int
    max_attempts: int
    token: int | None = None
    lease_until: float | None = None


class Model:
    """The contract, simply (no result_ttl purge: the test never advances 7 days)."""

    def __init__(self) -> None:
        self.jobs: dict[str, ModelJob] = {}

    def enqueue(
        self, batch: list[tuple[str, float, int]], on_conflict: OnConflict
    ) -> list[EnqueueOutcome] | type[JobConflict]:
        staged = dict(self.jobs)
        outcomes = []
        for job_id, run_at, max_attempts in batch:
            current = staged.get(job_id)
            if current is None:
                outcomes.append(EnqueueOutcome.CREATED)
            elif on_conflict == "keep":
                outcomes.append(EnqueueOutcome.KEPT)
                continue
            elif on_conflict == "reject" or current.state is JobState.RUNNING:
                return JobConflict
            else:
                outcomes.append(EnqueueOutcome.REPLACED)
            staged[job_id] = ModelJob(JobState.SCHEDULED, run_at, 0, max_attempts)
        self.jobs = staged
        return outcomes

    def expire_leases(self, now: float, only: str | None = None) -> None:
        """End the leases that ran out by ``now`` (of job ``only``, when given: a
        cancel or reschedule ends the lease of the job it touches)."""
        for job_id, job in self.jobs.items():
            lease_until = job.lease_until
            if only is not None and job_id != only:
                continue
            if job.state is JobState.RUNNING and lease_until is not None and lease_until <= now:
                if job.attempts >= job.max_attempts:
                    job.state = JobState.DEAD
                else:
                    job.state, job.run_at = JobState.SCHEDULED, lease_until
                job.lease_until = None

    def due(self, now: float) -> dict[str, float]:
        return {
            i: j.run_at
            for i, j in self.jobs.items()
            if j.state is JobState.SCHEDULED and j.run_at <= now
        }

    def is_current(self, claim: Claim) -> bool:
        job = self.jobs.get(claim.job.id)
        return job is not None and job.state is JobState.RUNNING and job.token == claim.token

    def next_due(self) -> float | None:
        times = [j.run_at for j in self.jobs.values() if j.state is JobState.SCHEDULED]
        return min(times, default=None)


def make_machine(factory: BackendFactory, root: Path) -> type[RuleBasedStateMachine]:
    counter = itertools.count()

    class BackendMatchesModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.stack = contextlib.ExitStack()
            store = str(root / f"model-{next(counter)}.db")
            self.backend: Backend = self.stack.enter_context(factory.open(self.clock, store))
            self.model = Model()
            self.claims: list[Claim] = []
            self.tokens: set[int] = set()  # every fencing token handed out so far
            # Stores keeping definite answers: an expired lease is not running, and
            # an outcome says when an attempt had started.
            self.definite = "definite_cancel" in factory.features

        def teardown(self) -> None:
            self.stack.close()

        @property
        def now(self) -> float:
            return self.clock.time()

        @rule(
            batch=st.lists(
                st.tuples(st.sampled_from(IDS), OFFSETS, st.integers(min_value=1, max_value=3)),
                min_size=1,
                max_size=3,
            ),
            on_conflict=st.sampled_from(["reject", "keep", "replace"]),
        )
        def enqueue(self, batch: list[tuple[str, float, int]], on_conflict: OnConflict) -> None:
            timed = [(i, self.now + offset, m) for i, offset, m in batch]
            expected = self.model.enqueue(timed, on_conflict)
            specs = [spec(i, run_at, max_attempts=m) for i, run_at, m in timed]
            if expected is JobConflict:
                with pytest.raises(JobConflict):
                    self.backend.enqueue(specs, on_conflict=on_conflict)
            else:
                assert self.backend.enqueue(specs, on_conflict=on_conflict) == expected

        @rule(job_id=st.sampled_from(IDS))
        def cancel(self, job_id: str) -> None:
            if self.definite:
                self.model.expire_leases(self.now, only=job_id)  # an expired lease: not running
            job = self.model.jobs.get(job_id)
            if job is None:
                expected = CancelOutcome.NOT_FOUND
            elif job.state is JobState.RUNNING:
                expected = CancelOutcome.RUNNING
            elif job.state is JobState.SCHEDULED:
                expected = CancelOutcome.done(job.attempts) if self.definite else None
                job.state = JobState.CANCELLED
            else:
                expected = CancelOutcome.FINISHED
            got = self.backend.cancel(job_id)
            assert got is expected if expected is not None else got.cancelled

        @rule(job_id=st.sampled_from(IDS), offset=OFFSETS)
        def reschedule(self, job_id: str, offset: float) -> None:
            if self.definite:
                self.model.expire_leases(self.now, only=job_id)
            job = self.model.jobs.get(job_id)
            if job is None:
                expected = RescheduleOutcome.NOT_FOUND
            elif job.state is JobState.RUNNING:
                expected = RescheduleOutcome.RUNNING
            elif job.state is JobState.SCHEDULED:
                expected = RescheduleOutcome.done(job.attempts) if self.definite else None
                job.run_at = self.now + offset
            else:
                expected = RescheduleOutcome.FINISHED
            got = self.backend.reschedule(job_id, self.now + offset)
            assert got is expected if expected is not None else got.rescheduled

        @rule(limit=st.integers(min_value=1, max_value=3), lease=st.sampled_from(LEASE_CHOICES))
        def claim(self, limit: int, lease: float) -> None:
            now = self.now
            self.model.expire_leases(now)
            due = self.model.due(now)
            claims = self.backend.claim(limit=limit, lease=lease, now=now)
            if claims and "attempt_at_start" in self.backend.features:
                # Every handler starts at once: each lease that runs out is an attempt
                # (the model's rule; test_contract_attempts covers unstarted claims).
                answers = self.backend.extend_many(claims, lease, started={c.token for c in claims})
                claims = [a for a in answers if isinstance(a, Claim)]
                assert len(claims) == len(answers)
            got = [c.job.id for c in claims]
            assert len(got) == min(limit, len(due)), (got, due)
            assert set(got) <= set(due), (got, due)
            times = [due[i] for i in got]
            assert times == sorted(times)
            left = [t for i, t in due.items() if i not in got]
            assert not times or not left or min(left) >= max(times), (got, due)
            for c in claims:
                job = self.model.jobs[c.job.id]
                job.state, job.attempts = JobState.RUNNING, job.attempts + 1
                job.token, job.lease_until = c.token, now + lease
                assert c.job.attempts == job.attempts
                assert c.lease_until == pytest.approx(now + lease)
            for c in claims:  # a fencing token is never handed out twice
                assert c.token not in self.tokens, (c, sorted(self.tokens))
                self.tokens.add(c.token)
            self.claims.extend(claims)

        def _finish(self, index: int, action: str) -> None:
            claim = self.claims[index % len(self.claims)]
            current = self.model.is_current(claim)
            job = self.model.jobs.get(claim.job.id)
            with pytest.raises(StaleClaim) if not current else contextlib.nullcontext():
                if action == "ack":
                    self.backend.ack(claim)
                elif action == "retry":
                    self.backend.retry(claim, self.now + RETRY_AFTER, "retry me")
                else:
                    self.backend.bury(claim, "dead")
            if current and job is not None:
                job.token = job.lease_until = None
                if action == "ack":
                    job.state = JobState.SUCCEEDED
                elif action == "retry":
                    job.state, job.run_at = JobState.SCHEDULED, self.now + RETRY_AFTER
                else:
                    job.state = JobState.DEAD

        @precondition(lambda self: bool(self.claims))
        @rule(
            index=st.integers(min_value=0, max_value=50),
            action=st.sampled_from(["ack", "retry", "bury"]),
        )
        def finish(self, index: int, action: str) -> None:
            self._finish(index, action)

        @precondition(lambda self: bool(self.claims))
        @rule(
            entries=st.lists(
                st.tuples(
                    st.integers(min_value=0, max_value=50),
                    st.sampled_from(["ack", "retry", "bury"]),
                ),
                min_size=1,
                max_size=4,
            )
        )
        def finish_batch(self, entries: list[tuple[int, str]]) -> None:
            batch: list[Completion] = []
            expected: list[bool] = []  # applied (True) or stale (False), in order
            for index, action in entries:
                claim = self.claims[index % len(self.claims)]
                if action == "ack":
                    batch.append(Completion.ack(claim))
                elif action == "retry":
                    batch.append(Completion.retry(claim, self.now + RETRY_AFTER, "retry me"))
                else:
                    batch.append(Completion.bury(claim, "dead"))
                # Entries apply in order: a claim finished earlier in the batch is stale.
                current = self.model.is_current(claim)
                expected.append(current)
                job = self.model.jobs.get(claim.job.id)
                if current and job is not None:
                    job.token = job.lease_until = None
                    if action == "ack":
                        job.state = JobState.SUCCEEDED
                    elif action == "retry":
                        job.state, job.run_at = JobState.SCHEDULED, self.now + RETRY_AFTER
                    else:
                        job.state = JobState.DEAD
            results = self.backend.complete(batch)
            assert [r is None for r in results] == expected, (entries, results)
            assert all(r is None or isinstance(r, StaleClaim) for r in results)

        @rule(job_id=st.sampled_from(IDS), offset=OFFSETS.map(abs))
        def requeue(self, job_id: str, offset: float) -> None:
            job = self.model.jobs.get(job_id)
            expected = job is not None and job.state is JobState.DEAD
            assert self.backend.requeue_dead(job_id, self.now + offset) is expected
            if job is not None and expected:
                job.state, job.attempts, job.run_at = JobState.SCHEDULED, 0, self.now + offset

        @rule(seconds=st.sampled_from([0.001, 0.5, 1, 3, 7, 15]))
        def advance(self, seconds: float) -> None:
            self.clock.advance(seconds)

        @rule(edge=st.sampled_from(["due", "lease"]), delta=st.sampled_from(EDGE_STEPS))
        def advance_to_an_edge(self, edge: str, delta: float) -> None:
            """Step to just before, exactly at, or just after the next due time or lease
            expiry, where a claim a little early or a lease a little long shows."""
            now = self.now
            if edge == "due":
                times = [
                    j.run_at for j in self.model.jobs.values() if j.state is JobState.SCHEDULED
                ]
            else:
                times = [
                    j.lease_until
                    for j in self.model.jobs.values()
                    if j.state is JobState.RUNNING and j.lease_until is not None
                ]
            ahead = [t + delta - now for t in times if t + delta > now]
            if ahead:
                self.clock.advance(min(ahead))
            self.claim(limit=3, lease=LEASE_CHOICES[0])  # right at the edge

        @precondition(lambda self: any(self._stale_while_running()))
        @rule(index=st.integers(min_value=0, max_value=50), action=FINISH_ACTIONS)
        def finish_a_stale_claim_of_a_running_job(self, index: int, action: str) -> None:
            """A claim whose lease ran out, its job now running under a newer claim:
            the old holder's ack / retry / bury must be refused (fencing)."""
            stale = list(self._stale_while_running())
            self._finish(self.claims.index(stale[index % len(stale)]), action)

        def _stale_while_running(self) -> Iterator[Claim]:
            for claim in self.claims:
                job = self.model.jobs.get(claim.job.id)
                if job is not None and job.state is JobState.RUNNING and job.token != claim.token:
                    yield claim

        @invariant()
        def states_agree(self) -> None:
            for job_id in IDS:
                job = self.backend.get(job_id)
                expected = self.model.jobs.get(job_id)
                if expected is None:
                    assert job is None
                    continue
                assert job is not None
                # A lease that ran out but was not yet noticed by a claim still reads RUNNING.
                assert job.state is expected.state, (job_id, job, expected)
                assert job.attempts == expected.attempts, (job_id, job, expected)
                if expected.state is JobState.SCHEDULED:
                    assert job.run_at == pytest.approx(expected.run_at)

        @rule(size=st.integers(min_value=1, max_value=3))
        def list_in_pages(self, size: int) -> None:
            # A rule, not an invariant: a walk per step would double the run on
            # networked stores. Pages of a still store join up to the whole listing.
            whole = [j.id for j in self.backend.list_jobs(limit=1000)]
            paged: list[str] = []
            page = self.backend.list_jobs(limit=size)
            while page:
                paged += [j.id for j in page]
                page = self.backend.list_jobs(limit=size, after=(page[-1].run_at, page[-1].id))
            assert paged == whole

        @invariant()
        def next_due_agrees(self) -> None:
            expected = self.model.next_due()
            got = self.backend.next_due()
            assert got == (None if expected is None else pytest.approx(expected))

    return BackendMatchesModel


@pytest.mark.timeout(1200)  # hundreds of examples: 300 s is too short on a loaded machine
def test_backend_matches_the_model(factory: BackendFactory) -> None:
    with tempfile.TemporaryDirectory() as root:
        run_state_machine_as_test(
            make_machine(factory, Path(root)),
            settings=settings(
                max_examples=EXAMPLES.get(factory.name, 60),
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
