"""Three worker processes on one SQLite store (and on Redis and PostgreSQL) run a
1-second schedule: every occurrence exactly once, edits and pauses take effect
while they run, and removing the schedule stops it."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from delayq.app import DelayQ
from delayq.recurring import occurrence_id
from tests._util import wait_until
from tests.postgres_support import POSTGRES_URL, pg_schema
from tests.redis_support import REDIS_URL, redis_client, redis_prefix

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # generous: the machine is shared and loaded


@dataclass(frozen=True)
class Run:
    """One handler run, as recorded by ``recurring_worker_proc``."""

    job_id: str
    run_at: float
    pid: int
    payload: object


class Cluster:
    """Three worker processes on one store (a SQLite file unless ``url`` is given),
    and a producer app on it."""

    def __init__(self, tmp_path: Path, url: str | None = None) -> None:
        self.url = url or f"sqlite:///{tmp_path / 'jobs.db'}"
        self.outdir = tmp_path / "ran"
        self.outdir.mkdir()
        self.app = DelayQ(self.url)
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.recurring_worker_proc",
                    self.url,
                    str(self.outdir),
                ],
                cwd=ROOT,
            )
            for _ in range(3)
        ]
        # All three are up before a test schedules anything: every occurrence
        # has three workers competing for it.
        if not wait_until(lambda: len(list(self.outdir.glob("ready.*"))) == 3, DEADLINE, 0.05):
            self.stop()
            raise AssertionError(f"the three workers did not start within {DEADLINE}s")

    def runs(self) -> list[Run]:
        found = []
        for path in self.outdir.glob("ran.*"):
            for line in path.read_text(encoding="utf-8").splitlines():
                job_id, run_at, pid, payload = line.split(" ", 3)
                found.append(Run(job_id, float(run_at), int(pid), json.loads(payload)))
        return sorted(found, key=lambda r: r.run_at)

    def wait_for(self, job_id: str) -> None:
        """Wait until the job ``job_id`` has run."""
        assert wait_until(lambda: any(r.job_id == job_id for r in self.runs()), DEADLINE, 0.05), (
            f"{job_id} did not run within {DEADLINE}s"
        )

    def sentinel(self, name: str, after: float) -> None:
        """Run a one-off job ``after`` seconds from now and wait for it: the workers
        have then had every earlier due job (ticks included) in front of them."""
        self.app.schedule("record", {"sentinel": name}, delay=after, job_id=name)
        self.wait_for(name)

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)
        self.app.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[Cluster]:
    redis_client().close()  # skips (or fails in CI) without a Redis server
    with redis_prefix() as prefix:
        c = Cluster(tmp_path, f"{REDIS_URL}?prefix={prefix}")
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture
def postgres_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with pg_schema() as schema:  # skips (or fails in CI) without a PostgreSQL server
        c = Cluster(tmp_path, f"{POSTGRES_URL}?schema={schema}")
        try:
            yield c
        finally:
            c.stop()  # the workers exit (closing their connections) before the drop


def occurrences(runs: list[Run], name: str) -> list[Run]:
    return [r for r in runs if r.job_id.startswith(name + "@")]


def test_three_workers_run_each_occurrence_of_a_1s_schedule_exactly_once(
    cluster: Cluster,
) -> None:
    exactly_once_then_removed(cluster)


@pytest.mark.redis
def test_three_workers_on_redis_run_each_occurrence_exactly_once(redis_cluster: Cluster) -> None:
    exactly_once_then_removed(redis_cluster)


@pytest.mark.postgres
def test_three_workers_on_postgres_run_each_occurrence_exactly_once(
    postgres_cluster: Cluster,
) -> None:
    exactly_once_then_removed(postgres_cluster)


def exactly_once_then_removed(cluster: Cluster) -> None:
    cluster.app.recurring("beat", handler="record", every=1, payload={"v": 1})
    assert wait_until(lambda: len(occurrences(cluster.runs(), "beat")) >= 6, DEADLINE, 0.05), (
        cluster.runs()
    )
    assert cluster.app.remove_recurring("beat") is True
    removed_at = time.time()
    cluster.sentinel("after-remove", after=2.5)
    runs = occurrences(cluster.runs(), "beat")
    counts = Counter(r.job_id for r in runs)
    assert all(n == 1 for n in counts.values()), counts  # exactly once per occurrence
    assert all(r.job_id == occurrence_id("beat", r.run_at) for r in runs)
    assert all(r.run_at <= removed_at for r in runs)  # nothing after the removal


def test_changing_and_pausing_a_schedule_while_workers_run(cluster: Cluster) -> None:
    app = cluster.app
    app.recurring("beat", handler="record", every=1, payload={"v": 1})
    assert wait_until(lambda: len(occurrences(cluster.runs(), "beat")) >= 2, DEADLINE, 0.05)
    app.update_recurring("beat", every=2, payload={"v": 2})
    changed_at = time.time()
    assert wait_until(
        lambda: sum(r.payload == {"v": 2} for r in occurrences(cluster.runs(), "beat")) >= 2,
        DEADLINE,
        0.05,
    )
    v2 = [r.run_at for r in occurrences(cluster.runs(), "beat") if r.payload == {"v": 2}]
    assert all(b - a >= 2 for a, b in itertools.pairwise(v2))  # the new interval
    assert all(t > changed_at - 1 for t in v2)

    assert app.pause_recurring("beat") is True
    paused_at = time.time()
    cluster.sentinel("while-paused", after=3.0)
    runs = occurrences(cluster.runs(), "beat")
    assert all(r.run_at <= paused_at for r in runs), [r.run_at - paused_at for r in runs]

    assert app.resume_recurring("beat") is True
    resumed_at = time.time()
    assert wait_until(
        lambda: any(r.run_at > resumed_at for r in occurrences(cluster.runs(), "beat")),
        DEADLINE,
        0.05,
    )
    runs = occurrences(cluster.runs(), "beat")
    assert not [r for r in runs if paused_at < r.run_at <= resumed_at]  # none of the pause
    counts = Counter(r.job_id for r in runs)
    assert all(n == 1 for n in counts.values()), counts
