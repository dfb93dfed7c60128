"""Shared input checks: seconds, aware datetimes, job ids."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

import pytest

from delayq import InvalidDelay, InvalidJobId
from delayq._validate import MAX_JOB_ID_LENGTH, check_datetime, check_job_id, check_seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0.0), (5, 5.0), (2.5, 2.5), (-3, -3.0), (Fraction(1, 4), 0.25), (10**20, 1e20)],
)
def test_real_numbers_are_seconds(value: object, expected: float) -> None:
    seconds = check_seconds(value)
    assert seconds == expected
    assert type(seconds) is float


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, True, False, "5", "5s", None, [1], 1j, Decimal("1")]
)
def test_non_numbers_and_non_finite_numbers_are_invalid_delays_naming_the_value(
    bad: object,
) -> None:
    with pytest.raises(InvalidDelay) as info:
        check_seconds(bad, "retry_in")
    message = str(info.value)
    assert "retry_in" in message
    assert repr(bad) in message


def test_aware_datetimes_become_epoch_seconds() -> None:
    moment = datetime(2024, 1, 1, tzinfo=UTC)
    assert check_datetime(moment) == 1704067200.0
    paris_winter = timezone(timedelta(hours=1))
    assert check_datetime(datetime(2024, 1, 1, 1, tzinfo=paris_winter)) == 1704067200.0
    assert check_datetime(1704067200) == 1704067200.0


def test_a_naive_datetime_is_rejected_with_how_to_fix_it() -> None:
    with pytest.raises(InvalidDelay, match="naive datetime; give it a timezone"):
        check_datetime(datetime(2024, 1, 1), "run_at")
    with pytest.raises(InvalidDelay):
        check_datetime(math.nan)


@pytest.mark.parametrize("good", ["a", "order-42:cancel", "ü" * 10, "x" * MAX_JOB_ID_LENGTH])
def test_valid_job_ids_are_returned(good: str) -> None:
    assert check_job_id(good) == good


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (42, "must be a str"),
        ("", "must not be empty"),
        ("x" * (MAX_JOB_ID_LENGTH + 1), "at most 255"),
        ("a\nb", "control characters"),
        ("a\x7fb", "control characters"),
        ("a\x85b", "control characters"),
        ("a\ud800", "not valid UTF-8 text"),
        ("\udfffb", "not valid UTF-8 text"),
    ],
)
def test_invalid_job_ids_say_why(bad: object, why: str) -> None:
    with pytest.raises(InvalidJobId, match=why):
        check_job_id(bad)
