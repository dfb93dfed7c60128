"""The SQLite backend in the contract suite: a file per test, and ``:memory:``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from delayq.backends.base import Backend
from delayq.backends.sqlite import SQLiteBackend
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory


@contextmanager
def _open(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
    # synchronous="normal": the same code paths, without an fsync per test commit.
    backend = SQLiteBackend(store, clock=clock, synchronous="normal", **options)
    try:
        yield backend
    finally:
        backend.close()


@contextmanager
def _open_live(store: str, /) -> Iterator[Backend]:
    backend = SQLiteBackend(store, synchronous="normal")
    try:
        yield backend
    finally:
        backend.close()


FACTORY = BackendFactory(
    name="sqlite", open=_open, features=SQLiteBackend.features, open_live=_open_live
)
