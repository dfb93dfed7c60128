"""The PostgreSQL store on a real server: transactions, plans, migrations, reconnects."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from delayq import DelayQ
from delayq.backends import open_backend
from delayq.backends.postgres import SCHEMA_VERSION, PostgresBackend
from delayq.backends.postgres import _schema as pg_schema_module
from delayq.backends.postgres._sql import Statements
from delayq.errors import (
    BackendUnavailable,
    ConfigurationError,
    InvalidOption,
    JobConflict,
)
from delayq.job import EnqueueOutcome, JobSpec, JobState
from tests._util import wait_until
from tests.postgres_support import (
    POSTGRES_URL,
    admin,
    app_name,
    drop_schema,
    pg_schema,
    schema_name,
    terminate_backends,
)

pytestmark = [pytest.mark.postgres]

LEASE = 30.0


@pytest.fixture
def schema() -> Iterator[str]:
    with pg_schema() as name:
        yield name


@pytest.fixture
def backend(schema: str) -> Iterator[PostgresBackend]:
    b = PostgresBackend(POSTGRES_URL, schema=schema, application_name=app_name(schema))
    yield b
    b.close()


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    c = admin()
    c.autocommit = False
    yield c
    c.close()


def spec(job_id: str, run_at: float | None = None, delay: float | None = None) -> JobSpec:
    return JobSpec(
        id=job_id,
        name="test.job",
        payload=json.dumps({"id": job_id}),
        run_at=0.0 if run_at is None else run_at,
        delay=delay,
    )


def server_now(backend: PostgresBackend) -> float:
    return float(backend._read("clock", "SELECT extract(epoch FROM now())::float8", {})[0][0])


# -- transactional enqueue ----------------------------------------------------------


def test_a_job_enqueued_in_a_committed_transaction_exists(
    backend: PostgresBackend, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("SELECT 1")  # the caller's transaction is open
    assert backend.enqueue([spec("j", delay=0)], connection=conn) == [EnqueueOutcome.CREATED]
    conn.commit()
    [claim] = backend.claim(limit=5, lease=LEASE)
    assert claim.job.id == "j"


def test_a_job_enqueued_in_a_rolled_back_transaction_never_exists(
    backend: PostgresBackend, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("SELECT 1")
    backend.enqueue([spec("j", delay=0)], connection=conn)
    conn.rollback()
    assert backend.get("j") is None
    assert backend.claim(limit=5, lease=LEASE) == []


def test_a_job_in_an_open_transaction_is_invisible_to_workers_until_commit(
    backend: PostgresBackend, conn: psycopg.Connection[Any]
) -> None:
    backend.enqueue([spec("far", delay=3600)])
    backend.enqueue([spec("j", delay=0)], connection=conn)  # idle: joins the next commit
    assert backend.claim(limit=5, lease=LEASE) == []
    assert backend.get("j") is None
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (backend.wait_for_due(60), done.set()), daemon=True)
    waiter.start()
    assert not done.wait(0.3)  # asleep toward the far job
    conn.commit()  # NOTIFY is delivered on commit: the waiter wakes
    assert done.wait(10)
    assert [c.job.id for c in backend.claim(limit=5, lease=LEASE)] == ["j"]


def test_a_conflict_in_the_callers_transaction_rolls_back_only_the_enqueue(
    backend: PostgresBackend, conn: psycopg.Connection[Any], schema: str
) -> None:
    backend.enqueue([spec("taken", delay=60)])
    conn.execute(f'CREATE TABLE "{schema}".orders (id int)')
    conn.execute(f'INSERT INTO "{schema}".orders VALUES (1)')
    with pytest.raises(JobConflict):
        backend.enqueue([spec("new", delay=60), spec("taken", delay=60)], connection=conn)
    backend.enqueue([spec("other", delay=60)], connection=conn)  # the transaction lives on
    conn.commit()
    assert backend.get("new") is None and backend.get("other") is not None
    with admin() as check:
        assert check.execute(f'SELECT count(*) FROM "{schema}".orders').fetchone() == (1,)


def test_schedule_with_a_connection_joins_the_transaction(
    schema: str, conn: psycopg.Connection[Any]
) -> None:
    with DelayQ(POSTGRES_URL, schema=schema) as app:
        job_id = app.schedule("order.cancel", {"order": 7}, delay=1800, connection=conn)
        assert app.get(job_id) is None
        conn.commit()
        job = app.get(job_id)
        assert job is not None and job.payload == {"order": 7}


def test_other_stores_refuse_a_connection() -> None:
    with DelayQ("memory://") as app, pytest.raises(InvalidOption, match="transactional"):
        app.schedule("x", delay=1, connection=object())


def test_a_connection_of_another_kind_is_refused(backend: PostgresBackend) -> None:
    with pytest.raises(InvalidOption, match="psycopg"):
        backend.enqueue([spec("j", delay=0)], connection="postgresql://elsewhere")


def test_sqlalchemy_connections_and_sessions_are_accepted(
    backend: PostgresBackend, schema: str
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    orm = pytest.importorskip("sqlalchemy.orm")
    engine = sqlalchemy.create_engine(
        POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://")
    )
    try:
        with engine.connect() as sa_conn:
            backend.enqueue([spec("core", delay=60)], connection=sa_conn)
            assert backend.get("core") is None
            sa_conn.commit()
        with orm.Session(engine) as session:
            backend.enqueue([spec("orm", delay=60)], connection=session)
            session.rollback()
            backend.enqueue([spec("orm2", delay=60)], connection=session)
            session.commit()
    finally:
        engine.dispose()
    assert backend.get("core") is not None
    assert backend.get("orm") is None and backend.get("orm2") is not None


def test_a_sqlalchemy_connection_on_another_driver_is_refused_with_nothing_begun(
    backend: PostgresBackend,
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine("sqlite://")  # not psycopg 3
    try:
        with engine.connect() as sa_conn:
            with pytest.raises(InvalidOption, match=r"psycopg.*got sqlite3\.Connection"):
                backend.enqueue([spec("j", delay=60)], connection=sa_conn)
            assert not sa_conn.in_transaction()  # the caller's connection is as it was
    finally:
        engine.dispose()


# -- plans --------------------------------------------------------------------------

_PARAMS: dict[str, Any] = {
    "q": "default",
    "now": 1.0,
    "ttl": 60.0,
    "dead_ttl": 60.0,
    "id": "x",
    "ids": ["x"],
    "limit": 10,
    "lease": 30.0,
    "max_recover": 10,
    "req": "00000000-0000-4000-8000-000000000000",
    "batch": 10,
    "state": "succeeded",
    "low": 0.0,
    "high": 1e12,
    "token": 1,
    "tokens": [1],
    "kinds": ["succeeded"],
    "run_ats": [None],
    "texts": [None],
    "results": [None],
    "run_at": 5.0,
    "delay": None,
    "older_than": 5.0,
    "all": True,
    "name": "test.job",
    "contains": None,
    "at_path": None,
    "at_value": None,
    "preview": None,
    "after_id": "s5",
    "flow_flag": "flow:default",
    "groups_flag": "flow_groups:default",
}


@pytest.mark.parametrize(
    "name",
    [
        "recover",
        "claim",
        "claimed_by",
        "purge",
        "purge_dead_letters",
        "complete",
        "complete_keyed",
        "extend",
        "cancel",
        "reschedule",
        "requeue",
        "get",
        "list_by_state",
        "list_by_name",
        "head",
        "wake_times",
        "stats",
        "due_count",
        "dead_letters",
        "purge_dead",
    ],
)
def test_hot_and_dashboard_queries_search_an_index(backend: PostgresBackend, name: str) -> None:
    # A table with a few thousand rows in every state, statistics fresh; with
    # sequential scans priced out, a plan still shows one only when no index fits.
    now = server_now(backend)
    backend.enqueue([spec(f"s{i}", now - 3000 + i) for i in range(3000)])  # all due
    claims = backend.claim(limit=1000, lease=LEASE)
    from delayq.backends.base import Completion  # noqa: PLC0415

    backend.complete([Completion.ack(c) for c in claims[:500]])
    backend.complete([Completion.bury(c, "x") for c in claims[500:700]])
    statement = getattr(backend._sql, name)
    with backend._conn("explaining") as c:
        c.execute(f'ANALYZE "{backend.schema}".jobs')
        with c.transaction():
            c.execute("SET LOCAL enable_seqscan = off")
            plan = "\n".join(
                row[0] for row in c.execute("EXPLAIN " + statement, _PARAMS).fetchall()
            )
            c.execute("ROLLBACK")  # nothing EXPLAIN touched is kept
    assert "Seq Scan" not in plan, plan


def test_listing_one_handlers_jobs_reads_its_own_index_range(backend: PostgresBackend) -> None:
    # 20 jobs of "test.job" among 5,000 of another handler: the listing of one
    # handler must not filter the whole state's range (the dashboard's handler view).
    now = server_now(backend)
    others = [replace(spec(f"o{i}", now + i), name="other.job") for i in range(5000)]
    backend.enqueue(others + [spec(f"t{i}", now + i * 250) for i in range(20)])
    with backend._conn("explaining") as c:
        c.execute(f'ANALYZE "{backend.schema}".jobs')
        params = {**_PARAMS, "state": "scheduled", "after_id": None, "ttl": 60.0}
        plan = "\n".join(
            row[0] for row in c.execute("EXPLAIN " + backend._sql.list_by_name, params)
        )
    assert "jobs_name" in plan, plan
    listed = backend.list_jobs(name="test.job", limit=5)
    assert [j.id for j in listed] == ["t0", "t1", "t2", "t3", "t4"]


# -- schema and migrations ----------------------------------------------------------


def test_concurrent_migrations_serialize_and_record_one_version() -> None:
    schema = schema_name()
    errors: list[BaseException] = []
    results: list[tuple[int, int]] = []
    start = threading.Barrier(6)

    def run() -> None:
        try:
            with psycopg.connect(POSTGRES_URL, autocommit=True) as c:
                start.wait()
                results.append(pg_schema_module.migrate(c, schema))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert sorted(results).count((0, SCHEMA_VERSION)) == 1  # one applied, five found it done
        with admin() as check:
            rows = check.execute(f'SELECT version FROM "{schema}".versions').fetchall()
        assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    finally:
        drop_schema(schema)


def test_a_store_without_its_schema_is_refused_when_migrate_is_off(schema: str) -> None:
    with pytest.raises(ConfigurationError, match="delayq migrate"):
        PostgresBackend(POSTGRES_URL, schema=schema, migrate=False)


def test_a_schema_from_a_newer_delayq_is_refused(backend: PostgresBackend, schema: str) -> None:
    with admin() as c:
        c.execute(f'INSERT INTO "{schema}".versions (version) VALUES (%s)', (SCHEMA_VERSION + 1,))
    with pytest.raises(ConfigurationError, match="upgrade delayq"):
        PostgresBackend(POSTGRES_URL, schema=schema)


def test_the_statements_of_a_schema_name_only_that_schema() -> None:
    assert '"jobs_x".jobs' in Statements.build("jobs_x").claim


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "error"),
    [
        (f"{POSTGRES_URL}?schema=Bad-Name", InvalidOption),
        (f"{POSTGRES_URL}?pool_size=0", InvalidOption),
        (f"{POSTGRES_URL}?pool_size=many", ConfigurationError),
        (f"{POSTGRES_URL}?result_ttl=-1", InvalidOption),
        (f"{POSTGRES_URL}?migrate=perhaps", ConfigurationError),
        (f"{POSTGRES_URL}?queue=", InvalidOption),
    ],
)
def test_bad_options_are_refused_at_open(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        open_backend(url)


def test_an_unreachable_server_is_backend_unavailable() -> None:
    with pytest.raises(BackendUnavailable):
        PostgresBackend("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)


def test_the_url_selects_queue_and_schema_and_masks_the_password(schema: str) -> None:
    url = POSTGRES_URL.replace("postgres@", "postgres:secret@") + f"?queue=orders&schema={schema}"
    backend = open_backend(url)
    try:
        assert isinstance(backend, PostgresBackend)
        assert (backend.queue, backend.schema) == ("orders", schema)
        assert "secret" not in backend.url and "secret" not in repr(backend)
    finally:
        backend.close()


def test_queues_of_one_schema_are_separate(schema: str) -> None:
    one = PostgresBackend(POSTGRES_URL, schema=schema, queue="one")
    two = PostgresBackend(POSTGRES_URL, schema=schema, queue="two")
    try:
        one.enqueue([spec("j", delay=0)])
        assert two.get("j") is None and two.claim(limit=5, lease=LEASE) == []
        assert [c.job.id for c in one.claim(limit=5, lease=LEASE)] == ["j"]
    finally:
        one.close()
        two.close()


# -- connection loss --------------------------------------------------------------


@pytest.mark.slow
def test_terminated_backends_are_replaced_and_waiters_still_wake(
    backend: PostgresBackend, schema: str
) -> None:
    backend.enqueue([spec("far", delay=3600)])
    done = threading.Event()

    def wait() -> None:
        backend.wait_for_due(60)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    assert wait_until(lambda: backend._listener is not None and backend._listener.listening)
    assert terminate_backends(schema) >= 2  # the pool's connection and the listener's
    # The wait ends (the listener lost its connection: look again), nothing is lost.
    assert done.wait(10)
    assert wait_until(lambda: backend._listener is not None and backend._listener.listening)
    for _ in range(3):  # a call may meet a dead pooled connection once
        try:
            backend.enqueue([spec("near", delay=0.2)])
            break
        except BackendUnavailable:
            continue
    assert backend.get("near") is not None
    deadline = time.monotonic() + 10
    claimed: list[str] = []
    while not claimed and time.monotonic() < deadline:
        backend.wait_for_due(5)
        claimed = [c.job.id for c in backend.claim(limit=5, lease=LEASE)]
    assert claimed == ["near"]
    assert backend.get("far") is not None
    job = backend.get("near")
    assert job is not None and job.state is JobState.RUNNING


# -- one round trip paths, waking -----------------------------------------------------


def test_complete_and_claim_finishes_the_batch_and_claims_the_next_jobs(
    backend: PostgresBackend,
) -> None:
    from delayq.backends.base import Completion  # noqa: PLC0415

    now = server_now(backend)
    backend.enqueue([spec(f"j{i}", now - 10 + i) for i in range(4)])
    first = backend.claim(limit=2, lease=LEASE)
    stale = first[0]
    answers, claims = backend.complete_and_claim(
        [
            Completion.ack(first[0]),
            Completion.ack(stale),
            Completion.retry(first[1], now - 20, "x"),
        ],
        limit=5,
        lease=LEASE,
    )
    assert answers[0] is None and answers[2] is None
    assert answers[1] is not None  # the same claim twice: applied once
    # The retried job is due again and is claimed in the same transaction.
    assert sorted(c.job.id for c in claims) == ["j1", "j2", "j3"]
    nothing, none = backend.complete_and_claim([], limit=0, lease=LEASE)
    assert nothing == [] and none == []
    job = backend.get("j0")
    assert job is not None and job.state is JobState.SUCCEEDED


def test_an_idle_wait_costs_one_query_and_the_listener_sends_none(
    backend: PostgresBackend, schema: str
) -> None:
    backend.enqueue([spec("far", delay=3600)])
    backend.wait_for_due(0)  # starts the listener
    calls = 0
    original = backend._conn

    def counting(doing: str) -> Any:
        nonlocal calls
        calls += 1
        return original(doing)

    backend._conn = counting  # type: ignore[method-assign]
    backend.wait_for_due(0.3)
    backend.wait_for_due(0.3)
    assert calls == 2  # one read of the schedule per wait, nothing while asleep
    with admin() as c:
        rows = c.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = %s "
            "AND (query LIKE 'LISTEN%%' OR query = 'SELECT 1')",
            (app_name(schema),),
        ).fetchall()
    assert len(rows) == 1  # the listener's last statement is its LISTEN (or a heartbeat)


def test_only_a_job_earlier_than_the_head_is_notified(schema: str) -> None:
    producer = PostgresBackend(POSTGRES_URL, schema=schema)
    waiter = PostgresBackend(POSTGRES_URL, schema=schema)
    try:
        now = server_now(producer)
        producer.enqueue([spec("head", now + 3600)])
        done = threading.Event()
        threading.Thread(target=lambda: (waiter.wait_for_due(60), done.set()), daemon=True).start()
        assert wait_until(
            lambda: waiter._listener is not None and len(waiter._listener.waiters) == 1
        )
        producer.enqueue([spec("later", now + 7200)])  # behind the head: no NOTIFY
        producer.enqueue([spec("earlier", now + 60)])  # the new head: NOTIFY
        assert done.wait(10)
        assert waiter._listener is not None
        heard = [due for _seq, due in waiter._listener.log]
        assert heard == [pytest.approx(now + 60)]
    finally:
        producer.close()
        waiter.close()


def test_the_migrate_command_creates_the_schema_once(schema: str) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from delayq.cli import cli  # noqa: PLC0415

    url = f"{POSTGRES_URL}?schema={schema}"
    shown = CliRunner().invoke(cli, ["--url", url, "migrate", "--sql"])
    assert shown.exit_code == 0 and "CREATE TABLE IF NOT EXISTS" in shown.output, shown.output
    first = CliRunner().invoke(cli, ["--url", url, "migrate"])
    assert first.exit_code == 0, first.output
    assert f"migrated from version 0 to {SCHEMA_VERSION}" in first.output
    again = CliRunner().invoke(cli, ["--url", url, "migrate"])
    assert again.exit_code == 0 and "nothing to do" in again.output
    elsewhere = CliRunner().invoke(cli, ["--url", "sqlite:///jobs.db", "migrate"])
    assert elsewhere.exit_code != 0 and "postgresql://" in elsewhere.output
    PostgresBackend(POSTGRES_URL, schema=schema, migrate=False).close()  # now accepted


def test_dead_letters_are_kept_dead_ttl_then_purged_in_batches(schema: str) -> None:
    from delayq.testing import FakeClock  # noqa: PLC0415

    clock = FakeClock()
    store = PostgresBackend(POSTGRES_URL, schema=schema, clock=clock, dead_ttl=3600)
    try:
        t0 = clock.time()
        store.enqueue([spec("d", t0)])
        [claim] = store.claim(limit=1, lease=LEASE)
        store.bury(claim, "boom")
        clock.advance(3599)
        store.claim(limit=1, lease=LEASE)
        assert [j.id for j in store.dead_letters()] == ["d"]
        clock.advance(2)
        store.claim(limit=1, lease=LEASE)  # the purge runs from the claim path
        assert store.dead_letters() == [] and store.get("d") is None
    finally:
        store.close()
