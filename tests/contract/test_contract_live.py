"""The contract in real time: every store as in production, no injected clock.

The rest of the suite drives time with a FakeClock. These tests open each store
the way a worker does (``BackendFactory.open_live``: "due" on the store's own
clock, the server's for a distributed store; the real blocking ``wait_for_due``
and its wake-ups) and state timings as "eventually, by a deadline": a job due in
300 ms is claimed once it is due and never before (on the store's clock), a
waiter sleeps until the due time instead of polling, an earlier job enqueued by
another process wakes a sleeping waiter, and a lease runs out in real time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from delayq.backends.base import Backend
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import InvalidOption, StaleClaim
from delayq.job import CancelOutcome, Claim, JobSpec
from tests.contract._registry import BackendFactory
from tests.contract._support import spec, started

pytestmark = pytest.mark.slow

DEADLINE = 30.0
"""Real seconds a test waits for what must happen; reached only when something is broken."""

LEASE = 30.0


@pytest.fixture
def live(factory: BackendFactory, store: str) -> Iterator[Backend]:
    if factory.open_live is None:
        pytest.fail(f"{factory.name}: the factory has no open_live (every store needs one)")
    with factory.open_live(store) as backend:
        yield backend


@pytest.fixture
def live_another(factory: BackendFactory, store: str) -> Iterator[Callable[[], Backend]]:
    """More production handles on the same store (needs the ``shared`` feature)."""
    if "shared" not in factory.features:
        pytest.skip(f"{factory.name} backend lacks feature 'shared'")
    assert factory.open_live is not None
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(factory.open_live(store))  # type: ignore[misc]


def due_in(job_id: str, seconds: float) -> JobSpec:
    """A job due ``seconds`` after the store's own "now" (a relative delay)."""
    return dataclasses.replace(spec(job_id, SYSTEM_CLOCK.time() + seconds), delay=seconds)


def claim_when_due(
    backend: Backend, *, limit: int = 1, lease: float = LEASE, deadline: float = DEADLINE
) -> tuple[list[Claim], int]:
    """Claim as a worker does (claim, else ``wait_for_due``); the claims and the waits."""
    waits = 0
    end = SYSTEM_CLOCK.monotonic() + deadline
    while True:
        claims = backend.claim(limit=limit, lease=lease)
        left = end - SYSTEM_CLOCK.monotonic()
        if claims or left <= 0:
            return claims, waits
        backend.wait_for_due(min(left, 5.0))
        waits += 1


def test_a_job_is_claimed_once_due_on_the_store_clock_and_never_before(live: Backend) -> None:
    live.enqueue([due_in("j", 0.3)])
    early = live.claim(limit=1, lease=LEASE)
    claims, waits = claim_when_due(live)
    assert early == []
    assert [c.job.id for c in claims] == ["j"]
    assert claims[0].claimed_at >= claims[0].job.run_at  # on the store's clock
    assert waits <= 5, f"{waits} waits for one due time: the waiter polls"


_PRODUCER = """
import dataclasses, os, sys, time
from tests.contract._registry import BACKEND_FACTORIES
from tests.contract._support import spec

name, store, job_id, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
opened = BACKEND_FACTORIES[name].open_live(store)  # held: its exit would clean the store up
backend = opened.__enter__()
backend.enqueue([dataclasses.replace(spec(job_id, time.time() + delay), delay=delay)])
sys.stdout.flush()
os._exit(0)
"""


def _enqueue_in_another_process(factory: BackendFactory, store: str, job_id: str) -> None:
    """Enqueue a job due in 50 ms from a fresh Python process with its own handle
    (so no in-process wake-up can stand in for the store's own)."""
    done = subprocess.run(
        [sys.executable, "-c", _PRODUCER, factory.name, store, job_id, "0.05"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_an_earlier_job_from_another_process_wakes_a_sleeping_waiter(
    live_another: Callable[[], Backend], factory: BackendFactory, store: str
) -> None:
    worker = live_another()
    worker.enqueue([due_in("far", 3600)])
    started, claimed = threading.Event(), threading.Event()
    got: list[str] = []

    def run() -> None:
        started.set()
        end = SYSTEM_CLOCK.monotonic() + 2 * DEADLINE
        while SYSTEM_CLOCK.monotonic() < end:
            claims = worker.claim(limit=1, lease=LEASE)
            if claims:
                got.extend(c.job.id for c in claims)
                claimed.set()
                return
            worker.wait_for_due(10 * DEADLINE)  # only a wake-up ends this early

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(DEADLINE)
    _enqueue_in_another_process(factory, store, "near")
    assert claimed.wait(DEADLINE), "the waiter was not woken by the earlier job"
    assert got == ["near"]
    thread.join(DEADLINE)


def test_interrupt_wakes_a_waiter_in_this_process(live: Backend) -> None:
    live.enqueue([due_in("far", 3600)])
    returned = threading.Event()

    def wait() -> None:
        live.wait_for_due(10 * DEADLINE)  # only the interrupt ends this early
        returned.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    end = SYSTEM_CLOCK.monotonic() + DEADLINE
    while not returned.wait(0.05) and SYSTEM_CLOCK.monotonic() < end:
        live.interrupt()  # until the thread is blocked and woken (no race with its start)
    assert returned.is_set()
    thread.join(DEADLINE)


def test_a_lease_runs_out_in_real_time_and_the_job_comes_back(live: Backend) -> None:
    live.enqueue([due_in("j", 0)])
    first, _ = claim_when_due(live, lease=0.5)
    assert [c.job.id for c in first] == ["j"]
    first = [started(live, first[0], 0.5)]  # its handler started: the expiry is an attempt
    again, _ = claim_when_due(live)
    assert [c.job.id for c in again] == ["j"]
    assert again[0].job.attempts == 2
    assert again[0].claimed_at >= first[0].lease_until
    with pytest.raises(StaleClaim):
        live.ack(first[0])
    live.ack(again[0])


def test_a_retry_runs_again_after_its_delay_on_the_store_clock(live: Backend) -> None:
    live.enqueue([due_in("j", 0)])
    (claim,), _ = claim_when_due(live)
    live.retry(claim, claim.claimed_at + 0.3, "try again")
    (again,), _ = claim_when_due(live)
    assert again.job.id == "j" and again.job.attempts == 2
    assert again.claimed_at >= claim.claimed_at + 0.3


@pytest.mark.backend_features("definite_cancel")
def test_a_job_cancelled_before_it_is_due_never_comes(live: Backend) -> None:
    live.enqueue([due_in("j", 0.2)])
    assert live.cancel("j") is CancelOutcome.CANCELLED
    claims, _ = claim_when_due(live, deadline=1.0)
    assert claims == []


def test_a_store_on_its_real_clock_refuses_an_injected_now(live: Backend) -> None:
    """``claim(now=)`` is for tests with an injected clock: on the real clock a later
    "now" would claim jobs before they are due."""
    live.enqueue([due_in("j", 3600)])
    with pytest.raises(InvalidOption, match="injected time"):
        live.claim(limit=1, lease=LEASE, now=SYSTEM_CLOCK.time() + 3600)
    assert live.claim(limit=1, lease=LEASE) == []
