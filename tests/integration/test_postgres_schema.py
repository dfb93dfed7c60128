"""The PostgreSQL schema at scale: counts, retention, tokens across restarts, migrations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import delayq.backends.postgres._schema as pg_schema_module
from delayq.backends.base import Completion
from delayq.backends.postgres import SCHEMA_VERSION, PostgresBackend
from delayq.job import JobSpec, Stats
from delayq.testing import FakeClock
from tests.postgres_support import POSTGRES_URL, admin, app_name, pg_schema

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def schema() -> Iterator[str]:
    with pg_schema() as name:
        yield name


@pytest.fixture
def backend(schema: str) -> Iterator[PostgresBackend]:
    b = PostgresBackend(POSTGRES_URL, schema=schema, application_name=app_name(schema))
    yield b
    b.close()


def spec(job_id: str, delay: float = 0.0) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload=json.dumps({}), run_at=0.0, delay=delay)


def _finish_many(schema: str, count: int, *, updated_at: float) -> None:
    """``count`` succeeded records written straight into the table (fast)."""
    with admin() as c:
        c.execute(
            f'INSERT INTO "{schema}".jobs (queue, id, name, payload, run_at, state, '
            f"max_attempts, backoff, misfire, created_at, updated_at) "
            f"SELECT 'default', 'f' || i, 't', '{{}}', 1, 'succeeded', 1, '{{}}', 'none', 1, %s "
            f"FROM generate_series(1, %s) AS i",
            (updated_at, count),
        )


# -- stats ------------------------------------------------------------------------


def test_stats_reads_a_few_pages_however_many_finished_records_are_kept(
    backend: PostgresBackend, schema: str
) -> None:
    now = float(backend._read("clock", "SELECT extract(epoch FROM now())::float8", {})[0][0])
    _finish_many(schema, 30_000, updated_at=now)
    backend.enqueue([spec("s", delay=60)])
    backend.claim(limit=1, lease=30)  # folds the count deltas
    with admin() as c:
        c.execute(f'ANALYZE "{schema}".jobs')  # statistics fresh, as autovacuum keeps them
    assert backend.stats().succeeded == 30_000
    with backend._conn("explaining") as c:
        plan = c.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + backend._sql.stats, backend._params()
        ).fetchone()
    assert plan is not None
    top = plan[0][0]["Plan"]
    pages = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    assert pages < 60, pages  # a count over 30,000 rows reads hundreds


def test_stats_counts_what_committed_and_nothing_rolled_back(
    backend: PostgresBackend,
) -> None:
    backend.enqueue([spec(f"j{i}") for i in range(5)] + [spec("later", delay=600)])
    claims = backend.claim(limit=3, lease=30)
    backend.complete([Completion.ack(claims[0]), Completion.bury(claims[1], "x")])
    assert backend.cancel("later").done
    caller = admin()
    caller.autocommit = False
    try:
        backend.enqueue([spec("rolled-back")], connection=caller)
        assert backend.stats().scheduled == 2  # not committed: not counted
        caller.rollback()
    finally:
        caller.close()
    stats = backend.stats()
    assert (stats.scheduled, stats.running, stats.succeeded, stats.dead, stats.cancelled) == (
        2,
        1,
        1,
        1,
        1,
    )
    assert isinstance(stats, Stats)


# -- retention ----------------------------------------------------------------------


def test_with_result_ttl_zero_a_finished_job_is_deleted_when_it_finishes(schema: str) -> None:
    store = PostgresBackend(POSTGRES_URL, schema=schema, result_ttl=0)
    try:
        store.enqueue([spec("a"), spec("b")])
        a, b = store.claim(limit=2, lease=30)
        store.complete([Completion.ack(a), Completion.retry(b, 1.0, "again")])
        with admin() as c:
            rows = c.execute(f'SELECT id, state FROM "{schema}".jobs ORDER BY id').fetchall()
        assert rows == [("b", "scheduled")]
        assert store.stats().succeeded == 0
    finally:
        store.close()


def test_the_purge_keeps_up_with_a_backlog_of_expired_records(schema: str) -> None:
    clock = FakeClock()
    store = PostgresBackend(POSTGRES_URL, schema=schema, clock=clock, result_ttl=60)
    try:
        _finish_many(schema, 7_000, updated_at=clock.time() - 3600)
        for _ in range(3):  # one purge a second: 1,000, then 2,000, then 4,000
            store.claim(limit=1, lease=30)
            clock.advance(1.0)
        with admin() as c:
            left = c.execute(f'SELECT count(*) FROM "{schema}".jobs').fetchone()
        assert left == (0,)
        assert store.stats().succeeded == 0
    finally:
        store.close()


# -- fencing tokens across a server restart --------------------------------------------


def test_the_first_session_after_a_server_start_moves_tokens_past_the_servers_clock(
    backend: PostgresBackend, schema: str
) -> None:
    backend.enqueue([spec("a"), spec("b")])
    [first] = backend.claim(limit=1, lease=30)
    with admin() as c:
        now = c.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert now is not None
        # As after a restart: the start recorded is not the server's.
        c.execute(f"UPDATE \"{schema}\".meta SET value = 'before'")
        c.execute(f"SELECT setval('\"{schema}\".tokens', 5)")  # a crash took it back
    again = PostgresBackend(POSTGRES_URL, schema=schema)
    try:
        [second] = again.claim(limit=1, lease=30)
    finally:
        again.close()
    assert second.token > first.token
    assert second.token >= int(now[0] * 1e6)


# -- migrations -----------------------------------------------------------------------


def test_a_newer_schema_that_still_reads_as_this_version_is_accepted(
    backend: PostgresBackend, schema: str
) -> None:
    with admin() as c:
        c.execute(
            f'INSERT INTO "{schema}".versions (version, oldest_reader) VALUES (%s, %s)',
            (SCHEMA_VERSION + 1, SCHEMA_VERSION),
        )
    PostgresBackend(POSTGRES_URL, schema=schema, migrate=False).close()
    PostgresBackend(POSTGRES_URL, schema=schema).close()


def test_pending_sql_lists_every_migration_of_a_new_schema_and_none_of_a_current_one(
    backend: PostgresBackend, schema: str
) -> None:
    conn: Any
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        assert pg_schema_module.pending_sql(conn, schema) == []
        fresh = pg_schema_module.pending_sql(conn, schema + "_new")
    assert fresh.count("COMMIT") == SCHEMA_VERSION + 1
    assert any("CREATE TABLE IF NOT EXISTS" in s and "_new" in s for s in fresh)
    assert all("lock_timeout" in fresh[i + 1] for i, s in enumerate(fresh[4:], 4) if s == "BEGIN")


def _index(schema: str, name: str) -> tuple[bool, str] | None:
    with admin() as c:
        row = c.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
    return None if row is None else (bool(row[0]), str(row[1]))


def test_an_index_build_left_invalid_is_dropped_and_built_again_by_the_next_migrate(
    backend: PostgresBackend, schema: str
) -> None:
    # An interrupted CREATE INDEX CONCURRENTLY leaves an invalid index of that name,
    # which IF NOT EXISTS would keep for ever (and the planner never uses).
    backend.enqueue([spec("a"), spec("b")])
    with admin() as c:
        c.execute(f'DROP INDEX "{schema}".jobs_name')
        with pytest.raises(psycopg.errors.UniqueViolation):
            c.execute(f'CREATE UNIQUE INDEX CONCURRENTLY jobs_name ON "{schema}".jobs (queue)')
    found = _index(schema, "jobs_name")
    assert found is not None and found[0] is False
    PostgresBackend(POSTGRES_URL, schema=schema).close()  # migrate=True: the repair pass
    found = _index(schema, "jobs_name")
    assert found is not None and found[0] is True
    assert "UNIQUE" not in found[1] and "(queue, name, state, run_at, seq)" in found[1]


def test_an_index_missing_after_its_migration_was_recorded_is_built(
    backend: PostgresBackend, schema: str
) -> None:
    with admin() as c:
        c.execute(f'DROP INDEX "{schema}".jobs_name')  # its process died before the build
    conn: Any
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        assert pg_schema_module.migrate(conn, schema) == (SCHEMA_VERSION, SCHEMA_VERSION)
    found = _index(schema, "jobs_name")
    assert found is not None and found[0] is True


def test_a_migration_from_version_4_builds_the_name_index_concurrently(schema: str) -> None:
    conn: Any
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        real = pg_schema_module.MIGRATIONS
        try:
            pg_schema_module.MIGRATIONS = real[:4]
            pg_schema_module.SCHEMA_VERSION = 4
            assert pg_schema_module.migrate(conn, schema) == (0, 4)
        finally:
            pg_schema_module.MIGRATIONS = real
            pg_schema_module.SCHEMA_VERSION = len(real)
        assert _index(schema, "jobs_name") is None
        assert pg_schema_module.migrate(conn, schema) == (4, SCHEMA_VERSION)
    found = _index(schema, "jobs_name")
    assert found is not None and found[0] is True


def test_released_key_records_are_swept_by_the_purge(schema: str) -> None:
    from delayq.keyed import KeyPolicy  # noqa: PLC0415

    clock = FakeClock(1_700_000_000.0)
    backend = PostgresBackend(POSTGRES_URL, schema=schema, clock=clock, result_ttl=60)
    policy = KeyPolicy.build("keep", unique="until_finished")
    assert policy is not None
    try:
        for n in range(50):
            job = JobSpec(id=f"order:{n}", name="t", payload="null", run_at=0.0, delay=0)
            backend.enqueue_keyed(job, policy)
        for claim in backend.claim(limit=50, lease=30):
            backend.ack(claim)
        with admin() as c:
            assert c.execute(f'SELECT count(*) FROM "{schema}".keyed').fetchone()[0] == 50
        clock.advance(120)
        backend.claim(limit=1, lease=30)  # its housekeeping: the purge, then the sweep
        with admin() as c:
            assert c.execute(f'SELECT count(*) FROM "{schema}".keyed').fetchone()[0] == 0
    finally:
        backend.close()
