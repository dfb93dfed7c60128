"""A worker's dashboard runs in a child process of its own: it starts, serves the
worker's store, shows what the worker relays, and ends with the worker (even a
worker killed outright)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from delayq.app import DelayQ
from delayq.cli.worker import WorkerOps
from delayq.observe.metrics import LatenessSeries
from tests._util import wait_until
from tests.unit._web_app import TARGET

pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie not yet reaped counts as exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


def test_the_dashboard_is_served_by_a_child_that_loads_the_app_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYQ_WEB_TOKEN", "t0ken")
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with DelayQ(url) as app:
        app.schedule("mail", {"to": "a@example.com"}, delay=60, job_id="seen-by-the-child")
        ops = WorkerOps(app, web_port=0, app_target=TARGET, store_url=url)
        ops.start()
        try:
            assert ops.web_url is not None and ops._web is not None
            pid = ops._web.pid
            assert pid is not None and pid != os.getpid()
            jobs = json.loads(_read(ops.web_url + "api/jobs"))
            assert [j["id"] for j in jobs["jobs"]] == ["seen-by-the-child"]
        finally:
            ops.close()
        assert _gone(pid)


def test_the_dashboards_process_ends_when_the_worker_closes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with DelayQ(url) as app:
        ops = WorkerOps(app, web_port=0, store_url=url)
        ops.start()
        assert ops._web is not None and ops.web_url is not None
        pid = ops._web.pid
        assert pid is not None
        _read(ops.web_url + "api/overview")
        ops.close()
        assert _gone(pid)
        ops.close()  # idempotent


def test_the_dashboards_process_ignores_a_ctrl_c_meant_for_the_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with DelayQ(url) as app:
        ops = WorkerOps(app, web_port=0, store_url=url)
        ops.start()
        try:
            assert ops._web is not None and ops._web.pid is not None and ops.web_url
            os.kill(ops._web.pid, signal.SIGINT)  # the worker drains; its dashboard stays up
            assert json.loads(_read(ops.web_url + "api/overview"))["counts"]["scheduled"] == 0
            assert not _gone(ops._web.pid)
        finally:
            ops.close()


def test_a_child_that_cannot_load_the_app_leaves_the_worker_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with DelayQ(url) as app:
        ops = WorkerOps(app, web_port=0, app_target="tests.unit.no_such_module:app")
        with caplog.at_level("WARNING", logger="delayq.worker"):
            ops.start()  # no error
        try:
            assert ops.web_url is None
            assert "cannot import 'tests.unit.no_such_module'" in caplog.text
            assert "runs without it" in caplog.text
        finally:
            ops.close()


def test_an_app_of_a_memory_store_gets_no_dashboard_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with DelayQ("memory://") as app:
        ops = WorkerOps(app, web_port=0)
        with caplog.at_level("WARNING", logger="delayq.worker"):
            ops.start()
        try:
            assert ops.web_url is None
            assert "memory:// store" in caplog.text
        finally:
            ops.close()


def test_the_dashboards_process_ends_when_its_worker_is_killed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    script = textwrap.dedent(
        f"""
        import sys, time
        from delayq.app import DelayQ
        from delayq.cli.worker import WorkerOps
        app = DelayQ({url!r})
        ops = WorkerOps(app, web_port=0, store_url={url!r})
        ops.start()
        print(ops._web.pid, flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "DELAYQ_WEB_TOKEN": "t0ken"}
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    ) as worker:
        try:
            assert worker.stdout is not None
            child = int(worker.stdout.readline())
            assert not _gone(child)
            worker.kill()  # SIGKILL: no close(), no stop message
            worker.wait(30)
            assert wait_until(lambda: _gone(child), timeout=30)
        finally:
            worker.kill()


def test_a_series_takes_the_slots_another_series_relays() -> None:
    worker = LatenessSeries(slot_seconds=10)
    shown = LatenessSeries(slot_seconds=10)
    worker.add(0.002, at=100.0)
    shown.merge(worker.recent())
    worker.add(0.002, at=105.0)  # the same slot again: replaced, not added twice
    worker.add(0.3, at=112.0)  # a new slot
    shown.merge(worker.recent())
    assert [(p.start, p.count) for p in shown.points()] == [(100.0, 2), (110.0, 1)]
    assert [p.p99 for p in shown.points()] == [p.p99 for p in worker.points()]


@pytest.mark.slow
def test_delayq_worker_web_port_serves_from_a_child_that_stops_with_the_worker(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with DelayQ(url) as app:
        app.schedule("mail", {"n": 1}, delay=600, job_id="waiting")
    env = {**os.environ, "DELAYQ_WEB_TOKEN": "t0ken", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "delayq", "--url", url, "worker", TARGET, "--web-port", "0"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env) as worker:
        try:
            assert worker.stderr is not None
            seen = ""
            while "dashboard on " not in seen:
                line = worker.stderr.readline()
                assert line, f"the worker exited: {seen}"
                seen += line
            served = seen.split("dashboard on ", 1)[1].split()[0]
            child = int(seen.split("(process ", 1)[1].split(")")[0])
            assert child != worker.pid
            jobs = json.loads(_read(served + "api/jobs"))
            assert [j["id"] for j in jobs["jobs"]] == ["waiting"]
            worker.send_signal(signal.SIGINT)  # a graceful stop: the dashboard goes with it
            assert worker.wait(60) == 0
            assert wait_until(lambda: _gone(child), timeout=30)
        finally:
            worker.kill()
            assert worker.stderr is not None
            worker.stderr.close()
