"""Random flow-control sequences against every store with ``flow_control``.

Hypothesis drives enqueues of jobs with a key (or none) and a priority, edits
of the keys' concurrency limits, claims, acks and the passage of time (leases
expire and free their slots). After each claim the store must have kept:

* never early: only due jobs are claimed;
* the limit: a key never gets more new leases than its limit leaves room for;
* no head-of-line blocking: a claim that returns fewer jobs than asked leaves
  no due job whose key still has room;
* priority: no unclaimed due job whose key still has room has a higher
  priority than a job the claim took.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from delayq.backends.base import Backend, LimitStore
from delayq.flow import Limit
from delayq.job import Claim, JobState
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory
from tests.contract._support import spec

KEYS = [None, "k1", "k2"]
LEASE = 5.0
EXAMPLES = {"memory": 200, "sqlite": 100}


def make_machine(factory: BackendFactory, root: Path) -> type[RuleBasedStateMachine]:
    counter = itertools.count()

    class FlowMatchesTheRules(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.stack = contextlib.ExitStack()
            store = str(root / f"flow-{next(counter)}.db")
            self.backend: Backend = self.stack.enter_context(factory.open(self.clock, store))
            assert isinstance(self.backend, LimitStore)
            self.limits: LimitStore = self.backend
            self.ids = itertools.count()
            self.jobs: dict[str, tuple[str | None, int, float]] = {}  # id -> key, priority, due
            self.scheduled: set[str] = set()
            self.running: dict[str, Claim] = {}
            self.limit: dict[str, int] = {}
            self.versions: dict[str, int] = {}

        def teardown(self) -> None:
            self.stack.close()

        def _expire(self, now: float) -> set[str]:
            """The jobs whose lease ran out: waiting again, due at a time only the
            store knows yet (the lease's end, or its own due time when no start
            was recorded), or buried after too many expired leases; see
            :meth:`_settle`."""
            expired = set()
            for job_id, claim in list(self.running.items()):
                if claim.lease_until <= now:
                    del self.running[job_id]
                    key, priority, _due = self.jobs[job_id]
                    self.jobs[job_id] = (key, priority, float("-inf"))
                    self.scheduled.add(job_id)
                    expired.add(job_id)
            return expired

        def _settle(self, expired: set[str]) -> None:
            for job_id in expired & self.scheduled:
                job = self.backend.get(job_id)
                assert job is not None
                if job.state is JobState.SCHEDULED:
                    key, priority, _due = self.jobs[job_id]
                    self.jobs[job_id] = (key, priority, job.run_at)
                else:
                    self.scheduled.discard(job_id)

        def _room(self, key: str | None) -> bool:
            if key is None or key not in self.limit:
                return True
            held = sum(1 for j in self.running if self.jobs[j][0] == key)
            return held < self.limit[key]

        @rule(
            key=st.sampled_from(KEYS),
            priority=st.integers(0, 2),
            offset=st.integers(-3000, 3000).map(lambda ms: ms / 1000),
        )
        def enqueue(self, key: str | None, priority: int, offset: float) -> None:
            job_id = f"j{next(self.ids)}"
            due = self.clock.time() + offset
            job = dataclasses.replace(
                spec(job_id, due, max_attempts=1000), key=key, priority=priority
            )
            self.backend.enqueue([job])
            self.jobs[job_id] = (key, priority, due)
            self.scheduled.add(job_id)

        @rule(key=st.sampled_from(["k1", "k2"]), concurrency=st.sampled_from([None, 1, 2, 3]))
        def set_limit(self, key: str, concurrency: int | None) -> None:
            version = self.versions.get(key, 0)
            if concurrency is None:
                if version:
                    assert self.limits.delete_limit(key, version=version)
                    del self.versions[key]
                self.limit.pop(key, None)
                return
            written = self.limits.put_limit(Limit(key, concurrency=concurrency), version=version)
            assert written == version + 1
            self.versions[key] = written
            self.limit[key] = concurrency

        @rule(n=st.integers(1, 4))
        def claim(self, n: int) -> None:
            now = self.clock.time()
            expired = self._expire(now)
            before = {k: sum(1 for j in self.running if self.jobs[j][0] == k) for k in self.limit}
            claims = self.backend.claim(limit=n, lease=LEASE, now=now)
            assert len(claims) <= n
            taken: dict[str | None, int] = {}
            for claim in claims:
                job_id = claim.job.id
                assert job_id in self.scheduled, f"{job_id} was not waiting"
                key, priority, due = self.jobs[job_id]
                assert due <= now, f"{job_id} claimed {due - now:.3f}s early"
                self.scheduled.discard(job_id)
                self.running[job_id] = claim
                taken[key] = taken.get(key, 0) + 1
            self._settle(expired)
            for key, count in taken.items():
                if key in self.limit:
                    room = max(0, self.limit[key] - before.get(key, 0))
                    assert count <= room, f"{key}: {count} new leases, room for {room}"
            lowest = min((self.jobs[c.job.id][1] for c in claims), default=None)
            for job_id in self.scheduled:
                key, priority, due = self.jobs[job_id]
                if due > now or not self._room(key):
                    continue
                assert len(claims) == n, f"{job_id} was due with room but not claimed"
                assert lowest is None or priority <= lowest, (
                    f"{job_id} (priority {priority}) passed over for priority {lowest}"
                )

        @rule(data=st.data())
        def ack(self, data: st.DataObject) -> None:
            live = sorted(j for j, c in self.running.items() if c.lease_until > self.clock.time())
            if not live:
                return
            job_id = data.draw(st.sampled_from(live))
            self.backend.ack(self.running.pop(job_id))

        @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 6.0]))
        def advance(self, seconds: float) -> None:
            self.clock.advance(seconds)

    return FlowMatchesTheRules


@pytest.mark.backend_features("flow_control")
def test_flow_control_keeps_its_rules(factory: BackendFactory) -> None:
    with tempfile.TemporaryDirectory() as root:
        run_state_machine_as_test(
            make_machine(factory, Path(root)),
            settings=settings(
                max_examples=EXAMPLES.get(factory.name, 30),
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
