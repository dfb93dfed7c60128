"""Where the dashboard answers: the Host check, a path prefix, its own cookie,
security headers on every answer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.web import create_app
from delayq.web.security import Guard, host_of

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[DelayQ]:
    with DelayQ(f"sqlite:///{tmp_path / 'web.db'}") as app:
        yield app


def test_a_foreign_host_header_is_refused_so_dns_rebinding_reads_nothing(app: DelayQ) -> None:
    app.schedule("mail", {"to": "user@example.com"}, delay=60)
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        assert client.get("/api/jobs").status_code == 200
        for host in ("attacker.example", "attacker.example:8080", "127.0.0.1.evil.example"):
            response = client.get("/api/jobs", headers={"Host": host})
            assert response.status_code == 421, host
            assert "user@example.com" not in response.text
        assert client.get("/", headers={"Host": "localhost:8080"}).status_code == 200
        assert client.get("/", headers={"Host": "[::1]:8080"}).status_code == 200


def test_allowed_hosts_add_names_and_a_star_allows_any(app: DelayQ) -> None:
    web = create_app(app, token=TOKEN, allowed_hosts=["jobs.example.com"])
    with TestClient(web, base_url="https://jobs.example.com") as client:
        assert client.get("/api/overview").status_code == 200
        assert client.get("/", headers={"Host": "other.example"}).status_code == 421
    with TestClient(create_app(app, allowed_hosts=["*"]), base_url="http://any.example") as c:
        assert c.get("/api/overview").status_code == 200


def test_host_names_are_read_without_port_or_brackets() -> None:
    assert host_of("Example.COM:8080") == "example.com"
    assert host_of("[::1]:80") == "::1"
    assert host_of("127.0.0.1") == "127.0.0.1"
    assert host_of("[::1") is None and host_of("a:b") is None and host_of("") is None


def test_behind_a_proxy_that_rewrites_host_forms_from_the_public_origin_act(
    app: DelayQ,
) -> None:
    job_id = app.schedule("mail", delay=60)
    web = create_app(app, token=TOKEN, allowed_hosts=["jobs.example.com"])
    with TestClient(web, base_url=BASE) as client:  # the proxy sends Host: 127.0.0.1
        client.get(f"/?token={TOKEN}")
        response = client.post(
            f"/jobs/{job_id}/cancel",
            data={"csrf": Guard(TOKEN).csrf},
            headers={"Origin": "https://jobs.example.com"},
            follow_redirects=False,
        )
        assert response.status_code == 303
        refused = client.post(
            f"/jobs/{job_id}/cancel",
            data={"csrf": Guard(TOKEN).csrf},
            headers={"Origin": "https://evil.example"},
        )
        assert refused.status_code == 403


def test_mounted_under_a_prefix_every_link_form_and_redirect_stays_under_it(app: DelayQ) -> None:
    job_id = app.schedule("mail", delay=60, job_id="j1")
    outer = Starlette(routes=[Mount("/ops/delayq", app=create_app(app, token=TOKEN))])
    with TestClient(outer, base_url=BASE) as client:
        login = client.get(f"/ops/delayq/?token={TOKEN}", follow_redirects=False)
        assert login.headers["location"] == "/ops/delayq/"
        assert "Path=/ops/delayq" in login.headers["set-cookie"]
        client.cookies.update(login.cookies)
        pages = [
            "/ops/delayq/",
            "/ops/delayq/jobs",
            f"/ops/delayq/jobs/{job_id}",
            "/ops/delayq/dead",
        ]
        for page in pages:
            html = client.get(page).text
            targets = [
                t for t in re.findall(r'(?:href|action|src)="([^"]+)"', html) if t != "data:,"
            ]
            assert targets, page
            assert all(t.startswith("/ops/delayq/") for t in targets), (page, targets)
            for target in {t for t in targets if "/cancel" not in t and "/reschedule" not in t}:
                assert client.get(target).status_code in (200, 404), target
        cancel = client.post(
            f"/ops/delayq/jobs/{job_id}/cancel",
            data={"csrf": Guard(TOKEN).csrf},
            follow_redirects=False,
        )
        assert cancel.status_code == 303
        assert cancel.headers["location"].startswith(f"/ops/delayq/jobs/{job_id}?")


def test_two_dashboards_on_one_host_keep_their_own_cookies(app: DelayQ) -> None:
    assert Guard("token-one").cookie != Guard("token-two").cookie
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        login = client.get(f"/?token={TOKEN}", follow_redirects=False)
        assert login.headers["set-cookie"].startswith(f"{Guard(TOKEN).cookie}=")


def test_a_login_link_never_redirects_off_this_server(app: DelayQ) -> None:
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        response = client.get(f"{BASE}//evil.example/?token={TOKEN}", follow_redirects=False)
        assert response.headers["location"] == "/evil.example/"


def test_a_500_page_keeps_the_security_headers(
    app: DelayQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(app, "stats", broken)
    with TestClient(
        create_app(app, token=TOKEN), base_url=BASE, raise_server_exceptions=False
    ) as client:
        response = client.get("/")
    assert response.status_code == 500
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["cache-control"] == "no-store"


def test_with_a_cache_repeated_gets_share_one_answer_and_an_action_clears_it(
    app: DelayQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    stats = app.stats
    monkeypatch.setattr(app, "stats", lambda: calls.append(1) or stats())
    job_id = app.schedule("mail", delay=60)
    web = create_app(app, token=TOKEN, cache_seconds=3600)
    with TestClient(web, base_url=BASE) as client:
        first = client.get("/api/overview").json()
        assert client.get("/api/overview").json() == first
        assert len(calls) == 1
        assert client.get("/api/overview?x=1").status_code == 200  # another question
        assert len(calls) == 2
        cancel = client.post(
            f"/api/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert cancel.json()["outcome"] == "cancelled"
        assert client.get("/api/overview").json()["counts"]["cancelled"] == 1
        assert len(calls) == 3
