"""The lease keeper on its own thread, batched renewals, and prefetched claims handed back.

On the memory store and a FakeClock: the tests wait for the worker's threads
through the clock (``Harness.asleep``) and events, never by sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import pytest

from delayq.backends.memory import MemoryBackend
from delayq.errors import StaleClaim
from delayq.job import Claim, JobState
from tests._util import wait_until
from tests.unit._worker_harness import TIMEOUT, Harness


class _StallingClaims(MemoryBackend):
    """A store whose ``claim`` hangs (until ``unstall``) once ``stall`` is set; it
    counts the claims each renewal call carries."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.stall = threading.Event()
        self.stalled = threading.Event()
        self.unstall = threading.Event()
        self.renewals: list[int] = []

    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        if self.stall.is_set():
            self.stalled.set()
            self.unstall.wait(TIMEOUT)
        return super().claim(limit=limit, lease=lease, now=now)

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        self.renewals.append(len(claims))
        return super().extend_many(claims, lease, started=started)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(_StallingClaims, lease=3.0)
    yield harness
    backend = harness.backend
    assert isinstance(backend, _StallingClaims)
    backend.unstall.set()
    harness.stop()


def test_a_stalled_claim_does_not_stop_lease_renewals(h: Harness) -> None:
    backend = h.backend
    assert isinstance(backend, _StallingClaims)
    release = threading.Event()
    started = threading.Event()
    h.app.register("long", lambda p: (started.set(), release.wait(TIMEOUT)))
    h.app.register("x", lambda p: None)
    long_id = h.app.schedule("long", delay=0)
    try:
        h.start()
        assert started.wait(TIMEOUT)
        backend.stall.set()
        h.app.schedule("x", delay=0)  # wakes the dispatcher, whose claim now hangs
        assert backend.stalled.wait(TIMEOUT)
        for _ in range(4):  # 6 s: two leases' worth, the claim hanging all along
            h.asleep()  # the lease keeper (the dispatcher is in its claim, not on the clock)
            h.clock.advance(1.5)
        h.asleep()
        job = h.job(long_id)
        assert job.state is JobState.RUNNING and job.attempts == 1
        assert job.lease_until > h.clock.time()  # renewed: nobody else may claim it
    finally:
        release.set()
        backend.unstall.set()


def test_one_renewal_pass_renews_every_held_lease_in_one_call(h: Harness) -> None:
    backend = h.backend
    assert isinstance(backend, _StallingClaims)
    release = threading.Event()
    started: list[str] = []
    h.app.register("long", lambda p: (started.append(p), release.wait(TIMEOUT)))
    for i in range(3):
        h.app.schedule("long", str(i), delay=0)
    try:
        h.start()
        assert wait_until(lambda: len(started) == 3, TIMEOUT)
        h.asleep(2)  # the dispatcher and the lease keeper
        h.clock.advance(1.0)  # lease / 3: every renewal falls due at once
        h.asleep(2)
        assert backend.renewals == [3]
    finally:
        release.set()


def test_a_prefetched_claim_waiting_behind_busy_slots_is_handed_back() -> None:
    h = Harness(concurrency=1, prefetch=1, lease=30.0)
    release = threading.Event()
    started: list[str] = []
    h.app.register("slow", lambda p: (started.append(p), release.wait(TIMEOUT)))
    first = h.app.schedule("slow", "first", delay=0)
    second = h.app.schedule("slow", "second", delay=0)
    try:
        worker = h.start()
        assert wait_until(lambda: started == ["first"], TIMEOUT)

        def prefetched() -> bool:
            stats = worker.stats()
            return (stats.in_flight, stats.prefetched) == (2, 1)

        assert wait_until(prefetched, TIMEOUT)
        assert h.job(second).state is JobState.RUNNING  # claimed ahead, waiting for the slot
        h.asleep()
        h.clock.advance(1.0)  # it waited min(1 s, lease / 3) while the slot stayed busy
        assert wait_until(lambda: h.job(second).state is JobState.SCHEDULED, TIMEOUT)
        job = h.job(second)
        assert job.attempts == 0  # handed back with its attempt, for an idle worker to take
        h.asleep()
        assert h.job(second).state is JobState.SCHEDULED  # not claimed again at once
        assert started == ["first"] and h.job(first).state is JobState.RUNNING
        assert worker.stats().returned == 1
        release.set()
        # The slot frees: the job runs here after all (nobody else took it).
        assert wait_until(lambda: h.job(second).state is JobState.SUCCEEDED, TIMEOUT)
    finally:
        release.set()
        h.stop()
