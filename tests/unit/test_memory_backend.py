"""MemoryBackend specifics; its contract is checked in ``tests/contract``."""

from __future__ import annotations

import pytest

import delayq.testing
from delayq.backends import open_backend
from delayq.backends.memory import MemoryBackend
from delayq.errors import ConfigurationError, InvalidDelay, InvalidOption, QueueClosed
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
