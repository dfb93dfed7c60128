"""Lists carry bounded previews, read cut from the store; payload search by
substring and JSON path in the dashboard's pages, its API, bulk actions and the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from click.testing import CliRunner
from starlette.testclient import TestClient

from delayq._present import parse_payload_at, payload_value
from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.cli import cli
from delayq.errors import InvalidOption, Unsupported
from delayq.job import PayloadPreview
from delayq.web import create_app, views
from delayq.web._rows import PREVIEW_CHARS

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = (1 << 20) - 100  # near the default payload limit (1 MiB)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'search.db'}"


@pytest.fixture
def app(url: str) -> Iterator[DelayQ]:
    with DelayQ(url) as app:
        yield app


@pytest.fixture
def client(app: DelayQ) -> Iterator[TestClient]:
    with TestClient(
        create_app(app, token=TOKEN), base_url=BASE, raise_server_exceptions=False
    ) as client:
        yield client


def orders(app: DelayQ) -> None:
    app.schedule("mail", {"to": "ann@example.com", "customer": {"id": 42}}, delay=60, job_id="a")
    app.schedule("mail", {"to": "bob@example.com", "customer": {"id": "42"}}, delay=61, job_id="b")
    app.schedule("sms", {"to": "ann@example.org", "customer": {"id": 7}}, delay=62, job_id="c")


def test_a_list_page_reads_big_payloads_cut_from_the_store(app: DelayQ) -> None:
    for i in range(5):
        app.schedule("mail", {"blob": "x" * MIB}, delay=60 + i, job_id=f"big{i}")
    page, _ = views.list_page(app, views.JobFilters(limit=100))
    assert len(page) == 5
    for job in page:  # never the whole MiB in the dashboard's process
        assert isinstance(job.payload, PayloadPreview)
        assert len(job.payload.text) <= PREVIEW_CHARS
        assert job.payload.chars > MIB


def test_api_jobs_over_big_payloads_answers_previews_and_the_job_has_it_whole(
    app: DelayQ, client: TestClient
) -> None:
    for i in range(20):
        app.schedule("mail", {"blob": "x" * MIB}, delay=60 + i, job_id=f"big{i}")
    response = client.get("/api/jobs?limit=100")
    assert response.status_code == 200
    assert len(response.content) < 50_000  # 20 MiB of payloads, a few KB of rows
    rows = response.json()["jobs"]
    assert rows[0]["payload_preview"].startswith('{"blob":"xxx') and rows[0]["payload_chars"] > MIB
    whole = client.get("/api/jobs/big0").json()
    assert len(whole["payload"]["blob"]) == MIB


def test_api_jobs_searches_payloads_by_substring_and_json_path(
    app: DelayQ, client: TestClient
) -> None:
    orders(app)

    def ids(query: str) -> list[str]:
        response = client.get(f"/api/jobs?{query}")
        assert response.status_code == 200, response.text
        return [j["id"] for j in response.json()["jobs"]]

    assert ids("payload_contains=ann%40") == ["a", "c"]
    assert ids("payload_contains=ann%40&name=sms") == ["c"]
    assert ids("payload_path=customer.id&payload_value=42") == ["a"]
    assert ids("payload_path=%24.customer.id&payload_value=%2242%22") == ["b"]  # "42": a string
    assert ids("payload_path=customer.id&payload_value=7&payload_contains=example.org") == ["c"]
    bad = client.get("/api/jobs?payload_path=customer..id&payload_value=1")
    assert bad.status_code == 400 and "payload path" in bad.json()["error"]
    assert client.get("/api/jobs?payload_value=1").status_code == 400


def test_the_jobs_page_searches_payloads_and_keeps_the_search_in_its_links(
    app: DelayQ, client: TestClient
) -> None:
    orders(app)
    page = client.get("/jobs?payload_path=customer.id&payload_value=42&limit=1")
    assert page.status_code == 200
    assert 'id="f-payload-path" value="customer.id"' in page.text
    assert "/jobs/a" in page.text and "/jobs/b" not in page.text


def test_a_store_that_cannot_search_says_so_and_hides_the_fields() -> None:
    class NoSearch(MemoryBackend):
        features = MemoryBackend.features - {"payload_search"}

    with DelayQ(backend=NoSearch()) as app:
        orders(app)
        with pytest.raises(Unsupported, match="cannot search payloads"):
            app.list_jobs(payload_contains="ann")
        with TestClient(create_app(app, token=TOKEN), base_url=BASE) as client:
            assert 'id="f-payload-contains"' not in client.get("/jobs").text
            refused = client.get("/api/jobs?payload_contains=ann")
    assert refused.status_code == 501 and "cannot search payloads" in refused.json()["error"]


def test_a_bulk_action_matches_by_payload(app: DelayQ, client: TestClient) -> None:
    orders(app)
    dry = client.post("/api/bulk/cancel", json={"payload_contains": "ann@"}, headers=AUTH)
    assert dry.json() == {"action": "cancel", "matched": 2, "dry_run": True}
    done = client.post(
        "/api/bulk/cancel",
        json={"payload_path": "customer.id", "payload_value": "42", "confirm": 1},
        headers=AUTH,
    )
    assert done.status_code == 200 and done.json()["outcomes"] == {"cancelled": 1}
    assert [j.id for j in app.list_jobs(state="scheduled")] == ["b", "c"]
    page = client.get("/bulk?action=cancel&payload_contains=example.org", headers=AUTH)
    assert "payload containing <code>example.org</code>" in page.text


def test_delayq_ls_and_bulk_search_payloads(app: DelayQ, url: str) -> None:
    orders(app)
    runner = CliRunner()
    listed = runner.invoke(
        cli,
        ["--url", url, "ls", "--payload-at", "customer.id=42", "--json"],
        catch_exceptions=False,
    )
    assert listed.exit_code == 0, listed.output
    assert [j["id"] for j in json.loads(listed.output)] == ["a"]
    cancelled = runner.invoke(
        cli,
        ["--url", url, "bulk", "cancel", "--payload-contains", "ann@", "--yes", "--json"],
        catch_exceptions=False,
    )
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.output)["matched"] == 2
    bad = runner.invoke(cli, ["--url", url, "ls", "--payload-at", "customer.id"])
    assert bad.exit_code != 0 and "PATH=VALUE" in bad.output


def test_a_typed_search_value_is_json_when_it_reads_as_json_else_text() -> None:
    assert payload_value("42") == 42 and payload_value("1.5") == 1.5
    assert payload_value("true") is True and payload_value('"42"') == "42"
    assert payload_value("paid") == "paid" and payload_value("[1]") == "[1]"
    assert payload_value("null") == "null"
    assert parse_payload_at("$.items[0].sku = A-1", "--payload-at") == ("$.items[0].sku", "A-1")
    with pytest.raises(InvalidOption, match="PATH=VALUE"):
        parse_payload_at("=1", "--payload-at")


def test_dead_letters_are_listed_with_previews_read_cut(app: DelayQ, client: TestClient) -> None:
    app.schedule("mail", {"blob": "x" * MIB}, job_id="dead-big")
    (claim,) = app.backend.claim(limit=1, lease=30)
    app.backend.bury(claim, "ValueError: too big")
    (job,) = app.dead_letters(preview=PREVIEW_CHARS)
    assert isinstance(job.payload, PayloadPreview) and job.payload.chars > MIB
    response = client.get("/api/dead")
    assert response.status_code == 200 and len(response.content) < 10_000
    assert response.json()["jobs"][0]["payload_chars"] > MIB
