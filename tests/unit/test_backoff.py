"""Backoff policies: exponential with cap and seeded jitter, explicit schedules, specs."""

from __future__ import annotations

import math
import random

import pytest

from delayq import ExponentialBackoff, InvalidDelay, InvalidOption, ScheduleBackoff
from delayq.backoff import Backoff, backoff_from_spec, parse_duration


def test_exponential_doubles_from_the_base() -> None:
    policy = ExponentialBackoff(base=0.05, factor=2, cap=10)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.05, 0.1, 0.2, 0.4])


def test_exponential_stops_at_the_cap() -> None:
    policy = ExponentialBackoff(base=1, factor=3, cap=20)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [1, 3, 9, 20, 20]


@pytest.mark.parametrize(
    ("base", "factor", "cap", "expected"),
    [
        (0.5, 2, 3, [0.5, 1, 2, 3, 3]),  # the cap is reached from the base, not from 1
        (0.25, 2, 0.9, [0.25, 0.5, 0.9, 0.9]),
        (3, 2, 20, [3, 6, 12, 20, 20]),
        (10, 10, 1000, [10, 100, 1000, 1000]),
    ],
)
def test_the_cap_applies_to_base_times_factor_powers_for_any_base(
    base: float, factor: float, cap: float, expected: list[float]
) -> None:
    policy = ExponentialBackoff(base=base, factor=factor, cap=cap)
    assert [policy.delay(n) for n in range(1, len(expected) + 1)] == pytest.approx(expected)


@pytest.mark.parametrize("attempt", [10**3, 10**6, 10**18])
def test_a_huge_attempt_number_returns_the_cap_without_overflow(attempt: int) -> None:
    assert ExponentialBackoff(base=1, factor=2, cap=3600).delay(attempt) == 3600
    assert ExponentialBackoff(base=1, factor=1e308, cap=1e308).delay(attempt) == 1e308


def test_a_slow_factor_reaches_the_cap_only_when_the_arithmetic_says_so() -> None:
    policy = ExponentialBackoff(base=0.001, factor=1.0001, cap=5)
    assert policy.delay(1000) == pytest.approx(0.001 * 1.0001**999)
    assert policy.delay(10**6) == 5


def test_factor_one_is_a_constant_delay_and_base_zero_is_no_delay() -> None:
    assert ExponentialBackoff(base=2, factor=1, cap=10).delay(10**6) == 2
    assert ExponentialBackoff(base=0, factor=2, cap=10).delay(7) == 0


def test_full_jitter_is_reproducible_with_a_seeded_rng_and_within_range() -> None:
    a = ExponentialBackoff(base=1, cap=100, jitter="full", rng=random.Random(42))
    b = ExponentialBackoff(base=1, cap=100, jitter="full", rng=random.Random(42))
    first = [a.delay(n) for n in range(1, 8)]
    assert first == [b.delay(n) for n in range(1, 8)]
    for n, d in enumerate(first, start=1):
        assert 0 <= d <= min(100, 2 ** (n - 1))
    expected = random.Random(42).uniform(0.0, 1.0)
    assert ExponentialBackoff(base=1, jitter="full", rng=random.Random(42)).delay(1) == expected


def test_equal_jitter_keeps_at_least_half_the_delay() -> None:
    policy = ExponentialBackoff(base=8, cap=8, jitter="equal", rng=random.Random(1))
    draws = [policy.delay(1) for _ in range(200)]
    assert all(4 <= d <= 8 for d in draws)
    assert len(set(draws)) > 100


def test_jitter_at_a_huge_attempt_stays_within_the_cap() -> None:
    policy = ExponentialBackoff(base=1, cap=60, jitter="full", rng=random.Random(0))
    assert 0 <= policy.delay(10**6) <= 60


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"base": -1}, "base"),
        ({"base": 10, "cap": 5}, "cap"),
        ({"factor": 0.5}, "factor"),
        ({"jitter": "lots"}, "jitter"),
    ],
)
def test_exponential_rejects_options_out_of_range(options: dict[str, object], word: str) -> None:
    with pytest.raises(InvalidOption, match=word):
        ExponentialBackoff(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1"])
def test_exponential_rejects_non_numbers(bad: object) -> None:
    with pytest.raises(InvalidDelay):
        ExponentialBackoff(base=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2"])
def test_attempt_numbers_start_at_one(bad: object) -> None:
    with pytest.raises(InvalidOption, match="attempt"):
        ExponentialBackoff().delay(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="attempt"):
        ScheduleBackoff((1,)).delay(bad)  # type: ignore[arg-type]


def test_schedule_text_equals_the_schedule_as_data() -> None:
    parsed = ScheduleBackoff.parse("2s,5s,10s,20s")
    assert parsed == ScheduleBackoff((2, 5, 10, 20))
    assert parsed == ScheduleBackoff.parse([2, 5, 10, 20])
    assert [parsed.delay(n) for n in (1, 2, 3, 4)] == [2, 5, 10, 20]


def test_schedule_reuses_the_last_delay_past_its_end() -> None:
    policy = ScheduleBackoff.parse("2s, 5s")
    assert [policy.delay(n) for n in (3, 10, 10**6)] == [5, 5, 5]


def test_schedule_reads_every_unit() -> None:
    policy = ScheduleBackoff.parse("250ms,3,1.5m,2h,1d")
    assert policy.delays == (0.25, 3.0, 90.0, 7200.0, 86400.0)


@pytest.mark.parametrize("bad", ["", " , ", "2x", "-1s", "fast"])
def test_schedule_rejects_unreadable_text(bad: str) -> None:
    with pytest.raises(InvalidOption):
        ScheduleBackoff.parse(bad)


def test_schedule_rejects_negative_and_non_numeric_delays() -> None:
    with pytest.raises(InvalidOption, match=">= 0"):
        ScheduleBackoff((1, -2))
    with pytest.raises(InvalidDelay):
        ScheduleBackoff((1, math.nan))


def test_parse_duration_names_the_bad_text() -> None:
    assert parse_duration(" 5m ") == 300
    with pytest.raises(InvalidOption, match="'5 minutes'"):
        parse_duration("5 minutes")


@pytest.mark.parametrize(
    "policy",
    [
        ExponentialBackoff(base=0.5, factor=3, cap=30, jitter="equal"),
        ScheduleBackoff((2, 5, 10, 20)),
    ],
)
def test_a_policy_round_trips_through_its_spec(policy: Backoff) -> None:
    assert backoff_from_spec(policy.to_spec()) == policy


def test_backoff_from_spec_reads_what_users_give() -> None:
    assert backoff_from_spec(None) == ExponentialBackoff()
    assert backoff_from_spec("2s,5s") == ScheduleBackoff((2, 5))
    assert backoff_from_spec([1, 2]) == ScheduleBackoff((1, 2))
    policy = ExponentialBackoff(base=3)
    assert backoff_from_spec(policy) is policy
    with pytest.raises(InvalidOption, match="unknown backoff kind"):
        backoff_from_spec({"kind": "linear"})
    with pytest.raises(InvalidOption, match="cannot use"):
        backoff_from_spec(42)  # type: ignore[arg-type]
