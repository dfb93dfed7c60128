"""Reliability on SQLite with real processes: SIGKILL, SIGTERM, two workers on one file.

Each test starts child Python processes (no mocks) and checks the database
afterwards. Children log to files under ``tmp_path`` (shown on failure).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.app import DelayQ
from delayq.job import JobState
from tests._util import wait_until

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent(
    """
    import os, sys, threading, time
    from delayq import DelayQ, Worker

    url, side_file = sys.argv[1], sys.argv[2]
    lease, concurrency = float(sys.argv[3]), int(sys.argv[4])
    app = DelayQ(url)
    fd = os.open(side_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(line):
        os.write(fd, (line + "\\n").encode())

    @app.handler("record")
    def run_once(payload, ctx):
        record(ctx.id)

    @app.handler("hang-first-attempt")
    def hang(payload, ctx):
        record(f"start {ctx.id} {ctx.attempt}")
        if ctx.attempt == 1:
            threading.Event().wait(600)  # killed here
        record(f"done {ctx.id} {ctx.attempt}")

    @app.handler("slow")
    def slow(payload, ctx):
        record(f"start {ctx.id}")
        threading.Event().wait(payload["seconds"])
        record(f"done {ctx.id}")

    @app.handler("until-released")
    def until_released(payload, ctx):
        # Runs until the test creates the release file (never longer than 60 s).
        record(f"start {ctx.id}")
        deadline = time.monotonic() + 60
        while not os.path.exists(payload["release"]) and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        record(f"done {ctx.id}")

    worker = Worker(app, concurrency=concurrency, lease=lease, grace=10)
    stop = worker.stop

    def stop_and_say_so(*args, **kwargs):
        stop(*args, **kwargs)
        record("stopping")  # the stop request has been taken: no more claims

    worker.stop = stop_and_say_so
    record("ready")
    worker.run()
    record("exited")
    """
)

PRODUCER = textwrap.dedent(
    """
    import sys
    from delayq import DelayQ

    app = DelayQ(sys.argv[1])
    i = 0
    while True:
        if i % 2:
            ids = app.schedule_many(
                [{"name": "record", "payload": {"i": i, "k": k}, "delay": 3600} for k in range(10)]
            )
        else:
            ids = [app.schedule("record", {"i": i}, delay=3600)]
        # Printed only after schedule returned: each printed id must be stored.
        sys.stdout.write("".join(f"{job_id}\\n" for job_id in ids))
        sys.stdout.flush()
        i += 1
    """
)


class Children:
    """Starts child processes and makes sure none outlives the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[str]] = []

    def worker(
        self, url: str, side_file: Path, *, lease: float, concurrency: int = 4
    ) -> subprocess.Popen[str]:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(side_file), str(lease), str(concurrency)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def producer(self, url: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()}" for p in sorted(self.tmp_path.glob("worker-*.log"))
        )

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    kids = Children(tmp_path)
    yield kids
    kids.kill_all()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_job_killed_mid_handler_runs_again_after_its_lease(
    tmp_path: Path, children: Children
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    side = tmp_path / "runs.txt"
    with DelayQ(url) as app:
        job_id = app.schedule("hang-first-attempt", {"n": 1}, delay=0, job_id="the-job")
    first = children.worker(url, side, lease=1.0)
    assert wait_until(lambda: f"start {job_id} 1" in lines(side), 30), children.logs()

    def start_recorded() -> bool:  # reported within lease / 10: the expiry is then an attempt
        with sqlite3.connect(tmp_path / "jobs.db") as db:
            row = db.execute("SELECT started FROM delayq_jobs WHERE id = ?", (job_id,)).fetchone()
        return bool(row and row[0])

    assert wait_until(start_recorded, 30), children.logs()
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    children.worker(url, side, lease=1.0)
    with DelayQ(url) as app:

        def succeeded() -> bool:
            job = app.get(job_id)
            return job is not None and job.state is JobState.SUCCEEDED

        assert wait_until(succeeded, 30), children.logs()
        job = app.get(job_id)
        assert job is not None and job.attempts == 2
    assert f"done {job_id} 2" in lines(side)
    assert f"done {job_id} 1" not in lines(side)


@pytest.mark.parametrize("synchronous", ["full", "normal"])
def test_every_job_whose_schedule_returned_survives_sigkill(
    tmp_path: Path, children: Children, synchronous: str
) -> None:
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}?synchronous={synchronous}"
    producer = children.producer(url)
    assert producer.stdout is not None
    printed: list[str] = []
    while len(printed) < 1500:
        line = producer.stdout.readline()
        assert line, "the producer exited early"
        printed.append(line)
    producer.send_signal(signal.SIGKILL)
    producer.wait(10)
    printed.extend(producer.stdout.read().splitlines(keepends=True))
    ids = [line.strip() for line in printed if line.endswith("\n")]  # complete lines only
    assert len(ids) >= 1500

    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = {row[0] for row in conn.execute("SELECT id FROM delayq_jobs")}
    missing = [job_id for job_id in ids if job_id not in stored]
    assert missing == []
    with DelayQ(url) as app:
        assert app.stats().scheduled == len(stored) >= len(ids)


def test_two_workers_on_one_file_run_each_job_exactly_once(
    tmp_path: Path, children: Children
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    sides = [tmp_path / "runs-a.txt", tmp_path / "runs-b.txt"]
    workers = [children.worker(url, side, lease=30.0, concurrency=4) for side in sides]
    assert wait_until(lambda: all("ready" in lines(s) for s in sides), 30), children.logs()
    count = 3000
    with DelayQ(url) as app:
        ids: list[str] = []
        for start in range(0, count, 500):
            ids += app.schedule_many(
                [
                    {"name": "record", "payload": {"n": n}, "delay": 0.5 + n / (4 * count)}
                    for n in range(start, start + 500)
                ]
            )
        assert wait_until(lambda: app.stats().succeeded == count, 60), children.logs()
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        # a graceful stop (grace=10) on a machine loaded by the whole suite: generous
        assert [proc.wait(90) for proc in workers] == [0, 0], children.logs()
        retried = [
            j.id for j in app.list_jobs(state=JobState.SUCCEEDED, limit=count) if j.attempts != 1
        ]
        assert retried == []  # no lease expired
    runs = Counter(
        line
        for side in sides
        for line in lines(side)
        if line not in ("ready", "exited", "stopping")
    )
    assert set(runs) == set(ids)  # none missing, none unknown
    assert [job_id for job_id, n in runs.items() if n > 1] == []  # none ran twice
    # "stopping" is written by the signal thread and may land after "exited"
    assert all([x for x in lines(side) if x != "stopping"][-1] == "exited" for side in sides)


def test_sigterm_lets_the_running_handler_finish_and_exits_cleanly(
    tmp_path: Path, children: Children
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    side = tmp_path / "runs.txt"
    release = tmp_path / "release"
    with DelayQ(url) as app:
        payload = {"release": str(release)}
        running = app.schedule("until-released", payload, delay=0, job_id="running")
        waiting = app.schedule("until-released", payload, delay=0, job_id="waiting")
    worker = children.worker(url, side, lease=30.0, concurrency=1)
    assert wait_until(lambda: f"start {running}" in lines(side), 30), children.logs()
    worker.send_signal(signal.SIGTERM)
    # The handler is still running when the stop is taken; only then may it finish.
    assert wait_until(lambda: "stopping" in lines(side), 30), children.logs()
    release.touch()
    assert worker.wait(30) == 0, children.logs()
    assert lines(side)[-3:] == ["stopping", f"done {running}", "exited"]
    with DelayQ(url) as app:
        first, second = app.get(running), app.get(waiting)
        assert first is not None and first.state is JobState.SUCCEEDED
        assert second is not None and second.state is JobState.SCHEDULED
        assert second.attempts == 0  # never claimed
