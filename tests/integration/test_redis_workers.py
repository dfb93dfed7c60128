"""Real worker processes sharing one Redis queue: draining, crashes, skewed clocks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from delayq.backends.redis import DEFAULT_QUEUE, RedisBackend, queue_keys
from delayq.backends.redis._store import DEFAULT_MAX_FINISHED
from delayq.job import JobSpec, JobState
from tests._util import wait_until
from tests.redis_support import REDIS_URL, RedisServer, redis_client, redis_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # real seconds, generous: worker processes start slowly on a loaded machine


@dataclass(frozen=True)
class Run:
    """One handler run, as recorded by ``redis_worker_proc``."""

    job_id: str
    attempt: int
    pid: int
    claimed_at: float
    run_at: float
    ran_at: float  # server time when the handler started

    @classmethod
    def parse(cls, line: str) -> Run:
        job_id, attempt, pid, claimed_at, run_at, ran_at = line.split()
        return cls(job_id, int(attempt), int(pid), float(claimed_at), float(run_at), float(ran_at))


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix() as p:
        yield p


@pytest.fixture
def backend(prefix: str) -> Iterator[RedisBackend]:
    b = RedisBackend.from_url(REDIS_URL, prefix=prefix)
    yield b
    b.close()


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis_client()
    yield c
    c.close()


@pytest.fixture
def start_worker(prefix: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start worker processes on this test's queue; any left running are killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*options: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.redis_worker_proc",
                REDIS_URL,
                prefix,
                *options,
            ],
            cwd=ROOT,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=15) == 0


def runs(client: redis.Redis, prefix: str) -> list[Run]:
    return [Run.parse(line.decode()) for line in client.lrange(f"{prefix}:ran", 0, -1)]


def server_time(backend: RedisBackend) -> float:
    seconds, micros = backend._redis.time()
    return seconds + micros / 1_000_000


def job(job_id: str, run_at: float, payload: object = None, max_attempts: int = 3) -> JobSpec:
    return JobSpec(
        id=job_id,
        name="record",
        payload=json.dumps(payload or {}),
        run_at=run_at,
        max_attempts=max_attempts,
    )


def test_four_worker_processes_run_20000_jobs_each_exactly_once(
    backend: RedisBackend,
    client: redis.Redis,
    prefix: str,
    start_worker: Callable[..., subprocess.Popen[bytes]],
) -> None:
    n = 20_000
    now = server_time(backend)
    for start in range(0, n, 1000):
        backend.enqueue([job(f"j{i}", now - 1 + i / n) for i in range(start, start + 1000)])
    workers = [start_worker() for _ in range(4)]

    def finished() -> bool:
        stats = backend.stats()
        return (stats.scheduled, stats.running) == (0, 0)

    assert wait_until(finished, timeout=5 * DEADLINE, interval=0.2)
    for worker in workers:
        stop(worker)
    counts = Counter(r.job_id for r in runs(client, prefix))
    assert len(counts) == n  # every job ran
    assert counts.most_common(1)[0][1] == 1  # none twice (no lease expired)
    stats = backend.stats()
    assert (stats.scheduled, stats.running, stats.dead) == (0, 0, 0)
    assert stats.succeeded == n  # every record kept to result_ttl, the oldest compact
    assert client.zcard(backend._keys["succeeded"]) == DEFAULT_MAX_FINISHED  # full ones


def test_a_job_whose_worker_is_killed_mid_handler_runs_again_after_its_lease(
    backend: RedisBackend,
    client: redis.Redis,
    prefix: str,
    start_worker: Callable[..., subprocess.Popen[bytes]],
) -> None:
    backend.enqueue([job("slow", server_time(backend), {"sleep_first": 60})])
    first = start_worker("--lease", "1.0")
    assert wait_until(lambda: len(runs(client, prefix)) == 1, timeout=DEADLINE)
    # Killed once the store knows its handler started (reported within lease / 10):
    # the lease that runs out then is an attempt (a start never recorded would not be).
    key = queue_keys(prefix, DEFAULT_QUEUE)["job:"] + "slow"
    assert wait_until(lambda: client.hget(key, "started") is not None, timeout=DEADLINE)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    killed_at = server_time(backend)
    running = backend.get("slow")
    assert running is not None and running.state is JobState.RUNNING
    assert running.lease_until is not None
    start_worker("--lease", "1.0")
    assert wait_until(lambda: _state(backend, "slow") is JobState.SUCCEEDED, timeout=DEADLINE)
    before, after = runs(client, prefix)
    assert (before.attempt, after.attempt) == (1, 2)
    assert before.pid != after.pid
    # Not before the lease the killed worker held had run out.
    assert after.claimed_at >= running.lease_until
    assert after.claimed_at >= killed_at - 1.0
    done = backend.get("slow")
    assert done is not None and "lease expired" in (done.last_error or "")


def _state(backend: RedisBackend, job_id: str) -> JobState | None:
    found = backend.get(job_id)
    return None if found is None else found.state


@pytest.mark.parametrize("skew", [600.0, -600.0], ids=["10min-ahead", "10min-behind"])
def test_a_worker_with_a_skewed_clock_runs_jobs_on_time_never_early(
    backend: RedisBackend,
    client: redis.Redis,
    prefix: str,
    start_worker: Callable[..., subprocess.Popen[bytes]],
    skew: float,
) -> None:
    worker = start_worker("--skew", repr(skew))
    # A job due now first: once it has run, the worker process is up and claiming,
    # so its start-up (seconds on a loaded machine) cannot make the others late.
    backend.enqueue([job("warm", server_time(backend))])
    assert wait_until(lambda: backend.stats().succeeded == 1, timeout=60, interval=0.05)
    now = server_time(backend)
    jobs = [job(f"j{i}", now + 1.0 + i * 0.1) for i in range(20)]
    backend.enqueue(jobs)
    assert wait_until(lambda: backend.stats().succeeded == 1 + len(jobs), timeout=60, interval=0.1)
    stop(worker)
    recorded = [r for r in runs(client, prefix) if r.job_id != "warm"]
    assert len(recorded) == len(jobs)
    for run in recorded:
        assert run.claimed_at >= run.run_at, f"{run.job_id} was claimed early"
        assert run.ran_at >= run.run_at, f"{run.job_id} ran early"
        # ...and not ten minutes late either: the worker never slept on its own
        # clock (a bound far below the skew, far above a loaded machine's delays).
        assert run.claimed_at - run.run_at < 60.0


def test_a_worker_keeps_running_through_a_redis_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always").start()
    prefix = "delayqtest:restart"
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.redis_worker_proc", server.url, prefix],
        cwd=ROOT,
    )
    admin = server.client()
    try:
        backend = RedisBackend.from_url(server.url, prefix=prefix)
        backend.enqueue([job("before", server_time(backend))])
        assert wait_until(lambda: _state(backend, "before") is JobState.SUCCEEDED, timeout=DEADLINE)
        backend.close()
        server.kill()
        server.start()
        admin = server.client()
        backend = RedisBackend.from_url(server.url, prefix=prefix)
        backend.enqueue([job("after", server_time(backend))])
        assert wait_until(lambda: _state(backend, "after") is JobState.SUCCEEDED, timeout=DEADLINE)
        assert worker.poll() is None
        backend.close()
        stop(worker)
        assert {line.split()[0] for line in admin.lrange(f"{prefix}:ran", 0, -1)} == {
            "before",
            "after",
        }
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(timeout=10)
        admin.close()
        server.stop()
