"""Flow control's API and value types: keys, priorities, groups and limits are
checked at the call, limits are stored through the app, the rate arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from delayq._present import job_dict
from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.cli import cli
from delayq.errors import InvalidOption, Unsupported
from delayq.flow import Admissions, Limit, Rate, admit_rate, group_turns, pick_limit
from delayq.testing import FakeClock


@pytest.fixture
def app() -> DelayQ:
    return DelayQ("memory://", clock=FakeClock())


def test_schedule_stores_key_priority_and_group(app: DelayQ) -> None:
    job_id = app.schedule("x", key="tenant:1", priority=3, group="tenant:1")
    job = app.get(job_id)
    assert job is not None and (job.key, job.priority, job.group) == ("tenant:1", 3, "tenant:1")
    plain = app.get(app.schedule("x"))
    assert plain is not None and (plain.key, plain.priority, plain.group) == (None, 0, None)
    [batch_id] = app.schedule_many([{"name": "x", "key": "k", "priority": -2, "group": "g"}])
    batched = app.get(batch_id)
    assert batched is not None and (batched.key, batched.priority, batched.group) == ("k", -2, "g")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key": ""}, "key must be 1 to 255 characters"),
        ({"key": "a" * 256}, "key must be 1 to 255 characters"),
        ({"key": 42}, "key must be a string"),
        ({"key": "tenant:*"}, "key must not contain '*'"),
        ({"key": "a\nb"}, "key must not contain control characters"),
        ({"group": ""}, "group must be 1 to 255 characters"),
        ({"priority": "high"}, "priority must be an int"),
        ({"priority": True}, "priority must be an int"),
        ({"priority": 10**7}, "priority must be between"),
    ],
)
def test_bad_flow_fields_fail_at_the_call_naming_the_field(
    app: DelayQ, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOption, match=message):
        app.schedule("x", **options)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match=rf"jobs\[0\]: {message}"):
        app.schedule_many([{"name": "x", **options}])


class _PlainStore(MemoryBackend):
    """A store that does not declare flow control."""

    features = MemoryBackend.features - {"flow_control"}


def test_a_store_without_flow_control_refuses_keys_and_limits() -> None:
    app = DelayQ(backend=_PlainStore())
    with pytest.raises(InvalidOption, match="need a store with flow control"):
        app.schedule("x", key="k")
    with pytest.raises(InvalidOption, match="need a store with flow control"):
        app.schedule("x", priority=1)
    with pytest.raises(InvalidOption, match=r"jobs\[0\]: key=, priority= and group= need"):
        app.schedule_many([{"name": "x", "group": "g"}])
    app.schedule("x", priority=0)  # the default is fine everywhere
    with pytest.raises(Unsupported, match="no flow control"):
        app.limit("k", concurrency=1)


def test_limits_are_stored_replaced_listed_and_removed(app: DelayQ) -> None:
    assert app.limits() == []
    assert app.limit("tenant:*", concurrency=2) == Limit("tenant:*", concurrency=2)
    app.limit("stripe:*", rate="100/s", burst=20)
    app.limit("tenant:*", concurrency=5)  # replaced, not added
    assert app.limits() == [
        Limit("stripe:*", rate=Rate(100, 1.0), burst=20),
        Limit("tenant:*", concurrency=5),
    ]
    assert app.remove_limit("tenant:*") is True
    assert app.remove_limit("tenant:*") is False
    assert [lim.pattern for lim in app.limits()] == ["stripe:*"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs concurrency=, rate= or both"),
        ({"concurrency": 0}, "concurrency must be between 1"),
        ({"concurrency": 2.5}, "concurrency must be an int"),
        ({"rate": "fast"}, "rate must be <count>/<unit>"),
        ({"rate": "0/s"}, "rate count must be between 1"),
        ({"rate": 100}, "rate must be text like '100/s'"),
        ({"rate": "10/s", "burst": -1}, "burst must be between 0"),
        ({"concurrency": 1, "burst": 3}, "burst is only for a limit with a rate"),
    ],
)
def test_bad_limits_fail_at_the_call_naming_the_field(
    app: DelayQ, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOption, match=message):
        app.limit("k", **options)  # type: ignore[arg-type]
    assert app.limits() == []


def test_a_bad_pattern_is_refused() -> None:
    with pytest.raises(InvalidOption, match="pattern must be 1 to 255 characters"):
        Limit("", concurrency=1)


@pytest.mark.parametrize(
    ("text", "count", "period", "shown"),
    [
        ("100/s", 100, 1.0, "100/s"),
        ("5/m", 5, 60.0, "5/m"),
        ("1000/h", 1000, 3600.0, "1000/h"),
        ("2/d", 2, 86400.0, "2/d"),
        (" 20 / 10s ", 20, 10.0, "20/10s"),
        ("3/0.5s", 3, 0.5, "3/0.5s"),
    ],
)
def test_rates_parse_and_show(text: str, count: int, period: float, shown: str) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.period, str(rate)) == (count, period, shown)


def test_a_limit_round_trips_through_its_stored_form() -> None:
    for limit in (
        Limit("a", concurrency=3),
        Limit("b:*", rate=Rate.parse("7/m"), burst=2),
        Limit("c", concurrency=1, rate=Rate.parse("1/s")),
    ):
        assert Limit.from_json(limit.to_json()) == limit


def test_a_key_s_own_limit_wins_then_the_most_specific_pattern() -> None:
    limits = [
        Limit("*", concurrency=1),
        Limit("tenant:*", concurrency=2),
        Limit("tenant:vip:*", concurrency=3),
        Limit("tenant:vip:7", concurrency=4),
    ]
    chosen = {
        key: found.pattern if (found := pick_limit(limits, key)) else None
        for key in ("other", "tenant:1", "tenant:vip:1", "tenant:vip:7")
    }
    assert chosen == {
        "other": "*",
        "tenant:1": "tenant:*",
        "tenant:vip:1": "tenant:vip:*",
        "tenant:vip:7": "tenant:vip:7",
    }
    assert pick_limit(limits[1:], "other") is None
    assert pick_limit([Limit("a.b", concurrency=1)], "aXb") is None  # only * is special


def test_the_cell_rate_algorithm_never_starts_more_than_count_plus_burst_per_period() -> None:
    rate, burst = Rate.parse("10/s"), 3
    tat: float | None = None
    starts: list[float] = []
    t = 0.0
    while t < 5.0:  # offered a start every millisecond
        allowed, value = admit_rate(tat, t, rate, burst)
        if allowed:
            starts.append(t)
            tat = value
        else:
            assert value > t  # a refused start is told a later time
        t = round(t + 0.001, 3)
    for i, start in enumerate(starts):
        in_window = [s for s in starts[i:] if s < start + 1.0]
        assert len(in_window) <= 10 + burst
    assert len(starts) >= 5 * 10  # the steady rate is kept


def test_admissions_hold_a_key_at_its_concurrency_and_spread_throttled_jobs() -> None:
    limits = [Limit("c", concurrency=2), Limit("r", rate=Rate.parse("1/s"))]
    step = Admissions(limits, running={"c": 1})
    assert step.decide("free", 10.0) == (True, None)  # no limit applies
    assert step.room("c") == 1 and step.decide("c", 10.0) == (True, None)
    step.start("c", 10.0)
    assert step.room("c") == 0 and step.decide("c", 10.0) == (False, None)
    assert step.decide("r", 10.0) == (True, None)
    step.start("r", 10.0)
    # over the rate: the next allowed moment, then the one after it for the next job
    assert step.decide("r", 10.0) == (False, 11.0)
    assert step.decide("r", 10.0) == (False, 12.0)
    assert step.rate_rows() == [("r", 11.0, 13.0)]


def test_group_turns_let_a_returning_group_in_just_behind_the_others() -> None:
    assert group_turns({}) == {}
    assert group_turns({"a": 100, "b": 3, "c": 99}) == {"a": 100, "b": 99, "c": 99}


def test_the_cli_sets_lists_and_removes_limits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    runner = CliRunner()
    done = runner.invoke(cli, ["--url", url, "limits", "set", "tenant:*", "--concurrency", "2"])
    assert done.exit_code == 0, done.output
    assert "tenant:*: concurrency 2" in done.output
    runner.invoke(cli, ["--url", url, "limits", "set", "api", "--rate", "100/s", "--burst", "5"])
    listed = runner.invoke(cli, ["--url", url, "limits", "ls"])
    assert listed.output.splitlines() == ["api: rate 100/s burst 5", "tenant:*: concurrency 2"]
    bad = runner.invoke(cli, ["--url", url, "limits", "set", "x", "--rate", "fast"])
    assert bad.exit_code == 2 and "rate must be <count>/<unit>" in bad.output
    assert runner.invoke(cli, ["--url", url, "limits", "rm", "api"]).exit_code == 0
    assert runner.invoke(cli, ["--url", url, "limits", "rm", "api"]).exit_code == 1


def test_get_shows_a_throttled_job_until_when(app: DelayQ) -> None:
    app.limit("api", rate="1/m")
    first, second = app.schedule("x", key="api"), app.schedule("x", key="api")
    claims = app._backend.claim(limit=2, lease=30)
    assert [c.job.id for c in claims] == [first]
    shown = job_dict(app.get(second))  # type: ignore[arg-type]
    assert shown["key"] == "api" and shown["throttled_until"] == claims[0].claimed_at + 60
    assert "key" not in job_dict(app.get(app.schedule("plain")))  # type: ignore[arg-type]
