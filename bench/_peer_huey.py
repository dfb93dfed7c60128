"""huey consumer entry for the Redis peers benchmark: ``huey_consumer bench._peer_huey.huey``."""

from __future__ import annotations

from huey import RedisHuey

from bench._peer_common import record, redis_url

# RedisHuey defaults throughout (blocking dequeue, results kept); only the Redis is chosen.
huey = RedisHuey("delayq-bench", url=redis_url())


@huey.task()
def noop(index: int, due: float) -> None:
    """No-op job that only records its lateness."""
    record(index, due)
