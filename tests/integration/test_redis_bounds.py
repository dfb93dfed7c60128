"""The Redis store stays bounded: capped records, chunked purges and large batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from delayq.backends.redis import RedisBackend
from delayq.backends.redis import _inspect as inspect_module
from delayq.backends.redis import _store as store_module
from delayq.errors import JobConflict
from delayq.job import JobSpec, JobState
from tests.redis_support import REDIS_URL, redis_prefix

pytestmark = [pytest.mark.redis]


def spec(job_id: str, run_at: float, *, max_attempts: int = 3) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload="{}", run_at=run_at, max_attempts=max_attempts)


@pytest.fixture
def open_redis() -> Iterator[Callable[..., RedisBackend]]:
    opened: list[RedisBackend] = []
    with redis_prefix() as prefix:

        def open_(**options: object) -> RedisBackend:
            backend = RedisBackend.from_url(REDIS_URL, prefix=prefix, **options)  # type: ignore[arg-type]
            opened.append(backend)
            return backend

        try:
            yield open_
        finally:
            for backend in opened:
                backend.close()


def now_of(backend: RedisBackend) -> float:
    seconds, micros = backend._redis.time()
    return float(seconds) + micros / 1e6


def test_finished_records_past_the_cap_are_dropped_oldest_first(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis(max_finished=3)
    now = now_of(backend)
    backend.enqueue([spec(f"j{i}", now - 10 + i) for i in range(6)])
    for claim in backend.claim(limit=6, lease=30.0):
        backend.ack(claim)
    assert backend.stats().succeeded == 3
    assert [backend.get(f"j{i}") for i in range(3)] == [None, None, None]
    kept = [backend.get(f"j{i}") for i in range(3, 6)]
    assert all(j is not None and j.state is JobState.SUCCEEDED for j in kept)


def test_dead_letters_past_the_cap_are_dropped_oldest_first(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis(max_dead=2)
    now = now_of(backend)
    backend.enqueue([spec(f"d{i}", now - 10 + i, max_attempts=1) for i in range(4)])
    for claim in backend.claim(limit=4, lease=30.0):
        backend.bury(claim, "boom")
    assert backend.stats().dead == 2
    assert [j.id for j in backend.dead_letters()] == ["d3", "d2"]
    assert backend.get("d0") is None


def test_purge_dead_deletes_every_dead_job_in_bounded_calls(
    open_redis: Callable[..., RedisBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inspect_module, "PURGE_BATCH", 7)
    backend = open_redis()
    now = now_of(backend)
    backend.enqueue([spec(f"d{i}", now - 1, max_attempts=1) for i in range(30)])
    for claim in backend.claim(limit=30, lease=30.0):
        backend.bury(claim, "boom")
    assert backend.purge_dead(job_ids=[f"d{i}" for i in range(10)]) == 10
    assert backend.purge_dead() == 20
    assert backend.stats().dead == 0


def test_a_batch_larger_than_one_call_is_stored_whole_or_not_at_all(
    open_redis: Callable[..., RedisBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "ENQUEUE_CHUNK", 4)
    backend = open_redis()
    now = now_of(backend)
    backend.enqueue([spec("taken", now + 60)])
    with pytest.raises(JobConflict, match="taken"):
        backend.enqueue([spec(f"j{i}", now + i) for i in range(9)] + [spec("taken", now)])
    assert backend.stats().scheduled == 1  # nothing of the batch
    with pytest.raises(JobConflict, match="more than once"):
        backend.enqueue([spec(f"j{i}", now + i) for i in range(9)] + [spec("j0", now)])
    outcomes = backend.enqueue([spec(f"j{i}", now + i) for i in range(10)])
    assert len(outcomes) == 10 and backend.stats().scheduled == 11
    kept = backend.enqueue(
        [spec(f"j{i}", now + i) for i in range(5)] + [spec("new", now)], on_conflict="keep"
    )
    assert [o.value for o in kept] == ["kept"] * 5 + ["created"]
