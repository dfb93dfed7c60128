"""PostgreSQL enqueue beside other transactions: no locks held for workers to wait on."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from delayq.backends.base import Completion
from delayq.backends.postgres import PostgresBackend
from delayq.backends.postgres._wake import channel_name
from delayq.job import EnqueueOutcome, JobSpec
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


@pytest.fixture
def caller() -> Iterator[psycopg.Connection[Any]]:
    c = admin()
    c.autocommit = False
    yield c
    c.rollback()
    c.close()


def spec(job_id: str, delay: float = 0.0) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload=json.dumps({}), run_at=0.0, delay=delay)


def _in_thread(call: Any) -> tuple[threading.Event, list[Any]]:
    done, out = threading.Event(), []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            out.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_a_callers_open_transaction_that_kept_jobs_blocks_no_worker(
    backend: PostgresBackend, caller: psycopg.Connection[Any]
) -> None:
    backend.enqueue([spec("x")])
    [running] = backend.claim(limit=1, lease=30)
    backend.enqueue([spec("y")])
    kept = backend.enqueue([spec("x"), spec("y")], on_conflict="keep", connection=caller)
    assert kept == [EnqueueOutcome.KEPT, EnqueueOutcome.KEPT]

    def worker() -> list[str]:  # what the dispatcher, lease keeper and committer do
        renewed = backend.extend(running, 30)
        claimed = [c.job.id for c in backend.claim(limit=5, lease=30)]
        assert backend.complete([Completion.ack(renewed)]) == [None]
        return claimed

    done, out = _in_thread(worker)
    try:
        assert done.wait(30), "the worker waited for the caller's transaction"
    finally:
        caller.rollback()  # (lets a blocked worker go on)
    assert out == [["y"]]


def test_keep_keeps_an_id_another_producer_inserts_meanwhile(
    backend: PostgresBackend, schema: str
) -> None:
    backend.enqueue([spec("old", delay=60)])
    other = admin()
    other.autocommit = False
    try:
        other.execute(  # another producer's insert of "x", not committed yet
            f'INSERT INTO "{schema}".jobs (queue, id, name, payload, run_at, state, '
            f"max_attempts, backoff, misfire, created_at, updated_at) VALUES "
            f"('default', 'x', 't', '{{}}', 1, 'scheduled', 1, '{{}}', 'none', 1, 1)"
        )
        done, out = _in_thread(
            lambda: backend.enqueue([spec("old"), spec("x")], on_conflict="keep")
        )
        with admin() as c:  # our insert of "x" waits on the other transaction

            def waiting() -> bool:
                row = c.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND wait_event_type = 'Lock'",
                    (app_name(schema),),
                ).fetchone()
                return row is not None and row[0] > 0

            assert wait_until(waiting, timeout=30) or done.is_set()
        other.commit()
        assert done.wait(30)
    finally:
        other.close()
    assert out == [[EnqueueOutcome.KEPT, EnqueueOutcome.KEPT]]


def test_many_schedules_in_one_transaction_send_one_wake_up(
    backend: PostgresBackend, schema: str, caller: psycopg.Connection[Any]
) -> None:
    channel = channel_name(schema, "default")
    with admin() as listener:
        listener.execute(f'LISTEN "{channel}"')
        for i in range(50):
            backend.enqueue([spec(f"j{i}", delay=60 + i)], connection=caller)
        backend.enqueue([spec("early", delay=30)], connection=caller)  # earlier: told again
        caller.commit()
        with admin() as other:  # committed after the caller: heard after its wake-ups
            other.execute(f"NOTIFY \"{channel}\", 'end'")
        heard: list[str] = []

        def ended() -> bool:
            heard.extend(n.payload for n in listener.notifies(timeout=0.1))
            return "end" in heard

        assert wait_until(ended, timeout=30)
    assert len(heard) == 3  # the first call's, the earlier one's, the marker
