"""The waking rule on Redis, where it is not automatic: workers share ONE wake token.

The contract says a sleeping worker learns of anything it must act on before
it planned to wake, leases included (so a lease whose holder died is recovered
on time). The memory and SQLite stores wake every waiter on every change; Redis
wakes ONE worker per token, so a worker the token missed keeps sleeping toward
its far-off job unless the claim that took a shorter lease wakes it. These
tests use the server's clock (real time), so they run against Redis only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from delayq.backends.redis import RedisBackend
from tests._util import wait_until
from tests.contract._support import spec
from tests.redis_support import REDIS_URL, redis_prefix

pytestmark = pytest.mark.redis


@pytest.fixture
def open_redis() -> Iterator[Callable[[], RedisBackend]]:
    """Handles on one fresh queue (own key prefix), closed afterwards."""
    with redis_prefix() as prefix:
        opened: list[RedisBackend] = []

        def open_() -> RedisBackend:
            backend = RedisBackend.from_url(REDIS_URL, prefix=prefix)
            opened.append(backend)
            return backend

        try:
            yield open_
        finally:
            for backend in opened:
                backend.close()


def server_time(backend: RedisBackend) -> float:
    seconds, micros = backend._redis.time()
    return float(seconds) + micros / 1e6


class Sleeper:
    """``wait_for_due`` on its own handle and thread."""

    def __init__(self, backend: RedisBackend, max_wait: float) -> None:
        self.backend = backend
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(max_wait,), daemon=True).start()

    def _run(self, max_wait: float) -> None:
        try:
            self.backend.wait_for_due(max_wait)
        finally:
            self.done.set()

    @property
    def blocked(self) -> bool:
        return bool(self.backend._wakes._in_redis)


def test_a_claim_taking_the_earliest_lease_wakes_a_worker_the_enqueue_token_missed(
    open_redis: Callable[[], RedisBackend],
) -> None:
    producer = open_redis()
    producer.enqueue([spec("far", server_time(producer) + 3600)])
    producer._redis.delete(producer._keys["wake"])  # the token that enqueue left
    sleepers = [Sleeper(open_redis(), max_wait=60), Sleeper(open_redis(), max_wait=60)]
    assert wait_until(lambda: all(s.blocked for s in sleepers), timeout=5)
    producer.enqueue([spec("now", server_time(producer))])  # one token: one sleeper wakes
    assert wait_until(lambda: any(s.done.is_set() for s in sleepers), timeout=5)
    [missed] = [s for s in sleepers if not s.done.is_set()]
    assert not missed.done.wait(0.2)  # still asleep toward the job due in an hour
    [claim] = producer.claim(limit=1, lease=2.0)  # a lease ending long before that job
    assert claim.job.id == "now"
    assert missed.done.wait(5), "the sleeping worker did not hear of the shorter lease"


def test_a_claim_behind_an_earlier_lease_wakes_nobody(
    open_redis: Callable[[], RedisBackend],
) -> None:
    producer = open_redis()
    now = server_time(producer)
    producer.enqueue([spec("first", now), spec("second", now), spec("far", now + 3600)])
    wake = producer._keys["wake"]
    producer._redis.delete(wake)  # the token that enqueue left
    [first] = producer.claim(limit=1, lease=5.0)
    assert producer._redis.llen(wake) == 1  # the earliest deadline now: a token
    producer._redis.delete(wake)
    [second] = producer.claim(limit=1, lease=30.0)  # ends after the first lease: no token
    assert (first.job.id, second.job.id) == ("first", "second")
    assert producer._redis.llen(wake) == 0


def test_a_claim_that_fills_its_limit_passes_the_token_on_for_a_later_job_of_the_batch(
    open_redis: Callable[[], RedisBackend],
) -> None:
    """One enqueue pushes one token; the busy worker that took it must pass one on
    when a job it cannot take (its slots are full) is due before any lease ends."""
    producer = open_redis()
    sleepers = [Sleeper(open_redis(), max_wait=60), Sleeper(open_redis(), max_wait=60)]
    assert wait_until(lambda: all(s.blocked for s in sleepers), timeout=5)
    now = server_time(producer)
    producer.enqueue([spec("now", now), spec("soon", now + 20)])  # one token
    assert wait_until(lambda: any(s.done.is_set() for s in sleepers), timeout=5)
    [missed] = [s for s in sleepers if not s.done.is_set()]
    assert not missed.done.wait(0.2)  # asleep for up to 60 s, unaware of "soon"
    # The worker that took the token fills its one slot; its lease outlasts "soon".
    [claim] = producer.claim(limit=1, lease=60.0)
    assert claim.job.id == "now"
    assert missed.done.wait(5), "the idle worker never heard of the job due in 20 s"
