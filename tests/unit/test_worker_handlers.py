"""Workers serving a subset of a queue's handlers (``Worker(handlers=...)``), on the
memory store and a FakeClock."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.backends.sqlite import SQLiteBackend
from delayq.errors import ConfigurationError, InvalidOption
from delayq.job import Claim, JobState
from delayq.testing import FakeClock
from delayq.worker import JobResult, Worker
from tests._util import wait_until
from tests.unit._worker_harness import T0, TIMEOUT


class _CountingMemory(MemoryBackend):
    """The memory store, counting its claims (a busy loop would show here)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.claims = self.waits = 0

    def claim(self, **options: Any) -> list[Claim]:
        self.claims += 1
        return super().claim(**options)

    def wait_for_due(self, max_wait: float, **options: Any) -> None:
        self.waits += 1
        super().wait_for_due(max_wait, **options)


class _CountingSQLite(SQLiteBackend):
    """The SQLite store, counting its claims."""

    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(path, **options)
        self.claims = self.waits = 0

    def claim(self, **options: Any) -> list[Claim]:
        self.claims += 1
        return super().claim(**options)

    def wait_for_due(self, max_wait: float, **options: Any) -> None:
        self.waits += 1
        super().wait_for_due(max_wait, **options)


_Counting = _CountingMemory | _CountingSQLite


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> Iterator[_Counting]:
    backend: _Counting
    if request.param == "memory":
        backend = _CountingMemory(clock=clock)
    else:
        backend = _CountingSQLite(str(tmp_path / "jobs.db"), clock=clock, synchronous="normal")
    yield backend
    backend.close()


@pytest.fixture
def app(store: _Counting, clock: FakeClock) -> DelayQ:
    return DelayQ(backend=store, clock=clock)


def _worker(app: DelayQ, results: queue.Queue[JobResult], **options: Any) -> Worker:
    return Worker(app, idle_wait=3600.0, on_result=results.put, prefetch=0, **options)


def test_a_slow_handler_on_its_own_worker_does_not_hold_up_the_fast_ones(app: DelayQ) -> None:
    release = threading.Event()
    started: queue.Queue[str] = queue.Queue()

    def slow(payload: Any) -> None:
        started.put(payload["n"])
        assert release.wait(TIMEOUT)

    app.register("report", slow)
    app.register("mail", lambda p: None)
    slow_ids = [app.schedule("report", {"n": i}, delay=0) for i in range(3)]
    fast_ids = [app.schedule("mail", {"n": i}, delay=0) for i in range(5)]
    slow_results: queue.Queue[JobResult] = queue.Queue()
    fast_results: queue.Queue[JobResult] = queue.Queue()
    slow_worker = _worker(app, slow_results, concurrency=1, handlers=["report"]).start()
    fast_worker = _worker(app, fast_results, concurrency=2, handlers=["mail"]).start()
    try:
        assert started.get(timeout=TIMEOUT) == 0  # the slow worker is busy with report 0
        done = {fast_results.get(timeout=TIMEOUT).job_id for _ in fast_ids}
        assert done == set(fast_ids)  # every mail ran while report 0 still runs
        states = [app.get(job_id).state for job_id in slow_ids]  # type: ignore[union-attr]
        assert states == [JobState.RUNNING, JobState.SCHEDULED, JobState.SCHEDULED]
        assert fast_worker.stats().claimed == 5  # it never claimed a report
        release.set()
        finished = {slow_results.get(timeout=TIMEOUT).job_id for _ in slow_ids}
        assert finished == set(slow_ids)
        assert slow_worker.stats().claimed == 3
    finally:
        release.set()
        slow_worker.stop(grace=0)
        fast_worker.stop(grace=0)


def test_a_filtered_worker_sleeps_while_other_handlers_jobs_are_due(
    app: DelayQ, store: _Counting, clock: FakeClock
) -> None:
    app.register("mail", lambda p: None)
    app.register("report", lambda p: None)
    backlog = [app.schedule("report", {"n": i}, delay=0) for i in range(20)]
    results: queue.Queue[JobResult] = queue.Queue()
    worker = _worker(app, results, handlers=["mail"]).start()
    try:
        assert clock.wait_for_waiters(1, TIMEOUT)  # asleep on the clock, not spinning
        claims = store.claims
        assert not wait_until(lambda: store.claims > claims, timeout=0.2)
        mail = app.schedule("mail", delay=10)  # wakes it; it sleeps toward its own head
        assert wait_until(lambda: clock.waiters() >= 1 and store.claims > claims)
        assert results.empty()
        clock.advance(10)
        assert results.get(timeout=TIMEOUT).job_id == mail
        for job_id in backlog:
            job = app.get(job_id)
            assert job is not None and (job.state, job.attempts) == (JobState.SCHEDULED, 0)
    finally:
        worker.stop(grace=0)


def test_a_handler_filter_keeps_flow_control_limits(
    app: DelayQ, store: _Counting, clock: FakeClock
) -> None:
    app.limit("tenant:*", concurrency=1)
    running = threading.Event()
    release = threading.Event()
    seen: list[int] = []

    def report(payload: Any) -> None:
        seen.append(payload["n"])
        running.set()
        assert release.wait(TIMEOUT)

    app.register("report", report)
    for i in range(2):
        app.schedule("report", {"n": i}, delay=0, key="tenant:1")
    results: queue.Queue[JobResult] = queue.Queue()
    worker = _worker(app, results, concurrency=2, handlers=["report"]).start()
    try:
        assert running.wait(TIMEOUT)
        # The dispatcher asleep after the claim that parked the second job (the lease
        # keeper, renewing the first, is the other waiter on the clock).
        assert wait_until(lambda: store.waits >= 1 and clock.waiters() >= 2)
        assert seen == [0]
        release.set()
        assert {results.get(timeout=TIMEOUT).outcome for _ in range(2)} == {"succeeded"}
        assert seen == [0, 1]
    finally:
        release.set()
        worker.stop(grace=0)


def test_a_handler_filter_naming_an_unregistered_handler_fails_at_start(app: DelayQ) -> None:
    app.register("mail", lambda p: None)
    worker = Worker(app, handlers=["mail", "reprot"])
    with pytest.raises(ConfigurationError, match=r"'reprot'.*registers 'mail'"):
        worker.start()
    assert not worker.running


@pytest.mark.parametrize("bad", [[], "mail", [""]])
def test_a_bad_handler_filter_is_refused(app: DelayQ, bad: Any) -> None:
    with pytest.raises(InvalidOption):
        Worker(app, handlers=bad)


class _NoFilter(MemoryBackend):
    features: ClassVar[frozenset[str]] = MemoryBackend.features - {"handler_filter"}


def test_a_handler_filter_on_a_store_without_it_is_a_configuration_error(
    clock: FakeClock,
) -> None:
    app = DelayQ(backend=_NoFilter(clock=clock), clock=clock)
    with pytest.raises(ConfigurationError, match="handler_filter"):
        Worker(app, handlers=["mail"])


def test_a_worker_for_recurring_ticks_names_the_built_in_tick_handler(app: DelayQ) -> None:
    worker = Worker(app, handlers=["delayq.recurring"], idle_wait=3600.0).start()
    try:
        assert worker.running
    finally:
        worker.stop(grace=0)
