"""Worker health: the liveness rule on hand-made snapshots, and /healthz served by a worker."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.cli.worker import WorkerOps
from delayq.errors import StaleClaim
from delayq.worker import WorkerHealth
from tests._util import wait_until
from tests.unit._worker_harness import TIMEOUT, Harness

HEALTHY = WorkerHealth(
    now=100.0,
    lease=30.0,
    in_flight=1,
    beats={"dispatcher": 99.0, "leases": 99.0},
    stuck_calls={},
    abandoned=0,
    abandoned_cap=4,
    loop_blocked_since=None,
    oldest_result_waiting=None,
    least_recently_renewed=95.0,
    idle_wait=10.0,
)


def test_a_worker_whose_parts_turn_and_whose_calls_return_is_healthy() -> None:
    assert HEALTHY.problems() == () and HEALTHY.healthy


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"running": False}, "not running"),
        ({"stuck_calls": {"dispatcher": 89.0}}, "dispatcher: its claim call has run for 11.0s"),
        ({"stuck_calls": {"leases": 80.0}}, "leases: its extend_many call"),
        ({"stuck_calls": {"committer": 85.0}}, "committer: its complete call has run for 15.0s"),
        ({"beats": {"dispatcher": 79.0}}, "dispatcher: its loop has not turned for 21.0s"),
        ({"least_recently_renewed": 79.0}, "lease keeper: a held claim was last renewed 21.0s"),
        ({"oldest_result_waiting": 89.0}, "committer: a finished attempt has waited 11.0s"),
        ({"abandoned": 4}, "4 handler(s) run on past their timeout (max_abandoned = 4)"),
        ({"loop_blocked_since": 80.0}, "asyncio loop of async handlers has been blocked"),
    ],
)
def test_each_part_that_stops_making_progress_is_a_problem_named_in_words(
    change: dict[str, Any], words: str
) -> None:
    problems = replace(HEALTHY, **change).problems()
    assert len(problems) == 1 and words in problems[0], problems


def test_bounds_are_not_problems_until_passed() -> None:
    at_the_bounds = replace(
        HEALTHY,
        stuck_calls={"dispatcher": 90.0, "committer": 90.0, "leases": 90.0},
        least_recently_renewed=80.0,
        oldest_result_waiting=90.0,
        abandoned=3,
        loop_blocked_since=90.0,
    )
    assert at_the_bounds.problems() == ()
    quiet = replace(HEALTHY, beats={"dispatcher": 80.0})  # idle_wait + lease / 3 exactly
    assert quiet.problems() == ()


def test_a_stopping_worker_draining_its_handlers_is_not_judged_by_its_dispatcher_beat() -> None:
    draining = replace(HEALTHY, beats={"dispatcher": 50.0}, stopping=True)
    assert draining.problems() == ()


class _HangingComplete(MemoryBackend):
    """``complete`` hangs until ``unblock`` is set."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.entered = threading.Event()
        self.unblock = threading.Event()

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        self.entered.set()
        self.unblock.wait(TIMEOUT)
        return super().complete(batch)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_answers_503_with_the_reason_while_a_commit_hangs_and_200_after() -> None:
    pytest.importorskip("prometheus_client")
    h = Harness(_HangingComplete)
    backend = h.backend
    assert isinstance(backend, _HangingComplete)
    h.app.register("x", lambda p: None)
    ops = WorkerOps(h.app, metrics_port=0, health_port=0)
    try:
        worker = h.start()
        ops.start(worker)
        health = f"http://127.0.0.1:{ops.health_port_served}/healthz"
        assert _get(health) == (200, "ok\n")
        h.app.schedule("x", delay=0)
        assert backend.entered.wait(TIMEOUT)
        h.clock.advance(11)  # past lease / 3 = 10 s
        status, body = _get(health)
        assert status == 503 and "committer: its complete call has run for 11.0s" in body
        on_metrics_port = f"http://127.0.0.1:{ops.port}/healthz"
        assert _get(on_metrics_port)[0] == 503
        metrics = _get(f"http://127.0.0.1:{ops.port}/metrics")[1]
        assert "delayq_worker_healthy 0.0" in metrics and "delayq_worker_abandoned 0.0" in metrics
        backend.unblock.set()
        assert h.next_result().outcome == "succeeded"
        assert wait_until(lambda: _get(health)[0] == 200, TIMEOUT)
    finally:
        backend.unblock.set()
        ops.close()
        h.stop()


def test_abandoned_handlers_at_the_cap_make_the_worker_unhealthy_and_show_in_the_gauge() -> None:
    pytest.importorskip("prometheus_client")
    h = Harness(max_abandoned=1)
    release = threading.Event()
    started = threading.Event()

    @h.app.handler("stuck", timeout=1.0)
    def stuck(payload: Any) -> None:
        started.set()
        release.wait(TIMEOUT)

    ops = WorkerOps(h.app, metrics_port=0)
    try:
        worker = h.start()
        ops.start(worker)
        h.app.schedule("stuck", delay=0, max_attempts=1)
        assert started.wait(TIMEOUT)
        h.asleep(2)  # the timeout watcher and the lease keeper
        h.clock.advance(1.0)  # the timeout: dead-lettered, its thread left running
        assert h.next_result().outcome == "dead"
        status, body = _get(f"http://127.0.0.1:{ops.port}/healthz")
        assert status == 503 and "max_abandoned = 1" in body
        metrics = _get(f"http://127.0.0.1:{ops.port}/metrics")[1]
        assert "delayq_worker_abandoned 1.0" in metrics
        assert "delayq_worker_abandoned_cap 1.0" in metrics
        release.set()
        assert wait_until(lambda: worker.health_snapshot().abandoned == 0, TIMEOUT)
        assert _get(f"http://127.0.0.1:{ops.port}/healthz")[0] == 200
    finally:
        release.set()
        ops.close()
        h.stop()


def test_a_stopped_worker_is_unhealthy() -> None:
    h = Harness()
    worker = h.start()
    worker.stop(grace=0)
    assert worker.health_snapshot().problems() == ("the worker is not running",)
