"""The registry of backends the contract suite runs against (see ``conftest.py``)."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from delayq.backends.base import FEATURES as STORE_FEATURES
from delayq.backends.base import Backend
from delayq.testing import FakeClock

__all__ = ["BACKEND_FACTORIES", "FEATURES", "BackendFactory", "OpenBackend"]

FEATURES = frozenset(STORE_FEATURES)


class OpenBackend(Protocol):
    """``open(clock, store, **options)``: a context manager yielding an open backend.

    ``options`` are backend constructor options the test needs (``result_ttl=``).
    """

    def __call__(
        self, clock: FakeClock, store: str, /, **options: Any
    ) -> contextlib.AbstractContextManager[Backend]: ...


class OpenLive(Protocol):
    """``open_live(store)``: a context manager yielding the store as in production.

    No injected clock: "due" on the store's own clock (the server's, for a
    distributed store) and the real blocking ``wait_for_due`` and wake-ups.
    """

    def __call__(self, store: str, /) -> contextlib.AbstractContextManager[Backend]: ...


@dataclass(frozen=True)
class BackendFactory:
    """How the contract suite opens one kind of backend (see the module docstring).

    ``open_live`` opens it in production mode for the real-time contract tests
    (``test_contract_live.py``); every store provides one.
    """

    name: str
    open: OpenBackend
    features: frozenset[str] = field(default_factory=frozenset)
    marks: tuple[Any, ...] = ()
    open_live: OpenLive | None = None

    def __post_init__(self) -> None:
        unknown = self.features - FEATURES
        if unknown:
            raise ValueError(f"{self.name}: unknown backend features {sorted(unknown)}")


def _discover() -> dict[str, BackendFactory]:
    found: dict[str, BackendFactory] = {}
    here = Path(__file__).parent
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda i: i.name):
        if not info.name.startswith("backend_"):
            continue
        module = importlib.import_module(f"tests.contract.{info.name}")
        factory: BackendFactory = module.FACTORY
        found[factory.name] = factory
    return found


BACKEND_FACTORIES: dict[str, BackendFactory] = _discover()
"""Every registered backend, by name (from ``tests/contract/backend_*.py``)."""
