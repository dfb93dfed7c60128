"""Batched renewals, and attempts counted from the handler's start (``attempt_at_start``).

See the rules "Batched renewals" and "Attempts count from the start" in
``delayq.backends.base``.
"""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend
from delayq.errors import StaleClaim
from delayq.job import Claim, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec

needs_clock = pytest.mark.backend_features("clock")

LEASE = 30.0


def claim_all(backend: Backend, now: float, limit: int = 100, lease: float = LEASE) -> list[Claim]:
    return backend.claim(limit=limit, lease=lease, now=now)


@needs_clock
def test_extend_many_renews_each_claim_and_reports_stale_ones(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0), spec("b", t0), spec("c", t0)])
    a, b, c = claim_all(backend, t0, lease=10)
    backend.ack(b)  # b's claim is no longer current
    clock.advance(8)
    answers = backend.extend_many([a, b, c], 10)
    assert len(answers) == 3
    renewed_a, stale_b, renewed_c = answers
    assert isinstance(stale_b, StaleClaim)
    assert isinstance(renewed_a, Claim) and isinstance(renewed_c, Claim)
    assert (renewed_a.token, renewed_c.token) == (a.token, c.token)
    assert renewed_a.lease_until == pytest.approx(t0 + 18)
    assert renewed_c.lease_until == pytest.approx(t0 + 18)
    assert claim_all(backend, t0 + 15) == []  # both leases live on
    assert backend.extend_many([], 10) == []
    backend.ack(renewed_a)
    backend.ack(renewed_c)
    job = backend.get("a")
    assert job is not None and job.state is JobState.SUCCEEDED
