"""The contract suite's backends: one registry, every test runs against every store.

How a backend plugs in
----------------------
Add a module ``tests/contract/backend_<name>.py`` that defines ``FACTORY``, a
:class:`~tests.contract._registry.BackendFactory`. It is discovered
automatically (no edit here needed) and every contract test is parametrized
with it (test ids ``[<name>]``).

``BackendFactory.open(clock, store, **options)`` is a context manager that yields an open
backend and cleans the store up afterwards:

* ``clock`` is the test's :class:`~delayq.testing.FakeClock`. The tests always
  pass ``now=clock.time()`` to ``claim`` explicitly, so a store that decides
  "due" on its own server clock still runs the suite. Backends that also use
  the injected clock everywhere else (ack/retry/extend timestamps, the
  ``result_ttl`` purge, ``stats().due``, ``wait_for_due`` deadlines) declare the
  ``"clock"`` feature.
* ``store`` is a per-test name (a file path for SQLite, a key prefix for Redis).
  Opening the same ``store`` twice must give two handles on one store if the
  factory declares ``"shared"``.
* ``options`` are constructor options a test needs (only ``result_ttl=``).
* Skip (or fail under ``DELAYQ_REQUIRE_SERVICES=1``) from inside ``open`` with
  :func:`tests.conftest.service_missing` when a server is absent; add
  ``marks=(pytest.mark.redis,)`` so ``-m 'not redis'`` deselects it.

Features a test may need (``@pytest.mark.backend_features("clock")``; tests
whose backend lacks one are skipped with the reason):

* ``clock``: the backend takes ``clock=`` and uses it for every time it is not
  given as ``now=``.
* ``shared``: two handles opened on one ``store`` see the same jobs.
* ``durable``: a store closed and reopened keeps its jobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from delayq.backends.base import Backend
from delayq.testing import FakeClock
from tests.contract._declared_gaps import run_time_gap_error
from tests.contract._registry import BACKEND_FACTORIES, BackendFactory

__all__ = ["BACKEND_FACTORIES", "BackendFactory"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Fail a run-time skip the table does not declare, and a declared one that runs."""
    report = yield
    params = getattr(item, "callspec", None)
    factory = params.params.get("factory") if params is not None else None
    if not isinstance(factory, BackendFactory) or not isinstance(item, pytest.Function):
        return report
    where = report.longrepr[0] if isinstance(report.longrepr, tuple) else ""
    error = run_time_gap_error(
        factory.name,
        item.originalname,
        skipped_at_run_time=report.skipped and Path(where).name == "_realtime.py",
        ran=report.when == "call" and report.passed,
    )
    if error is not None:
        report.outcome = "failed"
        report.longrepr = error
    return report


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backend_features(*names): contract test needs these backend features"
    )


@pytest.fixture(
    params=[pytest.param(f, id=name, marks=f.marks) for name, f in BACKEND_FACTORIES.items()]
)
def factory(request: pytest.FixtureRequest) -> BackendFactory:
    """The backend kind under test; skips tests needing features it lacks."""
    f: BackendFactory = request.param
    marker = request.node.get_closest_marker("backend_features")
    if marker is not None:
        missing = set(marker.args) - f.features
        if missing:
            pytest.skip(f"{f.name} backend lacks feature(s) {sorted(missing)}")
    return f


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A fresh store name for this test (a file path; Redis uses it as a prefix seed)."""
    return str(tmp_path / "jobs.db")


@pytest.fixture
def backend(factory: BackendFactory, clock: FakeClock, store: str) -> Iterator[Backend]:
    with factory.open(clock, store) as b:
        yield b


@pytest.fixture
def open_backend(
    factory: BackendFactory, clock: FakeClock, store: str
) -> Iterator[Callable[..., Backend]]:
    """Open a backend on the test's store with options (``open_backend(result_ttl=60)``)."""
    with contextlib.ExitStack() as stack:
        yield lambda **options: stack.enter_context(factory.open(clock, store, **options))


@pytest.fixture
def open_another(
    factory: BackendFactory, clock: FakeClock, store: str
) -> Iterator[Callable[..., Backend]]:
    """Open more handles on the test's store (needs the ``shared`` feature)."""
    if "shared" not in factory.features:
        pytest.skip(f"{factory.name} backend lacks feature 'shared'")
    with contextlib.ExitStack() as stack:
        yield lambda **options: stack.enter_context(factory.open(clock, store, **options))
