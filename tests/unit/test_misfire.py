"""The misfire policy at its limits: a job just inside a grace runs, just outside is skipped.

``Misfire.should_run`` is checked exactly at and around each limit, and the worker is
checked end to end on a FakeClock: ``misfire="skip"`` still runs a job claimed 0.999 s late
(ordinary scheduling latency never skips a job) and skips one claimed 1.001 s late.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.job import JobState, Misfire
from delayq.testing import FakeClock
from delayq.worker import JobResult, Worker

T0 = 1_700_000_000.0
TIMEOUT = 10.0  # real seconds; only reached when something is broken


@pytest.mark.parametrize(
    ("policy", "lateness", "runs"),
    [
        ("skip", 0.0, True),
        ("skip", 0.999, True),
        ("skip", 1.0, True),
        ("skip", 1.001, False),
        ("grace:30", 29.999, True),
        ("grace:30", 30.0, True),
        ("grace:30", 30.000001, False),
        (0, 0.0, True),
        (0, 1e-6, False),
        ("run", 10**9, True),
    ],
)
def test_should_run_at_the_limits(policy: Any, lateness: float, runs: bool) -> None:
    assert Misfire.parse(policy).should_run(lateness) is runs


def test_skip_allows_one_second_of_ordinary_latency() -> None:
    assert Misfire.parse("skip") == Misfire("skip", 1.0)


class _Worker:
    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.app = DelayQ(backend=MemoryBackend(clock=self.clock), clock=self.clock)
        self.ran: list[Any] = []
        self.app.register("x", self.ran.append)
        self.results: queue.Queue[JobResult] = queue.Queue()
        self.worker: Worker | None = None

    def run_after(self, late: float, misfire: str) -> tuple[JobResult, Any]:
        job_id = self.app.schedule("x", {"late": late}, delay=10, misfire=misfire)
        self.clock.advance(10 + late)  # no worker was running while it fell due
        self.worker = Worker(self.app, idle_wait=3600.0, on_result=self.results.put).start()
        result = self.results.get(timeout=TIMEOUT)
        assert result.job_id == job_id
        return result, self.app.get(job_id)


@pytest.fixture
def w() -> Iterator[_Worker]:
    harness = _Worker()
    yield harness
    if harness.worker is not None:
        harness.worker.stop(grace=0)


@pytest.mark.parametrize(("late", "outcome"), [(0.999, "succeeded"), (1.001, "skipped")])
def test_skip_runs_a_job_less_than_a_second_late_and_skips_one_just_later(
    w: _Worker, late: float, outcome: str
) -> None:
    result, job = w.run_after(late, "skip")
    assert result.outcome == outcome
    assert result.lateness == pytest.approx(late, abs=1e-6)
    assert job.state is (JobState.SUCCEEDED if outcome == "succeeded" else JobState.SKIPPED)
    assert w.ran == ([{"late": late}] if outcome == "succeeded" else [])


@pytest.mark.parametrize(("late", "outcome"), [(4.999, "succeeded"), (5.001, "skipped")])
def test_a_grace_runs_a_job_just_inside_it_and_skips_one_just_outside(
    w: _Worker, late: float, outcome: str
) -> None:
    result, _ = w.run_after(late, "grace:5")
    assert result.outcome == outcome
