"""A result() waiting for a job is woken by a finish in its own process, and reads
again after its pause when the finish happened elsewhere.

The fake clock never moves in the first tests: a waiter that depended on its pause
to end would wait for ever, so returning at all shows that the finish woke it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.errors import JobCancelled
from delayq.job import Job
from delayq.results import FinishedJobs, finished_jobs
from delayq.testing import FakeClock
from tests.unit._worker_harness import T0, TIMEOUT, Harness


class ReadsTold(MemoryBackend):
    """A memory store that tells the test each time a job is read."""

    reads: threading.Semaphore

    def get(self, job_id: str) -> Job | None:
        job = super().get(job_id)
        self.reads.release()
        return job


@pytest.fixture
def h() -> Iterator[Harness]:
    ReadsTold.reads = threading.Semaphore(0)
    harness = Harness(ReadsTold, concurrency=2)
    try:
        yield harness
    finally:
        harness.stop()
        harness.app.close()


def read_once() -> None:
    assert ReadsTold.reads.acquire(timeout=TIMEOUT), "the waiter never read the job"


class Waiter(threading.Thread):
    """``app.result(job_id)`` in a thread of its own; its value or error kept."""

    def __init__(self, h: Harness, job_id: str, timeout: float) -> None:
        super().__init__(daemon=True)
        self.h, self.job_id, self.timeout = h, job_id, timeout
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.h.app.result(self.job_id, timeout=self.timeout)
        except BaseException as exc:
            self.error = exc

    def finished(self) -> Waiter:
        self.join(TIMEOUT)
        assert not self.is_alive(), "the waiter was not woken"
        return self


def test_a_waiting_result_returns_when_a_worker_of_this_process_records_it(
    h: Harness,
) -> None:
    go = threading.Event()

    @h.app.task(name="total", store_result=True)
    def total(order: int) -> int:
        assert go.wait(TIMEOUT)
        return order * 2

    h.start()
    handle = total.schedule(21)
    waiter = Waiter(h, handle.id, timeout=60)
    waiter.start()
    read_once()  # it has seen the job unfinished; it waits now, or is about to
    go.set()
    assert waiter.finished().value == 42
    assert h.clock.time() == T0  # no pause of its ended: the finish woke it
    assert h.next_result().outcome == "succeeded"


def test_a_cancel_wakes_a_waiting_result(h: Harness) -> None:
    h.app.register("later", lambda payload: 1, store_result=True)
    job_id = h.app.schedule("later", delay=3600)
    waiter = Waiter(h, job_id, timeout=7200)
    waiter.start()
    read_once()
    assert h.app.cancel(job_id).cancelled
    assert isinstance(waiter.finished().error, JobCancelled)
    assert h.clock.time() == T0
    assert not finished_jobs(h.backend)._watches  # the waiter's watch is gone with it


def test_an_async_wait_is_woken_by_a_finish_in_another_thread(h: Harness) -> None:
    h.app.register("later", lambda payload: 1, store_result=True)
    job_id = h.app.schedule("later", delay=3600)

    async def main() -> None:
        waiting = asyncio.ensure_future(h.app.aresult(job_id, timeout=7200))
        await asyncio.to_thread(read_once)
        assert (await asyncio.to_thread(h.app.cancel, job_id)).cancelled
        with pytest.raises(JobCancelled):
            await asyncio.wait_for(waiting, TIMEOUT)

    asyncio.run(main())
    assert h.clock.time() == T0


def test_a_finish_recorded_elsewhere_is_read_after_the_waiter_s_pause(h: Harness) -> None:
    h.app.register("now", lambda payload: 1, store_result=True)
    job_id = h.app.schedule("now")
    waiter = Waiter(h, job_id, timeout=60)
    waiter.start()
    read_once()
    # The store's own calls, as a worker in another process makes them: no wake-up here.
    [claim] = h.backend.claim(limit=1, lease=30)
    assert h.backend.complete([Completion.ack(claim, result="5")]) == [None]
    assert h.clock.wait_for_waiters(1, TIMEOUT)  # its first pause: 10 ms
    h.clock.advance(0.01)
    assert waiter.finished().value == 5
    assert h.clock.time() > T0  # a pause ended before it read the finish


def test_a_finish_wakes_only_the_watches_of_its_job() -> None:
    clock = FakeClock()
    finishes = FinishedJobs()
    with finishes.watch("a") as a, finishes.watch("b") as b:
        finishes.notify(["b", "c"])
        assert not a.wait(clock, 0)
        assert b.wait(clock, 60)  # fired: returns at once, the clock never moved
        assert not b.wait(clock, 0)  # a fire is used once
        finishes.notify(iter(["a"]))
        assert a.wait(clock, 60)
    assert not finishes._watches
    finishes.notify(["a"])  # nobody watches: nothing to do


def test_handles_on_one_store_url_share_their_finishes() -> None:
    one, two = MemoryBackend(), MemoryBackend()
    try:
        assert finished_jobs(one) is finished_jobs(two)  # both "memory://"
    finally:
        one.close()
        two.close()
