"""The dashboard answers the on-call questions: why did it fail, is anything
stuck, is it healthy now. Failures come from a real worker run, so the text
checked is what the worker really stores (a whole traceback)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.observe.logs import JOB_FIELD, result_logger
from delayq.observe.metrics import SeriesPoint
from delayq.testing import FakeClock
from delayq.web import create_app
from delayq.web.charts import lateness_svg
from tests.unit._worker_harness import Harness

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"
ERROR = "ConnectionError: 503 from https://hooks.example.com/0"


def _fail(payload: object) -> None:
    raise ConnectionError("503 from https://hooks.example.com/0")


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.app.register("webhook.send", _fail)
    yield harness
    harness.stop()


@pytest.fixture
def client(h: Harness) -> Iterator[TestClient]:
    with TestClient(create_app(h.app, token=TOKEN), base_url=BASE) as client:
        yield client


def _bury_one(h: Harness) -> str:
    job_id = h.app.schedule("webhook.send", {"to": "x"}, max_attempts=1)
    h.start()
    result = h.next_result()
    assert result.outcome == "dead"
    stored = h.job(job_id).last_error
    assert stored.startswith("Traceback (most recent call last):")  # what the worker stores
    return job_id


def test_lists_and_dead_letters_show_the_exception_not_the_tracebacks_first_line(
    h: Harness, client: TestClient
) -> None:
    job_id = _bury_one(h)
    (row,) = client.get("/api/jobs", params={"state": "dead"}).json()["jobs"]
    assert row["error_summary"] == ERROR
    assert client.get("/api/dead").json()["jobs"][0]["error_summary"] == ERROR
    for page in ("/dead", "/jobs?state=dead"):
        html = client.get(page).text
        assert ERROR in html
        assert "Traceback (most recent call last)" not in html
    detail = client.get(f"/jobs/{job_id}").text
    assert "Traceback (most recent call last)" in detail and ERROR in detail


def test_the_json_logs_error_field_is_the_exception(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.app.schedule("webhook.send", {"to": "x"}, max_attempts=2, backoff=[60])
    h.start()
    result = h.next_result()
    assert result.outcome == "retried"
    logger = logging.getLogger("delayq.test.jobs")
    with caplog.at_level(logging.INFO, logger="delayq.test.jobs"):
        result_logger(logger)(result)
    # only this logger's: the worker still running may log meanwhile (its own loggers)
    (record,) = [r for r in caplog.records if r.name == "delayq.test.jobs"]
    assert getattr(record, JOB_FIELD)["error"] == ERROR


def test_a_retrying_job_is_counted_and_filtered_apart_from_scheduled(
    h: Harness, client: TestClient
) -> None:
    retrying = h.app.schedule("webhook.send", max_attempts=3, backoff=[3600])
    h.start()
    assert h.next_result().outcome == "retried"
    h.stop()
    h.app.schedule("webhook.send", delay=60, job_id="fresh")
    data = client.get("/api/overview").json()
    assert data["counts"]["scheduled"] == 2
    rows = client.get("/api/jobs", params={"state": "retrying"}).json()["jobs"]
    assert [r["id"] for r in rows] == [retrying] and rows[0]["retrying"] is True
    assert "retrying" in client.get("/jobs?state=retrying").text


def test_a_running_job_whose_lease_expired_is_flagged_as_stuck() -> None:
    clock = FakeClock(1_700_000_000.0)
    with DelayQ("memory://", clock=clock) as app:
        app.schedule("report.build", job_id="stuck")
        assert len(app.backend.claim(limit=1, lease=30)) == 1  # its worker then dies
        clock.advance(70)
        with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
            data = client.get("/api/overview").json()
            assert data["expired_leases"] == 1
            assert data["oldest_expired_lease"]["id"] == "stuck"
            assert data["oldest_expired_lease"]["expired_for"] == pytest.approx(40)
            (row,) = client.get("/api/jobs", params={"state": "running"}).json()["jobs"]
            assert row["lease_expired_for"] == pytest.approx(40)
            assert "lease expired 40.0s ago, due again" in client.get("/jobs?state=running").text
            assert "lease expired 40.0s ago" in client.get("/jobs/stuck").text
            assert "lease expired 40.0s ago" in client.get("/").text


def test_lists_carry_a_bounded_payload_preview_and_the_job_api_the_whole_payload(
    h: Harness, client: TestClient
) -> None:
    big = {"blob": "x" * 100_000}
    h.app.schedule("report.build", big, delay=60, job_id="fat")
    (row,) = client.get("/api/jobs").json()["jobs"]
    assert "payload" not in row and len(row["payload_preview"]) <= 200
    assert row["payload_chars"] > 100_000
    assert len(client.get("/api/jobs").content) < 2_000
    assert len(client.get("/jobs").content) < 20_000
    assert client.get("/api/jobs/fat").json()["payload"] == big


def test_the_lateness_charts_now_is_the_current_time_and_idle_slots_are_gaps() -> None:
    now = 1_700_000_000.0
    slot = 10.0
    # two bursts 25 minutes ago, five minutes apart; nothing since
    points = [
        SeriesPoint(start=now - 1800 + i * slot, count=5, p50=0.001, p99=0.01) for i in range(3)
    ] + [SeriesPoint(start=now - 1500 + i * slot, count=5, p50=0.001, p99=0.01) for i in range(3)]
    svg = lateness_svg(points, slot_seconds=slot, now=now)
    assert svg.count('class="p99"') == 2  # one line per burst: the idle gap is not drawn
    right_edge = 720 - 8
    xs = [
        float(pair.split(",")[0])
        for line in svg.split("<polyline")[1:]
        for pair in line.split('points="')[1].split('"')[0].split()
    ]
    assert max(xs) < right_edge * 0.3  # 25-minute-old data sits far left of "now"
    assert ">now</text>" in svg
