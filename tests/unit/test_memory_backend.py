"""MemoryBackend specifics; its contract is checked in ``tests/contract``."""

from __future__ import annotations

import pytest

import delayq.testing
from delayq import DelayQ
from delayq.backends import open_backend
from delayq.backends.memory import MemoryBackend
from delayq.errors import ConfigurationError, InvalidDelay, InvalidOption, QueueClosed
from delayq.job import JobState
from delayq.testing import FakeClock
from tests.contract._support import spec


def test_memory_url_opens_a_fresh_store_each_time() -> None:
    clock = FakeClock()
    first = open_backend("memory://", clock=clock)
    second = open_backend("memory://", clock=clock)
    assert isinstance(first, MemoryBackend) and isinstance(second, MemoryBackend)
    first.enqueue([spec("a", clock.time())])
    assert second.get("a") is None
    assert first.url == "memory://"


def test_from_url_refuses_another_scheme() -> None:
    with pytest.raises(ConfigurationError, match="memory://"):
        MemoryBackend.from_url("sqlite:///x.db")


def test_testing_module_exports_the_memory_backend() -> None:
    assert delayq.testing.MemoryBackend is MemoryBackend
    assert "MemoryBackend" in delayq.testing.__all__


def test_a_negative_result_ttl_is_rejected() -> None:
    with pytest.raises(InvalidOption, match="result_ttl"):
        MemoryBackend(result_ttl=-1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "soon"])
def test_a_non_finite_run_at_is_rejected_and_nothing_is_stored(bad: object) -> None:
    backend = MemoryBackend(clock=FakeClock())
    with pytest.raises(InvalidDelay, match="run_at"):
        backend.enqueue([spec("ok", 0.0), spec("bad", bad)])  # type: ignore[arg-type]
    assert backend.get("ok") is None


def test_a_job_read_back_is_a_copy_the_caller_may_change() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    backend.enqueue([spec("j", clock.time(), payload={"items": [1]})])
    job = backend.get("j")
    assert job is not None
    job.payload["items"].append(2)
    job.backoff["kind"] = "changed"
    again = backend.get("j")
    assert again is not None
    assert again.payload == {"items": [1]}
    assert again.backoff == {"kind": "exponential"}


def test_calls_after_close_raise_queue_closed_and_waits_return() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    backend.close()
    with pytest.raises(QueueClosed):
        backend.claim(limit=1, lease=5, now=clock.time())
    backend.wait_for_due(3600)  # returns at once: nothing will ever become due


def test_an_unreadable_record_is_buried_and_the_other_jobs_of_the_claim_are_claimed() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    t0 = clock.time()
    backend.enqueue([spec("a", t0), spec("bad", t0), spec("b", t0)])
    backend._jobs["bad"].payload = "{not json"  # a record broken behind the API's back
    claims = backend.claim(limit=10, lease=30, now=t0)
    assert [c.job.id for c in claims] == ["a", "b"]
    [dead] = backend.dead_letters()
    assert (dead.id, dead.state, dead.payload) == ("bad", JobState.DEAD, "{not json")
    assert "cannot decode the stored job" in (dead.last_error or "")


def test_a_skewed_producer_schedules_a_delay_on_the_backend_clock() -> None:
    """The review's repro on memory: a producer 5 s behind asks for delay=10."""
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    producer = DelayQ(backend=backend, clock=FakeClock(clock.time() - 5))
    job_id = producer.schedule("x", None, delay=10)
    assert backend.claim(limit=1, lease=5, now=clock.time() + 9.5) == []
    [claim] = backend.claim(limit=1, lease=5, now=clock.time() + 10)
    assert claim.job.id == job_id
