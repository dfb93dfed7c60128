"""Flow control (feature ``flow_control``): limit records, concurrency and rate
limits held in the claim step, priorities and fair shares, on every store that
declares it."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import pytest

from delayq.backends.base import Backend, LimitStore
from delayq.flow import Limit, LimitRecord, Rate
from delayq.job import Claim, JobSpec, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec

needs_flow = pytest.mark.backend_features("flow_control")
LEASE = 30.0


def limits(backend: Backend) -> LimitStore:
    assert isinstance(backend, LimitStore)
    return backend


def keyed(
    job_id: str,
    run_at: float,
    key: str | None = None,
    *,
    priority: int = 0,
    group: str | None = None,
    max_attempts: int = 3,
) -> JobSpec:
    return dataclasses.replace(
        spec(job_id, run_at, max_attempts=max_attempts), key=key, priority=priority, group=group
    )


def ids(claims: list[Claim]) -> list[str]:
    return [c.job.id for c in claims]


def one_by_one(backend: Backend, now: float, n: int) -> list[str]:
    """Claim (and ack) ``n`` jobs one claim at a time: the claim order."""
    order: list[str] = []
    for _ in range(n):
        [claim] = backend.claim(limit=1, lease=LEASE, now=now)
        order.append(claim.job.id)
        backend.ack(claim)
    return order


@needs_flow
def test_limit_records_are_written_with_compare_and_set(backend: Backend) -> None:
    store = limits(backend)
    two = Limit("tenant:*", concurrency=2)
    assert store.get_limit("tenant:*") is None
    assert store.put_limit(two, version=0) == 1
    assert store.put_limit(two, version=0) is None  # exists already
    rated = Limit("tenant:*", concurrency=3, rate=Rate.parse("100/s"), burst=20)
    assert store.put_limit(rated, version=1) == 2
    assert store.put_limit(two, version=1) is None  # someone else wrote version 2
    assert store.get_limit("tenant:*") == LimitRecord(rated, 2)
    store.put_limit(Limit("stripe:acct_1", rate=Rate.parse("5/m")), version=0)
    assert [r.limit.pattern for r in store.list_limits()] == ["stripe:acct_1", "tenant:*"]
    assert store.delete_limit("tenant:*", version=1) is False
    assert store.delete_limit("tenant:*", version=2) is True
    assert store.delete_limit("tenant:*") is False
    assert [r.limit.pattern for r in store.list_limits()] == ["stripe:acct_1"]


@needs_flow
def test_a_job_keeps_its_key_priority_and_group(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([keyed("a", t0, "tenant:1", priority=7, group="g")])
    job = backend.get("a")
    assert job is not None
    assert (job.key, job.priority, job.group, job.throttled_until) == ("tenant:1", 7, "g", None)
    [claim] = backend.claim(limit=1, lease=LEASE, now=t0)
    assert (claim.job.key, claim.job.priority, claim.job.group) == ("tenant:1", 7, "g")
    backend.retry(claim, t0 + 1, "boom")
    again = backend.get("a")
    assert again is not None and (again.key, again.priority, again.group) == ("tenant:1", 7, "g")


@needs_flow
def test_a_key_at_its_concurrency_limit_is_passed_over_and_claimed_when_a_slot_frees(
    backend: Backend, clock: FakeClock
) -> None:
    limits(backend).put_limit(Limit("tenant:*", concurrency=1), version=0)
    t0 = clock.time()
    backend.enqueue(
        [
            keyed("a1", t0 - 3, "tenant:a"),
            keyed("a2", t0 - 2, "tenant:a"),
            keyed("b1", t0 - 1, "tenant:b"),
            keyed("free", t0, None),
        ]
    )
    first = backend.claim(limit=4, lease=LEASE, now=t0)
    assert ids(first) == ["a1", "b1", "free"]  # a2 is passed over, not blocking the rest
    assert backend.claim(limit=4, lease=LEASE, now=t0) == []
    waiting = backend.get("a2")
    assert waiting is not None and waiting.state is JobState.SCHEDULED
    backend.ack(first[0])
    assert ids(backend.claim(limit=4, lease=LEASE, now=t0)) == ["a2"]


@needs_flow
def test_a_key_s_own_limit_wins_over_its_pattern(backend: Backend, clock: FakeClock) -> None:
    store = limits(backend)
    store.put_limit(Limit("tenant:*", concurrency=1), version=0)
    store.put_limit(Limit("tenant:big", concurrency=3), version=0)
    t0 = clock.time()
    backend.enqueue([keyed(f"big{i}", t0, "tenant:big") for i in range(4)])
    backend.enqueue([keyed(f"small{i}", t0 + 0.5, "tenant:small") for i in range(2)])
    claimed = backend.claim(limit=10, lease=LEASE, now=t0 + 1)
    assert ids(claimed) == ["big0", "big1", "big2", "small0"]


@needs_flow
def test_an_expired_lease_frees_its_slot(backend: Backend, clock: FakeClock) -> None:
    limits(backend).put_limit(Limit("k", concurrency=1), version=0)
    t0 = clock.time()
    backend.enqueue([keyed("once", t0 - 1, "k"), keyed("next", t0, "k")])
    assert ids(backend.claim(limit=2, lease=5, now=t0)) == ["once"]
    assert backend.claim(limit=2, lease=5, now=t0 + 4.999) == []
    # the lease ran out: its slot is free again (and the limit still holds)
    assert len(backend.claim(limit=2, lease=5, now=t0 + 5)) == 1


@needs_flow
def test_a_limit_edited_at_runtime_takes_effect_at_the_next_claim(
    backend: Backend, clock: FakeClock
) -> None:
    store = limits(backend)
    store.put_limit(Limit("k", concurrency=1), version=0)
    t0 = clock.time()
    backend.enqueue([keyed(f"j{i}", t0, "k") for i in range(6)])
    running = backend.claim(limit=6, lease=LEASE, now=t0)
    assert ids(running) == ["j0"]
    store.put_limit(Limit("k", concurrency=3), version=1)
    running += backend.claim(limit=6, lease=LEASE, now=t0)
    assert ids(running) == ["j0", "j1", "j2"]
    store.put_limit(Limit("k", concurrency=2), version=2)  # lowered below what runs
    backend.ack(running[0])
    assert backend.claim(limit=6, lease=LEASE, now=t0) == []  # 2 still run: at the new limit
    backend.ack(running[1])
    assert ids(backend.claim(limit=6, lease=LEASE, now=t0)) == ["j3"]
    assert store.delete_limit("k") is True  # no limit: everything due is claimed
    assert ids(backend.claim(limit=6, lease=LEASE, now=t0)) == ["j4", "j5"]


@needs_flow
def test_a_job_over_its_rate_is_throttled_until_its_next_allowed_time(
    backend: Backend, clock: FakeClock
) -> None:
    limits(backend).put_limit(Limit("api", rate=Rate.parse("1/s")), version=0)
    t0 = clock.time()
    backend.enqueue([keyed(f"r{i}", t0, "api") for i in range(3)] + [keyed("other", t0, "x")])
    assert ids(backend.claim(limit=4, lease=LEASE, now=t0)) == ["r0", "other"]
    r1, r2 = backend.get("r1"), backend.get("r2")
    assert r1 is not None and r2 is not None
    assert r1.state is JobState.SCHEDULED and r1.run_at == t0  # its place is kept
    assert r1.throttled_until == pytest.approx(t0 + 1)
    assert r2.throttled_until == pytest.approx(t0 + 2)  # spread out, not all woken at once
    assert backend.claim(limit=4, lease=LEASE, now=t0 + 0.999) == []
    assert ids(backend.claim(limit=4, lease=LEASE, now=t0 + 1)) == ["r1"]
    assert ids(backend.claim(limit=4, lease=LEASE, now=t0 + 2)) == ["r2"]
    done = backend.get("r2")
    assert done is not None and done.throttled_until is None


@needs_flow
def test_a_burst_lets_that_many_more_start_at_once(backend: Backend, clock: FakeClock) -> None:
    limits(backend).put_limit(Limit("api", rate=Rate.parse("10/s"), burst=2), version=0)
    t0 = clock.time()
    backend.enqueue([keyed(f"r{i}", t0, "api") for i in range(5)])
    assert ids(backend.claim(limit=5, lease=LEASE, now=t0)) == ["r0", "r1", "r2"]
    assert ids(backend.claim(limit=5, lease=LEASE, now=t0 + 0.1)) == ["r3"]


@needs_flow
def test_a_throttled_job_can_be_cancelled_or_rescheduled(
    backend: Backend, clock: FakeClock
) -> None:
    limits(backend).put_limit(Limit("api", rate=Rate.parse("1/m")), version=0)
    t0 = clock.time()
    backend.enqueue([keyed(f"r{i}", t0, "api") for i in range(3)])
    [first] = backend.claim(limit=3, lease=LEASE, now=t0)
    backend.ack(first)
    assert backend.cancel("r1").cancelled
    assert backend.reschedule("r2", t0 + 90).rescheduled
    moved = backend.get("r2")
    assert moved is not None and moved.run_at == t0 + 90
    assert ids(backend.claim(limit=3, lease=LEASE, now=t0 + 90)) == ["r2"]


@needs_flow
def test_higher_priority_first_then_due_order(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue(
        [
            keyed("low", t0 - 9, priority=0),
            keyed("high_late", t0 - 1, priority=5),
            keyed("high_early", t0 - 2, priority=5),
            keyed("high_tie", t0 - 1, priority=5),
            keyed("mid", t0, priority=1),
            keyed("future", t0 + 1, priority=9),  # never early
            keyed("neg", t0 - 10, priority=-1),
        ]
    )
    assert one_by_one(backend, t0, 6) == [
        "high_early",
        "high_late",
        "high_tie",
        "mid",
        "low",
        "neg",
    ]
    assert backend.claim(limit=5, lease=LEASE, now=t0) == []


@needs_flow
def test_groups_take_turns(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([keyed(f"a{i}", t0 - 10 + i * 0.1, group="A") for i in range(5)])
    backend.enqueue([keyed(f"b{i}", t0 - 1 + i * 0.1, group="B") for i in range(2)])
    assert one_by_one(backend, t0, 7) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]


@needs_flow
def test_a_big_group_gets_its_share_in_one_claim(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([keyed(f"a{i:03}", t0 - 100 + i * 0.01, group="A") for i in range(100)])
    backend.enqueue([keyed(f"b{i}", t0 - 1, group="B") for i in range(3)])
    claimed = ids(backend.claim(limit=6, lease=LEASE, now=t0))
    assert sorted(claimed) == ["a000", "a001", "a002", "b0", "b1", "b2"]


@needs_flow
def test_concurrent_claims_never_exceed_the_limit(backend: Backend, clock: FakeClock) -> None:
    limits(backend).put_limit(Limit("k", concurrency=2), version=0)
    t0 = clock.time()
    backend.enqueue([keyed(f"j{i}", t0, "k") for i in range(30)])
    lock = threading.Lock()
    running: set[str] = set()
    most = 0
    done = 0

    def work() -> None:
        nonlocal most, done
        while True:
            with lock:
                if done >= 30:
                    return
            got = backend.claim(limit=3, lease=LEASE, now=t0)
            with lock:
                running.update(ids(got))
                most = max(most, len(running))
            for claim in got:
                with lock:  # out of the set before the store frees the slot
                    running.discard(claim.job.id)
                    done += 1
                backend.ack(claim)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert done == 30 and most <= 2


@pytest.mark.backend_features("flow_control", "shared")
def test_two_handles_share_the_limits(
    open_another: Callable[..., Backend], clock: FakeClock
) -> None:
    one, two = open_another(), open_another()
    limits(one).put_limit(Limit("k", concurrency=2), version=0)
    t0 = clock.time()
    one.enqueue([keyed(f"j{i}", t0, "k") for i in range(5)])
    a = one.claim(limit=5, lease=LEASE, now=t0)
    b = two.claim(limit=5, lease=LEASE, now=t0)
    assert len(a) + len(b) == 2
    limits(two).put_limit(Limit("k", concurrency=3), version=1)
    assert len(one.claim(limit=5, lease=LEASE, now=t0)) == 1


@needs_flow
def test_a_freed_slot_wakes_a_worker_waiting_for_it(backend: Backend, clock: FakeClock) -> None:
    limits(backend).put_limit(Limit("k", concurrency=1), version=0)
    t0 = clock.time()
    backend.enqueue([keyed("first", t0, "k"), keyed("parked", t0, "k")])
    [first] = backend.claim(limit=2, lease=LEASE, now=t0)
    waiter = threading.Thread(target=backend.wait_for_due, args=(600.0,))
    waiter.start()
    backend.ack(first)
    waiter.join(timeout=60)  # woken by the ack, not by the 600 s max_wait
    assert not waiter.is_alive()
    assert ids(backend.claim(limit=2, lease=LEASE, now=t0)) == ["parked"]


@needs_flow
def test_a_slot_freed_before_the_worker_waits_makes_its_parked_job_due(
    backend: Backend, clock: FakeClock
) -> None:
    # The ack comes between the worker's claim and its wait (its wake-up is gone by
    # then): the wait must find the parked job due, not sleep toward max_wait.
    limits(backend).put_limit(Limit("k", concurrency=1), version=0)
    t0 = clock.time()
    backend.enqueue([keyed("first", t0, "k"), keyed("parked", t0, "k")])
    [first] = backend.claim(limit=2, lease=LEASE, now=t0)
    backend.ack(first)
    waiter = threading.Thread(target=backend.wait_for_due, args=(600.0,))
    waiter.start()
    waiter.join(timeout=60)  # returns at once: a job is due
    assert not waiter.is_alive()
    assert ids(backend.claim(limit=2, lease=LEASE, now=t0)) == ["parked"]
