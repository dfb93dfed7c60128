"""The dashboard's recurring schedules (list, a page per schedule, the API twin),
through Starlette's TestClient on a fake clock."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import ClassVar
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.job import JobState
from delayq.recurring import TICK_HANDLER, occurrence_id
from delayq.testing import FakeClock
from delayq.web import create_app
from delayq.web.security import Guard
from tests.recurring_support import LEASE, context, drive

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"  # a Host the dashboard answers to
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def app(clock: FakeClock) -> Iterator[DelayQ]:
    with DelayQ("memory://", clock=clock, rng=random.Random(3)) as app:
        yield app


@pytest.fixture
def client(app: DelayQ) -> Iterator[TestClient]:
    with TestClient(
        create_app(app, token=TOKEN), base_url=BASE, raise_server_exceptions=False
    ) as client:
        yield client


def login(client: TestClient) -> str:
    """Open the login link; returns the CSRF value the pages embed."""
    assert client.get(f"/?token={TOKEN}", follow_redirects=False).status_code == 303
    return Guard(TOKEN).csrf


def fail_next(app: DelayQ, clock: FakeClock, error: str) -> None:
    """Run the ticks due now and bury the first occurrence claimed with ``error``."""
    for claim in app.backend.claim(limit=10, lease=LEASE, now=clock.time()):
        if claim.job.name == TICK_HANDLER:
            handler = app.get_handler(TICK_HANDLER)
            assert handler is not None
            handler.call(claim.job.payload, context(claim))
            app.backend.ack(claim)
        else:
            app.backend.bury(claim, error)


def test_the_list_shows_each_schedule_with_its_timing_next_run_and_last_run(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.recurring("report.daily", cron="0 3 * * *", tz="Europe/Berlin", handler="report")
    app.recurring("cache.warm", every=60, handler="warm")
    drive(app, clock, T0 + 150)  # cache.warm ran at +60 and +120
    app.pause_recurring("cache.warm")
    page = client.get("/recurring")
    assert page.status_code == 200
    html = page.text
    assert 'data-name="report.daily"' in html and 'data-name="cache.warm"' in html
    assert "cron 0 3 * * * (Europe/Berlin)" in html and "every 60s" in html
    assert "2026-01-01 03:00:00 CET" in html  # the next run, in the schedule's zone
    assert "2026-01-01 00:02:00 UTC" in html  # cache.warm's last run
    assert "state-paused" in html and "state-active" in html
    assert 'href="/recurring/report.daily"' in html


def test_a_schedules_page_shows_next_runs_last_run_and_recent_occurrences(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.recurring("beat", every=10, handler="h", payload={"to": "ops"})
    drive(app, clock, T0 + 25)  # +10 and +20 ran
    clock.advance(T0 + 29.5 - clock.time())  # the tick of +30, then the occurrence fails
    fail_next(app, clock, "tick")
    clock.advance(0.5)
    fail_next(app, clock, "ValueError: upstream said <no>")
    page = client.get("/recurring/beat", params={"runs": "3"})
    assert page.status_code == 200
    html = page.text
    assert html.count('class="next-run"') == 3
    upcoming = html.split('id="next-runs"', 1)[1].split("</table>", 1)[0]
    for text in ("00:00:40 UTC", "00:00:50 UTC", "00:01:00 UTC"):
        assert f"2026-01-01 {text}" in upcoming
    last = html.split('id="last-run"', 1)[1].split("</p>", 1)[0]
    assert occurrence_id("beat", T0 + 30) in last and "dead" in last
    assert "ValueError: upstream said &lt;no&gt;" in last  # escaped
    history = html.split('id="history"', 1)[1]
    rows = [occurrence_id("beat", T0 + t) for t in (30, 20, 10)]
    assert [history.index(f'data-id="{r}"') for r in rows] == sorted(
        history.index(f'data-id="{r}"') for r in rows
    )  # newest first
    assert history.count("state-succeeded") == 2
    assert "&#34;to&#34;: &#34;ops&#34;" in html.split('id="payload"', 1)[1]


def test_occurrences_without_a_job_say_why(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.recurring("beat", every=10, handler="h")
    drive(app, clock, T0 + 25)
    app.pause_recurring("beat")
    clock.advance(20)  # +30 and +40 fall into the pause
    history = client.get("/recurring/beat").text.split('id="history"', 1)[1]
    assert history.count("paused: not run") == 2
    assert history.count("state-succeeded") == 2


def test_an_unknown_schedule_is_a_404_page(client: TestClient) -> None:
    page = client.get("/recurring/nope")
    assert page.status_code == 404 and 'id="not-found"' in page.text
    assert client.get("/recurring/nope", params={"runs": "x"}).status_code == 400


def test_run_now_pause_and_resume_from_the_page(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.recurring("beat", every=3600, handler="h", payload={"n": 1})
    anonymous = client.get("/recurring/beat").text
    assert 'id="run-now"' not in anonymous  # no token: no action forms
    assert client.post("/recurring/beat/run", data={"csrf": "x"}).status_code == 401
    csrf = login(client)
    page = client.get("/recurring/beat").text
    assert 'id="run-now"' in page and 'id="pause"' in page and 'id="resume"' not in page
    assert client.post("/recurring/beat/run", data={"csrf": ""}).status_code == 403
    ran = client.post("/recurring/beat/run", data={"csrf": csrf}, follow_redirects=False)
    assert ran.status_code == 303
    job_id = occurrence_id("beat", clock.time())
    assert ran.headers["location"] == "/recurring/beat?" + urlencode(
        {"done": "enqueued", "job": job_id}
    )
    job = app.get(job_id)
    assert job is not None and job.state is JobState.SCHEDULED and job.payload == {"n": 1}
    shown = client.get(ran.headers["location"]).text
    assert "Outcome: <strong>enqueued</strong>" in shown and f'id="outcome-job">{job_id}<' in shown
    paused = client.post("/recurring/beat/pause", data={"csrf": csrf}, follow_redirects=False)
    assert paused.headers["location"] == "/recurring/beat?done=paused"
    schedule = app.get_recurring("beat")
    assert schedule is not None and schedule.paused
    page = client.get("/recurring/beat").text
    assert 'id="resume"' in page and 'id="pause"' not in page and "None while paused." in page
    client.post("/recurring/beat/resume", data={"csrf": csrf})
    schedule = app.get_recurring("beat")
    assert schedule is not None and not schedule.paused
    gone = client.post("/recurring/nope/pause", data={"csrf": csrf}, follow_redirects=False)
    assert gone.headers["location"] == "/recurring/nope?done=not_found"
    assert client.post("/recurring/beat/explode", data={"csrf": csrf}).status_code == 404


def test_the_api_twin_answers_the_same_as_the_page(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.recurring("beat", every=10, handler="h")
    drive(app, clock, T0 + 25)
    listed = client.get("/api/recurring").json()["schedules"]
    assert [s["name"] for s in listed] == ["beat"]
    assert listed[0]["state"] == "active" and listed[0]["next_runs"] == [T0 + 30]
    one = client.get("/api/recurring/beat", params={"runs": "2", "history": "2"}).json()
    assert one["next_runs"] == [T0 + 30, T0 + 40]
    assert one["next_runs_iso"][0] == "2026-01-01T00:00:30.000+00:00"
    assert [o["job_id"] for o in one["history"]] == [
        occurrence_id("beat", T0 + 20),
        occurrence_id("beat", T0 + 10),
    ]
    assert one["last_run"]["state"] == "succeeded"
    assert client.get("/api/recurring/nope").status_code == 404
    assert client.post("/api/recurring/beat/pause").status_code == 401
    paused = client.post("/api/recurring/beat/pause", headers=AUTH)
    assert paused.json() == {"name": "beat", "outcome": "paused"}
    assert client.get("/api/recurring/beat").json()["state"] == "paused"
    ran = client.post("/api/recurring/beat/run", headers=AUTH).json()
    assert ran["outcome"] == "enqueued" and app.get(ran["id"]) is not None
    resumed = client.post("/api/recurring/beat/resume", headers=AUTH)
    assert resumed.json()["outcome"] == "resumed"
    missing = client.post("/api/recurring/nope/run", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["outcome"] == "not_found"
    spec = client.get("/api/openapi.json").json()["paths"]
    for path in ("/api/recurring", "/api/recurring/{name}", "/api/recurring/{name}/run"):
        assert path in spec


def test_the_jobs_page_hides_tick_jobs_unless_asked(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.recurring("beat", every=10, handler="h")
    drive(app, clock, T0 + 25)
    shown = client.get("/jobs").text
    assert f">{occurrence_id('beat', T0 + 20)}<" in shown
    assert "delayq.recurring:beat@" not in shown
    asked = client.get("/jobs", params={"ticks": "1"}).text
    assert "delayq.recurring:beat@" in asked and 'id="f-ticks" checked' in asked


class _NoSchedules(MemoryBackend):
    """A store that does not declare the 'recurring' feature (as RabbitMQ)."""

    features: ClassVar[frozenset[str]] = frozenset({"clock"})


def test_a_store_without_schedules_says_so(clock: FakeClock) -> None:
    with (
        DelayQ(backend=_NoSchedules(clock=clock), clock=clock) as app,
        TestClient(
            create_app(app, token=TOKEN), base_url=BASE, raise_server_exceptions=False
        ) as client,
    ):
        page = client.get("/recurring")
        assert page.status_code == 501 and "recurring" in page.text
        assert client.get("/recurring/x").status_code == 501
        assert client.get("/api/recurring").status_code == 501
        assert client.post("/api/recurring/x/run", headers=AUTH).status_code == 501
