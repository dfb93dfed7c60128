"""The PostgreSQL store never raises after a commit: what follows it is best effort."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from delayq import DelayQ
from delayq.backends.base import Completion
from delayq.backends.postgres import PostgresBackend
from delayq.backends.postgres._claims import PostgresClaims
from delayq.errors import BackendUnavailable, StaleClaim
from delayq.job import JobSpec, JobState
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


def _break_the_wake_up(backend: PostgresBackend) -> None:
    """Every statement that could run after a commit (the wake-up, a read of stale
    claims) fails from now on."""
    backend._sql = dataclasses.replace(
        backend._sql, head_check="SELECT 1 / 0", stale="SELECT 1 / 0"
    )


def _rows(schema: str) -> list[tuple[object, ...]]:
    with admin() as c:
        return c.execute(f'SELECT id, state FROM "{schema}".jobs ORDER BY id').fetchall()


def test_schedule_returns_its_id_when_the_wake_up_after_its_commit_fails(schema: str) -> None:
    with DelayQ(POSTGRES_URL, schema=schema) as app:
        assert isinstance(app.backend, PostgresBackend)
        _break_the_wake_up(app.backend)
        job_id = app.schedule("order.cancel", {"order": 42}, delay=1800)
        assert _rows(schema) == [(job_id, "scheduled")]  # stored once, and reported so


def test_reschedule_requeue_and_completions_report_what_they_committed(
    backend: PostgresBackend, schema: str
) -> None:
    backend.enqueue([spec("r", delay=3600), spec("d"), spec("c"), spec("cc")])
    _break_the_wake_up(backend)
    assert backend.reschedule("r", delay=1800).done
    claims = {c.job.id: c for c in backend.claim(limit=3, lease=30)}
    backend.bury(claims["d"], "boom")
    assert backend.requeue_dead("d", delay=60) is True
    retried, stale = backend.complete(
        [Completion.retry(claims["c"], 1.0, "again"), Completion.ack(claims["d"])]
    )
    assert retried is None and isinstance(stale, StaleClaim) and "'d'" in str(stale)
    answers, _ = backend.complete_and_claim(
        [Completion.retry(claims["cc"], 1.0, "again")], limit=1, lease=30
    )
    assert answers == [None]
    assert dict(_rows(schema))["r"] == "scheduled"
    job = backend.get("d")
    assert job is not None and job.state is JobState.SCHEDULED


def test_a_repeated_completion_is_refused_as_already_recorded_not_as_expired(
    backend: PostgresBackend,
) -> None:
    backend.enqueue([spec("a")])
    [claim] = backend.claim(limit=1, lease=30)
    assert backend.complete([Completion.ack(claim)]) == [None]
    [again] = backend.complete([Completion.ack(claim)])  # a retry after a lost reply
    assert isinstance(again, StaleClaim)
    assert "already completed" in str(again) and "expired" not in str(again)


def test_a_claim_whose_reply_was_lost_returns_its_jobs_on_the_retry(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 11: the claim committed, its reply never arrived; the retry finds
    that call's jobs by its request id, so no attempt is spent on nobody."""
    backend.enqueue([dataclasses.replace(spec("once"), max_attempts=1), spec("later", 3600)])
    received = PostgresClaims._claims
    lost: list[int] = []

    def lose_the_first_reply(store: Any, conn: Any, rows: list[Any]) -> list[Any]:
        if not lost:
            lost.append(len(rows))
            raise psycopg.OperationalError("consuming input failed: the reply was lost")
        return received(store, conn, rows)

    monkeypatch.setattr(PostgresClaims, "_claims", lose_the_first_reply)
    [claim] = backend.claim(limit=5, lease=30)
    assert lost == [1]  # the first call had claimed it
    assert claim.job.id == "once" and claim.job.attempts == 1
    assert backend.complete([Completion.ack(claim)]) == [None]
    job = backend.get("once")
    assert job is not None and job.state is JobState.SUCCEEDED


def test_a_claim_retried_after_a_failure_before_its_commit_claims_afresh(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.enqueue([spec("a")])
    sent = PostgresClaims._claim_once
    failed: list[bool] = []

    def fail_before_sending(store: Any, params: dict[str, Any]) -> list[Any]:
        if not failed:
            failed.append(True)
            raise BackendUnavailable("the connection broke before the claim was sent")
        return sent(store, params)

    monkeypatch.setattr(PostgresClaims, "_claim_once", fail_before_sending)
    [claim] = backend.claim(limit=5, lease=30)
    assert failed == [True] and claim.job.id == "a" and claim.job.attempts == 1


def _lose_the_first_reply_after_commit(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> list[bool]:
    """The first call's last step after its commit fails as a lost reply would."""
    told = backend._told
    lost: list[bool] = []

    def lose(conn: Any, at: float | None) -> None:
        if not lost:
            lost.append(True)
            raise psycopg.OperationalError("consuming input failed: the reply was lost")
        told(conn, at)

    monkeypatch.setattr(backend, "_told", lose)
    return lost


def test_a_completion_whose_reply_was_lost_is_applied_once_and_answered_applied(
    backend: PostgresBackend, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 12: the store's retry of a committed batch reports it applied, not stale."""
    backend.enqueue([spec("a"), spec("b")])
    claims = {c.job.id: c for c in backend.claim(limit=2, lease=30)}
    lost = _lose_the_first_reply_after_commit(backend, monkeypatch)
    answers = backend.complete(
        [Completion.ack(claims["a"]), Completion.retry(claims["b"], 60, "x")]
    )
    assert lost == [True] and answers == [None, None]
    assert dict(_rows(schema)) == {"a": "succeeded", "b": "scheduled"}


def test_a_complete_and_claim_whose_reply_was_lost_returns_its_claims_and_answers(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.enqueue([spec("done"), dataclasses.replace(spec("next"), max_attempts=1)])
    [first] = [c for c in backend.claim(limit=1, lease=30)]
    lost = _lose_the_first_reply_after_commit(backend, monkeypatch)
    answers, claims = backend.complete_and_claim([Completion.ack(first)], limit=5, lease=30)
    assert lost == [True] and answers == [None]
    assert [(c.job.id, c.job.attempts) for c in claims] == [("next", 1)]
    assert backend.complete([Completion.ack(claims[0])]) == [None]


def test_a_failed_claim_part_completes_alone_on_the_same_connection(schema: str) -> None:
    """Finding 21: with one pooled connection, the fallback does not wait for a second."""
    backend = PostgresBackend(
        POSTGRES_URL,
        schema=schema,
        application_name=app_name(schema),
        pool_size=1,
        connect_timeout=1,
    )
    try:
        backend.enqueue([spec("a"), spec("b", delay=3600)])
        [claim] = backend.claim(limit=1, lease=30)
        backend._sql = dataclasses.replace(backend._sql, claim="SELECT 1 / 0")
        answers, claims = backend.complete_and_claim([Completion.ack(claim)], limit=1, lease=30)
        assert answers == [None] and claims == []
        assert dict(_rows(schema))["a"] == "succeeded"
    finally:
        backend.close()


def test_the_callers_retry_of_acks_whose_call_failed_after_commit_is_answered_applied(
    backend: PostgresBackend, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 12: both attempts of the call lost their reply; the worker's own retry
    of the batch is told the acks are recorded, not that their leases expired."""
    backend.enqueue([spec("a")])
    [claim] = backend.claim(limit=1, lease=30)
    told = backend._told
    failures: list[bool] = []

    def lose_two(conn: Any, at: float | None) -> None:
        if len(failures) < 2:
            failures.append(True)
            raise psycopg.OperationalError("consuming input failed: the reply was lost")
        told(conn, at)

    monkeypatch.setattr(backend, "_told", lose_two)
    with pytest.raises(BackendUnavailable):
        backend.complete([Completion.ack(claim)])
    assert backend.complete([Completion.ack(claim)]) == [None]  # the worker's retry
    [again] = backend.complete([Completion.ack(claim)])  # a true repeat is still refused
    assert isinstance(again, StaleClaim) and "already completed" in str(again)
    assert dict(_rows(schema)) == {"a": "succeeded"}
