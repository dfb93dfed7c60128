"""Cancel on RabbitMQ: the queue's log decides a cancel racing a start in another process.

A job is cancelled or runs, never both, and the canceller's answer says which;
a worker killed between its start record and its handler loses no job.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.backends.rabbitmq import RabbitMQBackend
from delayq.errors import BackendUnavailable, Unsupported
from delayq.job import CancelOutcome, JobSpec, JobState
from tests._util import wait_until
from tests.rabbitmq_support import delete_queues, unique_queue, vhost_url

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RACES = 200


@pytest.fixture
def queue() -> Iterator[str]:
    name = unique_queue()
    yield name
    delete_queues(name)


@pytest.fixture
def store(queue: str) -> Iterator[RabbitMQBackend]:
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    yield backend
    backend.close()


def due_now(job_id: str) -> JobSpec:
    return JobSpec(id=job_id, name="race", payload="{}", run_at=0.0, delay=0.0)


def claimer(queue: str, record: Path, *flags: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.integration.rabbitmq_race_proc"]
    return subprocess.Popen([*command, vhost_url(), queue, str(record), *flags], cwd=ROOT)


def started(record: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in record.read_text().splitlines() if line.strip())


def test_a_cancel_racing_a_start_in_another_process_has_one_winner_and_says_which(
    store: RabbitMQBackend, queue: str, tmp_path: Path
) -> None:
    record = tmp_path / "started.txt"
    record.touch()
    worker = claimer(queue, record)
    try:
        store.enqueue([due_now("warm-up")])  # the claimer is up once it ran this
        assert wait_until(lambda: "warm-up" in started(record), timeout=90)
        rng = random.Random(7)
        pause = threading.Event()
        answers: dict[str, CancelOutcome] = {}
        for i in range(RACES):
            store.enqueue([due_now(f"r{i}")])
            pause.wait(rng.uniform(0.0, 0.004))  # spread the cancels over the delivery
            answers[f"r{i}"] = store.cancel(f"r{i}")
        finals = {JobState.SUCCEEDED, JobState.CANCELLED}

        def settled() -> bool:
            return all((j := store.get(i)) is not None and j.state in finals for i in answers)

        assert wait_until(settled, timeout=60, interval=0.1)
        store.enqueue([due_now("stop")])  # after every raced delivery has been judged
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    runs = started(record)
    assert max(runs.values()) == 1  # no job started twice
    for job_id, answer in answers.items():
        job = store.get(job_id)
        assert job is not None
        if answer.cancelled:
            assert answer is CancelOutcome.CANCELLED and job_id not in runs
            assert job.state is JobState.CANCELLED
        else:
            assert answer in (CancelOutcome.RUNNING, CancelOutcome.FINISHED), answer
            assert runs[job_id] == 1 and job.state is JobState.SUCCEEDED


def test_a_worker_killed_between_its_start_record_and_the_handler_loses_no_job(
    store: RabbitMQBackend, queue: str, tmp_path: Path
) -> None:
    record = tmp_path / "started.txt"
    record.touch()
    store.enqueue([due_now("victim")])
    first = claimer(queue, record, "--die-after-claim")
    assert first.wait(timeout=90) == -signal.SIGKILL
    job = store.get("victim")
    assert job is not None and job.state is JobState.RUNNING  # its start is in the log
    assert store.cancel("victim") is CancelOutcome.RUNNING  # under its live lease
    second = claimer(queue, record)
    try:

        def done() -> bool:
            job = store.get("victim")
            return job is not None and job.state is JobState.SUCCEEDED

        assert wait_until(done, timeout=90, interval=0.05)
        store.enqueue([due_now("stop")])
        assert second.wait(timeout=60) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(timeout=10)
    assert started(record)["victim"] == 1  # the dead worker never recorded it


def test_with_log_false_a_job_runs_without_a_start_record_and_nothing_is_by_id(
    queue: str,
) -> None:
    backend = RabbitMQBackend(vhost_url(log="false"), queue=queue)
    try:
        assert "definite_cancel" not in backend.features
        assert "definite_cancel" in RabbitMQBackend.features
        backend.enqueue([due_now("j")])

        def claimed() -> list[str]:
            claims = backend.claim(limit=1, lease=30)
            backend.complete([Completion.ack(c) for c in claims])
            return [c.job.id for c in claims]

        assert wait_until(lambda: claimed() == ["j"], timeout=30, interval=0.02)
        with pytest.raises(Unsupported, match="log=false"):
            backend.cancel("j")
        with pytest.raises(Unsupported, match="log=false"):
            backend.get("j")
    finally:
        backend.close()


def test_a_claim_whose_start_record_went_unanswered_loses_no_job(
    store: RabbitMQBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = store._arbiter.append

    def stored_then_lost(kind: str, action: str, *args: Any, **fields: Any) -> Any:
        real(kind, action, *args, **fields)  # the record is in the log, its answer lost
        monkeypatch.setattr(store._arbiter, "append", real)
        raise BackendUnavailable("the answer was lost")

    store.enqueue([due_now("j")])

    def delivered() -> bool:
        store.wait_for_due(0.05)  # starts the consumer
        return store._consumer.buffered() == 1

    assert wait_until(delivered, timeout=30)
    monkeypatch.setattr(store._arbiter, "append", stored_then_lost)
    with pytest.raises(BackendUnavailable):
        store.claim(limit=1, lease=30)
    got: list[str] = []

    def claimed() -> bool:
        claims = store.claim(limit=1, lease=30)
        store.complete([Completion.ack(c) for c in claims])
        got.extend(c.job.id for c in claims)
        return bool(got)

    assert wait_until(claimed, timeout=30, interval=0.02)
    assert got == ["j"]
    job = store.get("j")
    assert job is not None and job.state is JobState.SUCCEEDED
