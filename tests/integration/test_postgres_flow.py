"""Flow control on PostgreSQL beyond the contract: which claim a queue takes, the
flow statements' plans, and a migration that leaves a live table in place."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import delayq.backends.postgres._schema as pg_schema_module
from delayq.backends.base import Completion
from delayq.backends.postgres import PostgresBackend
from delayq.flow import Limit
from delayq.job import JobSpec, JobState
from tests.postgres_support import POSTGRES_URL, admin, app_name, pg_schema

pytestmark = [pytest.mark.postgres]
LEASE = 30.0


@pytest.fixture
def backend() -> Iterator[PostgresBackend]:
    with pg_schema() as schema:
        b = PostgresBackend(POSTGRES_URL, schema=schema, application_name=app_name(schema))
        yield b
        b.close()


def spec(job_id: str, run_at: float, key: str | None = None, priority: int = 0) -> JobSpec:
    plain = JobSpec(id=job_id, name="t", payload=json.dumps({}), run_at=run_at)
    return dataclasses.replace(plain, key=key, priority=priority)


def server_now(backend: PostgresBackend) -> float:
    with backend._conn("reading the clock") as c:
        row = c.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    assert row is not None
    return float(row[0])


def test_a_queue_without_flow_fields_keeps_the_plain_claim(backend: PostgresBackend) -> None:
    now = server_now(backend)
    backend.enqueue([spec(f"j{i}", now - 1) for i in range(3)])
    assert len(backend.claim(limit=5, lease=LEASE)) == 3
    assert backend._flow_seen == set()  # no flag: the one-statement claim


def test_a_queue_with_a_keyed_job_takes_the_flow_claim_in_every_handle(
    backend: PostgresBackend,
) -> None:
    other = PostgresBackend(
        POSTGRES_URL, schema=backend.schema, application_name=app_name(backend.schema)
    )
    try:
        now = server_now(backend)
        other.claim(limit=1, lease=LEASE)  # this handle has claimed before the flag exists
        backend.put_limit(Limit("k", concurrency=1), version=0)
        backend.enqueue([spec("a", now - 2, "k"), spec("b", now - 1, "k")])
        [first] = other.claim(limit=5, lease=LEASE)  # its plain claim sees the flag
        assert first.job.id == "a" and "flow:default" in other._flow_seen
        assert backend.claim(limit=5, lease=LEASE) == []  # at the limit, in either handle
        other.complete([Completion.ack(first)])
        assert [c.job.id for c in backend.claim(limit=5, lease=LEASE)] == ["b"]
    finally:
        other.close()


def test_a_handle_whose_plain_claims_came_back_full_notices_the_flag_one_claim_later(
    backend: PostgresBackend,
) -> None:
    other = PostgresBackend(
        POSTGRES_URL, schema=backend.schema, application_name=app_name(backend.schema)
    )
    try:
        now = server_now(backend)
        backend.enqueue([spec(f"p{i}", now - 9) for i in range(3)])
        assert len(other.claim(limit=1, lease=LEASE)) == 1  # full: it stops reading the flags
        backend.put_limit(Limit("k", concurrency=1), version=0)
        backend.enqueue([spec("a", now - 2, "k"), spec("b", now - 1, "k")])
        assert other.claim(limit=1, lease=LEASE) == []  # the flag holds the plain claim back
        claimed = [c.job.id for c in other.claim(limit=5, lease=LEASE)]
        assert claimed == ["p1", "p2", "a"]  # the flow claim: b waits for a's slot
    finally:
        other.close()


def test_a_parked_job_is_listed_with_its_due_time_but_is_not_the_head(
    backend: PostgresBackend,
) -> None:
    now = server_now(backend)
    backend.put_limit(Limit("k", concurrency=1), version=0)
    backend.enqueue([spec("a", now - 2, "k"), spec("b", now - 1, "k")])
    [running] = backend.claim(limit=5, lease=LEASE)
    assert running.job.id == "a"
    [parked] = backend.list_jobs(state=JobState.SCHEDULED)
    assert (parked.id, parked.run_at, parked.throttled_until) == ("b", now - 1, None)
    assert backend.next_due() is None  # waiting for a slot, not for a time
    assert backend.stats().due == 0


def test_complete_and_claim_frees_a_slot_and_takes_the_parked_job_in_one_call(
    backend: PostgresBackend,
) -> None:
    now = server_now(backend)
    backend.put_limit(Limit("k", concurrency=1), version=0)
    backend.enqueue([spec("a", now - 2, "k"), spec("b", now - 1, "k")])
    [first] = backend.claim(limit=5, lease=LEASE)
    assert backend.claim(limit=5, lease=LEASE) == []  # b is parked
    done, claims = backend.complete_and_claim([Completion.ack(first)], limit=5, lease=LEASE)
    assert done == [None] and [c.job.id for c in claims] == ["b"]


_PARAMS: dict[str, Any] = {
    "q": "default",
    "now": 1e12,
    "n": 10,
    "keys": ["k1"],
    "rooms": [1],
    "ids": ["x"],
    "ats": [None],
    "groups": ["g"],
    "groups_flag": "flow_groups:default",
}


@pytest.mark.parametrize(
    "name",
    ["parked_keys", "unpark", "candidates", "group_candidates", "key_state", "lock_rows", "hold"],
)
def test_the_flow_claim_searches_an_index(backend: PostgresBackend, name: str) -> None:
    now = server_now(backend)
    backend.put_limit(Limit("k*", concurrency=2), version=0)
    backend.enqueue([spec(f"p{i}", now - 3000 + i, None) for i in range(2000)])
    backend.enqueue([spec(f"k{i}", now - 3000 + i, f"k{i % 20}", i % 3) for i in range(2000)])
    backend.claim(limit=200, lease=LEASE)  # parks most keyed jobs, runs some
    statement = getattr(backend._flow_sql, name)
    with backend._conn("explaining") as c:
        c.execute(f'ANALYZE "{backend.schema}".jobs')
        with c.transaction():
            c.execute("SET LOCAL enable_seqscan = off")
            plan = "\n".join(
                row[0] for row in c.execute("EXPLAIN " + statement, _PARAMS).fetchall()
            )
            c.execute("ROLLBACK")
    assert "Seq Scan on jobs" not in plan, plan
    if name == "candidates":
        assert "jobs_flow_due" in plan and "jobs_due" in plan, plan


def test_the_flow_migration_leaves_a_live_table_in_place() -> None:
    with pg_schema() as schema, admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".versions (version integer PRIMARY KEY)')
        for version in range(pg_schema_module.SCHEMA_VERSION - 1):  # up to version 5
            step = pg_schema_module.MIGRATIONS[version]
            for statement in step.steps + step.concurrent:
                conn.execute(statement.format(s=f'"{schema}"'))
        conn.execute(
            f'INSERT INTO "{schema}".jobs (queue, id, name, payload, run_at, state, '
            f"max_attempts, backoff, misfire, created_at, updated_at) "
            f"VALUES ('q', 'old', 't', '{{}}', 1, 'scheduled', 3, '{{}}', 'run', 1, 1)"
        )
        before = _relfilenode(conn, schema)
        flow = pg_schema_module.MIGRATIONS[pg_schema_module.SCHEMA_VERSION - 1]
        for statement in flow.steps + flow.concurrent:
            conn.execute(statement.format(s=f'"{schema}"'))
        assert _relfilenode(conn, schema) == before  # no rewrite: the columns are metadata
        row = conn.execute(
            f'SELECT flow_key, priority, flow_group, flow_run_at, parked FROM "{schema}".jobs'
        ).fetchone()
        assert row == (None, 0, None, None, False)


def _relfilenode(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        "SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", (f'"{schema}".jobs',)
    ).fetchone()
    assert row is not None
    return int(row[0])
