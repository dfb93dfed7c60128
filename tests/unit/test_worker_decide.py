"""decide(): every rule that ends an attempt, as a table (no threads, no store)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from delayq.backends.base import Completion
from delayq.job import Claim, Job, JobState
from delayq.worker._decide import Decision, decide, format_error, timeout_error

T0 = 1_700_000_000.0


def claim(
    *,
    attempt: int = 1,
    max_attempts: int = 3,
    run_at: float = T0,
    claimed_at: float = T0,
    backoff: dict[str, Any] | None = None,
    misfire: str = "run",
    last_error: str | None = None,
    name: str = "x",
) -> Claim:
    job = Job(
        id="j1",
        name=name,
        payload=None,
        run_at=run_at,
        state=JobState.RUNNING,
        attempts=attempt,
        max_attempts=max_attempts,
        backoff={"kind": "schedule", "delays": [2, 5]} if backoff is None else backoff,
        misfire=misfire,
        created_at=T0 - 60,
        updated_at=claimed_at,
        last_error=last_error,
    )
    return Claim(job, token=7, lease_until=claimed_at + 30, claimed_at=claimed_at)


@pytest.mark.parametrize(
    ("case", "kwargs", "facts", "expected"),
    [
        ("run it", {}, {"ran": False}, None),
        ("success", {}, {"ran": True}, Decision("succeeded")),
        (
            "a late success is noted",
            {"claimed_at": T0 + 3},
            {"ran": True},
            Decision("succeeded", note="ran 3.000s late (misfire policy run)"),
        ),
        (
            "a failure is retried after the backoff of this attempt",
            {"attempt": 2},
            {"ran": True, "error": "boom"},
            Decision("retried", error="boom", retry_at=T0 + 10 + 5),
        ),
        (
            "the last failure is dead-lettered",
            {"attempt": 3},
            {"ran": True, "error": "boom"},
            Decision("dead", error="boom"),
        ),
        (
            "overdue at its start beyond misfire skip is skipped, however early the claim",
            {"claimed_at": T0 + 0.5, "misfire": "skip"},
            {"ran": False},
            Decision("skipped", note="skipped: 10.000s late (misfire policy skip)"),
        ),
        (
            "within the misfire grace at its start it runs",
            {"claimed_at": T0 + 3, "misfire": "grace:15.0"},
            {"ran": False},
            None,
        ),
        (
            "a success is noted late by its start, not by its claim",
            {"claimed_at": T0},
            {"ran": True, "started_at": T0 + 4},
            Decision("succeeded", note="ran 4.000s late (misfire policy run)"),
        ),
    ],
)
def test_decide_table(
    case: str, kwargs: dict[str, Any], facts: dict[str, Any], expected: Decision | None
) -> None:
    c = claim(**kwargs)
    assert decide(c, T0 + 10, **facts) == expected, case


def test_an_unreadable_backoff_dead_letters_with_both_errors() -> None:
    d = decide(claim(backoff={"kind": "nonsense"}), T0, ran=True, error="boom")
    assert d is not None and d.outcome == "dead"
    assert d.error is not None and d.error.startswith("boom") and "cannot read" in d.error


def test_an_unreadable_misfire_policy_dead_letters() -> None:
    d = decide(claim(misfire="sometimes"), T0, ran=False)
    assert d is not None and d.outcome == "dead"
    assert "cannot read the job's misfire policy 'sometimes'" in (d.error or "")


def test_an_unknown_handler_is_retried_within_the_grace_then_dead() -> None:
    first = decide(
        claim(), T0, ran=False, handler_known=False, registered=["b", "a"], unknown_grace=60
    )
    assert first is not None and (first.outcome, first.retry_at) == ("retried", T0 + 2)
    assert "registered: a, b" in (first.error or "")
    # The retry notes when the name was first unknown; later attempts measure from there.
    later = claim(attempt=2, run_at=T0 + 50, claimed_at=T0 + 50, last_error=first.error)
    second = decide(later, T0 + 50, ran=False, handler_known=False, unknown_grace=60)
    assert second is not None and second.retry_at == T0 + 55
    capped = claim(attempt=2, run_at=T0 + 58, claimed_at=T0 + 58, last_error=first.error)
    third = decide(capped, T0 + 58, ran=False, handler_known=False, unknown_grace=60)
    assert third is not None and third.retry_at == T0 + 60  # never past the grace
    over = claim(attempt=9, run_at=T0 + 60, claimed_at=T0 + 60, last_error=first.error)
    last = decide(over, T0 + 60, ran=False, handler_known=False, unknown_grace=60)
    assert last is not None and last.outcome == "dead"
    assert "still unknown 60.0s after" in (last.error or "")


def test_a_zero_grace_dead_letters_an_unknown_handler_at_once() -> None:
    d = decide(claim(), T0, ran=False, handler_known=False, unknown_grace=0)
    assert d is not None and d.outcome == "dead" and "UnknownHandler" in (d.error or "")


@pytest.mark.parametrize(
    ("decision", "state"),
    [
        (Decision("succeeded"), JobState.SUCCEEDED),
        (Decision("skipped", note="n"), JobState.SKIPPED),
        (Decision("retried", error="e", retry_at=T0 + 1), JobState.SCHEDULED),
        (Decision("dead", error="e"), JobState.DEAD),
    ],
)
def test_each_decision_is_one_store_call(decision: Decision, state: JobState) -> None:
    completion = decision.completion(claim())
    assert isinstance(completion, Completion) and completion.state is state
    assert not completion.released


def test_returned_is_a_release() -> None:
    assert Decision("returned").completion(claim()).released


def test_an_error_text_keeps_its_traceback_and_is_cut_in_the_middle() -> None:
    try:
        raise ValueError("x" * 40_000)
    except ValueError as exc:
        text = format_error(exc)
    assert text.startswith("Traceback") and "characters cut" in text and len(text) < 17_000


def test_a_timeout_error_names_the_handler_and_the_limit() -> None:
    assert "handler 'mail' ran past its timeout of 2.5s" in timeout_error("mail", 2.5)


def test_decide_does_not_change_the_claim() -> None:
    c = claim()
    before = replace(c)
    decide(c, T0, ran=True, error="boom")
    assert c == before


def test_an_unknown_handler_is_handed_back_with_its_attempt_where_the_store_can() -> None:
    d = decide(claim(attempt=3), T0, ran=False, handler_known=False, keep_attempt=True)
    assert d is not None and d.outcome == "retried" and d.keep_attempt
    assert d.retry_at == T0 + 5  # the job's backoff still paces the hand-backs
    completion = d.completion(claim(attempt=3))
    assert completion.released and completion.run_at == T0 + 5
    assert "UnknownHandler" in (completion.error or "")


def test_misfire_and_lateness_are_judged_on_the_due_time_the_store_reports() -> None:
    # A store whose producer's clock set run_at 3 s behind its own reports the due time
    # on the claim's clock (RabbitMQ); the job is on time by it.
    c = replace(claim(run_at=T0 - 3, claimed_at=T0, misfire="skip"), due_at=T0)
    assert c.due == T0 and c.context().run_at == T0
    assert decide(c, T0 + 0.5, ran=False) is None
    assert decide(c, T0 + 0.5, ran=True) == Decision("succeeded")
    assert decide(claim(run_at=T0 - 3, misfire="skip"), T0, ran=False) == Decision(
        "skipped", note="skipped: 3.000s late (misfire policy skip)"
    )
