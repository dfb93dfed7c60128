"""Policy written once for every store: URL options, the on_conflict table, counts."""

from __future__ import annotations

import pytest

from delayq.backends._common import conflict_error, resolve_conflicts
from delayq.backends._urls import UrlOptions, mask, merge_options, split_url
from delayq.errors import ConfigurationError, InvalidOption, JobConflict
from delayq.job import EnqueueOutcome, JobState, Stats
from tests.contract._support import spec

CREATED, KEPT, REPLACED = EnqueueOutcome.CREATED, EnqueueOutcome.KEPT, EnqueueOutcome.REPLACED


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:s3cret@h:6379/0?password=s3cret",
        "postgresql://u:s3cret@h/db?password=s3cret",
        "amqp://u:s3cret@h/vhost?sentinel_password=s3cret",
    ],
)
def test_every_password_is_masked_whatever_the_scheme(url: str) -> None:
    masked = mask(url)
    assert "s3cret" not in masked and "u:***@h" in masked


def test_split_url_keeps_the_driver_options_and_parses_ours() -> None:
    url, ours = split_url("redis://h/0?queue=q&socket_timeout=3", {"queue": str}, store="Redis")
    assert (url, ours) == ("redis://h/0?socket_timeout=3", {"queue": "q"})
    with pytest.raises(ConfigurationError, match="unknown sqlite URL option 'x'"):
        split_url("sqlite:///a.db?x=1", {"queue": str}, store="sqlite", strict=True)


def test_a_keyword_at_its_default_lets_the_url_decide() -> None:
    given = UrlOptions("redis://h/?queue=orders", {"queue": "orders"}, {"queue": "default"})
    assert given.pick("queue", "default") == "orders"
    assert given.pick("queue", "orders") == "orders"
    assert given.pick("prefix", "p") == "p"
    with pytest.raises(InvalidOption, match="queue='invoices' as a keyword"):
        given.pick("queue", "invoices")


def test_true_is_not_one_when_options_are_compared() -> None:
    with pytest.raises(InvalidOption, match="set twice"):
        merge_options("x://?n=1", {"n": 1}, {"n": True})
    assert merge_options("x://?n=1", {"n": 1.0}, {"n": 1, "m": 2}) == {"n": 1, "m": 2}


def test_the_on_conflict_table() -> None:
    a, b = spec("a", 1.0), spec("b", 1.0)
    stored = {"a": JobState.SCHEDULED}
    assert resolve_conflicts([a, b], stored, "keep") == ([KEPT, CREATED], {"b": b})
    assert resolve_conflicts([a, b], stored, "replace") == ([REPLACED, CREATED], {"a": a, "b": b})
    with pytest.raises(JobConflict, match="already exists \\(scheduled\\)"):
        resolve_conflicts([b, a], stored, "reject")
    with pytest.raises(JobConflict, match="is running and cannot be replaced"):
        resolve_conflicts([a], {"a": JobState.RUNNING}, "replace")
    assert resolve_conflicts([a], {"a": JobState.RUNNING}, "keep") == ([KEPT], {})


def test_an_id_twice_in_a_batch_meets_its_first_spec_and_keeps_the_last_place() -> None:
    a1, b, a2 = spec("a", 1.0), spec("b", 1.0), spec("a", 5.0)
    outcomes, final = resolve_conflicts([a1, b, a2], {}, "replace")
    assert outcomes == [CREATED, CREATED, REPLACED]
    assert list(final) == ["b", "a"] and final["a"] is a2
    with pytest.raises(JobConflict, match="already exists"):
        resolve_conflicts([a1, a2], {}, "reject")


def test_a_conflict_message_carries_the_note() -> None:
    error = conflict_error("j", "running", "replace", note=" (3 stored)")
    assert str(error).endswith("wait for it to finish (3 stored)")


def test_stats_from_counts_reads_a_count_per_state_value() -> None:
    stats = Stats.from_counts({"scheduled": 3, "dead": 1}, due=2, next_due=5.0)
    assert stats == Stats(scheduled=3, due=2, dead=1, next_due=5.0)
