"""Keyed calls on the memory store: :func:`delayq.keyed.decide` under the store's lock.

A key's record is released when its current run's record is deleted (the
``result_ttl`` and ``dead_ttl`` purges, ``purge_dead``), at once or when its
throttle window ends, so the records are the keys in use, not every key ever
called; the key's next call starts again at run 1 (past any run id a finished
or dead record still holds)."""

from __future__ import annotations

import heapq
import threading
from dataclasses import replace
from typing import Any

from delayq.backends._common import check_spec
from delayq.clock import Clock
from delayq.errors import JobConflict
from delayq.job import JobSpec, JobState
from delayq.keyed import (
    Current,
    Decision,
    KeyedResult,
    KeyPolicy,
    KeyState,
    append_payload,
    decide,
)


class MemoryKeyed:
    """Keyed calls (feature ``keyed``) on the host ``MemoryBackend``, which provides
    the lock, the records and the helpers below. ``_keys`` and ``_key_of`` are
    guarded by ``_lock``."""

    _lock: threading.Lock
    _clock: Clock
    _jobs: dict[str, Any]
    _keys: dict[str, KeyState]  # key -> its record
    _key_of: dict[str, str]  # a key's job ids -> the key
    _released: list[tuple[float, str, str]]  # (window end, key, run id) of released keys

    def _check_open(self) -> None:
        raise NotImplementedError

    def _purge_finished(self, now: float) -> None:
        raise NotImplementedError

    def _lookup(self, job_id: str, now: float) -> Any:
        raise NotImplementedError

    def _next_due(self) -> float | None:
        raise NotImplementedError

    def _insert(self, spec: JobSpec, now: float) -> Any:
        raise NotImplementedError

    def _schedule(self, rec: Any) -> None:
        raise NotImplementedError

    def _wake_if_earlier(self, run_at: float, head: float | None) -> None:
        raise NotImplementedError

    def enqueue_keyed(self, spec: JobSpec, policy: KeyPolicy) -> KeyedResult:
        """One keyed call (``spec.id`` is the key), decided by
        :func:`delayq.keyed.decide` and stored under the lock."""
        return _enqueue_keyed(self, spec, policy)


def release_key(store: MemoryKeyed, job_id: str, now: float) -> None:
    """The record ``job_id`` was deleted (purged): drop its key's record if this was
    the key's current run, at once, or when its throttle window ends (the heap
    ``_released``, swept by :func:`sweep_released`). Called under the lock."""
    key = store._key_of.pop(job_id, None)
    if key is None:
        return
    state = store._keys.get(key)
    if state is None or state.job_id != job_id:
        return
    if state.window_end <= now:
        del store._keys[key]
    else:
        heapq.heappush(store._released, (state.window_end, key, job_id))


def sweep_released(store: MemoryKeyed, now: float) -> None:
    """Drop the records of released keys whose throttle window has ended (under the lock)."""
    heap = store._released
    while heap and heap[0][0] <= now:
        _, key, job_id = heapq.heappop(heap)
        state = store._keys.get(key)
        if state is not None and state.job_id == job_id and job_id not in store._jobs:
            del store._keys[key]


def _first_free_run(store: MemoryKeyed, decision: Decision, now: float) -> Decision:
    """``decision`` moved past run ids another record still holds: a released key
    starts again at run 1, and an earlier run (a dead letter, or still running past
    ``result_ttl``) or a plain job may hold that id; none is ever overwritten."""
    state = decision.state
    while True:
        if store._lookup(state.job_id, now) is None:
            break
        state = replace(state, runs=state.runs + 1)
    if state is decision.state:
        return decision
    return replace(decision, state=state, job_id=state.job_id)


def _enqueue_keyed(store: MemoryKeyed, spec: JobSpec, policy: KeyPolicy) -> KeyedResult:
    spec = check_spec(spec)
    with store._lock:
        store._check_open()
        now = store._clock.time()
        store._purge_finished(now)
        key = spec.id
        state = store._keys.get(key)
        current: Current | None = None
        if state is not None:
            rec = store._lookup(state.job_id, now)
            if rec is not None:
                current = Current(rec.state, rec.attempts, rec.run_at)
        due = float(spec.run_at) if spec.delay is None else now + max(0.0, spec.delay)
        decision = decide(policy, key, state, current, now=now, due=due)
        if decision.write:
            payload = spec.payload
            if decision.create:
                decision = _first_free_run(store, decision, now)
                old = store._lookup(decision.job_id, now)
                if old is not None and old.state in (JobState.SCHEDULED, JobState.RUNNING):
                    raise JobConflict(
                        f"job {decision.job_id!r} exists ({old.state.value}) and is not "
                        f"keyed with {policy.describe()!r}"
                    )
                if decision.append:
                    payload = append_payload(None, spec.payload)
                made = JobSpec(
                    id=decision.job_id,
                    name=spec.name,
                    payload=payload,
                    run_at=decision.run_at,
                    max_attempts=spec.max_attempts,
                    backoff=spec.backoff,
                    misfire=spec.misfire,
                    created_at=now,
                    key=spec.key,
                    priority=spec.priority,
                    group=spec.group,
                )
                head = store._next_due()
                store._insert(made, now)
                store._wake_if_earlier(decision.run_at, head)
            else:
                rec = store._jobs[decision.job_id]
                head = store._next_due()
                rec.payload = append_payload(rec.payload, payload) if decision.append else payload
                rec.run_at = decision.run_at
                rec.throttled_until = None
                rec.updated_at = now
                store._schedule(rec)
                store._wake_if_earlier(rec.run_at, head)
        if state is not None and state.job_id != decision.job_id:
            store._key_of.pop(state.job_id, None)  # only a key's current run shows its counters
        store._keys[key] = decision.state
        store._key_of[decision.job_id] = key
        return KeyedResult(decision.job_id, decision.outcome, decision.run_at)
