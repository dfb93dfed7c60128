"""A store failing in the middle of a group commit: nothing half-applied, the worker recovers.

The SQLite store is made to fail on the second statement of a ``complete`` batch (after
the first entry was written inside the transaction): the whole batch is rolled back.
The worker, on a store whose commit fails once, keeps the result (and the lease) and
records it when the store answers again: the job ends SUCCEEDED after one run.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from delayq.app import DelayQ
from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.backends.sqlite import SQLiteBackend
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import BackendError, BackendUnavailable, StaleClaim
from delayq.job import Claim, JobState
from delayq.testing import FakeClock
from delayq.worker import JobResult, Worker
from tests.contract._support import spec

TIMEOUT = 10.0  # real seconds; only reached when something is broken


def test_sqlite_rolls_back_a_batch_that_fails_after_its_first_entry(tmp_path: Path) -> None:
    clock = FakeClock()
    backend = SQLiteBackend(tmp_path / "jobs.db", clock=clock, synchronous="normal")
    try:
        now = clock.time()
        backend.enqueue([spec(f"j{i}", now) for i in range(3)])
        claims = backend.claim(limit=3, lease=30, now=now)
        batch = [
            Completion.ack(claims[0]),
            Completion.retry(claims[1], now + 5, "try again"),
            Completion.bury(claims[2], "gave up"),
        ]
        with backend._db_lock:
            conn = backend._connection()
        updates: list[str] = []

        def trace(sql: str) -> None:
            if sql.lstrip().upper().startswith("UPDATE DELAYQ_JOBS"):
                updates.append(sql)

        interrupted: list[bool] = []

        def interrupt_once() -> int:  # the second UPDATE fails; the ROLLBACK may run
            if len(updates) >= 2 and not interrupted:
                interrupted.append(True)
                return 1
            return 0

        conn.set_trace_callback(trace)
        conn.set_progress_handler(interrupt_once, 1)
        try:
            with pytest.raises(BackendError):
                backend.complete(batch)
        finally:
            conn.set_progress_handler(None, 1)
            conn.set_trace_callback(None)
        assert interrupted and len(updates) >= 2  # the first entry was written when it failed

        for claim in claims:  # nothing of the batch stayed
            job = backend.get(claim.job.id)
            assert job is not None and job.state is JobState.RUNNING and job.attempts == 1
        assert backend.complete(batch) == [None, None, None]  # the same batch, again
        states = [backend.get(c.job.id).state for c in claims]  # type: ignore[union-attr]
        assert states == [JobState.SUCCEEDED, JobState.SCHEDULED, JobState.DEAD]
    finally:
        backend.close()


class _FailsToCommitOnce(MemoryBackend):
    """A store whose first group commit fails (as a lost connection would)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failed = threading.Event()

    def _fail_once(self) -> None:
        if not self.failed.is_set():
            self.failed.set()
            raise BackendUnavailable("the store went away during the commit")

    def complete(self, batch: Any) -> list[StaleClaim | None]:
        self._fail_once()
        return super().complete(batch)

    def complete_and_claim(
        self, batch: Any, *, limit: int, lease: float
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        self._fail_once()
        return super().complete_and_claim(batch, limit=limit, lease=lease)


def test_the_worker_keeps_a_result_whose_group_commit_failed_and_records_it_later() -> None:
    clock = FakeClock()
    backend = _FailsToCommitOnce(clock=clock)
    app = DelayQ(backend=backend, clock=clock)
    runs: list[int] = []
    app.register("x", lambda payload, ctx: runs.append(ctx.attempt))
    results: queue.Queue[JobResult] = queue.Queue()
    job_id = app.schedule("x", delay=0)
    worker = Worker(app, lease=30.0, idle_wait=3600.0, on_result=results.put).start()
    try:
        assert backend.failed.wait(TIMEOUT)
        job = app.get(job_id)
        assert job is not None and job.state is JobState.RUNNING  # nothing half-recorded
        result: JobResult | None = None
        deadline = SYSTEM_CLOCK.monotonic() + TIMEOUT
        while result is None and SYSTEM_CLOCK.monotonic() < deadline:
            try:
                result = results.get(timeout=0.05)
            except queue.Empty:
                clock.advance(0.1)  # the committer retries on the worker's clock
        assert result is not None
        assert (result.job_id, result.outcome, result.attempt) == (job_id, "succeeded", 1)
        assert runs == [1]  # recorded, not run again
        job = app.get(job_id)
        assert job is not None and job.state is JobState.SUCCEEDED
    finally:
        worker.stop(grace=0)
