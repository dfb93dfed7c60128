"""The in-memory reference backend in the contract suite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from delayq.backends.base import Backend
from delayq.backends.memory import MemoryBackend
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory


@contextmanager
def _open(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
    backend = MemoryBackend(clock=clock, **options)
    try:
        yield backend
    finally:
        backend.close()


@contextmanager
def _open_live(store: str, /) -> Iterator[Backend]:
    backend = MemoryBackend()
    try:
        yield backend
    finally:
        backend.close()


FACTORY = BackendFactory(
    name="memory", open=_open, features=MemoryBackend.features, open_live=_open_live
)
