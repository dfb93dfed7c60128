"""Three worker processes on one SQLite store (and on Redis and PostgreSQL) run a
1-second schedule: every occurrence exactly once, also when the process running
the chain stops; edits and pauses take effect while they run, removing the
schedule stops it; overlap="skip", run now and declarative sync hold across
the processes."""

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
class Span:
    """One run of the ``slow`` handler: wall-clock start and end, nominal time."""

    job_id: str
    start: float
    end: float
    scheduled_for: float


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

    def runs(self) -> list[Run]:
        found = []
        for path in self.outdir.glob("ran.*"):
            for line in path.read_text(encoding="utf-8").splitlines():
                job_id, run_at, pid, payload = line.split(" ", 3)
                found.append(Run(job_id, float(run_at), int(pid), json.loads(payload)))
        return sorted(found, key=lambda r: r.run_at)

    def spans(self) -> list[Span]:
        found = []
        for path in self.outdir.glob("spans.*"):
            for line in path.read_text(encoding="utf-8").splitlines():
                job_id, start, end, scheduled_for = line.split(" ")
                found.append(Span(job_id, float(start), float(end), float(scheduled_for)))
        return sorted(found, key=lambda s: s.start)

    def stop_worker(self, pid: int) -> None:
        """SIGTERM the worker process ``pid`` and wait for it to exit."""
        [worker] = [w for w in self.workers if w.pid == pid]
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=DEADLINE)

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
    assert wait_until(lambda: len(occurrences(cluster.runs(), "beat")) >= 3, DEADLINE, 0.05), (
        cluster.runs()
    )
    # Stop the process that ran the latest occurrence: the rest must run elsewhere,
    # so at least two processes share the schedule, whichever claimed what before.
    stopped = occurrences(cluster.runs(), "beat")[-1].pid
    cluster.stop_worker(stopped)
    seen = len(occurrences(cluster.runs(), "beat"))
    assert wait_until(
        lambda: len(occurrences(cluster.runs(), "beat")) >= seen + 3, DEADLINE, 0.05
    ), cluster.runs()
    assert cluster.app.remove_recurring("beat") is True
    removed_at = time.time()
    cluster.sentinel("after-remove", after=2.5)
    runs = occurrences(cluster.runs(), "beat")
    counts = Counter(r.job_id for r in runs)
    assert all(n == 1 for n in counts.values()), counts  # exactly once per occurrence
    assert all(r.job_id == occurrence_id("beat", r.run_at) for r in runs)
    assert all(r.run_at <= removed_at for r in runs)  # nothing after the removal
    assert {r.pid for r in runs[seen:]} - {stopped}  # others went on after it stopped


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


def test_overlap_skip_run_now_and_sync_across_three_workers(cluster: Cluster) -> None:
    policies_across_processes(cluster)


@pytest.mark.redis
def test_overlap_skip_run_now_and_sync_across_three_workers_on_redis(
    redis_cluster: Cluster,
) -> None:
    policies_across_processes(redis_cluster)


@pytest.mark.postgres
def test_overlap_skip_run_now_and_sync_across_three_workers_on_postgres(
    postgres_cluster: Cluster,
) -> None:
    policies_across_processes(postgres_cluster)


def policies_across_processes(cluster: Cluster) -> None:
    app = cluster.app
    beat = {"name": "beat", "handler": "record", "every": 1, "payload": {"v": 1}}
    daily = {"name": "daily", "handler": "record", "cron": "0 3 * * *"}
    slow = {
        "name": "slow",
        "handler": "slow",
        "every": 1,
        "overlap": "skip",
        "payload": {"sleep": 2.5},  # each run outlasts two occurrences
    }
    assert app.sync_recurring([beat, daily, slow])["created"] == ["beat", "daily", "slow"]
    now_id = app.run_recurring_now("daily")  # its next run is hours away
    cluster.wait_for(now_id)
    assert wait_until(lambda: len(cluster.spans()) >= 3, DEADLINE, 0.05), cluster.spans()

    result = app.sync_recurring([{**beat, "payload": {"v": 2}}, daily])  # slow deleted from code
    synced_at = time.time()
    assert result == {
        "created": [],
        "changed": ["beat"],
        "unchanged": ["daily"],
        "removed": ["slow"],
    }
    assert wait_until(
        lambda: sum(r.payload == {"v": 2} for r in occurrences(cluster.runs(), "beat")) >= 2,
        DEADLINE,
        0.05,
    )
    cluster.sentinel("after-sync", after=3.5)

    spans = cluster.spans()
    assert all(a.end < b.start for a, b in itertools.pairwise(spans)), spans  # one at a time
    assert all(s.job_id == occurrence_id("slow", s.scheduled_for) for s in spans)
    assert all(s.scheduled_for < synced_at for s in spans)  # none due after the sync removed it
    runs = cluster.runs()
    assert [r.job_id for r in runs].count(now_id) == 1
    beats = occurrences(runs, "beat")
    assert all(n == 1 for n in Counter(r.job_id for r in beats).values())
    assert all(r.payload == {"v": 2} for r in beats if r.run_at > synced_at + 1)
