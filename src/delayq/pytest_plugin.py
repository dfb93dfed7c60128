"""delayq's pytest plugin: fixtures for testing code that uses delayq.

Loaded by pytest when delayq is installed (the ``pytest11`` entry point); it only
defines fixtures, so it changes nothing in a test that does not ask for them:

* ``delayq_clock``: a :class:`~delayq.testing.FakeClock`;
* ``delayq_app``: an :class:`~delayq.testing.InlineApp` on that clock (a memory
  store; ``delayq_app.advance(1800)`` runs what falls due), closed after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from delayq.testing import FakeClock, InlineApp

__all__ = ["delayq_app", "delayq_clock"]


@pytest.fixture
def delayq_clock() -> FakeClock:
    """A fake clock for the test: it moves only when advanced."""
    return FakeClock()


@pytest.fixture
def delayq_app(delayq_clock: FakeClock) -> Iterator[InlineApp]:
    """A DelayQ on a memory store and ``delayq_clock`` whose jobs run inline."""
    app = InlineApp(clock=delayq_clock)
    try:
        yield app
    finally:
        app.close()
