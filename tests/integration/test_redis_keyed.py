"""Keyed calls on Redis: the key's record lives with its current job, and producers in
several processes calling on the same keys at once get one decision each."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq import DelayQ
from delayq.backends.redis import RedisBackend
from delayq.job import JobSpec, JobState
from delayq.keyed import KeyedOutcome, KeyedResult, KeyPolicy
from delayq.testing import FakeClock
from tests.redis_support import REDIS_URL, redis_prefix

pytestmark = [pytest.mark.redis]

DEBOUNCE = KeyPolicy.build("debounce", max_wait=60)
THROTTLE = KeyPolicy.build("throttle", window=10)
UNIQUE = KeyPolicy.build("keep", unique="until_finished")
APPEND = KeyPolicy.build("append", max_items=7)
PROCESSES = 4
CALLS = 60


def call(backend: RedisBackend, policy: KeyPolicy | None, payload: Any, *, key: str = "k",
         delay: float = 5.0) -> KeyedResult:  # fmt: skip
    assert policy is not None
    job = JobSpec(id=key, name="t", payload=json.dumps(payload), run_at=0.0, delay=delay)
    return backend.enqueue_keyed(job, policy)


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix() as name:
        yield name


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def open_redis(prefix: str) -> Iterator[Callable[..., RedisBackend]]:
    opened: list[RedisBackend] = []

    def open_(**options: Any) -> RedisBackend:
        backend = RedisBackend.from_url(REDIS_URL, prefix=prefix, **options)
        opened.append(backend)
        return backend

    yield open_
    for backend in opened:
        backend.close()


def record(backend: RedisBackend, key: str = "k") -> str:
    return backend._keys["keyed:"] + key


def test_the_record_expires_with_its_finished_job_and_a_new_call_starts_over(
    open_redis: Callable[..., RedisBackend], client: redis.Redis
) -> None:
    clock = FakeClock()
    backend = open_redis(clock=clock, result_ttl=60)
    call(backend, DEBOUNCE, 1, delay=0)
    assert client.pttl(record(backend)) == -1  # held by a live job: no expiry
    [claim] = backend.claim(limit=1, lease=30)
    backend.ack(claim)
    assert 0 < client.pttl(record(backend)) <= 60_000  # kept as long as the job's record
    job = backend.get("k")
    assert job is not None and job.keyed is not None and job.keyed.run == 1
    clock.advance(61)
    assert backend.get("k") is None  # purged past result_ttl, and its key's record with it
    assert not client.exists(record(backend))
    again = call(backend, DEBOUNCE, 2)
    assert (again.id, again.outcome) == ("k", KeyedOutcome.CREATED)
    assert client.pttl(record(backend)) == -1


def test_a_throttle_record_outlives_its_purged_job_until_the_window_ends(
    open_redis: Callable[..., RedisBackend], client: redis.Redis
) -> None:
    clock = FakeClock()
    backend = open_redis(clock=clock, result_ttl=1)
    call(backend, THROTTLE, 1, delay=0)
    [claim] = backend.claim(limit=1, lease=30)
    backend.ack(claim)
    assert 1_000 < client.pttl(record(backend)) <= 10_000  # the window, not result_ttl
    clock.advance(3)
    assert backend.get("k") is None
    assert call(backend, THROTTLE, 2, delay=0).outcome is KeyedOutcome.DROPPED
    clock.advance(8)  # the window ended
    assert (call(backend, THROTTLE, 3, delay=0).outcome) is KeyedOutcome.CREATED


def test_cancel_dead_letters_and_caps_release_the_record(
    open_redis: Callable[..., RedisBackend], client: redis.Redis
) -> None:
    backend = open_redis(result_ttl=60, max_finished=1)
    call(backend, UNIQUE, 1, key="c")
    backend.cancel("c")
    assert 0 < client.pttl(record(backend, "c")) <= 60_000
    call(backend, UNIQUE, 1, key="d")
    backend.cancel("d")  # past max_finished=1: "c" is kept compact, its record with it
    assert 0 < client.pttl(record(backend, "c")) <= 60_000 and client.exists(record(backend, "d"))
    call(backend, UNIQUE, 1, key="x", delay=0)
    [claim] = backend.claim(limit=1, lease=30)
    backend.bury(claim, "boom")
    assert client.pttl(record(backend, "x")) == -1  # a dead letter is kept until purged
    assert backend.purge_dead(job_ids=["x"]) == 1
    assert not client.exists(record(backend, "x"))
    call(backend, UNIQUE, 1, key="y", delay=0)
    [claim] = backend.claim(limit=1, lease=30)
    backend.bury(claim, "boom")
    assert call(backend, UNIQUE, 2, key="y").id == "y#2"  # the dead letter frees the key
    assert backend.purge_dead(job_ids=["y"]) == 1
    assert client.exists(record(backend, "y"))  # y#2 is the current run: its record stays


def test_an_earlier_finished_run_holding_the_new_id_is_kept_and_skipped(
    open_redis: Callable[..., RedisBackend],
) -> None:
    clock = FakeClock()
    backend = open_redis(clock=clock, result_ttl=100)
    call(backend, DEBOUNCE, 1, delay=0)
    [first] = backend.claim(limit=1, lease=300)
    call(backend, DEBOUNCE, 2, delay=0)  # k#2 beside the running k
    [second] = backend.claim(limit=1, lease=300)
    backend.ack(second)
    clock.advance(50)
    backend.ack(first)
    clock.advance(51)  # k#2 is purged, k (finished later) is not
    assert backend.get("k#2") is None and backend.get("k") is not None
    result = call(backend, DEBOUNCE, 3)  # the key was released with k#2: run 1 again...
    assert (result.id, result.outcome) == ("k#2", KeyedOutcome.CREATED)  # ...past k
    kept = backend.get("k")
    assert kept is not None and kept.state is JobState.SUCCEEDED and kept.payload == 1
    assert backend.get("k#2").payload == 3  # type: ignore[union-attr]


def _produce(prefix: str, who: int, go: Any, out: Any) -> None:
    backend = RedisBackend.from_url(REDIS_URL, prefix=prefix)
    try:
        go.wait(timeout=30)
        results = []
        for n in range(CALLS):
            for key, policy in (("a", APPEND), ("d", DEBOUNCE), ("u", UNIQUE)):
                r = call(backend, policy, f"{who}:{n}", key=key, delay=300)
                results.append((key, r.id, r.outcome.value))
        out.put(results)
    finally:
        backend.close()


def test_producers_in_several_processes_make_exactly_the_expected_jobs(prefix: str) -> None:
    context = multiprocessing.get_context("spawn")
    go = context.Barrier(PROCESSES)
    out = context.Queue()
    procs = [
        context.Process(target=_produce, args=(prefix, who, go, out)) for who in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    results = [item for _ in procs for item in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    total = PROCESSES * CALLS
    by_key = {key: [(i, o) for k, i, o in results if k == key] for key in "adu"}
    assert [o for _, o in by_key["d"]].count("created") == 1
    assert {i for i, _ in by_key["d"]} == {"d"}
    assert [o for _, o in by_key["u"]].count("created") == 1
    assert {o for _, o in by_key["u"]} == {"created", "kept"}
    batches = -(-total // 7)
    assert [o for _, o in by_key["a"]].count("created") == batches
    backend = RedisBackend.from_url(REDIS_URL, prefix=prefix)
    try:
        ids = ["a"] + [f"a#{n}" for n in range(2, batches + 1)]
        lists = [backend.get(i).payload for i in ids]  # type: ignore[union-attr]
        assert backend.get(f"a#{batches + 1}") is None
        assert [len(items) for items in lists[:-1]] == [7] * (batches - 1)
        items = [item for batch in lists for item in batch]
        assert sorted(items) == sorted(f"{w}:{n}" for w in range(PROCESSES) for n in range(CALLS))
        for who in range(PROCESSES):  # one producer's items keep their order
            mine = [int(i.split(":")[1]) for i in items if i.startswith(f"{who}:")]
            assert mine == sorted(mine)
        debounced = backend.get("d")
        assert debounced is not None and debounced.keyed is not None
        assert debounced.keyed.calls == total and debounced.keyed.extended == total - 1
    finally:
        backend.close()


def test_the_app_schedules_keyed_calls_on_redis(prefix: str) -> None:
    app = DelayQ(f"{REDIS_URL}?prefix={prefix}")
    try:
        for n in range(3):
            app.schedule("digest", {"event": n}, job_id="d", on_conflict="append", max_items=10)
        result = app.schedule_keyed("ping", None, job_id="p", on_conflict="throttle", window=10)
        assert (result.id, result.outcome) == ("p", KeyedOutcome.CREATED)
        again = app.schedule_keyed("ping", None, job_id="p", on_conflict="throttle", window=10)
        assert again.outcome is KeyedOutcome.DROPPED
        job = app.get("d")
        assert job is not None and job.payload == [{"event": 0}, {"event": 1}, {"event": 2}]
        assert job.keyed is not None and (job.keyed.mode, job.keyed.items) == (
            "append max_items=10",
            3,
        )
    finally:
        app.close()


def test_a_plain_replace_of_a_key_s_finished_run_keeps_it_the_key_s_run(
    open_redis: Callable[..., RedisBackend], client: redis.Redis
) -> None:
    backend = open_redis(result_ttl=60)
    call(backend, DEBOUNCE, 1, delay=0)
    [claim] = backend.claim(limit=1, lease=30)
    backend.ack(claim)
    assert client.pttl(record(backend)) > 0
    backend.enqueue(
        [JobSpec(id="k", name="t", payload="2", run_at=0.0, delay=100)], on_conflict="replace"
    )
    assert client.pttl(record(backend)) == -1  # held again by the live job
    result = call(backend, DEBOUNCE, 3)
    assert (result.id, result.outcome) == ("k", KeyedOutcome.EXTENDED)
    backend.cancel("k")
    assert client.pttl(record(backend)) > 0  # and released with it
