"""arq worker entry for the Redis peers benchmark: ``arq bench._peer_arq.WorkerSettings``."""

from __future__ import annotations

from typing import Any, ClassVar

from arq.connections import RedisSettings

from bench._peer_common import record, redis_url


async def noop(ctx: dict[str, Any], index: int, due: float) -> None:
    """No-op job that only records its lateness."""
    record(index, due)


class WorkerSettings:
    """arq defaults throughout (poll_delay 0.5 s, max_jobs 10); only the Redis is chosen."""

    functions: ClassVar[list[Any]] = [noop]
    redis_settings = RedisSettings.from_dsn(redis_url())
