"""Prefetched jobs with real worker processes on SQLite: SIGTERM hands them back at once,
SIGKILL loses none (they come back after their lease).

The worker runs one handler slot and prefetches three: under a backlog it holds
four claims, one running (blocked on purpose) and three waiting for the slot.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.app import DelayQ
from delayq.job import JobState
from tests._util import wait_until

pytestmark = pytest.mark.slow

DEADLINE = 30.0  # real seconds; only reached when something is broken

WORKER = textwrap.dedent(
    """
    import os, sys, threading
    from delayq import DelayQ, Worker

    url, side_file, lease, hold = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    app = DelayQ(url)
    fd = os.open(side_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @app.handler("hold")
    def run(payload, ctx):
        os.write(fd, f"start {ctx.id} {ctx.attempt} {os.getpid()}\\n".encode())
        if hold == "hold":
            threading.Event().wait(600)  # stopped or killed here
        elif hold.startswith("hold-first:") and ctx.attempt == 1:
            threading.Event().wait(float(hold.split(":")[1]))

    os.write(fd, b"ready\\n")
    Worker(app, concurrency=1, prefetch=3, lease=lease, grace=600).run()
    os.write(fd, b"exited\\n")
    """
)


class Workers:
    """Starts worker processes and makes sure none outlives the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, url: str, side: Path, *, lease: float, hold: bool | str
    ) -> subprocess.Popen[bytes]:
        mode = hold if isinstance(hold, str) else "hold" if hold else "run"
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(side), str(lease), mode],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
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


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    kids = Workers(tmp_path)
    yield kids
    kids.kill_all()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def states(app: DelayQ, ids: list[str]) -> dict[str, tuple[JobState, int]]:
    jobs = {job_id: app.get(job_id) for job_id in ids}
    return {job_id: (job.state, job.attempts) for job_id, job in jobs.items() if job is not None}


def hold_four(
    url: str, side: Path, workers: Workers, *, lease: float, hold: bool | str = True
) -> tuple[list[str], str]:
    """Schedule six due jobs, start a holding worker; return the ids and the running one."""
    with DelayQ(url) as app:
        ids = [app.schedule("hold", {"n": n}, delay=0, job_id=f"job-{n}") for n in range(6)]
        workers.start(url, side, lease=lease, hold=hold)
        assert wait_until(lambda: any(x.startswith("start ") for x in lines(side)), DEADLINE)
        assert wait_until(lambda: app.stats().running == 4, DEADLINE), workers.logs()
    running = next(x.split()[1] for x in lines(side) if x.startswith("start "))
    return ids, running


def test_sigterm_hands_prefetched_jobs_back_at_once(tmp_path: Path, workers: Workers) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    side = tmp_path / "runs.txt"
    ids, running = hold_four(url, side, workers, lease=30.0)
    worker = workers.procs[0]
    with DelayQ(url) as app:
        held = [i for i, (state, _) in states(app, ids).items() if state is JobState.RUNNING]
        prefetched = sorted(set(held) - {running})
        assert len(prefetched) == 3
        worker.send_signal(signal.SIGTERM)
        # Handed back while the running handler still has its grace period (600 s).
        assert wait_until(lambda: app.stats().running == 1, DEADLINE), workers.logs()
        assert worker.poll() is None
        after = states(app, ids)
        assert [after[i] for i in prefetched] == [(JobState.SCHEDULED, 0)] * 3
        assert after[running] == (JobState.RUNNING, 1)
        for job_id in prefetched:
            job = app.get(job_id)
            assert job is not None and job.run_at <= job.created_at + 1  # still due
    assert [x for x in lines(side) if x.startswith("start ")] == [f"start {running} 1 {worker.pid}"]


def test_sigkill_loses_no_prefetched_job(tmp_path: Path, workers: Workers) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    side = tmp_path / "runs.txt"
    lease = 2.0
    ids, _ = hold_four(url, side, workers, lease=lease)
    first = workers.procs[0]
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    second = workers.start(url, side, lease=lease, hold=False)
    with DelayQ(url) as app:

        def all_done() -> bool:
            return all(state is JobState.SUCCEEDED for state, _ in states(app, ids).values())

        assert wait_until(all_done, DEADLINE), workers.logs()
        assert len(states(app, ids)) == 6
    starts = [x.split() for x in lines(side) if x.startswith("start ")]
    by_first = [job_id for _, job_id, _, pid in starts if pid == str(first.pid)]
    by_second = {job_id for _, job_id, _, pid in starts if pid == str(second.pid)}
    assert len(by_first) == 1  # the prefetched jobs never started in the killed worker
    assert by_second == set(ids)  # every job ran, the killed one's included


def test_a_paused_worker_does_not_start_prefetched_jobs_whose_lease_ran_out(
    tmp_path: Path, workers: Workers
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    side = tmp_path / "runs.txt"
    lease = 2.0
    # The first worker's running handler holds its slot for 3 s, then returns.
    ids, running = hold_four(url, side, workers, lease=lease, hold="hold-first:3")
    paused = workers.procs[0]
    paused.send_signal(signal.SIGSTOP)
    try:
        second = workers.start(url, side, lease=lease, hold=False)
        with DelayQ(url) as app:

            def all_done() -> bool:
                return all(state is JobState.SUCCEEDED for state, _ in states(app, ids).values())

            assert wait_until(all_done, DEADLINE), workers.logs()
    finally:
        paused.send_signal(signal.SIGCONT)
    # Resumed: its handler returns, and the prefetched claims (leases long gone) must
    # be handed back unstarted, not run a second time: by the lease check before a
    # handler starts, or as prefetched claims that waited too long behind a busy slot
    # (a hand-back the store then finds stale).
    log = tmp_path / "worker-0.log"

    def handed_back() -> bool:
        text = log.read_text()
        return "handing it back unstarted" in text or all(
            f"job {job_id} (hold): its lease expired before the result was recorded" in text
            for job_id in {f"job-{n}" for n in range(4)} - {running}  # claimed first (FIFO)
        )

    assert wait_until(handed_back, DEADLINE), workers.logs()
    starts = [x.split() for x in lines(side) if x.startswith("start ")]
    assert [(job_id, pid) for _, job_id, _, pid in starts if pid == str(paused.pid)] == [
        (running, str(paused.pid))
    ]
    assert {job_id for _, job_id, _, pid in starts if pid == str(second.pid)} == set(ids)
