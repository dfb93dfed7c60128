"""The Redis store stays bounded: capped records, chunked purges and large batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from delayq.backends.redis import RedisBackend
from delayq.backends.redis import _inspect as inspect_module
from delayq.backends.redis import _store as store_module
from delayq.errors import JobConflict
from delayq.job import CancelOutcome, JobSpec, JobState
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


def test_finished_records_past_the_cap_are_kept_compact_until_their_result_ttl(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis(max_finished=3)
    now = now_of(backend)
    backend.enqueue([spec(f"j{i}", now - 10 + i) for i in range(6)])
    for claim in backend.claim(limit=6, lease=30.0):
        backend.ack(claim)
    assert backend.stats().succeeded == 6  # three full records, three compact ones
    kept = [backend.get(f"j{i}") for i in range(3, 6)]
    assert all(j is not None and j.state is JobState.SUCCEEDED for j in kept)
    assert all(j is not None and j.payload == {} for j in kept)
    compact = [backend.get(f"j{i}") for i in range(3)]
    assert all(j is not None and j.state is JobState.SUCCEEDED for j in compact)
    assert all(j is not None and j.payload is None and "dropped" in (j.outcome or "")
               for j in compact)  # fmt: skip


def test_a_finished_id_past_the_cap_is_never_scheduled_again_within_its_window(
    open_redis: Callable[..., RedisBackend],
) -> None:
    # The dedup window: on a busy queue the oldest full records go past
    # max_finished long before result_ttl; keep / reject / cancel still see them.
    backend = open_redis(max_finished=2)
    now = now_of(backend)
    backend.enqueue([spec(f"o{i}", now - 1) for i in range(12)])
    for claim in backend.claim(limit=12, lease=30.0):
        backend.ack(claim)
    again = backend.enqueue([spec(f"o{i}", now) for i in range(12)], on_conflict="keep")
    assert [o.value for o in again] == ["kept"] * 12
    with pytest.raises(JobConflict):
        backend.enqueue([spec("o0", now)])
    assert backend.cancel("o0") is CancelOutcome.FINISHED
    assert backend.claim(limit=12, lease=30.0) == []  # nothing runs twice


def test_compact_records_past_their_own_cap_are_dropped_oldest_first(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis(max_finished=1)  # compact records: at most 10
    now = now_of(backend)
    backend.enqueue([spec(f"c{i:02}", now - 20 + i) for i in range(15)])
    for claim in backend.claim(limit=15, lease=30.0):
        backend.ack(claim)
    assert backend.stats().succeeded == 11
    assert [backend.get(f"c{i:02}") for i in range(4)] == [None] * 4
    assert all(backend.get(f"c{i:02}") is not None for i in range(4, 15))


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
