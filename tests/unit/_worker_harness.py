"""A worker on the memory store and a FakeClock, its results in a queue (worker tests)."""

from __future__ import annotations

import queue
from typing import Any

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.testing import FakeClock
from delayq.worker import JobResult, Worker

T0 = 1_700_000_000.0
TIMEOUT = 10.0  # real seconds; only reached when something is broken


class Harness:
    """An app on a FakeClock plus a worker whose results land in a queue."""

    def __init__(self, store: type[MemoryBackend] = MemoryBackend, **worker_options: Any) -> None:
        self.clock = FakeClock(T0)
        self.backend = store(clock=self.clock)
        self.app = DelayQ(backend=self.backend, clock=self.clock)
        self.results: queue.Queue[JobResult] = queue.Queue()
        options: dict[str, Any] = {"idle_wait": 3600.0, "on_result": self.results.put}
        options.update(worker_options)
        self.options = options
        self.worker: Worker | None = None

    def start(self) -> Worker:
        self.worker = Worker(self.app, **self.options).start()
        return self.worker

    def next_result(self) -> JobResult:
        return self.results.get(timeout=TIMEOUT)

    def asleep(self, waiters: int = 1) -> None:
        """Block until ``waiters`` threads wait on the clock (the worker is idle)."""
        assert self.clock.wait_for_waiters(waiters, TIMEOUT)

    def job(self, job_id: str) -> Any:
        job = self.app.get(job_id)
        assert job is not None
        return job

    def stop(self) -> None:
        if self.worker is not None and self.worker.running:
            self.worker.stop(grace=0)
