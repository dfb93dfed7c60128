"""Real workers on the RabbitMQ store: no head-of-line blocking, crashes, dropped connections."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import DelayQ, JobContext, Worker
from tests._util import wait_until
from tests.rabbitmq_support import close_connections, delete_queues, unique_queue, vhost_url

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue() -> Iterator[str]:
    name = unique_queue()
    yield name
    delete_queues(name)


@pytest.fixture
def app(queue: str) -> Iterator[DelayQ]:
    a = DelayQ(vhost_url(), queue=queue)
    yield a
    a.close()


class Recorder:
    """A ``record`` handler that notes (job id, attempt, lateness on this host's clock)."""

    def __init__(self, app: DelayQ) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[str, int, float]] = []
        app.register("record", self)

    def __call__(self, payload: Any, ctx: JobContext) -> None:
        from delayq.clock import SYSTEM_CLOCK  # noqa: PLC0415

        with self.lock:
            self.runs.append((ctx.id, ctx.attempt, SYSTEM_CLOCK.time() - ctx.run_at))

    def ids(self) -> Counter[str]:
        with self.lock:
            return Counter(job_id for job_id, _, _ in self.runs)


def test_jobs_due_in_a_second_run_on_time_among_a_thousand_due_in_an_hour(app: DelayQ) -> None:
    recorder = Recorder(app)
    worker = Worker(app, concurrency=8).start()
    try:
        for i in range(1000):  # interleaved: a long one, then a short one
            app.schedule("record", None, delay=3600, job_id=f"hour-{i}")
            app.schedule("record", None, delay=1.0, job_id=f"second-{i}")
        assert wait_until(lambda: len(recorder.ids()) >= 1000, timeout=60)
    finally:
        worker.stop()
    ids = recorder.ids()
    assert set(ids) == {f"second-{i}" for i in range(1000)}  # no hour job ran
    latenesses = sorted(lateness for _, _, lateness in recorder.runs)
    assert latenesses[0] >= 0, "a job ran before it was due"
    # Each short job ran soon after its own due time, not after the hour jobs ahead of it.
    assert latenesses[-1] < 30, latenesses[-10:]


def test_a_worker_killed_mid_handler_runs_the_job_again_as_the_same_attempt(
    app: DelayQ, queue: str, tmp_path: Path
) -> None:
    record = tmp_path / "ran.txt"
    record.touch()

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.rabbitmq_worker_proc",
                vhost_url(),
                queue,
                str(record),
            ],
            cwd=ROOT,
        )

    def runs() -> list[list[str]]:
        return [line.split() for line in record.read_text().splitlines()]

    first = start()
    try:
        app.schedule("record", {"sleep_first": 600}, delay=0.2, job_id="victim")
        assert wait_until(lambda: any(r[0] == "victim" for r in runs()), timeout=90)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        second = start()
        try:
            assert wait_until(lambda: len(runs()) == 2, timeout=90)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    # The broker returned it when its worker died: a return, counted against max_returns,
    # not an attempt (the store cannot tell whether the dead worker had started it).
    assert [r[:2] for r in runs()] == [["victim", "1"], ["victim", "1"]]


def test_connections_closed_under_a_running_worker_lose_no_job(app: DelayQ) -> None:
    recorder = Recorder(app)
    worker = Worker(app, concurrency=4).start()
    count = 300
    try:
        for i in range(count):
            app.schedule("record", None, delay=(i % 30) / 10, job_id=f"j{i}")
        assert wait_until(lambda: len(recorder.ids()) >= 50, timeout=30)
        close_connections()  # the worker's consumer and publisher, and this producer
        assert wait_until(lambda: len(recorder.ids()) >= 150, timeout=60)
        close_connections()
        assert wait_until(lambda: len(recorder.ids()) == count, timeout=60), count - len(
            recorder.ids()
        )
    finally:
        worker.stop()
    assert min(lateness for _, _, lateness in recorder.runs) >= 0
    # At least once: a job whose ack was lost with its connection may run twice.
    assert set(recorder.ids()) == {f"j{i}" for i in range(count)}


def test_an_idle_worker_sends_nothing_and_a_new_job_wakes_it(app: DelayQ) -> None:
    recorder = Recorder(app)
    worker = Worker(app, concurrency=2, idle_wait=3600).start()
    try:
        assert wait_until(app._backend._consumer.connected.is_set, timeout=10)  # type: ignore[attr-defined]
        app.schedule("record", None, delay=0.05, job_id="wake")
        assert wait_until(lambda: recorder.ids() == Counter({"wake": 1}), timeout=10)
    finally:
        worker.stop()
