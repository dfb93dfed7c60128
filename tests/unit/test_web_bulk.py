"""Bulk requeue / purge / cancel by filter: a count first, then a confirmation
of that very count (pages, API, CLI)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from click.testing import CliRunner
from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.cli import cli
from delayq.job import JobState
from delayq.web import create_app
from delayq.web.security import Guard

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bulk.db'}"


@pytest.fixture
def app(url: str) -> Iterator[DelayQ]:
    with DelayQ(url) as app:
        yield app


def bury(app: DelayQ, name: str, n: int) -> list[str]:
    ids = [app.schedule(name, {"i": i}) for i in range(n)]
    for claim in app.backend.claim(limit=100, lease=30):
        if claim.job.id in ids:
            app.backend.bury(claim, "Traceback (most recent call last):\nValueError: no")
    return ids


def dead(app: DelayQ, name: str | None = None) -> int:
    return len(app.list_jobs(state=JobState.DEAD, name=name, limit=500))


def test_the_page_counts_then_requeues_only_on_confirmation(app: DelayQ) -> None:
    bury(app, "webhook.send", 5)
    bury(app, "email.send", 2)
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        client.get(f"/?token={TOKEN}")
        page = client.get("/bulk", params={"action": "requeue", "name": "webhook.send"}).text
        assert "<strong>5</strong> dead job(s) match" in page
        assert 'name="confirm" value="5"' in page
        assert dead(app) == 7  # counting changed nothing
        csrf = Guard(TOKEN).csrf
        form = {"csrf": csrf, "confirm": "5", "name": "webhook.send"}
        done = client.post("/bulk/requeue", data=form)
        assert "bulk requeue: 5 requeued" in done.text
    assert dead(app, "webhook.send") == 0 and dead(app, "email.send") == 2


def test_a_count_that_moved_is_refused_and_shown_again(app: DelayQ) -> None:
    bury(app, "webhook.send", 3)
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        client.get(f"/?token={TOKEN}")
        form = {"csrf": Guard(TOKEN).csrf, "confirm": "2"}
        page = client.post("/bulk/purge", data=form).text
        assert "3 job(s) match now, not the 2 confirmed" in page
    assert dead(app) == 3


def test_purge_all_on_the_dead_page_is_a_link_to_the_confirmation_not_a_button(
    app: DelayQ,
) -> None:
    bury(app, "webhook.send", 1)
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        client.get(f"/?token={TOKEN}")
        html = client.get("/dead").text
    assert 'name="all" value="yes"' not in html
    assert 'href="/bulk?action=purge" id="purge-all"' in html


def test_the_api_dry_runs_without_confirm_and_acts_with_it(app: DelayQ) -> None:
    bury(app, "webhook.send", 4)
    app.schedule("email.send", delay=60)
    app.schedule("email.send", delay=60)
    with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
        assert client.post("/api/bulk/purge", json={}).status_code == 401
        dry = client.post("/api/bulk/purge", json={}, headers=AUTH).json()
        assert dry == {"action": "purge", "matched": 4, "dry_run": True}
        moved = client.post("/api/bulk/purge", json={"confirm": 9}, headers=AUTH)
        assert moved.status_code == 409 and moved.json()["matched"] == 4
        done = client.post("/api/bulk/purge", json={"confirm": 4}, headers=AUTH).json()
        assert done["outcomes"] == {"purged": 4}
        body = {"name": "email.send", "confirm": 2}
        cancelled = client.post("/api/bulk/cancel", json=body, headers=AUTH).json()
        assert cancelled["outcomes"] == {"cancelled": 2}
        assert client.post("/api/bulk/nope", json={}, headers=AUTH).status_code == 400
    assert dead(app) == 0


def test_the_cli_asks_before_acting_and_yes_skips_the_question(url: str) -> None:
    with DelayQ(url) as app:
        bury(app, "webhook.send", 3)
    runner = CliRunner()
    refused = runner.invoke(cli, ["--url", url, "bulk", "requeue"], input="n\n")
    assert "3 dead job(s) match: requeue them?" in refused.output
    assert refused.exit_code == 1
    with DelayQ(url) as app:
        assert dead(app) == 3
    done = runner.invoke(cli, ["--url", url, "bulk", "requeue", "--name", "webhook.send", "--yes"])
    assert done.exit_code == 0, done.output
    assert "3 requeued" in done.output
    with DelayQ(url) as app:
        assert dead(app) == 0
