"""dramatiq worker entry for the Redis peers benchmark: ``dramatiq bench._peer_dramatiq``.

Importing it also makes the Redis broker the global broker, so the benchmark's enqueuing
side sends through the same broker configuration as the worker.
"""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench._peer_common import record, redis_url

broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)


@dramatiq.actor
def noop(index: int, due: float) -> None:
    """No-op job that only records its lateness."""
    record(index, due)
