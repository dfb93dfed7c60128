"""decide() at its boundaries: each limit, default and message (what mutation testing asks)."""

from __future__ import annotations

import traceback

import pytest

from delayq.backends.base import Completion
from delayq.job import JobState, Misfire
from delayq.worker._decide import (
    DEFAULT_UNKNOWN_HANDLER_GRACE,
    MAX_ERROR_CHARS,
    Decision,
    _cut,
    decide,
    format_error,
    timeout_error,
)
from tests.unit.test_worker_decide import T0, claim


def test_a_success_exactly_at_the_slow_note_limit_has_no_note() -> None:
    at_limit = claim(claimed_at=T0 + Misfire.SKIP_GRACE)
    assert decide(at_limit, T0 + 10, ran=True) == Decision("succeeded")
    past = claim(claimed_at=T0 + Misfire.SKIP_GRACE + 0.001)
    assert decide(past, T0 + 10, ran=True) == Decision(
        "succeeded", note="ran 1.001s late (misfire policy run)"
    )


def test_a_failure_before_the_last_attempt_is_retried_and_past_it_dead() -> None:
    before_last = decide(claim(attempt=2, max_attempts=3), T0, ran=True, error="e")
    assert before_last is not None and before_last.outcome == "retried"
    past_last = decide(claim(attempt=4, max_attempts=3), T0, ran=True, error="e")
    assert past_last == Decision("dead", error="e")


def test_the_first_retry_uses_the_first_backoff_delay() -> None:
    assert decide(claim(attempt=1), T0, ran=True, error="e") == Decision(
        "retried", error="e", retry_at=T0 + 2
    )


def test_the_default_unknown_handler_grace_is_five_minutes() -> None:
    assert DEFAULT_UNKNOWN_HANDLER_GRACE == 300.0
    within = decide(claim(), T0 + 299.9, ran=False, handler_known=False)
    assert within is not None and within.outcome == "retried"
    at = decide(claim(), T0 + 300, ran=False, handler_known=False)
    assert at is not None and at.outcome == "dead"


def test_an_unknown_handler_retry_says_until_when_and_since_when() -> None:
    d = decide(claim(name="mail"), T0, ran=False, handler_known=False, unknown_grace=60)
    assert d is not None and d.error == (
        "UnknownHandler: no handler is registered under 'mail' in this worker "
        "(registered: none); retried until 2023-11-14T22:14:20.000+00:00 in case a "
        "worker that knows it starts (rolling deploy) [unknown handler since epoch 1700000000.0]"
    )


def test_an_unknown_handler_dead_letter_says_how_long_and_how_to_requeue() -> None:
    d = decide(claim(name="mail"), T0 + 61.25, ran=False, handler_known=False, unknown_grace=60)
    assert d is not None and d.outcome == "dead"
    assert d.error == (
        "UnknownHandler: no handler is registered under 'mail' in this worker "
        "(registered: none); still unknown 61.2s after 2023-11-14T22:13:20.000+00:00 "
        "(unknown_handler_grace=60s). Requeue the job once a worker knows it"
    )


def test_an_unknown_handler_first_seen_later_than_due_counts_from_the_due_time() -> None:
    noted = "UnknownHandler: ... [unknown handler since epoch 1700000100.5]"
    c = claim(run_at=T0, last_error=noted)
    d = decide(c, T0 + 59, ran=False, handler_known=False, unknown_grace=60)
    assert d is not None and d.outcome == "retried" and d.retry_at == T0 + 60


def test_a_skip_note_names_the_policy_as_written_back() -> None:
    d = decide(claim(claimed_at=T0 + 7, misfire="grace:5"), T0 + 10, ran=False)
    # Judged when the handler would start (now), not at the claim.
    assert d == Decision("skipped", note="skipped: 10.000s late (misfire policy grace:5.0)")


def test_a_misfire_policy_that_cannot_be_read_names_the_parse_error() -> None:
    d = decide(claim(misfire="grace:-1"), T0, ran=False)
    assert d is not None and d.outcome == "dead"
    assert d.error is not None and d.error.startswith(
        "cannot read the job's misfire policy 'grace:-1': "
    )
    assert len(d.error) > len("cannot read the job's misfire policy 'grace:-1': ")


def test_a_backoff_that_cannot_be_read_keeps_the_error_first() -> None:
    d = decide(claim(backoff={"kind": "nonsense"}), T0, ran=True, error="boom")
    assert d is not None and d.error is not None
    assert d.error.startswith("boom\n\ncannot read the job's backoff {'kind': 'nonsense'}: ")


def test_each_completion_carries_its_note_error_and_due_time() -> None:
    c = claim()
    assert Decision("succeeded", note="late").completion(c) == Completion(
        c, JobState.SUCCEEDED, outcome="late"
    )
    assert Decision("skipped", note="n").completion(c) == Completion(
        c, JobState.SKIPPED, outcome="n"
    )
    assert Decision("retried", error="e", retry_at=T0 + 5).completion(c) == Completion.retry(
        c, T0 + 5, "e"
    )
    assert Decision("dead", error="e").completion(c) == Completion.bury(c, "e")


@pytest.mark.parametrize("outcome", ["stale", "error"])
def test_an_outcome_without_a_store_call_has_no_completion(outcome: str) -> None:
    with pytest.raises(AssertionError, match=f"no store call records the outcome '{outcome}'"):
        Decision(outcome).completion(claim())  # type: ignore[arg-type]


def test_an_error_text_is_cut_only_past_the_limit_and_keeps_both_halves() -> None:
    assert MAX_ERROR_CHARS == 16_000
    exact = "a" * MAX_ERROR_CHARS
    assert _cut(exact) == exact
    text = "h" * 8_000 + "m" * 5 + "t" * 8_000
    assert _cut(text) == "h" * 8_000 + "\n... [5 characters cut] ...\n" + "t" * 8_000


def test_a_timeout_error_says_the_attempt_failed_and_the_thread_is_left() -> None:
    assert timeout_error("mail", 2.5) == (
        "HandlerTimeout: handler 'mail' ran past its timeout of 2.5s; the attempt counts as "
        "failed (a sync handler's thread is left to finish and its result ignored)"
    )


def test_an_error_text_is_the_whole_traceback_without_its_final_newline() -> None:
    error = ValueError("boom")
    try:
        raise error
    except ValueError:
        text = format_error(error)
    assert text == "".join(traceback.format_exception(error)).rstrip("\n")
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("\nValueError: boom")
