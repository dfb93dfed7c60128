"""saq worker entry for the Redis peers benchmark: ``saq bench._peer_saq.settings``."""

from __future__ import annotations

from typing import Any

from saq import Queue

from bench._peer_common import record, redis_url


async def noop(ctx: dict[str, Any], *, index: int, due: float) -> None:
    """No-op job that only records its lateness."""
    record(index, due)


# saq defaults throughout (concurrency 10, timers.schedule 1 s); only the Redis is chosen.
settings: dict[str, Any] = {
    "queue": Queue.from_url(redis_url()),
    "functions": [noop],
}
