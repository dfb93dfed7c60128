"""The Redis backend in the contract suite (one key prefix per test store)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from delayq.backends.base import Backend
from delayq.backends.redis import RedisBackend
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory
from tests.redis_support import REDIS_URL, redis_prefix


@contextmanager
def _open(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
    with redis_prefix(store) as prefix:
        backend = RedisBackend.from_url(REDIS_URL, prefix=prefix, clock=clock, **options)
        try:
            yield backend
        finally:
            backend.close()


@contextmanager
def _open_live(store: str, /) -> Iterator[Backend]:
    # No clock: "due" on the server's TIME, waits in BLPOP on the wake list.
    with redis_prefix(store) as prefix:
        backend = RedisBackend.from_url(REDIS_URL, prefix=prefix)
        try:
            yield backend
        finally:
            backend.close()


FACTORY = BackendFactory(
    name="redis",
    open=_open,
    open_live=_open_live,
    features=RedisBackend.features,
    marks=(pytest.mark.redis,),
)
