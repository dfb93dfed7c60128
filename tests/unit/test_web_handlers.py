"""The per-handler table: store counts (grouped on SQLite, walked elsewhere) and
the worker counters' attempts, failure rate and lateness."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.observe.metrics import Metrics
from delayq.testing import FakeClock
from delayq.web import create_app
from delayq.worker import JobResult

BASE = "http://127.0.0.1"


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_each_handler_shows_its_backlog_dead_jobs_and_the_worker_counters(
    store: str, tmp_path: object
) -> None:
    clock = FakeClock(1_700_000_000.0)
    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path}/h.db"
    with DelayQ(url, clock=clock) as app:
        app.schedule("webhook.send", job_id="w1")
        (claim,) = app.backend.claim(limit=1, lease=30)
        app.backend.bury(claim, "ConnectionError: 503")
        for i in range(3):
            app.schedule("email.send", {"i": i}, delay=i)
        app.schedule("email.send", delay=600)
        clock.advance(30)
        metrics = Metrics()
        for outcome, lateness in (("succeeded", 0.0003), ("retried", 0.002), ("dead", 0.002)):
            metrics.on_result(JobResult("x", "webhook.send", 1, outcome, lateness, 0.01))  # type: ignore[arg-type]
        with TestClient(create_app(app, metrics=metrics), base_url=BASE) as client:
            rows = {r["name"]: r for r in client.get("/api/handlers").json()["handlers"]}
            html = client.get("/handlers").text
    email, hook = rows["email.send"], rows["webhook.send"]
    assert (email["scheduled"], email["due"], email["dead"]) == (4, 3, 0)
    assert email["oldest_overdue_age"] == pytest.approx(30)
    assert (hook["dead"], hook["started"]) == (1, 3)
    assert hook["failure_rate"] == pytest.approx(2 / 3)
    assert hook["p50"] == 0.0025 and hook["p99"] == 0.0025
    assert "waiting 30.0s" in html and "66.7%" in html
