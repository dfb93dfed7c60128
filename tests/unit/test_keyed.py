"""The keyed-call decision (delayq.keyed): properties every store inherits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq.backends.memory import MemoryBackend
from delayq.backends.sqlite import SQLiteBackend
from delayq.job import JobSpec, JobState
from delayq.keyed import KeyedOutcome, KeyPolicy, KeyState
from delayq.testing import FakeClock

POLICY = KeyPolicy.build("debounce", max_wait=60)
APPEND = KeyPolicy.build("append", max_items=4)


def _spec(payload: object, delay: float) -> JobSpec:
    return JobSpec(id="k", name="x", payload=json.dumps(payload), run_at=0.0, delay=delay)


def test_a_key_record_reads_back_from_its_json() -> None:
    state = KeyState("k", "debounce max_wait=60", 3, 10.5, 0.0, 4, 0, 7)
    assert KeyState.from_json("k", state.to_json()) == state
    assert state.job_id == "k#3"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.floats(0, 30), st.booleans()), max_size=30))
def test_a_debounced_run_is_never_due_after_its_first_call_plus_max_wait(
    steps: list[tuple[float, float, bool]],
) -> None:
    assert POLICY is not None
    clock = FakeClock(1_000.0)
    store = MemoryBackend(clock=clock)
    first: dict[str, float] = {}
    for gap, delay, claim in steps:
        clock.advance(gap)
        result = store.enqueue_keyed(_spec(None, delay), POLICY)
        if result.outcome is KeyedOutcome.CREATED:
            first[result.id] = clock.time()
        cap = first[result.id] + 60
        # due at now + delay, or at the cap (already past when no worker took the job yet)
        assert min(clock.time() + delay, cap) == result.run_at
        if claim:
            for c in store.claim(limit=5, lease=30):
                store.ack(c)
                job = store.get(c.job.id)
                assert job is not None and job.state is JobState.SUCCEEDED


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=40))
def test_every_appended_payload_is_delivered_in_exactly_one_batch(
    steps: list[tuple[int, bool]],
) -> None:
    assert APPEND is not None
    clock = FakeClock(1_000.0)
    store = MemoryBackend(clock=clock)
    sent: list[int] = []
    delivered: list[int] = []
    for n, (gap, claim) in enumerate(steps):
        clock.advance(gap)
        store.enqueue_keyed(_spec(n, 2), APPEND)
        sent.append(n)
        if claim:
            for c in store.claim(limit=5, lease=30):
                assert len(c.job.payload) <= 4
                delivered.extend(c.job.payload)
                store.ack(c)
    clock.advance(10)
    for c in store.claim(limit=100, lease=30):
        delivered.extend(c.job.payload)
    assert sorted(delivered) == sent


def _key_records(store: object) -> int:
    if isinstance(store, MemoryBackend):
        return len(store._keys)
    with store._read("counting key records") as conn:  # type: ignore[attr-defined]
        return int(conn.execute("SELECT COUNT(*) FROM delayq_keyed").fetchone()[0])


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_key_records_go_with_their_runs_so_a_key_per_order_does_not_grow_the_store(
    kind: str, tmp_path: Path
) -> None:
    # "cancel order N unless paid": one key per order, ever; after the runs are
    # purged by result_ttl (and dead letters by purge_dead) no record is left.
    clock = FakeClock(1_000.0)
    store: Any = (
        MemoryBackend(clock=clock, result_ttl=60)
        if kind == "memory"
        else SQLiteBackend(str(tmp_path / "k.db"), clock=clock, result_ttl=60)
    )
    unique = KeyPolicy.build("keep", unique="until_finished")
    assert POLICY is not None and unique is not None
    try:
        for n in range(300):
            job = JobSpec(id=f"order:{n}", name="x", payload="null", run_at=0.0, delay=0)
            store.enqueue_keyed(job, POLICY if n % 2 else unique)
        assert _key_records(store) == 300
        claims = store.claim(limit=300, lease=30)
        for claim in claims[:-10]:
            store.ack(claim)
        for claim in claims[-10:]:
            store.bury(claim, "boom")
        for _ in range(3):  # bounded purge batches
            clock.advance(120)
            store.claim(limit=1, lease=30)
        assert _key_records(store) == 10  # the dead letters' keys
        assert store.purge_dead() == 10
        assert _key_records(store) == 0
    finally:
        store.close()
