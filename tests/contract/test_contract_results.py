"""Results (feature ``results``): an ack's return value is kept with the finished record.

Every test receives ``backend`` (one per registered factory) and the test's
``clock`` (a FakeClock). Claims always pass ``now=`` explicitly.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from delayq.backends.base import Backend, Completion
from delayq.errors import InvalidOption
from delayq.job import Job, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec
from tests.contract.test_contract import LEASE, claim_all, claim_one

pytestmark = pytest.mark.backend_features("results")


def job_of(backend: Backend, job_id: str) -> Job:
    job = backend.get(job_id)
    assert job is not None, job_id
    return job


def test_an_ack_s_result_is_kept_with_the_finished_record(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("sum", t0), spec("plain", t0)])
    total, plain = claim_all(backend, t0)
    assert backend.complete(
        [Completion.ack(total, result='{"total":3}'), Completion.ack(plain, outcome="note")]
    ) == [None, None]
    done = job_of(backend, "sum")
    assert (done.state, done.result) == (JobState.SUCCEEDED, '{"total":3}')
    other = job_of(backend, "plain")
    assert (other.state, other.outcome, other.result) == (JobState.SUCCEEDED, "note", None)
    listed = {j.id: j.result for j in backend.list_jobs(state=JobState.SUCCEEDED)}
    assert listed == {"sum": '{"total":3}', "plain": None}


def test_a_result_reads_back_exactly_with_any_text_and_at_64_kib(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("text", t0), spec("big", t0), spec("null", t0)])
    text, big, null = claim_all(backend, t0)
    odd = json.dumps({"é": "日本 \u0000 \n 'quote' \"dq\"", "n": [1.5, None, True]})
    large = json.dumps("x" * (64 * 1024 - 2))
    backend.complete(
        [
            Completion.ack(text, result=odd),
            Completion.ack(big, result=large),
            Completion.ack(null, result="null"),
        ]
    )
    assert job_of(backend, "text").result == odd
    assert job_of(backend, "big").result == large
    assert job_of(backend, "null").result == "null"  # a handler that returned None


def test_a_retry_keeps_no_result_and_the_later_success_stores_its_own(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("flaky", t0)])
    first = claim_one(backend, t0)
    backend.complete([Completion.retry(first, t0 + 5, "HTTP 503")])
    assert job_of(backend, "flaky").result is None
    second = claim_one(backend, t0 + 5)
    backend.complete([Completion.ack(second, result="[2]")])
    assert job_of(backend, "flaky").result == "[2]"


def test_replace_of_a_finished_job_drops_its_result(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("again", t0)])
    backend.complete([Completion.ack(claim_one(backend, t0), result="42")])
    backend.enqueue([spec("again", t0 + 10)], on_conflict="replace")
    replaced = job_of(backend, "again")
    assert (replaced.state, replaced.result) == (JobState.SCHEDULED, None)
    backend.complete([Completion.ack(claim_one(backend, t0 + 10))])
    assert job_of(backend, "again").result is None


def test_complete_and_claim_keeps_the_result_of_its_acks(
    backend: Backend, clock: FakeClock
) -> None:
    past = clock.time() - 3600  # due on any store's clock (see test_contract_complete_and_claim)
    backend.enqueue([spec("a", past), spec("b", past + 0.001)])
    first = claim_one(backend, clock.time())
    answers, claims = backend.complete_and_claim(
        [Completion.ack(first, result='"ok"')], limit=1, lease=LEASE
    )
    assert answers == [None]
    assert [c.job.id for c in claims] in (["b"], [])  # a two-call store claims nothing
    assert job_of(backend, "a").result == '"ok"'


@pytest.mark.backend_features("results", "clock")
def test_a_result_goes_with_its_record_after_result_ttl(
    open_backend: Callable[..., Backend], clock: FakeClock
) -> None:
    backend = open_backend(result_ttl=60)
    t0 = clock.time()
    backend.enqueue([spec("kept", t0)])
    backend.complete([Completion.ack(claim_one(backend, t0), result="1")])
    clock.advance(59)
    assert job_of(backend, "kept").result == "1"
    clock.advance(2)
    backend.claim(limit=1, lease=LEASE, now=clock.time())
    assert backend.get("kept") is None


def test_a_result_is_only_for_a_succeeded_ack(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("j", t0)])
    claim = claim_one(backend, t0)
    with pytest.raises(InvalidOption, match="only for an ack as succeeded"):
        Completion.ack(claim, state=JobState.SKIPPED, result="1")
    with pytest.raises(InvalidOption, match="only for an ack as succeeded"):
        Completion(claim, JobState.DEAD, error="boom", result="1")
