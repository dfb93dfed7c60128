"""The handler filter (feature ``handler_filter``): a claim and a wait that serve a
subset of a queue's handlers, on every store that declares it."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import cast

import pytest

from delayq.backends.base import Backend, Completion, FiltersHandlers, LimitStore
from delayq.errors import InvalidOption
from delayq.flow import Limit
from delayq.job import Claim, JobSpec, JobState
from delayq.testing import FakeClock
from tests.contract._support import spec

needs_filter = pytest.mark.backend_features("handler_filter")
needs_filter_clock = pytest.mark.backend_features("handler_filter", "clock")
LEASE = 30.0


def filtering(backend: Backend) -> FiltersHandlers:
    assert isinstance(backend, FiltersHandlers)
    return backend


def claim_named(backend: Backend, now: float, *names: str, limit: int = 100) -> list[Claim]:
    return filtering(backend).claim(limit=limit, lease=LEASE, now=now, names=names)


def ids(claims: list[Claim]) -> list[str]:
    return [c.job.id for c in claims]


def mixed(t0: float) -> list[JobSpec]:
    """Jobs of three handlers, interleaved in due order (``fast`` last)."""
    return [
        spec("slow-1", t0 - 5, name="slow"),
        spec("fast-1", t0 - 4, name="fast"),
        spec("mail-1", t0 - 3, name="mail"),
        spec("slow-2", t0 - 2, name="slow"),
        spec("fast-2", t0 - 1, name="fast"),
        spec("fast-3", t0 - 1, name="fast"),  # a tie: enqueue order
    ]


@needs_filter
def test_a_filtered_claim_returns_only_those_names_in_due_order(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(mixed(t0))
    assert ids(claim_named(backend, t0, "fast")) == ["fast-1", "fast-2", "fast-3"]
    assert ids(claim_named(backend, t0, "slow", "mail")) == ["slow-1", "mail-1", "slow-2"]


@needs_filter
def test_a_filtered_claim_takes_its_limit_from_the_head_of_its_names(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(mixed(t0))
    assert ids(claim_named(backend, t0, "fast", limit=2)) == ["fast-1", "fast-2"]
    assert ids(claim_named(backend, t0, "fast", "mail", limit=1)) == ["mail-1"]
    assert ids(claim_named(backend, t0, "fast", "mail", limit=5)) == ["fast-3"]


@needs_filter
def test_a_filtered_claim_leaves_other_names_due_jobs_untouched(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(mixed(t0))
    claim_named(backend, t0, "fast")
    for job_id in ("slow-1", "mail-1", "slow-2"):
        job = backend.get(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.last_error) == (JobState.SCHEDULED, 0, None)
    assert ids(backend.claim(limit=10, lease=LEASE, now=t0)) == ["slow-1", "mail-1", "slow-2"]


@needs_filter
def test_a_filtered_claim_of_a_name_without_jobs_claims_nothing(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(mixed(t0))
    assert claim_named(backend, t0, "nobody") == []
    assert backend.stats().scheduled == 6


@needs_filter
def test_a_filtered_claim_is_never_early(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec("later", t0 + 60, name="fast"), spec("now", t0, name="slow")])
    assert claim_named(backend, t0, "fast") == []
    assert ids(claim_named(backend, t0 + 60, "fast")) == ["later"]


@needs_filter
def test_a_filtered_claim_returns_expired_leases_of_every_name(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("s", t0, name="slow"), spec("f", t0 + 50, name="fast")])
    [held] = claim_named(backend, t0, "slow")
    assert held.job.id == "s"
    # The slow lease ends at t0 + 30; a claim of "fast" at t0 + 60 returns it
    # to the due set without taking it.
    assert ids(claim_named(backend, t0 + 60, "fast")) == ["f"]
    job = backend.get("s")
    assert job is not None and job.state is JobState.SCHEDULED
    assert ids(claim_named(backend, t0 + 60, "slow")) == ["s"]


@needs_filter
def test_complete_and_claim_with_names_claims_only_those_names(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(mixed(t0))
    [first] = claim_named(backend, t0, "fast", limit=1)
    answers, claims = filtering(backend).complete_and_claim(
        [Completion.ack(first)], limit=10, lease=LEASE, names=["fast"]
    )
    assert answers == [None]
    assert ids(claims) == ["fast-2", "fast-3"]
    assert backend.stats().scheduled == 3


@needs_filter
def test_cancel_reschedule_and_retry_of_filtered_jobs_work_as_before(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue(mixed(t0))
    assert backend.cancel("fast-1").done
    assert backend.reschedule("fast-2", t0 + 100).done
    [claim] = claim_named(backend, t0, "fast")
    assert claim.job.id == "fast-3"
    backend.retry(claim, t0 + 50, "boom")
    assert claim_named(backend, t0 + 49, "fast") == []
    [again] = claim_named(backend, t0 + 50, "fast")
    assert (again.job.id, again.job.attempts, again.job.last_error) == ("fast-3", 2, "boom")
    backend.ack(again)
    assert ids(claim_named(backend, t0 + 100, "fast")) == ["fast-2"]


@needs_filter
def test_an_empty_or_bad_handler_filter_is_refused(backend: Backend, clock: FakeClock) -> None:
    store = filtering(backend)
    with pytest.raises(InvalidOption, match="at least one handler"):
        store.claim(limit=1, lease=LEASE, names=[])
    with pytest.raises(InvalidOption, match="collection of names"):
        store.claim(limit=1, lease=LEASE, names=cast("list[str]", "a,b"))
    with pytest.raises(InvalidOption, match="at least one handler"):
        store.wait_for_due(1.0, names=())


class FilteredWaiter:
    """Runs ``wait_for_due(max_wait, names=...)`` on a thread."""

    def __init__(self, backend: Backend, max_wait: float, names: list[str]) -> None:
        self.done = threading.Event()
        store = filtering(backend)
        self.thread = threading.Thread(
            target=lambda: (store.wait_for_due(max_wait, names=names), self.done.set()),
            daemon=True,
        )
        self.thread.start()

    def finished(self, timeout: float = 10.0) -> bool:
        return self.done.wait(timeout)


@needs_filter_clock
def test_a_filtered_wait_sleeps_past_other_names_due_jobs_until_its_own_head(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("backlog", t0 - 10, name="slow"), spec("mine", t0 + 30, name="fast")])
    waiter = FilteredWaiter(backend, 3600, ["fast"])
    assert clock.wait_for_waiters(1)
    assert not waiter.finished(timeout=0.05)  # a due "slow" job does not end the wait
    clock.advance(29)
    assert not waiter.finished(timeout=0.05)
    clock.advance(1)
    assert waiter.finished()


@needs_filter_clock
def test_a_filtered_wait_with_nothing_of_its_names_sleeps_for_max_wait(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("backlog", clock.time() - 10, name="slow")])
    waiter = FilteredWaiter(backend, 60, ["fast"])
    assert clock.wait_for_waiters(1)
    assert not waiter.finished(timeout=0.05)
    clock.advance(60)
    assert waiter.finished()


@needs_filter_clock
def test_a_filtered_wait_wakes_when_a_job_of_its_names_arrives_before_its_head(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    # The queue's head (a "slow" job) is earlier than anything "fast" waits for.
    backend.enqueue([spec("backlog", t0 - 10, name="slow"), spec("far", t0 + 3600, name="fast")])
    waiter = FilteredWaiter(backend, 7200, ["fast"])
    assert clock.wait_for_waiters(1)
    backend.enqueue([spec("near", t0 + 60, name="fast")])
    assert waiter.finished()


@pytest.mark.backend_features("handler_filter", "clock", "shared")
def test_a_filtered_waiter_on_another_handle_is_woken_by_a_new_head_of_its_names(
    open_another: Callable[..., Backend], clock: FakeClock
) -> None:
    producer, worker = open_another(), open_another()
    t0 = clock.time()
    producer.enqueue([spec("backlog", t0 - 10, name="slow"), spec("far", t0 + 3600, name="fast")])
    waiter = FilteredWaiter(worker, 7200, ["fast"])
    assert clock.wait_for_waiters(1)
    assert not waiter.finished(timeout=0.05)
    producer.enqueue([spec("near", t0 + 60, name="fast")])
    assert waiter.finished()


@needs_filter_clock
def test_a_filtered_wait_returns_at_once_when_a_job_of_its_names_is_due(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("mine", clock.time() - 1, name="fast")])
    assert FilteredWaiter(backend, 3600, ["fast"]).finished()


@pytest.mark.backend_features("handler_filter", "flow_control")
def test_a_filtered_claim_keeps_the_flow_limits(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    assert isinstance(backend, LimitStore)
    backend.put_limit(Limit("tenant:*", concurrency=1), version=0)

    def keyed(job_id: str, at: float, name: str) -> JobSpec:
        return dataclasses.replace(spec(job_id, at, name=name), key="tenant:1")

    backend.enqueue(
        [keyed("a-1", t0 - 3, "a"), keyed("b-1", t0 - 2, "b"), keyed("a-2", t0 - 1, "a")]
    )
    [first] = claim_named(backend, t0, "a")
    assert first.job.id == "a-1"
    assert claim_named(backend, t0, "a") == []  # the key is at its limit
    assert backend.claim(limit=10, lease=LEASE, now=t0) == []
    backend.ack(first)
    assert ids(claim_named(backend, t0, "a")) == ["a-2"]
    assert claim_named(backend, t0, "b") == []
