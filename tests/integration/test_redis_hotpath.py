"""The Redis store's hot path: complete-and-claim in one script call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.redis import RedisBackend
from delayq.backends.redis._connection import Connection
from delayq.errors import InvalidOption, StaleClaim
from delayq.job import JobSpec, JobState
from tests.redis_support import REDIS_URL, redis_prefix

pytestmark = [pytest.mark.redis]


def spec(job_id: str, run_at: float) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload="{}", run_at=run_at)


@pytest.fixture
def backend() -> Iterator[RedisBackend]:
    with redis_prefix() as prefix:
        b = RedisBackend.from_url(REDIS_URL, prefix=prefix)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def script_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = Connection.script

    def counting(self: Connection, name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(Connection, "script", counting)
    return calls


def now_of(backend: RedisBackend) -> float:
    seconds, micros = backend._redis.time()
    return float(seconds) + micros / 1e6


def test_complete_and_claim_finishes_the_batch_and_claims_the_next_in_one_script_call(
    backend: RedisBackend, script_calls: list[str]
) -> None:
    now = now_of(backend)
    backend.enqueue([spec(f"j{i}", now - 1) for i in range(5)])
    first = backend.claim(limit=2, lease=30.0)
    stale = first[1]
    backend.complete([Completion.ack(stale)])  # a second ack of it is stale
    script_calls.clear()
    answers, claims = backend.complete_and_claim(
        [Completion.ack(first[0]), Completion.ack(stale)], limit=2, lease=30.0
    )
    assert script_calls == ["complete_and_claim"]
    assert answers[0] is None and isinstance(answers[1], StaleClaim)
    assert [c.job.id for c in claims] == ["j2", "j3"]
    assert all(c.job.state is JobState.RUNNING and c.job.attempts == 1 for c in claims)
    job = backend.get("j0")
    assert job is not None and job.state is JobState.SUCCEEDED


def test_complete_and_claim_with_limit_zero_claims_nothing(backend: RedisBackend) -> None:
    now = now_of(backend)
    backend.enqueue([spec("a", now - 1), spec("b", now - 1)])
    [claim] = backend.claim(limit=1, lease=30.0)
    answers, claims = backend.complete_and_claim(
        [Completion.retry(claim, now + 60, "boom")], limit=0, lease=30.0
    )
    assert answers == [None] and claims == []
    assert backend.stats().running == 0
    _, claims = backend.complete_and_claim([], limit=5, lease=30.0)
    assert [c.job.id for c in claims] == ["b"]
    with pytest.raises(InvalidOption):
        backend.complete_and_claim([], limit=-1, lease=30.0)
