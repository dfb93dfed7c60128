"""examples/django_app runs: settings-based config, on_commit scheduling in its
views, ``manage.py delayq_worker --once`` and the long-running worker (real
processes, deadlines)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests._util import wait_until

pytest.importorskip("django", reason="the django extra is not installed")

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_app"
DEADLINE = 60.0  # real seconds; reached only when something is broken

pytestmark = pytest.mark.slow  # starts Django processes


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
        "DELAYQ_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
        "SHOP_DB": str(tmp_path / "shop.sqlite3"),
        "ORDER_CANCEL_AFTER": "0",
    }


def manage(env: dict[str, str], *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def client(env: dict[str, str], calls: str) -> list[dict[str, object]]:
    """Run ``calls`` (lines of ``post(path)`` / ``get(path)``) in the project's test client."""
    code = (
        textwrap.dedent(
            """
        import json
        from django.test import Client
        c = Client()
        out = []
        post = lambda p: out.append(c.post(p).json())
        get = lambda p: out.append(c.get(p).json())
        """
        )
        + textwrap.dedent(calls)
        + "\nprint(json.dumps(out))\n"
    )
    lines = manage(env, "shell", "-c", code).strip().splitlines()
    return list(json.loads(lines[-1]))


def test_a_job_is_stored_on_commit_only_and_run_by_delayq_worker_once(
    env: dict[str, str],
) -> None:
    placed, refused, stored, gone = client(
        env,
        """
        post("/orders/7")
        post("/orders/8?fail=1")
        get("/jobs/cancel-order-7")
        get("/jobs/cancel-order-8")
        """,
    )
    assert placed == {"job": "cancel-order-7", "placed": True}
    assert refused == {"job": "cancel-order-8", "placed": False}
    assert stored["state"] == "scheduled"
    assert gone["state"] is None  # its transaction rolled back: never stored
    out = manage(env, "delayq_worker", "--once")
    assert "cancel-order-7 order.cancel attempt 1: succeeded" in out and "1 job(s) run" in out
    [done] = client(env, 'get("/jobs/cancel-order-7")')
    assert done == {"job": "cancel-order-7", "state": "succeeded", "result": "cancelled order 7"}


def test_the_worker_command_runs_jobs_until_it_is_stopped(env: dict[str, str]) -> None:
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "delayq_worker", "--concurrency", "1"],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client(env, 'post("/orders/9")')
        seen: dict[str, Any] = {}

        def succeeded() -> bool:
            [job] = client(env, 'get("/jobs/cancel-order-9")')
            seen.update(job)
            return bool(job["state"] == "succeeded")

        assert wait_until(succeeded, DEADLINE, 0.2), seen
        assert seen["result"] == "cancelled order 9"
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=DEADLINE)
    assert worker.returncode == 0, out
    assert "handlers ['order.cancel']" in out
