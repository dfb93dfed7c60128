"""Worker heartbeats in the store: the workers page, /api/workers and ``delayq workers``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("starlette.testclient")

from click.testing import CliRunner
from starlette.testclient import TestClient

from delayq.app import DelayQ
from delayq.backends.base import WORKER_FORGET_AFTER, WorkerRegistry
from delayq.cli import cli
from delayq.cli.worker import WorkerOps
from delayq.observe.workers import Heartbeat, worker_rows
from delayq.testing import FakeClock
from delayq.web import create_app
from delayq.worker import Worker

BASE = "http://127.0.0.1"


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_a_worker_is_listed_while_it_beats_and_forgotten_when_it_stops(
    url: str, tmp_path: Path
) -> None:
    clock = FakeClock(1_700_000_000.0)
    store = f"sqlite:///{tmp_path / 'w.db'}" if url == "sqlite" else url
    with DelayQ(store, clock=clock) as app:
        assert isinstance(app.backend, WorkerRegistry)
        worker = Worker(app, concurrency=3, lease=30, name="billing-1")
        beat = Heartbeat(app, worker, every=3600, clock=clock).start()
        (row,) = worker_rows(app.backend.list_workers(), clock.time())
        assert row["name"] == "billing-1" and row["concurrency"] == 3 and row["in_flight"] == 0
        assert row["gone"] is False and row["id"] == beat.worker_id
        clock.advance(31)  # no beat for longer than its lease
        (row,) = worker_rows(app.backend.list_workers(), clock.time())
        assert row["gone"] is True and row["seen_ago"] == pytest.approx(31)
        beat.beat()
        (row,) = worker_rows(app.backend.list_workers(), clock.time())
        assert row["gone"] is False
        beat.stop()
        assert app.backend.list_workers() == []


def test_the_workers_page_api_and_cli_show_alive_and_gone_workers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    clock = FakeClock(1_700_000_000.0)
    with DelayQ(url, clock=clock) as app:
        backend = app.backend
        assert isinstance(backend, WorkerRegistry)
        info = {"host": "h1", "pid": 11, "name": None, "concurrency": 8, "in_flight": 2}
        backend.beat_worker("h1:11:aa", json.dumps({**info, "lease": 30, "started": 0}))
        clock.advance(40)
        backend.beat_worker("h2:22:bb", json.dumps({**info, "host": "h2", "lease": 30}))
        with TestClient(create_app(app), base_url=BASE) as client:
            rows = {w["id"]: w for w in client.get("/api/workers").json()["workers"]}
            assert rows["h1:11:aa"]["gone"] is True and rows["h2:22:bb"]["gone"] is False
            html = client.get("/workers").text
            assert "gone: not seen for 40.0s" in html and "alive" in html
    result = CliRunner().invoke(cli, ["--url", url, "workers", "--json"])
    assert result.exit_code == 0, result.output
    assert {w["id"] for w in json.loads(result.output)} == {"h1:11:aa", "h2:22:bb"}


def test_worker_ops_record_the_worker_in_the_store_until_closed(tmp_path: Path) -> None:
    with DelayQ(f"sqlite:///{tmp_path / 'w.db'}") as app:
        worker = Worker(app, concurrency=2)
        ops = WorkerOps(app)
        ops.start(worker)
        try:
            (beat,) = app.backend.list_workers()  # type: ignore[attr-defined]
            assert json.loads(beat.data)["concurrency"] == 2
        finally:
            ops.close()
        assert app.backend.list_workers() == []  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_redis_store_keeps_heartbeats_under_its_prefix() -> None:
    pytest.importorskip("redis")
    from delayq.backends.redis import RedisBackend  # noqa: PLC0415
    from tests.redis_support import REDIS_URL, redis_prefix  # noqa: PLC0415

    with redis_prefix() as prefix:
        clock = FakeClock(1_700_000_000.0)
        backend = RedisBackend.from_url(REDIS_URL, prefix=prefix, clock=clock)
        try:
            backend.beat_worker("h:1:aa", json.dumps({"lease": 30}))
            clock.advance(5)
            backend.beat_worker("h:2:bb", json.dumps({"lease": 30}))
            beats = backend.list_workers()
            assert [b.worker_id for b in beats] == ["h:2:bb", "h:1:aa"]
            assert beats[1].seen == pytest.approx(clock.time() - 5)
            backend.forget_worker("h:1:aa")
            assert [b.worker_id for b in backend.list_workers()] == ["h:2:bb"]
        finally:
            backend.close()


def test_the_postgres_store_keeps_heartbeats_per_queue_and_forgets_stale_ones() -> None:
    pytest.importorskip("psycopg")
    from delayq.backends.postgres import PostgresBackend  # noqa: PLC0415
    from tests.postgres_support import POSTGRES_URL, pg_schema  # noqa: PLC0415

    with pg_schema() as schema:
        clock = FakeClock(1_700_000_000.0)
        backend = PostgresBackend(POSTGRES_URL, schema=schema, clock=clock)
        other = PostgresBackend(POSTGRES_URL, schema=schema, queue="other", clock=clock)
        try:
            assert isinstance(backend, WorkerRegistry)
            backend.beat_worker("h:1:aa", json.dumps({"lease": 30}))
            other.beat_worker("h:9:zz", json.dumps({"lease": 30}))
            clock.advance(5)
            backend.beat_worker("h:2:bb", json.dumps({"lease": 30}))
            beats = backend.list_workers()
            assert [b.worker_id for b in beats] == ["h:2:bb", "h:1:aa"]  # this queue's only
            assert beats[1].seen == pytest.approx(clock.time() - 5)
            backend.beat_worker("h:1:aa", json.dumps({"lease": 30, "in_flight": 3}))
            assert json.loads(backend.list_workers()[0].data)["in_flight"] == 3  # replaced
            backend.forget_worker("h:1:aa")
            assert [b.worker_id for b in backend.list_workers()] == ["h:2:bb"]
            clock.advance(WORKER_FORGET_AFTER + 1)
            assert backend.list_workers() == []  # not renewed: not listed
            backend.beat_worker("h:3:cc", json.dumps({"lease": 30}))  # drops the stale row
            with backend._conn("checking") as conn:
                rows = conn.execute(
                    f'SELECT queue, id FROM "{schema}".workers ORDER BY queue, id'
                ).fetchall()
            assert rows == [("default", "h:3:cc"), ("other", "h:9:zz")]
        finally:
            backend.close()
            other.close()
