"""Redis for tests: the shared server's URL, per-test key prefixes, and cleanup.

Tests use the server at ``DELAYQ_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``)
under their own key prefix, delete their keys afterwards, and never flush it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from tests.conftest import service_missing

REDIS_URL = os.environ.get("DELAYQ_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_client(url: str = REDIS_URL) -> redis.Redis:
    """A redis-py client on ``url``; skips (or fails in CI) when it does not answer."""
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        service_missing("Redis", f"{url}: {exc}")
    return client


def unique_prefix(seed: str | None = None) -> str:
    """A key prefix no other test uses (stable for one ``seed``)."""
    if seed is None:
        seed = uuid.uuid4().hex
    return "delayqtest:" + hashlib.sha1(seed.encode()).hexdigest()[:12]


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` (SCAN, never FLUSH)."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.delete(*batch)
            batch.clear()
    if batch:
        deleted += client.delete(*batch)
    return deleted


@contextmanager
def redis_prefix(seed: str | None = None, url: str = REDIS_URL) -> Iterator[str]:
    """A fresh key prefix on the test Redis, whose keys are deleted afterwards."""
    client = redis_client(url)
    prefix = unique_prefix(seed)
    try:
        yield prefix
    finally:
        delete_prefix(client, prefix)
        client.close()
