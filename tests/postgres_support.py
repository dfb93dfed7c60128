"""PostgreSQL for tests: the shared server's URL, one schema per test, and cleanup.

Tests use the server at ``DELAYQ_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), each in its own schema that is
dropped afterwards; they never touch another schema. Backends opened by tests
carry the application name :data:`APP_NAME` plus the schema, so a test that
terminates server backends selects only its own.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from tests.conftest import service_missing

POSTGRES_URL = os.environ.get("DELAYQ_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
APP_NAME = "delayq-test"

_users: dict[str, int] = {}  # schema -> open pg_schema() contexts (dropped by the last)
_users_lock = threading.Lock()


def admin() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection; skips (or fails in CI) when the server does not answer."""
    try:
        return psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        service_missing("PostgreSQL", f"{POSTGRES_URL}: {exc}")
        raise AssertionError("unreachable") from exc


def schema_name(seed: str | None = None) -> str:
    """A schema name no other test uses (stable for one ``seed``)."""
    if seed is None:
        seed = uuid.uuid4().hex
    return "dq_test_" + hashlib.sha1(seed.encode()).hexdigest()[:16]


def drop_schema(schema: str) -> None:
    assert schema.startswith("dq_test_"), schema  # never anything but a test's own
    with admin() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def pg_schema(seed: str | None = None) -> Iterator[str]:
    """A schema name for this test; the schema is dropped when the last user leaves."""
    admin().close()  # skip early when the server is absent
    schema = schema_name(seed)
    with _users_lock:
        _users[schema] = _users.get(schema, 0) + 1
    try:
        yield schema
    finally:
        with _users_lock:
            _users[schema] -= 1
            last = _users[schema] == 0
            if last:
                del _users[schema]
        if last:
            drop_schema(schema)


def app_name(schema: str) -> str:
    """The application_name of the test backends of ``schema``."""
    return f"{APP_NAME}-{schema}"[:63]


def terminate_backends(schema: str) -> int:
    """``pg_terminate_backend`` every server backend of this test's schema; how many."""
    with admin() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (app_name(schema),),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)
