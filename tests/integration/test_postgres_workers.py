"""Real worker processes sharing one PostgreSQL queue: draining, crashes, lost connections."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from delayq.backends.postgres import PostgresBackend
from delayq.job import JobSpec, JobState
from tests._util import wait_until
from tests.postgres_support import POSTGRES_URL, admin, app_name, pg_schema, terminate_backends

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # real seconds, generous: worker processes start slowly on a loaded machine

Run = tuple[str, int, int, float, float, float]  # id, attempt, pid, claimed_at, lease_until, ran


@pytest.fixture
def schema() -> Iterator[str]:
    with pg_schema() as name:
        yield name


@pytest.fixture
def backend(schema: str) -> Iterator[PostgresBackend]:
    b = PostgresBackend(POSTGRES_URL, schema=schema)
    with admin() as conn:
        conn.execute(
            f'CREATE TABLE "{schema}".ran (id text, attempt int, pid int, claimed_at float8, '
            f"lease_until float8, ran_at float8)"
        )
    yield b
    b.close()


@pytest.fixture
def start_worker(schema: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start worker processes on this test's queue; any left running are killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*options: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.postgres_worker_proc",
                POSTGRES_URL,
                schema,
                app_name(schema),
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


def runs(schema: str) -> list[Run]:
    with admin() as conn:
        return conn.execute(f'SELECT * FROM "{schema}".ran ORDER BY ran_at').fetchall()  # type: ignore[return-value]


def server_time(backend: PostgresBackend) -> float:
    return float(backend._read("clock", "SELECT extract(epoch FROM now())::float8", {})[0][0])


def job(job_id: str, run_at: float, payload: object = None) -> JobSpec:
    return JobSpec(id=job_id, name="record", payload=json.dumps(payload or {}), run_at=run_at)


def state(backend: PostgresBackend, job_id: str) -> JobState | None:
    found = backend.get(job_id)
    return None if found is None else found.state


def test_three_worker_processes_run_20000_jobs_each_once_while_its_lease_lives(
    backend: PostgresBackend, schema: str, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    n = 20_000
    now = server_time(backend)
    for start in range(0, n, 2000):
        backend.enqueue([job(f"j{i}", now - 1 + i / n) for i in range(start, start + 2000)])
    workers = [start_worker() for _ in range(3)]
    assert wait_until(lambda: backend.stats().succeeded == n, timeout=120, interval=0.25)
    for worker in workers:
        stop(worker)
    recorded = runs(schema)
    counts = Counter(r[0] for r in recorded)
    assert len(counts) == n  # every job ran
    assert counts.most_common(1)[0][1] == 1  # none twice
    assert all(r[5] < r[4] for r in recorded)  # each ran while its lease lived
    assert len({r[2] for r in recorded}) == 3  # all three workers took part
    stats = backend.stats()
    assert (stats.scheduled, stats.running, stats.dead) == (0, 0, 0)


def test_a_job_whose_worker_is_killed_mid_handler_runs_again_after_its_lease(
    backend: PostgresBackend, schema: str, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    backend.enqueue([job("slow", server_time(backend), {"sleep_first": 60})])
    first = start_worker("--lease", "1.0")
    assert wait_until(lambda: len(runs(schema)) == 1, timeout=DEADLINE)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    running = backend.get("slow")
    assert running is not None and running.state is JobState.RUNNING
    assert running.lease_until is not None
    start_worker("--lease", "1.0")
    assert wait_until(lambda: state(backend, "slow") is JobState.SUCCEEDED, timeout=DEADLINE)
    before, after = runs(schema)
    assert (before[1], after[1]) == (1, 2)
    assert before[2] != after[2]
    assert after[3] >= running.lease_until  # not before the killed worker's lease ran out
    done = backend.get("slow")
    assert done is not None and "lease expired" in (done.last_error or "")


def test_workers_whose_server_backends_are_terminated_still_run_every_job(
    backend: PostgresBackend, schema: str, start_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    workers = [start_worker("--lease", "2.0") for _ in range(2)]
    now = server_time(backend)
    backend.enqueue([job(f"a{i}", now + i * 0.02) for i in range(200)])
    assert wait_until(lambda: backend.stats().succeeded >= 50, timeout=30, interval=0.05)
    # Both workers are past start-up (each has run a job) before their backends go.
    pids = {w.pid for w in workers}
    assert wait_until(lambda: {r[2] for r in runs(schema)} >= pids, timeout=30, interval=0.05)
    assert terminate_backends(schema) >= 2  # the workers' pools and listeners
    backend.enqueue([job(f"b{i}", server_time(backend) + 0.5 + i * 0.01) for i in range(200)])
    assert terminate_backends(schema) >= 0
    assert wait_until(lambda: backend.stats().succeeded == 400, timeout=60, interval=0.1)
    assert all(w.poll() is None for w in workers)
    for worker in workers:
        stop(worker)
    assert {r[0] for r in runs(schema)} == {f"a{i}" for i in range(200)} | {
        f"b{i}" for i in range(200)
    }
    assert backend.dead_letters() == []
