"""PostgreSQL connections: URLs and options, the caller's connection, errors by kind."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from delayq.backends.postgres import PostgresBackend
from delayq.backends.postgres._connection import mask
from delayq.backends.postgres._schema import check_schema_name
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError, InvalidOption
from delayq.job import JobSpec
from delayq.testing import FakeClock
from tests._util import wait_until
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


def _setting(store: PostgresBackend, name: str) -> str:
    return str(store._read("reading a setting", f"SHOW {name}", {})[0][0])


def _with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


# -- the caller's connection ----------------------------------------------------------


def test_a_connection_to_another_database_is_refused(backend: PostgresBackend) -> None:
    other = psycopg.connect(POSTGRES_URL.rsplit("/", 1)[0] + "/postgres", autocommit=False)
    try:
        with pytest.raises(InvalidOption, match="'postgres'"):
            backend.enqueue([spec("x")], connection=other)
        assert other.info.transaction_status is not psycopg.pq.TransactionStatus.INERROR
    finally:
        other.close()
    assert backend.get("x") is None


def test_a_session_without_a_bind_is_refused_as_an_option(backend: PostgresBackend) -> None:
    orm = pytest.importorskip("sqlalchemy.orm")
    with pytest.raises(InvalidOption, match="Session"):
        backend.enqueue([spec("x")], connection=orm.Session())


# -- URLs and session options ---------------------------------------------------------


def test_libpq_options_in_the_url_reach_the_server(schema: str) -> None:
    url = _with_query(
        POSTGRES_URL, "options=-c%20statement_timeout%3D1234&application_name=my%20app"
    )
    store = PostgresBackend(url, schema=schema)
    try:
        assert _setting(store, "statement_timeout") == "1234ms"
        assert _setting(store, "synchronous_commit") == "on"  # the store's own, beside them
    finally:
        store.close()


def test_pgoptions_from_the_environment_are_kept(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=4321")
    store = PostgresBackend(POSTGRES_URL, schema=schema)
    try:
        assert _setting(store, "statement_timeout") == "4321ms"
    finally:
        store.close()


def test_a_database_that_does_not_exist_is_a_configuration_error_at_once() -> None:
    url = POSTGRES_URL.rsplit("/", 1)[0] + "/dq_test_no_such_database"
    with pytest.raises(ConfigurationError, match="does not exist"):
        PostgresBackend(url, connect_timeout=30)


def test_passwords_in_the_query_are_masked() -> None:
    url = "postgresql://app@db/shop?sslmode=require&password=s3cret&sslpassword=k3y&x=1"
    assert mask(url) == "postgresql://app@db/shop?sslmode=require&password=***&sslpassword=***&x=1"
    assert "s3cret" not in mask("postgresql:///shop?host=/run/pg&PASSWORD=s3cret")


@pytest.mark.parametrize("name", ["public", "information_schema", "pg_catalog", "pg_toast"])
def test_schemas_delayq_does_not_own_are_refused(name: str) -> None:
    with pytest.raises(InvalidOption, match="schema"):
        check_schema_name(name)


# -- errors by kind -------------------------------------------------------------------


def test_a_lock_wait_given_up_is_a_backend_error_not_unavailable(schema: str) -> None:
    store = PostgresBackend(
        POSTGRES_URL, schema=schema, application_name=app_name(schema), lock_timeout=0.2
    )
    holder: Any = admin()
    holder.autocommit = False
    try:
        store.enqueue([spec("x", delay=60)])
        holder.execute(f'SELECT 1 FROM "{schema}".jobs WHERE id = %s FOR UPDATE', ("x",))
        with pytest.raises(BackendError, match="lock") as caught:
            store.cancel("x")
        assert not isinstance(caught.value, BackendUnavailable)
    finally:
        holder.close()
        store.close()


def test_the_first_call_after_the_server_dropped_the_connections_succeeds(
    backend: PostgresBackend, schema: str
) -> None:
    assert backend.get("x") is None  # the pool holds a connection
    with admin() as c:
        c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app_name(schema),),
        )

        def gone() -> bool:
            row = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (app_name(schema),),
            ).fetchone()
            return row is not None and row[0] == 0

        assert wait_until(gone, timeout=30)
    backend.enqueue([spec("x", delay=60)])  # a write: never retried, so it must not fail
    assert backend.get("x") is not None


# -- PgBouncer (transaction pooling) and poll-only ---------------------------------------


def test_behind_pgbouncer_no_session_state_is_used_and_waits_poll(schema: str) -> None:
    clock = FakeClock()
    store = PostgresBackend(
        _with_query(POSTGRES_URL, "pgbouncer=true&poll_interval=2"),
        schema=schema,
        clock=clock,
        application_name=app_name(schema),
    )
    try:
        assert _setting(store, "plan_cache_mode") == "auto"  # no session settings
        store.enqueue([spec("far", delay=3600)])
        for _ in range(8):  # past psycopg's threshold for preparing a statement
            store.claim(limit=1, lease=30)
        assert store._read("counting", "SELECT count(*) FROM pg_prepared_statements", {}) == [(0,)]
        done = threading.Event()
        threading.Thread(target=lambda: (store.wait_for_due(60), done.set()), daemon=True).start()
        assert wait_until(lambda: clock.waiters() >= 1 or done.is_set(), timeout=30)
        deadline = clock.next_deadline()
        assert deadline is not None and deadline - clock.monotonic() <= 2.0  # a bounded poll
        with admin() as c:
            listening = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND query LIKE 'LISTEN%%'",
                (app_name(schema),),
            ).fetchone()
        assert listening == (0,)
        clock.advance(2.0)
        assert done.wait(30)
    finally:
        store.close()


def test_a_full_pool_is_waited_for_once_and_not_taken_for_a_failed_server(schema: str) -> None:
    store = PostgresBackend(
        POSTGRES_URL,
        schema=schema,
        application_name=app_name(schema),
        pool_size=1,
        connect_timeout=0.5,
    )
    pool = store._pool
    taken: list[str] = []
    checks: list[str] = []
    real_connection, real_check = pool.connection, pool.check

    def connection(*args: Any, **kwargs: Any) -> Any:
        taken.append("connection")
        return real_connection(*args, **kwargs)

    def check() -> None:
        checks.append("check")
        real_check()

    try:
        with real_connection():  # the pool's only connection is busy
            pool.connection = connection  # type: ignore[method-assign]
            pool.check = check  # type: ignore[method-assign]
            with pytest.raises(BackendUnavailable, match=r"(?i)pool|connection"):
                store.get("x")
            assert taken == ["connection"]  # a read is retried, but not after a full pool
            taken.clear()
            store.wait_for_due(0.2)  # not an error: the wait is cut short
            assert taken == ["connection"]
        assert checks == []  # the server is fine: no connection is dropped
        pool.connection = real_connection  # type: ignore[method-assign]
        assert store.get("x") is None
    finally:
        store.close()
