"""Never early, at sub-millisecond resolution, on every store.

A job due at ``t`` is not claimable at ``t - 10 µs`` (nor at any time before), and is at
``t`` itself. Due times off the millisecond grid catch a store that rounds them to its
own resolution in the wrong direction.
"""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend
from delayq.testing import FakeClock
from tests.contract._support import spec

LEASE = 30.0
EARLY = [0.5, 0.001, 0.0005, 0.0001, 0.00001]


@pytest.mark.parametrize("offset", [5.0, 5.0004, 5.0006, 5.000_001])
@pytest.mark.parametrize("early", EARLY)
def test_a_job_is_not_claimed_a_fraction_of_a_millisecond_before_it_is_due(
    backend: Backend, clock: FakeClock, offset: float, early: float
) -> None:
    due = clock.time() + offset
    backend.enqueue([spec("j", due)])
    assert backend.claim(limit=1, lease=LEASE, now=due - early) == []
    claims = backend.claim(limit=1, lease=LEASE, now=due)
    assert [c.job.id for c in claims] == ["j"]
    assert claims[0].claimed_at >= due - 1e-6


def test_a_rescheduled_job_is_not_claimed_early_either(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0 + 1)])
    due = t0 + 2.0007
    backend.reschedule("j", due)
    assert backend.claim(limit=1, lease=LEASE, now=due - 0.0001) == []
    assert [c.job.id for c in backend.claim(limit=1, lease=LEASE, now=due)] == ["j"]


def test_a_retried_job_is_not_claimed_before_its_retry_time(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    (claim,) = backend.claim(limit=1, lease=LEASE, now=t0)
    retry_at = t0 + 1.0003
    backend.retry(claim, retry_at, "boom")
    assert backend.claim(limit=1, lease=LEASE, now=retry_at - 0.0001) == []
    assert [c.job.id for c in backend.claim(limit=1, lease=LEASE, now=retry_at)] == ["j"]
