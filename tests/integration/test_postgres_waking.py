"""PostgreSQL waits: a claim racing an enqueue, and waits while LISTEN is down."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import psycopg
import pytest

import delayq.backends.postgres._wake as wake
from delayq.backends.postgres import PostgresBackend
from delayq.backends.postgres._wake import FALLBACK_WAIT
from delayq.job import JobSpec
from delayq.testing import FakeClock
from tests._util import wait_until
from tests.postgres_support import POSTGRES_URL, admin, app_name, pg_schema

pytestmark = [pytest.mark.postgres]

_LOCK_KEY = 802_271  # the advisory lock that holds the claim's commit open


@pytest.fixture
def schema() -> Iterator[str]:
    with pg_schema() as name:
        yield name


def spec(job_id: str, delay: float) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload=json.dumps({}), run_at=0.0, delay=delay)


def _hold_claim_commits(schema: str) -> None:
    """A deferred trigger: a claim's commit waits for the advisory lock the test holds."""
    with admin() as c:
        c.execute(
            f'CREATE FUNCTION "{schema}".hold() RETURNS trigger LANGUAGE plpgsql AS '
            f"$$BEGIN PERFORM pg_advisory_xact_lock_shared({_LOCK_KEY}); RETURN NULL; END$$"
        )
        c.execute(
            f'CREATE CONSTRAINT TRIGGER hold AFTER UPDATE ON "{schema}".jobs '
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
            "WHEN (OLD.state = 'scheduled' AND NEW.state = 'running') "
            f'EXECUTE FUNCTION "{schema}".hold()'
        )


def _waiting_on_the_lock(schema: str) -> bool:
    with admin() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
            (app_name(schema),),
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_job_committed_while_a_claim_commits_wakes_the_claiming_worker(schema: str) -> None:
    worker = PostgresBackend(POSTGRES_URL, schema=schema, application_name=app_name(schema))
    producer = PostgresBackend(POSTGRES_URL, schema=schema, application_name="delayq-producer")
    holder = admin()
    try:
        _hold_claim_commits(schema)
        worker.wait_for_due(0)  # its listener is up, as in a running worker
        assert wait_until(lambda: worker._listener is not None and worker._listener.listening)
        producer.enqueue([spec("h1", delay=0)])
        holder.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        claimed: list[str] = []
        woke = threading.Event()

        def dispatcher() -> None:  # claim, then wait: one thread, as in the worker
            claimed.extend(c.job.id for c in worker.claim(limit=1, lease=3600))
            worker.wait_for_due(600)
            woke.set()

        thread = threading.Thread(target=dispatcher, daemon=True)
        thread.start()
        assert wait_until(lambda: _waiting_on_the_lock(schema), timeout=30)
        # The claim of h1 is not committed yet: h1 still looks like the head, so
        # the producer's own check sends no wake-up for j2.
        producer.enqueue([spec("j2", delay=0)])
        holder.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
        assert woke.wait(60), "the worker slept although j2 was due"
        assert claimed == ["h1"]
        assert [c.job.id for c in worker.claim(limit=1, lease=30)] == ["j2"]
    finally:
        holder.close()
        worker.interrupt()
        worker.close()
        producer.close()


def _refuse() -> psycopg.Connection[tuple[object, ...]]:
    raise psycopg.OperationalError("FATAL: sorry, too many clients already")


def test_a_wait_after_a_claim_still_sleeps_while_listen_is_down(schema: str) -> None:
    clock = FakeClock()
    store = PostgresBackend(
        POSTGRES_URL, schema=schema, clock=clock, application_name=app_name(schema)
    )
    try:
        store.enqueue([spec("far", delay=3600)])
        store.wait_for_due(0)
        listener = store._listener
        assert listener is not None and wait_until(lambda: listener.listening)
        listener._connect = _refuse  # new connections are refused (max_connections)
        with admin() as c:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND query LIKE 'LISTEN%%'",
                (app_name(schema),),
            )
        assert wait_until(lambda: not listener.listening, timeout=30)
        done = threading.Event()

        def dispatcher() -> None:
            store.claim(limit=8, lease=30)  # leaves its read of the schedule for the wait
            store.wait_for_due(10)
            done.set()

        threading.Thread(target=dispatcher, daemon=True).start()
        assert wait_until(lambda: done.is_set() or clock.waiters() >= 1, timeout=30)
        assert not done.is_set(), "the wait returned at once: claim and wait would spin"
        deadline = clock.next_deadline()
        assert deadline is not None and deadline - clock.monotonic() <= FALLBACK_WAIT
        clock.advance(FALLBACK_WAIT)
        assert done.wait(30)
    finally:
        store.close()


class _QuietConnection:
    """A LISTEN connection that never hears anything; records what it is sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.idle_polls = threading.Semaphore(0)

    def execute(self, query: str) -> None:
        self.sent.append(query)

    def notifies(self, timeout: float) -> list[object]:
        self.idle_polls.release()
        return []

    def close(self) -> None:
        pass


def test_an_idle_listener_sends_a_heartbeat() -> None:
    quiet = _QuietConnection()
    real_poll = wake._POLL_STOP
    wake._POLL_STOP = 0.0
    listener = wake.Listener(lambda: quiet, "delayq_test")
    try:
        assert listener.start()
        assert wait_until(lambda: "SELECT 1" in quiet.sent, timeout=30)
        assert quiet.sent[0].startswith("LISTEN")
    finally:
        listener.close()
        wake._POLL_STOP = real_poll
