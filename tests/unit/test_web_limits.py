"""The dashboard's flow-control limits page and API, and what a job page says of
its key (throttled until, priority, group, keyed counters), through TestClient."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.testing import FakeClock
from delayq.web import create_app
from delayq.web.security import Guard

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> Iterator[DelayQ]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'l.db'}"
    with DelayQ(url, clock=clock, rng=random.Random(3)) as app:
        yield app


@pytest.fixture
def client(app: DelayQ) -> Iterator[TestClient]:
    with TestClient(
        create_app(app, token=TOKEN), base_url=BASE, raise_server_exceptions=False
    ) as client:
        yield client


def login(client: TestClient) -> str:
    assert client.get(f"/?token={TOKEN}", follow_redirects=False).status_code == 303
    return Guard(TOKEN).csrf


def test_the_page_lists_sets_and_removes_limits_with_the_csrf_value(
    app: DelayQ, client: TestClient
) -> None:
    app.limit("tenant:*", concurrency=2)
    page = client.get("/limits").text
    assert 'data-pattern="tenant:*"' in page and "set-limit" not in page  # read-only
    form = {"pattern": "stripe:*", "rate": "100/s", "burst": "20", "concurrency": ""}
    assert client.post("/limits", data={**form, "csrf": "x"}).status_code == 401
    csrf = login(client)
    assert client.post("/limits", data={**form, "csrf": ""}).status_code == 403
    done = client.post("/limits", data={**form, "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and "done=set" in done.headers["location"]
    (stripe,) = [lim for lim in app.limits() if lim.pattern == "stripe:*"]
    assert (str(stripe.rate), stripe.burst, stripe.concurrency) == ("100/s", 20, None)
    page = client.get(done.headers["location"]).text
    assert 'id="outcome"' in page and 'data-pattern="stripe:*"' in page and "set-limit" in page
    removed = client.post(
        "/limits/tenant%3A%2A/remove", data={"csrf": csrf}, follow_redirects=False
    )
    assert "done=removed" in removed.headers["location"]
    assert [lim.pattern for lim in app.limits()] == ["stripe:*"]
    again = client.post("/limits/tenant%3A%2A/remove", data={"csrf": csrf}, follow_redirects=False)
    assert "done=not_found" in again.headers["location"]


def test_a_bad_limit_from_the_form_is_400_with_the_limits_own_reason(
    app: DelayQ, client: TestClient
) -> None:
    csrf = login(client)
    for form, reason in [
        ({"pattern": "t:*"}, "needs concurrency=, rate= or both"),
        ({"pattern": "t:*", "concurrency": "two"}, "concurrency must be a whole number"),
        ({"pattern": "t:*", "rate": "fast"}, "rate"),
        ({"pattern": " "}, "pattern is required"),
    ]:
        answer = client.post("/limits", data={**form, "csrf": csrf})
        assert answer.status_code == 400 and reason in answer.text, (form, answer.text)
    assert app.limits() == []


def test_the_api_lists_sets_and_deletes_with_the_bearer_token(
    app: DelayQ, client: TestClient
) -> None:
    assert client.post("/api/limits", json={"pattern": "a", "concurrency": 1}).status_code == 401
    made = client.post("/api/limits", json={"pattern": "a:*", "concurrency": 3}, headers=AUTH)
    assert made.status_code == 200 and made.json()["outcome"] == "set"
    assert client.get("/api/limits").json()["limits"] == [
        {
            "pattern": "a:*",
            "concurrency": 3,
            "rate": None,
            "burst": 0,
            "describe": "a:*: concurrency 3",
        }
    ]
    bad = client.post("/api/limits", json={"pattern": "a:*", "concurrency": True}, headers=AUTH)
    assert bad.status_code == 400
    assert client.post("/api/limits", content=b"[1]", headers=AUTH).status_code == 400
    assert client.delete("/api/limits/a%3A%2A").status_code == 401
    gone = client.delete("/api/limits/a%3A%2A", headers=AUTH)
    assert gone.json() == {"pattern": "a:*", "outcome": "removed"}
    assert client.delete("/api/limits/a%3A%2A", headers=AUTH).status_code == 404
    paths = client.get("/api/openapi.json").json()["paths"]
    assert {"/api/limits", "/api/limits/{pattern}"} <= set(paths)


def test_a_job_page_shows_its_key_priority_group_and_throttling(
    app: DelayQ, clock: FakeClock, client: TestClient
) -> None:
    app.limit("acct:1", rate="1/m")
    app.register("pay", lambda p: None)
    first = app.schedule("pay", delay=0, key="acct:1", priority=5, group="tenant-a")
    second = app.schedule("pay", delay=0, key="acct:1")
    claims = app.backend.claim(limit=10, lease=30)
    assert [c.job.id for c in claims] == [first]  # the second is over the rate
    page = client.get(f"/jobs/{second}").text
    assert 'throttled until <time datetime="2026-01-01T00:01:00.000+00:00"' in page  # 1/m
    assert "over its key" in page
    page = client.get(f"/jobs/{first}").text
    assert 'id="job-key"' in page and "acct:1" in page and 'id="throttled"' not in page
    assert 'id="job-priority">5<' in page and "tenant-a" in page


def test_a_keyed_job_page_shows_its_mode_and_counters(app: DelayQ, client: TestClient) -> None:
    app.register("digest", lambda p: None)
    for n in range(3):
        result = app.schedule_keyed(
            "digest", {"n": n}, job_id="user:7", on_conflict="debounce", delay=60, max_wait=600
        )
    page = client.get(f"/jobs/{result.id}").text
    assert 'id="job-keyed"' in page and "user:7" in page and "3 call(s)" in page


class _NoFlowControl(MemoryBackend):
    features = MemoryBackend.features - {"flow_control"}


def test_a_store_without_flow_control_says_so_on_the_page_and_501_in_the_api() -> None:
    with (
        DelayQ(backend=_NoFlowControl()) as app,
        TestClient(create_app(app, token=TOKEN), base_url=BASE) as client,
    ):
        page = client.get("/limits")
        assert page.status_code == 200 and 'id="no-limits"' in page.text
        assert client.get("/api/limits").status_code == 501
        made = client.post("/api/limits", json={"pattern": "a", "concurrency": 1}, headers=AUTH)
        assert made.status_code == 501
