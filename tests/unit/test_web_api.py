"""The dashboard's JSON API, security rules and pages, through Starlette's TestClient."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.errors import Unsupported
from delayq.job import Job, JobState
from delayq.observe.metrics import LatenessSeries, Metrics
from delayq.web import create_app, views
from delayq.web.security import Guard, is_loopback
from delayq.worker import JobResult

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"  # a Host the dashboard answers to
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[DelayQ]:
    with DelayQ(f"sqlite:///{tmp_path / 'web.db'}") as app:
        yield app


@pytest.fixture
def client(app: DelayQ) -> Iterator[TestClient]:
    with TestClient(
        create_app(app, token=TOKEN), base_url=BASE, raise_server_exceptions=False
    ) as client:
        yield client


def bury(app: DelayQ, job_id: str, error: str) -> None:
    (claim,) = [c for c in app.backend.claim(limit=100, lease=30) if c.job.id == job_id]
    app.backend.bury(claim, error)


def login(client: TestClient) -> str:
    """Open the login link; returns the CSRF value the pages embed."""
    response = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    return Guard(TOKEN).csrf


def test_overview_counts_states_and_names_the_oldest_overdue_job(
    app: DelayQ, client: TestClient
) -> None:
    app.schedule("mail", job_id="now-1")
    app.schedule("mail", delay=3600, job_id="later")
    data = client.get("/api/overview").json()
    assert data["counts"]["scheduled"] == 2
    assert data["due_now"] == 1
    assert data["oldest_overdue"]["id"] == "now-1"
    assert data["next_due"] is not None and data["lateness"] == []
    assert data["lateness_source"] is None  # a dashboard on its own has no lateness samples


def test_jobs_filter_by_state_and_name_and_page_with_a_cursor(
    app: DelayQ, client: TestClient
) -> None:
    app.schedule_many(
        [{"name": "mail" if i % 3 else "sms", "delay": i, "job_id": f"j{i:02}"} for i in range(20)]
    )
    app.cancel("j01")
    seen: list[str] = []
    query: dict[str, object] = {"state": "scheduled", "name": "mail", "limit": 4}
    pages = 0
    while True:
        body = client.get("/api/jobs", params=query).json()
        seen.extend(j["id"] for j in body["jobs"])
        pages += 1
        if body["next"] is None:
            break
        query.update(body["next"])
    expected = [f"j{i:02}" for i in range(20) if i % 3 and i != 1]
    assert seen == expected
    assert pages == 3  # 12 jobs, 4 a page: the third page knows it is the last


def test_bad_filters_are_400_with_the_reason(client: TestClient) -> None:
    response = client.get("/api/jobs", params={"state": "lost"})
    assert response.status_code == 400 and "state must be one of" in response.json()["error"]
    response = client.get("/api/jobs", params={"due_after": "yesterday"})
    assert response.status_code == 400 and "due_after" in response.json()["error"]


def test_an_action_without_the_token_is_refused_and_changes_nothing(
    app: DelayQ, client: TestClient
) -> None:
    job_id = app.schedule("mail", delay=60)
    response = client.post(f"/api/jobs/{job_id}/cancel")
    assert response.status_code == 401
    response = client.post(f"/api/jobs/{job_id}/cancel", headers={"Authorization": "Bearer no"})
    assert response.status_code == 401
    job = app.get(job_id)
    assert job is not None and job.state.value == "scheduled"


def test_cancel_gives_the_clis_definite_outcomes(app: DelayQ, client: TestClient) -> None:
    job_id = app.schedule("mail", delay=60)
    first = client.post(f"/api/jobs/{job_id}/cancel", headers=AUTH)
    assert first.status_code == 200 and first.json() == {"id": job_id, "outcome": "cancelled"}
    again = client.post(f"/api/jobs/{job_id}/cancel", headers=AUTH)
    assert again.json()["outcome"] == "finished"
    missing = client.post("/api/jobs/nope/cancel", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["outcome"] == "not_found"


def test_reschedule_takes_a_delay_or_a_time_but_not_both(app: DelayQ, client: TestClient) -> None:
    job_id = app.schedule("mail", delay=60)
    ok = client.post(f"/api/jobs/{job_id}/reschedule", headers=AUTH, json={"delay": "2h"})
    assert ok.json()["outcome"] == "rescheduled"
    job = app.get(job_id)
    assert job is not None and job.run_at > app.clock.time() + 7000
    both = client.post(f"/api/jobs/{job_id}/reschedule", headers=AUTH, json={"delay": 1, "at": 2})
    assert both.status_code == 400 and "exactly one" in both.json()["error"]
    odd = client.post(f"/api/jobs/{job_id}/reschedule", headers=AUTH, json={"when": 1})
    assert odd.status_code == 400 and "unknown field" in odd.json()["error"]


def test_requeue_and_purge_dead_letters(app: DelayQ, client: TestClient) -> None:
    for job_id in ("d1", "d2", "d3"):
        app.schedule("mail", job_id=job_id)
        bury(app, job_id, "boom")
    assert [j["id"] for j in client.get("/api/dead").json()["jobs"]] == ["d3", "d2", "d1"]
    requeued = client.post("/api/jobs/d1/requeue", headers=AUTH)
    assert requeued.json()["outcome"] == "requeued"
    assert client.post("/api/jobs/d1/requeue", headers=AUTH).json()["outcome"] == "not_dead"
    purged = client.post("/api/dead/purge", headers=AUTH, json={"ids": ["d2"]})
    assert purged.json() == {"purged": 1}
    assert client.post("/api/dead/purge", headers=AUTH, json={}).status_code == 400
    assert client.post("/api/dead/purge", headers=AUTH, json={"all": True}).json() == {"purged": 1}


def test_a_cookie_session_acts_only_with_the_csrf_value_from_this_origin(
    app: DelayQ, client: TestClient
) -> None:
    job_id = app.schedule("mail", delay=60)
    csrf = login(client)
    assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 403  # cookie, no CSRF
    wrong = client.post(f"/api/jobs/{job_id}/cancel", headers={"X-CSRF-Token": "guess"})
    assert wrong.status_code == 403
    foreign = client.post(
        f"/api/jobs/{job_id}/cancel",
        headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"},
    )
    assert foreign.status_code == 403
    form = client.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf}, follow_redirects=False)
    assert form.status_code == 303 and form.headers["location"].endswith("?done=cancelled")


def test_a_wrong_login_token_is_refused(client: TestClient) -> None:
    response = client.get("/?token=nope", follow_redirects=False)
    assert response.status_code == 401 and "delayq_session" not in response.headers.get(
        "set-cookie", ""
    )


def test_reads_need_the_token_when_required(app: DelayQ) -> None:
    web = create_app(app, token=TOKEN, require_token_for_reads=True)
    with TestClient(web, base_url=BASE) as client:
        assert client.get("/").status_code == 401
        assert client.get("/api/jobs").status_code == 401
        assert client.get("/api/jobs", headers=AUTH).status_code == 200
        login(client)
        assert client.get("/jobs").status_code == 200


def test_payloads_and_errors_are_escaped_in_pages(app: DelayQ, client: TestClient) -> None:
    app.schedule("mail", {"html": "<script>alert(1)</script>"}, job_id="x<b>")
    bury(app, "x<b>", "<img src=x onerror=alert(2)>")
    page = client.get("/jobs/x%3Cb%3E").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "<b>" not in page
    csp = client.get("/").headers["content-security-policy"]
    assert "script-src 'self';" in csp and "unsafe-inline" not in csp.split("style-src")[0]
    assert "default-src 'none'" in csp


def test_an_internal_error_shows_no_traceback(
    app: DelayQ, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("secret internals at /srv/app.py line 3")

    monkeypatch.setattr(app, "stats", broken)
    for path in ("/", "/api/overview"):
        response = client.get(path)
        assert response.status_code == 500
        assert "secret internals" not in response.text and "Traceback" not in response.text


def test_openapi_describes_every_api_route(client: TestClient) -> None:
    spec = client.get("/api/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    for path in ("/api/jobs", "/api/jobs/{job_id}/cancel", "/api/dead/purge", "/metrics"):
        assert path in spec["paths"]


def test_metrics_serves_store_gauges_and_this_processs_counters(app: DelayQ) -> None:
    metrics = Metrics()
    metrics.on_result(JobResult("a", "mail", 1, "succeeded", 0.004, 0.1))
    app.schedule("mail")
    with TestClient(create_app(app, token=TOKEN, metrics=metrics), base_url=BASE) as client:
        text = client.get("/metrics").text
    assert "delayq_store_up 1.0" in text
    assert 'delayq_jobs{state="scheduled"} 1.0' in text
    assert 'delayq_jobs_succeeded_total{name="mail"} 1.0' in text


def test_a_series_from_the_workers_process_draws_the_chart(app: DelayQ) -> None:
    series = LatenessSeries()
    for lateness in (0.002, 0.004, 1.5):
        series.add(lateness)
    with TestClient(create_app(app, token=TOKEN, series=series), base_url=BASE) as client:
        page = client.get("/").text
        data = client.get("/api/overview").json()
    assert "<svg" in page and "this process&#39;s worker" in page
    assert data["lateness"][0]["count"] == 3 and data["lateness"][0]["p99"] == 2.5
    assert data["throughput_per_minute"] == pytest.approx(18.0)  # 3 in one 10 s slot


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


class _OldStore(MemoryBackend):
    """A store whose list_jobs predates the name filter and the cursor."""

    def list_jobs(  # type: ignore[override]
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
    ) -> list[Job]:
        return super().list_jobs(
            state=state, due_after=due_after, due_before=due_before, limit=limit
        )


@pytest.mark.parametrize("scan", [3, 2000])
def test_a_store_without_cursor_support_is_paged_by_bounded_reads(
    scan: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "SCAN_LIMIT", scan)
    with DelayQ(backend=_OldStore()) as app:
        # ties at one due time, and a name filter that skips most jobs
        app.schedule_many(
            [
                {"name": "mail" if i % 3 == 0 else "sms", "at": 2e9 + i // 4, "job_id": f"j{i:02}"}
                for i in range(20)
            ]
        )
        with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
            seen: list[str] = []
            query: dict[str, object] = {"name": "mail", "limit": 2}
            for _ in range(50):
                body = client.get("/api/jobs", params=query).json()
                seen.extend(j["id"] for j in body["jobs"])
                if body["next"] is None:
                    break
                query.update(body["next"])
    assert seen == [f"j{i:02}" for i in range(20) if i % 3 == 0]


_WORKER_CHILD = """
import sys
from delayq.observe.metrics import Metrics
from delayq.worker import JobResult
m = Metrics()
for i in range(int(sys.argv[1])):
    m.on_result(JobResult(str(i), "mail", 1, "succeeded", float(sys.argv[2]), 0.01))
"""


@pytest.mark.slow
def test_a_separate_dashboard_charts_what_the_hosts_workers_wrote_since_it_started(
    app: DelayQ, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "prom"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))

    def worker_process(count: int, lateness: float) -> None:
        subprocess.run(
            [sys.executable, "-c", _WORKER_CHILD, str(count), str(lateness)],
            check=True,
            timeout=60,
        )

    worker_process(3, 0.003)  # before the dashboard started: not dated, not charted
    web = create_app(app, token=TOKEN)
    dash = web.state.dashboard
    dash.sample()
    assert dash.series.points() == []
    worker_process(2, 50.0)
    dash.sample()
    (point,) = dash.series.points()
    assert point.count == 2 and point.p50 == 60.0
    with TestClient(web, base_url=BASE) as client:
        data = client.get("/api/overview").json()
    assert str(directory) in data["lateness_source"]
    assert data["lateness"][0]["count"] >= 2


def test_page_forms_reschedule_requeue_and_purge_with_the_csrf_value(
    app: DelayQ, client: TestClient
) -> None:
    csrf = login(client)
    job_id = app.schedule("mail", delay=60)
    moved = client.post(
        f"/jobs/{job_id}/reschedule", data={"csrf": csrf, "delay": "3h"}, follow_redirects=False
    )
    assert moved.headers["location"].endswith("?done=rescheduled")
    job = app.get(job_id)
    assert job is not None and job.run_at > app.clock.time() + 3 * 3600 - 60
    both = client.post(f"/jobs/{job_id}/reschedule", data={"csrf": csrf, "delay": "1m", "at": "1"})
    assert both.status_code == 400 and "exactly one" in both.text
    for dead_id in ("d1", "d2"):
        app.schedule("mail", job_id=dead_id)
        bury(app, dead_id, "boom")
    back = client.post(
        "/jobs/d1/requeue", data={"csrf": csrf, "back": "dead"}, follow_redirects=False
    )
    assert back.headers["location"] == "/dead?done=d1%3A+requeued"
    purged = client.post("/dead/purge", data={"csrf": csrf, "id": "d2"})
    assert purged.status_code == 200 and "purged 1 dead job(s)" in purged.text
    assert client.post("/dead/purge", data={"csrf": csrf}).status_code == 400
    assert client.post("/dead/purge", data={"id": "d1"}).status_code == 403


def test_a_store_that_cannot_list_says_so_with_501(monkeypatch: pytest.MonkeyPatch) -> None:
    with DelayQ("memory://") as app:

        def cannot(*args: object, **kwargs: object) -> None:
            raise Unsupported("this store keeps no record of a job outside its message")

        monkeypatch.setattr(app, "stats", cannot)
        with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
            page = client.get("/")
            api = client.get("/api/overview")
    assert page.status_code == 501 and "keeps no record" in page.text
    assert api.status_code == 501 and "keeps no record" in api.json()["error"]


def test_a_kept_result_shows_on_the_job_page_and_in_its_api_twin(
    app: DelayQ, client: TestClient
) -> None:
    from delayq.backends.base import Completion  # noqa: PLC0415

    job_id = app.schedule("report", {"day": 1})
    (claim,) = app.backend.claim(limit=1, lease=30)
    app.backend.complete([Completion.ack(claim, result='{"rows": 3, "note": "<b>"}')])
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert '<pre id="result">' in page.text and "&lt;b&gt;" in page.text  # escaped
    assert client.get(f"/api/jobs/{job_id}").json()["result"] == {"rows": 3, "note": "<b>"}
    plain = app.schedule("report", {"day": 2}, delay=60)
    assert 'id="result"' not in client.get(f"/jobs/{plain}").text
