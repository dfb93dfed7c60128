"""Real-time mode of the contract suite, for stores that cannot take injected time.

The suite drives time with a :class:`~delayq.testing.FakeClock` and passes
``now=`` to ``claim``. A broker decides "due" by itself, in real time, and
delivers a due job a few milliseconds later, so a store without the ``clock``
feature runs the suite through :func:`realtime`, which wraps its factory's
``open`` and keeps each test's meaning this way:

* The store gets the test's FakeClock as ``clock=``: times it stamps and the
  relative delay of a job (its ``run_at`` minus the clock's "now") come from
  it, so a job due at ``t0 + 10`` is due ten real seconds after it is stored.
* ``claim(now=t)`` with ``t`` at or before the clock's "now" means "what is
  due now": it claims again and again until the jobs have arrived, by a
  deadline. It returns as soon as ``limit`` jobs came, or once nothing more
  came for ``QUIET`` seconds after the first; a claim that finds nothing
  waits until ``DEADLINE`` (so an expected empty claim is checked for that long).
* ``claim(now=t)`` with ``t`` in the future of the clock needs injected
  time: the test is skipped, naming the missing ``clock`` feature.
* A call the store answers with :class:`~delayq.errors.Unsupported` skips the
  test with the store's reason, provided the store does not declare the
  feature that call needs (``inspect``, ``definite_cancel``); when it does,
  the error propagates and the test fails. A store without ``inspect`` keeps
  no index of job ids, so it cannot tell that an id is taken: a test that
  enqueues an id it enqueued before (a conflict test) is skipped too.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from delayq.backends.base import Backend
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import Unsupported
from delayq.job import Claim, EnqueueOutcome, JobSpec
from delayq.testing import FakeClock

__all__ = ["DEADLINE", "QUIET", "RealTimeStore", "realtime"]

DEADLINE = 2.0
"""Real seconds a claim of what is due now waits for the first job to arrive."""

QUIET = 0.2
"""Real seconds without a new arrival after which such a claim returns what it has."""

_FEATURE_OF: dict[str, str] = {
    "get": "inspect",
    "list_jobs": "inspect",
    "stats": "inspect",
    "next_due": "inspect",
    "enqueue": "inspect",  # on_conflict keep / replace need an index of ids
    "cancel": "definite_cancel",
    "reschedule": "definite_cancel",
}


class RealTimeStore:
    """A store seen by the contract suite in real time (see the module docstring)."""

    def __init__(self, backend: Backend, clock: FakeClock) -> None:
        self._backend = backend
        self._clock = clock
        self._ids: set[str] = set()  # ids enqueued through this handle

    def enqueue(self, jobs: Sequence[JobSpec], **options: Any) -> list[EnqueueOutcome]:
        if "inspect" not in self._backend.features:
            ids = [spec.id for spec in jobs]
            taken = self._ids.intersection(ids) or {i for i in ids if ids.count(i) > 1}
            if taken:
                pytest.skip(
                    f"store lacks feature 'inspect': it keeps no index of job ids, so it "
                    f"cannot tell that {sorted(taken)[0]!r} is taken (on_conflict)"
                )
            self._ids.update(ids)
        return self.__getattr__("enqueue")(jobs, **options)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        feature = _FEATURE_OF.get(name)
        if feature is None or not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Unsupported as exc:
                if feature in self._backend.features:
                    raise
                pytest.skip(f"store lacks feature {feature!r}: {exc}")

        return call

    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        if now is not None and now > self._clock.time():
            pytest.skip(
                "store lacks feature 'clock': the test claims at an injected future time "
                f"(now=clock+{now - self._clock.time():g}s)"
            )
        claims = self._backend.claim(limit=limit, lease=lease)
        clock = SYSTEM_CLOCK
        deadline = clock.monotonic() + DEADLINE
        quiet_until = clock.monotonic() + QUIET
        while len(claims) < limit:
            now_mono = clock.monotonic()
            if now_mono >= (quiet_until if claims else deadline):
                break
            until = quiet_until if claims else deadline
            self._backend.wait_for_due(min(0.05, until - now_mono))
            more = self._backend.claim(limit=limit - len(claims), lease=lease)
            if more:
                claims.extend(more)
                quiet_until = clock.monotonic() + QUIET
        return claims


OpenFn = Callable[..., contextlib.AbstractContextManager[Backend]]


def realtime(open_store: OpenFn) -> OpenFn:
    """Wrap a factory's ``open`` so its store runs the suite in real time."""

    @contextlib.contextmanager
    def open_realtime(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
        with open_store(clock, store, **options) as backend:
            yield RealTimeStore(backend, clock)  # type: ignore[misc]

    return open_realtime
