"""The PostgreSQL backend in the contract suite (one schema per test store)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from delayq.backends.base import Backend
from delayq.backends.postgres import PostgresBackend
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory
from tests.postgres_support import POSTGRES_URL, app_name, pg_schema


@contextmanager
def _open(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
    with pg_schema(store) as schema:
        backend = PostgresBackend(
            POSTGRES_URL,
            schema=schema,
            clock=clock,
            pool_size=4,
            application_name=app_name(schema),
            **options,
        )
        try:
            yield backend
        finally:
            backend.close()


@contextmanager
def _open_live(store: str, /) -> Iterator[Backend]:
    # No clock: "due" on the server's clock, waits on LISTEN/NOTIFY.
    with pg_schema(store) as schema:
        backend = PostgresBackend(
            POSTGRES_URL, schema=schema, pool_size=4, application_name=app_name(schema)
        )
        try:
            yield backend
        finally:
            backend.close()


FACTORY = BackendFactory(
    name="postgres",
    open=_open,
    open_live=_open_live,
    features=PostgresBackend.features,
    marks=(pytest.mark.postgres,),
)
