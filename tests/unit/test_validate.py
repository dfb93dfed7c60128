"""Shared input checks: seconds, aware datetimes, job ids."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from delayq import InvalidDelay, InvalidJobId, InvalidOption
from delayq._validate import (
    MAX_JOB_ID_LENGTH,
    check_datetime,
    check_duration,
    check_int,
    check_job_id,
    check_limit,
    check_seconds,
)


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


@pytest.mark.parametrize(
    ("value", "minimum", "maximum"), [(1, 1, None), (0, 0, None), (7, 2, 7), (10**30, 1, None)]
)
def test_check_int_returns_an_int_in_range(value: int, minimum: int, maximum: int | None) -> None:
    assert check_int(value, "n", minimum=minimum, maximum=maximum) is value


def test_check_int_accepts_an_int_subclass() -> None:
    class Count(int):
        pass

    assert check_int(Count(3), "n", minimum=1) == 3


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (True, {"minimum": 0}, "n must be an int >= 0, got True"),
        (False, {"minimum": 0}, "n must be an int >= 0, got False"),
        (1.0, {"minimum": 1}, "n must be an int >= 1, got 1.0"),
        ("3", {"minimum": 1}, "n must be an int >= 1, got '3'"),
        (None, {"minimum": 1}, "n must be an int >= 1, got None"),
        (0, {"minimum": 1}, "n must be an int >= 1, got 0"),
        (8, {"minimum": 1, "maximum": 7}, "n must be an int >= 1 and <= 7, got 8"),
        ("x", {"minimum": 1, "none_ok": True}, "n must be None or an int >= 1, got 'x'"),
        (-1, {"minimum": 0, "note": " (0: no cap)"}, "n must be an int >= 0 (0: no cap), got -1"),
    ],
)
def test_check_int_refuses_bools_non_ints_and_out_of_range_naming_the_field(
    value: object, kwargs: Any, message: str
) -> None:
    with pytest.raises(InvalidOption) as info:
        check_int(value, "n", **kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "expected"), [(timedelta(minutes=2), 120.0), (5, 5.0), (0.5, 0.5)]
)
def test_check_duration_takes_a_timedelta_or_seconds(value: object, expected: float) -> None:
    assert check_duration(value, "every") == expected


def test_check_duration_names_the_field() -> None:
    with pytest.raises(InvalidDelay, match="every must be a number of seconds"):
        check_duration("5m", "every")


def test_check_limit_is_an_int_of_at_least_one() -> None:
    assert check_limit(1) == 1
    with pytest.raises(InvalidOption, match=r"^limit must be an int >= 1, got 0$"):
        check_limit(0)
