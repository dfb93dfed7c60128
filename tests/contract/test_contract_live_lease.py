"""Contract: a live lease is still "running" (the other side of ``test_contract_settled``).

Cancel and reschedule refuse a job whose lease has not run out, and the
claim's ack still takes effect afterwards.
"""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend
from delayq.job import CancelOutcome, RescheduleOutcome
from delayq.testing import FakeClock
from tests.contract._support import spec

pytestmark = pytest.mark.backend_features("clock", "definite_cancel")

LEASE = 10.0


def test_a_live_lease_is_still_running(backend: Backend, clock: FakeClock) -> None:
    backend.enqueue([spec("j", clock.time())])
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    clock.advance(LEASE - 1)
    assert backend.cancel("j") is CancelOutcome.RUNNING
    assert backend.reschedule("j", clock.time() + 60) is RescheduleOutcome.RUNNING
    backend.ack(claim)
