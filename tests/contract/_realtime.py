"""Real-time mode of the contract suite, for stores that cannot take injected time.

The suite drives time with a :class:`~delayq.testing.FakeClock` and passes
``now=`` to ``claim``. A broker decides "due" by itself, in real time, so a
store without the ``clock`` feature runs the suite through :func:`realtime`,
which maps the test's clock onto a short real timeline and keeps each test's
meaning this way:

* **Test time runs 1/SCALE times faster than real time.** From the first
  ``enqueue`` on, test time ``T`` is the real instant ``R(T) = R0 + (T - T0) *
  SCALE``. Delays, leases and reschedules given to the store are scaled (a job due 5 test
  seconds ahead is due 0.25 real seconds after it is stored), and the times in
  the claims it returns are mapped back (``claimed_at``, ``lease_until`` and
  the job's ``run_at`` read in test time). The store gets the test's FakeClock
  for the times it stamps; the harness advances that clock as test time passes.
* **A claim at ``now=T`` happens at ``R(T)``**: it waits until then (a test
  whose clock jumps further than ``MAX_REAL_WAIT`` real seconds ahead is
  skipped, naming the missing ``clock`` feature), claims, and, if jobs the test
  expects to be due by ``T`` have not come yet, claims again until they come,
  by a deadline; it first lets ``SETTLE`` real seconds pass after the last enqueue
  or retry, so jobs still in flight in the broker take their place in the due
  order. "Never early" is checked for real: a job stored at ``R(T0)``
  to be due at ``T`` may not be handed out before ``R(T)``.
* A test that moves its clock itself (``clock.advance``) is followed: the next
  call waits until real time catches up. Handles opened on one store share
  one timeline and one record of the jobs the test expects.
* A claim that keeps waiting for a due job past the real instant at which
  another, later job is due too gives that one back (``release``) rather than
  hand it to a claim at an earlier test time: on a loaded machine delivery
  may lag by more than the gap between two test times.
* A call the store answers with :class:`~delayq.errors.Unsupported` skips the
  test with the store's reason, provided the store does not declare the
  feature that call needs (``inspect``, ``definite_cancel``); when it does,
  the error propagates and the test fails. A store with neither ``inspect``
  nor ``definite_cancel`` (a log that decides every race on an id) cannot tell
  that an id is taken: a test that enqueues an id it enqueued before (a
  conflict test) is skipped too.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from delayq.backends._common import complete_then_claim
from delayq.backends.base import Backend, Completion
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import Unsupported
from delayq.job import CancelOutcome, Claim, EnqueueOutcome, JobSpec, JobState, RescheduleOutcome
from delayq.testing import FakeClock

__all__ = ["DEADLINE", "MAX_REAL_WAIT", "SCALE", "RealTimeStore", "realtime"]

SCALE = 0.1
"""Real seconds per test second."""

MAX_REAL_WAIT = 3.5
"""The longest real wait for test time to pass (35 test seconds); longer jumps skip."""

DEADLINE = 6.0
"""Real seconds a claim waits for jobs the test expects to be due (it returns as soon
as they came: the bound only matters on a loaded machine, where a delivery through
the levels and the queue's log took over 2 s)."""

SETTLE = 0.1
"""Real seconds a claim lets pass after the last enqueue or retry, so that what the broker
is still delivering takes its place in the due order first."""

_FEATURE_OF: dict[str, str] = {
    "get": "inspect",
    "list_jobs": "inspect",
    "stats": "inspect",
    "next_due": "inspect",
    "enqueue": "inspect",  # on_conflict keep / replace need an index of ids
    "cancel": "definite_cancel",
    "reschedule": "definite_cancel",
}

_pause = threading.Event()  # never set: waits until a deadline


def _finite(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


@dataclass
class _Track:
    """What the harness expects of one job, in test time."""

    due: float | None  # scheduled, due at this test time (None: held or finished)
    lease_until: float | None = None  # held by a claim until this test time
    claimed_due: float = 0.0  # the due time of the claimed attempt (a release restores it)


@dataclass
class _Timeline:
    """One store's mapping of test time onto real time, and its jobs (shared by its handles)."""

    t0: float
    r0: float
    anchored: bool = False
    jobs: dict[str, _Track] = field(default_factory=dict)
    handles: int = 0
    changed: float = 0.0  # real time of the last enqueue, retry or release


_TIMELINES: dict[tuple[int, str], _Timeline] = {}  # (id of the test's clock, store) -> timeline


class RealTimeStore:
    """A store seen by the contract suite in real time (see the module docstring)."""

    def __init__(self, backend: Backend, clock: FakeClock, timeline: _Timeline) -> None:
        self._backend = backend
        self._clock = clock
        self._line = timeline
        self._jobs = timeline.jobs

    # -- time --------------------------------------------------------------------
    def _real(self, t: float) -> float:
        return self._line.r0 + (t - self._line.t0) * SCALE

    def _catch_up(self, t: float) -> None:
        """Wait until real time reaches test time ``t``; move the FakeClock there."""
        wait = self._real(t) - SYSTEM_CLOCK.monotonic()
        if wait > MAX_REAL_WAIT:
            pytest.skip(
                f"store lacks feature 'clock': the test moves time {t - self._clock.time():g} "
                f"s ahead, {wait:.1f} s of real time in real-time mode"
            )
        if wait > 0:
            _pause.wait(wait)
        if t > self._clock.time():
            self._clock.advance(t - self._clock.time())

    def _sync(self) -> None:
        """Let real time catch up with a test that advanced its clock itself."""
        if self._line.anchored:
            self._catch_up(self._clock.time())

    def _scaled(self, run_at: float) -> float:
        """A due time (test) as the store must see it: now + the scaled delay (a due
        time in the past as it is)."""
        now = self._clock.time()
        return run_at if run_at <= now else now + (run_at - now) * SCALE

    # -- calls that need translating ---------------------------------------------
    def enqueue(self, jobs: Sequence[JobSpec], **options: Any) -> list[EnqueueOutcome]:
        specs = list(jobs)
        if not {"inspect", "definite_cancel"} & self._backend.features:
            ids = [spec.id for spec in specs if isinstance(spec, JobSpec)]
            taken = set(self._jobs).intersection(ids) or {i for i in ids if ids.count(i) > 1}
            if taken:
                pytest.skip(
                    f"store lacks feature 'inspect': it keeps no index of job ids, so it "
                    f"cannot tell that {sorted(taken)[0]!r} is taken (on_conflict)"
                )
        self._sync()
        line = self._line
        if not line.anchored:
            line.t0, line.r0, line.anchored = self._clock.time(), SYSTEM_CLOCK.monotonic(), True
        now = self._clock.time()
        dues: dict[str, float] = {}
        scaled: list[Any] = []
        for spec in specs:
            if not isinstance(spec, JobSpec) or not _finite(
                spec.run_at if spec.delay is None else spec.delay
            ):
                scaled.append(spec)  # bad input: the store rejects it as it is
                continue
            if spec.delay is None:
                due = spec.run_at
                # due now or in the past: as it is (the store keeps that due time)
                scaled.append(spec if due <= now else replace(spec, delay=(due - now) * SCALE))
            else:
                due = now + max(0.0, spec.delay)
                scaled.append(replace(spec, delay=spec.delay * SCALE))
            dues[spec.id] = due
        outcomes = self._call("enqueue", scaled, **options)
        self._line.changed = SYSTEM_CLOCK.monotonic()
        for job_id, due in dues.items():
            self._jobs[job_id] = _Track(due)
        return outcomes  # type: ignore[no-any-return]

    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        self._sync()
        at = self._clock.time() if now is None else max(now, self._clock.time())
        self._catch_up(at)
        real_lease = lease * SCALE if _finite(lease) and lease > 0 else lease
        expected = 0
        for track in self._jobs.values():
            when = track.due if track.due is not None else track.lease_until
            if when is not None and when <= at:
                expected += 1
        if expected:
            settle = self._line.changed + SETTLE - SYSTEM_CLOCK.monotonic()
            if settle > 0:
                _pause.wait(settle)
        deadline = SYSTEM_CLOCK.monotonic() + DEADLINE
        claims: list[Claim] = []
        while True:
            for claim in self._backend.claim(limit=limit - len(claims), lease=real_lease):
                if self._too_late_to_tell(claim, at):
                    self._backend.release(claim)  # due after ``at``: not this claim's job
                else:
                    claims.append(claim)
            left = deadline - SYSTEM_CLOCK.monotonic()
            if len(claims) >= min(limit, expected) or left <= 0:
                break
            self._backend.wait_for_due(min(0.02, left))
        return [self._held(claim, at, lease) for claim in claims]

    def _too_late_to_tell(self, claim: Claim, at: float) -> bool:
        """A job due after ``at`` that came once it was really due: handing it to a claim
        at ``at`` would be the harness's lateness, not the store being early."""
        track = self._jobs.get(claim.job.id)
        if track is None:
            return False
        when = track.due if track.due is not None else track.lease_until
        return when is not None and when > at and SYSTEM_CLOCK.monotonic() >= self._real(when)

    def _held(self, claim: Claim, at: float, lease: float) -> Claim:
        """A claim as the test sees it (test times), and the job noted as held."""
        track = self._jobs.setdefault(claim.job.id, _Track(None))
        due = track.due if track.due is not None else (track.lease_until or at)
        track.claimed_due, track.due, track.lease_until = due, None, at + lease
        job = replace(claim.job, run_at=due, lease_until=at + lease, updated_at=at)
        # Test time knows one clock: the due time is the job's (due_at would be real time).
        return replace(claim, job=job, lease_until=at + lease, claimed_at=at, due_at=None)

    def extend(self, claim: Claim, lease: float) -> Claim:
        self._sync()
        real = lease * SCALE if _finite(lease) and lease > 0 else lease
        self._backend.extend(claim, real)
        until = self._clock.time() + lease
        if claim.job.id in self._jobs:
            self._jobs[claim.job.id].lease_until = until
        return replace(claim, job=replace(claim.job, lease_until=until), lease_until=until)

    def complete(self, batch: Sequence[Completion]) -> list[Any]:
        self._sync()
        items = list(batch)
        scaled = [
            replace(item, run_at=self._scaled(item.run_at))
            if isinstance(item, Completion) and _finite(item.run_at)
            else item
            for item in items
        ]
        results = self._backend.complete(scaled)
        for item, stale in zip(items, results, strict=True):
            if stale is None and isinstance(item, Completion):
                self._note(item)
        return results

    def _note(self, item: Completion) -> None:
        if item.state is JobState.SCHEDULED:
            self._line.changed = SYSTEM_CLOCK.monotonic()
        track = self._jobs.setdefault(item.claim.job.id, _Track(None))
        track.lease_until = None
        if item.released:
            track.due = track.claimed_due
        elif item.state is JobState.SCHEDULED:
            track.due = item.run_at
        else:
            track.due = None

    def ack(self, claim: Claim, **options: Any) -> None:
        self._sync()
        self._backend.ack(claim, **options)
        self._note(Completion.ack(claim))

    def retry(self, claim: Claim, run_at: float, error: str) -> None:
        self._sync()
        self._backend.retry(claim, self._scaled(run_at) if _finite(run_at) else run_at, error)
        self._note(Completion.retry(claim, run_at, error))

    def bury(self, claim: Claim, error: str) -> None:
        self._sync()
        self._backend.bury(claim, error)
        self._note(Completion.bury(claim, error))

    def release(self, claim: Claim) -> None:
        self._sync()
        self._backend.release(claim)
        self._note(Completion.release(claim))

    def complete_and_claim(
        self, batch: Sequence[Completion], *, limit: int, lease: float
    ) -> tuple[list[Any], list[Claim]]:
        """``complete`` then ``claim``, each as above."""
        return complete_then_claim(self, batch, limit=limit, lease=lease)

    def get(self, job_id: str) -> Any:
        """The job, its due time read in test time (as a claim's)."""
        self._sync()
        job = self._call("get", job_id)
        track = self._jobs.get(job_id)
        if job is not None and track is not None and track.due is not None:
            job = replace(job, run_at=track.due)
        return job

    def cancel(self, job_id: str) -> Any:
        self._sync()
        outcome = self._call("cancel", job_id)
        track = self._jobs.get(job_id)
        if isinstance(outcome, CancelOutcome) and outcome.cancelled and track is not None:
            track.due = track.lease_until = None
        return outcome

    def reschedule(self, job_id: str, run_at: Any = None, *, delay: Any = None) -> Any:
        """A due time (or delay) scaled as ``enqueue`` scales it."""
        return self._moved("reschedule", job_id, run_at, delay)

    def requeue_dead(self, job_id: str, run_at: Any = None, *, delay: Any = None) -> Any:
        return self._moved("requeue_dead", job_id, run_at, delay)

    def _moved(self, name: str, job_id: str, run_at: Any, delay: Any) -> Any:
        self._sync()
        real_at = self._scaled(run_at) if _finite(run_at) else run_at
        real_delay = delay * SCALE if _finite(delay) and delay > 0 else delay
        outcome = self._call(name, job_id, real_at, delay=real_delay)
        moved = outcome is True or (
            isinstance(outcome, RescheduleOutcome) and outcome.name.startswith("RESCHEDULED")
        )
        if moved:
            now = self._clock.time()
            due = (run_at or now) if delay is None else now + max(0.0, delay)
            track = self._jobs.setdefault(job_id, _Track(None))
            track.due, track.lease_until = due, None
            self._line.changed = SYSTEM_CLOCK.monotonic()
        return outcome

    def wait_for_due(self, max_wait: float) -> None:
        ok = _finite(max_wait) and max_wait > 0
        self._backend.wait_for_due(max_wait * SCALE if ok else max_wait)

    # -- everything else ---------------------------------------------------------
    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        feature = _FEATURE_OF.get(name)
        try:
            return getattr(self._backend, name)(*args, **kwargs)
        except Unsupported as exc:
            if feature is None or feature in self._backend.features:
                raise
            pytest.skip(f"store lacks feature {feature!r}: {exc}")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name not in _FEATURE_OF or not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, *args, **kwargs)

        return call


OpenFn = Callable[..., contextlib.AbstractContextManager[Backend]]


def realtime(open_store: OpenFn) -> OpenFn:
    """Wrap a factory's ``open`` so its store runs the suite in real time."""

    @contextlib.contextmanager
    def open_realtime(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
        key = (id(clock), store)
        line = _TIMELINES.setdefault(key, _Timeline(clock.time(), SYSTEM_CLOCK.monotonic()))
        line.handles += 1
        try:
            with open_store(clock, store, **options) as backend:
                yield RealTimeStore(backend, clock, line)  # type: ignore[misc]
        finally:
            line.handles -= 1
            if not line.handles:
                del _TIMELINES[key]

    return open_realtime
