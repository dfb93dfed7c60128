"""Redis tells result waiters in other processes: ``ack_job`` publishes the id of a
job acked with a result on the queue's ``done`` channel."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from delayq import DelayQ
from delayq.backends.base import Completion, TellsFinishes
from delayq.backends.redis import RedisBackend
from delayq.testing import FakeClock
from tests._util import wait_until
from tests.redis_support import REDIS_URL, redis_client, redis_prefix

pytestmark = pytest.mark.redis

TIMEOUT = 30.0  # real seconds; only reached when something is broken


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix() as p:
        yield p


def test_a_result_acked_by_another_handle_wakes_the_waiter_at_once(prefix: str) -> None:
    clock = FakeClock()  # the app's: never advanced, so only the notice ends the wait
    store = RedisBackend(REDIS_URL, prefix=prefix, queue="orders")
    other = RedisBackend(REDIS_URL, prefix=prefix, queue="orders")  # as another process
    app = DelayQ(backend=store, clock=clock)
    client = redis_client()
    try:
        assert isinstance(store, TellsFinishes)
        job_id = app.schedule("total", None)
        got: list[Any] = []
        waiter = threading.Thread(
            target=lambda: got.append(app.result(job_id, timeout=3600)), daemon=True
        )
        waiter.start()
        assert clock.wait_for_waiters(1, TIMEOUT)  # it read the job unfinished
        channel = f"{prefix}:{{orders}}:done"
        assert wait_until(lambda: client.pubsub_numsub(channel)[0][1] >= 1, TIMEOUT)
        [claim] = other.claim(limit=1, lease=30)
        assert other.complete([Completion.ack(claim, result='{"total": 42}')]) == [None]
        waiter.join(TIMEOUT)
        assert not waiter.is_alive(), "the waiter was not told"
        assert got == [{"total": 42}]
    finally:
        app.close()
        store.close()
        other.close()
        client.close()
