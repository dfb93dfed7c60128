"""``Backend.complete_and_claim``: record a batch, then claim the next jobs (one round
trip where the store allows it). Every test runs against every store.

``complete_and_claim`` has no ``now=``: the jobs here are due an hour before the
test clock's time, so they are due on any store's clock (the FakeClock's, or a
server's real one, which is later still).
"""

from __future__ import annotations

import pytest

from delayq.backends.base import Backend, Completion
from delayq.errors import InvalidOption, StaleClaim
from delayq.job import JobState
from delayq.testing import FakeClock
from tests.contract._support import spec
from tests.contract.test_contract import LEASE, claim_all, ids, state_of


def due_jobs(backend: Backend, clock: FakeClock, n: int) -> float:
    """Enqueue ``j0``..``j{n-1}``, due in that order an hour ago; return that time."""
    past = clock.time() - 3600
    backend.enqueue([spec(f"j{i}", past + i * 0.001) for i in range(n)])
    return past


def test_it_records_the_batch_then_claims_the_next_jobs_in_due_order(
    backend: Backend, clock: FakeClock
) -> None:
    past = due_jobs(backend, clock, 5)
    first = claim_all(backend, past + 1, limit=2)
    answers, claims = backend.complete_and_claim(
        [Completion.ack(c) for c in first], limit=2, lease=LEASE
    )
    assert answers == [None, None]
    assert ids(claims) == ["j2", "j3"]
    assert [state_of(backend, f"j{i}") for i in range(5)] == [
        JobState.SUCCEEDED,
        JobState.SUCCEEDED,
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.SCHEDULED,
    ]
    assert all(c.attempt == 1 for c in claims)
    assert len({c.token for c in [*first, *claims]}) == 4  # fresh fencing tokens


def test_a_limit_of_zero_only_records(backend: Backend, clock: FakeClock) -> None:
    past = due_jobs(backend, clock, 3)
    [first] = claim_all(backend, past + 1, limit=1)
    answers, claims = backend.complete_and_claim([Completion.ack(first)], limit=0, lease=LEASE)
    assert (answers, claims) == ([None], [])
    assert state_of(backend, "j0") is JobState.SUCCEEDED
    assert backend.stats().running == 0


def test_an_empty_batch_only_claims(backend: Backend, clock: FakeClock) -> None:
    due_jobs(backend, clock, 2)
    answers, claims = backend.complete_and_claim([], limit=5, lease=LEASE)
    assert answers == [] and ids(claims) == ["j0", "j1"]


def test_a_stale_entry_is_reported_and_the_rest_still_applies_and_claims(
    backend: Backend, clock: FakeClock
) -> None:
    past = due_jobs(backend, clock, 3)
    a, b = claim_all(backend, past + 1, limit=2)
    backend.complete([Completion.ack(a)])  # a's token is spent
    answers, claims = backend.complete_and_claim(
        [Completion.ack(a), Completion.retry(b, past, "boom")], limit=1, lease=LEASE
    )
    assert isinstance(answers[0], StaleClaim) and answers[1] is None
    assert ids(claims) == ["j1"]  # retried due at once, ahead of j2
    assert claims[0].attempt == 2


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_a_bad_limit_is_refused(backend: Backend, limit: object) -> None:
    with pytest.raises(InvalidOption, match="limit"):
        backend.complete_and_claim([], limit=limit, lease=LEASE)  # type: ignore[arg-type]
