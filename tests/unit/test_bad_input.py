"""Bad input fails at ``schedule`` with a clear error naming the field; nothing is stored.

Run against every embedded store: validation happens before the store is
touched, and this proves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from delayq.app import DelayQ
from delayq.errors import (
    ConfigurationError,
    InvalidDelay,
    InvalidInput,
    InvalidJobId,
    InvalidOption,
    InvalidPayload,
    PayloadTooLarge,
)

LIMIT = 1024  # max_payload_bytes of the app under test


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DelayQ]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'bad.db'}"
    with DelayQ(url, max_payload_bytes=LIMIT) as app:
        yield app


def assert_nothing_stored(app: DelayQ) -> None:
    stats = app.stats()
    assert stats.scheduled == stats.running == stats.dead == stats.cancelled == 0
    assert app.list_jobs() == []


class Weird:
    pass


# (id, schedule kwargs on top of a valid call, error class, text the message must contain)
CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("delay-nan", {"delay": float("nan")}, InvalidDelay, "delay must be a finite number"),
    ("delay-inf", {"delay": float("inf")}, InvalidDelay, "delay must be a finite number"),
    ("delay-minus-inf", {"delay": float("-inf")}, InvalidDelay, "finite"),
    ("delay-bool", {"delay": True}, InvalidDelay, "got True of type bool"),
    ("delay-string", {"delay": "10"}, InvalidDelay, "got '10' of type str"),
    ("delay-and-at", {"at": 1_700_000_000}, InvalidOption, "exactly one of delay="),
    ("delay-over-100-years", {"delay": 1e12}, InvalidDelay, "at most"),
    ("delay-int-past-float", {"delay": 10**400}, InvalidDelay, "finite"),
    ("at-int-past-float", {"delay": None, "at": 10**400}, InvalidDelay, "finite"),
    ("misfire-int-past-float", {"misfire": 10**400}, InvalidOption, "misfire"),
    (
        "at-naive-datetime",
        {"delay": None, "at": datetime(2030, 1, 1, 9, 0)},
        InvalidDelay,
        "naive datetime; give it a timezone, e.g. datetime.now(timezone.utc)",
    ),
    ("at-nan", {"delay": None, "at": float("nan")}, InvalidDelay, "at must be a finite"),
    ("at-string", {"delay": None, "at": "2030-01-01"}, InvalidDelay, "at must be a number"),
    ("at-bool", {"delay": None, "at": False}, InvalidDelay, "of type bool"),
    ("payload-set", {"payload": {1, 2}}, InvalidPayload, "payload is a set"),
    ("payload-bytes", {"payload": b"\x00\x01"}, InvalidPayload, "payload is a bytes"),
    ("payload-object", {"payload": Weird()}, InvalidPayload, "payload is a Weird"),
    ("payload-nested-set", {"payload": {"a": [1, {2}]}}, InvalidPayload, "payload['a'][1]"),
    ("payload-nan", {"payload": {"x": float("nan")}}, InvalidPayload, "JSON cannot represent"),
    ("payload-int-key", {"payload": {1: "a"}}, InvalidPayload, "keys must be str"),
    ("payload-too-large", {"payload": "x" * 2000}, PayloadTooLarge, "limit is 1024 bytes"),
    (
        "payload-too-large-multibyte",
        {"payload": "é" * 600},
        PayloadTooLarge,
        "payload is 1202 bytes",
    ),
    ("job-id-empty", {"job_id": ""}, InvalidJobId, "job_id must not be empty"),
    ("job-id-too-long", {"job_id": "x" * 256}, InvalidJobId, "at most 255"),
    ("job-id-nul", {"job_id": "a\x00b"}, InvalidJobId, "control characters"),
    ("job-id-newline", {"job_id": "order\n1"}, InvalidJobId, "control characters"),
    ("job-id-del", {"job_id": "x\x7f"}, InvalidJobId, "control characters"),
    ("job-id-int", {"job_id": 123}, InvalidJobId, "job_id must be a str"),
    ("max-attempts-zero", {"max_attempts": 0}, InvalidOption, "max_attempts must be an int >= 1"),
    ("max-attempts-negative", {"max_attempts": -3}, InvalidOption, "max_attempts"),
    ("max-attempts-bool", {"max_attempts": True}, InvalidOption, "max_attempts"),
    ("max-attempts-float", {"max_attempts": 2.5}, InvalidOption, "max_attempts"),
    (
        "max-attempts-over-int32",
        {"max_attempts": 2**63},
        InvalidOption,
        "max_attempts must be an int >= 1 and <= 2147483647, got 9223372036854775808",
    ),
    ("max-attempts-just-over", {"max_attempts": 2**31}, InvalidOption, "<= 2147483647"),
    (
        "payload-int-over-4300-digits",
        {"payload": {"n": 10**5000}},
        InvalidPayload,
        "payload['n'] is an int with more than 4300 digits",
    ),
    ("payload-huge-int-alone", {"payload": -(10**4300)}, InvalidPayload, "more than 4300 digits"),
    (
        "payload-lone-surrogate",
        {"payload": {"note": "caf\ud800"}},
        InvalidPayload,
        "payload['note'] is not valid UTF-8 text",
    ),
    ("payload-surrogate-str", {"payload": "\udc80"}, InvalidPayload, "not valid UTF-8 text"),
    (
        "payload-surrogate-key",
        {"payload": {"k\ud800": 1}},
        InvalidPayload,
        "not valid UTF-8 text",
    ),
    ("job-id-lone-surrogate", {"job_id": "a\ud800"}, InvalidJobId, "not valid UTF-8 text"),
    ("name-lone-surrogate", {"name": "x\ud800"}, InvalidOption, "name is not valid UTF-8 text"),
    (
        "on-conflict-unknown",
        {"on_conflict": "overwrite"},
        InvalidOption,
        "on_conflict must be one of 'reject', 'keep', 'replace'; got 'overwrite'",
    ),
    ("backoff-text", {"backoff": "soon"}, InvalidOption, "backoff"),
    ("backoff-kind", {"backoff": {"kind": "fibonacci"}}, InvalidOption, "unknown backoff kind"),
    ("backoff-negative", {"backoff": [-1]}, InvalidOption, "backoff delays must be >= 0"),
    ("backoff-number", {"backoff": 5}, InvalidOption, "backoff must be"),
    ("misfire-word", {"misfire": "later"}, InvalidOption, "misfire must be 'run', 'skip'"),
    ("misfire-negative", {"misfire": -5}, InvalidOption, "misfire grace must be >= 0"),
    ("misfire-bool", {"misfire": True}, InvalidOption, "misfire"),
    ("name-empty", {"name": ""}, InvalidOption, "name must be a non-empty handler name"),
    ("name-none", {"name": None}, InvalidOption, "name must be a str"),
]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input_is_rejected_with_a_clear_error_and_nothing_stored(
    app: DelayQ, overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    kwargs: dict[str, Any] = {"name": "order.cancel", "payload": {"order": 1}, "delay": 60}
    kwargs.update(overrides)
    with pytest.raises(error) as info:
        app.schedule(**kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, InvalidInput) and isinstance(info.value, ValueError)
    assert_nothing_stored(app)


def test_the_default_payload_limit_is_one_mebibyte(tmp_path: Path) -> None:
    with DelayQ(f"sqlite:///{tmp_path / 'big.db'}") as app:
        app.schedule("x", "a" * ((1 << 20) - 2), delay=1)  # 1 MiB exactly, with the quotes
        with pytest.raises(PayloadTooLarge, match="limit is 1048576 bytes"):
            app.schedule("x", "a" * ((1 << 20) - 1), delay=1)
        assert app.stats().scheduled == 1


def test_one_bad_job_in_a_batch_stores_none_of_the_batch(app: DelayQ) -> None:
    with pytest.raises(InvalidDelay, match=r"jobs\[2\]: delay must be a finite"):
        app.schedule_many(
            [
                {"name": "a", "delay": 1},
                {"name": "b", "delay": 2},
                {"name": "c", "delay": float("nan")},
            ]
        )
    assert_nothing_stored(app)


def test_a_batch_item_that_is_not_a_mapping_is_named(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match=r"jobs\[0\]: each job must be a mapping"):
        app.schedule_many([("a", 1)])  # type: ignore[list-item]
    assert_nothing_stored(app)


@pytest.mark.parametrize("bad_id", ["", "x" * 256, "a\tb", 7])
def test_bad_job_ids_are_rejected_by_every_lookup(app: DelayQ, bad_id: Any) -> None:
    for call in (app.cancel, app.get, app.requeue):
        with pytest.raises(InvalidJobId):
            call(bad_id)
    with pytest.raises(InvalidJobId):
        app.reschedule(bad_id, delay=1)


def test_bad_reschedule_times_change_nothing(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=60)
    before = app.get(job_id)
    for kwargs in ({"delay": float("nan")}, {"at": datetime(2030, 1, 1)}, {"delay": "5"}):
        with pytest.raises(InvalidDelay):
            app.reschedule(job_id, **kwargs)
    assert app.get(job_id) == before


def test_a_lone_surrogate_in_a_lookup_id_is_an_invalid_job_id(app: DelayQ) -> None:
    for call in (app.cancel, app.get, app.requeue):
        with pytest.raises(InvalidJobId, match="not valid UTF-8 text"):
            call("order-\ud800")


def test_a_batch_names_the_item_with_a_lone_surrogate(app: DelayQ) -> None:
    with pytest.raises(InvalidPayload, match=r"jobs\[1\]: payload\['x'\] is not valid UTF-8"):
        app.schedule_many(
            [{"name": "a", "delay": 1}, {"name": "b", "delay": 1, "payload": {"x": "\ud800"}}]
        )
    assert_nothing_stored(app)


def test_max_attempts_of_the_app_is_capped_too(tmp_path: Path) -> None:
    with pytest.raises(InvalidOption, match="<= 2147483647"):
        DelayQ("memory://", max_attempts=2**40)
    with DelayQ("memory://", max_attempts=2**31 - 1) as app:
        job_id = app.schedule("x", delay=1)
        job = app.get(job_id)
        assert job is not None and job.max_attempts == 2**31 - 1


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/typo.db"])
def test_a_misspelt_store_option_is_a_configuration_error_naming_it(
    tmp_path: Path, url: str
) -> None:
    with pytest.raises(ConfigurationError, match="synchronus") as info:
        DelayQ(url.format(tmp=tmp_path), synchronus="full")
    assert "option" in str(info.value)


@pytest.mark.parametrize("ids", ["order-17", b"order-17"])
def test_purge_dead_refuses_a_bare_string_of_ids(app: DelayQ, ids: Any) -> None:
    app.schedule("x", delay=0, job_id="o", max_attempts=1)
    [claim] = app.backend.claim(limit=1, lease=5)
    app.backend.bury(claim, "boom")
    with pytest.raises(InvalidOption, match=r"job_ids must be a list of ids.*\['order-17'\]"):
        app.purge_dead(job_ids=ids)
    assert [j.id for j in app.dead_letters()] == ["o"]
    assert app.purge_dead(job_ids=("o",)) == 1
