"""Recurring schedules on a fake clock: time zones, month ends, leap days, jitter,
downtime, and runtime edits (pause, resume, change, remove)."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import ClassVar
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import DelayQ, MissedRuns, Schedule
from delayq.backends.base import ScheduleRecord, ScheduleStore
from delayq.backends.memory import MemoryBackend
from delayq.errors import (
    BackendError,
    ConfigurationError,
    InvalidDelay,
    InvalidOption,
    InvalidPayload,
)
from delayq.job import JobSpec, JobState
from delayq.recurring import LEAD, TICK_HANDLER, occurrence_id, plan, tick_id
from delayq.testing import FakeClock
from tests.recurring_support import context, drive

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def at(zone: ZoneInfo, *fields: int, fold: int = 0) -> float:
    return datetime(*fields, tzinfo=zone, fold=fold).timestamp()  # type: ignore[misc]


def local(t: float, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(t, zone).isoformat()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(at(UTC, 2026, 1, 1, 0, 0))  # type: ignore[arg-type]


@pytest.fixture
def app(clock: FakeClock) -> Iterator[DelayQ]:
    with DelayQ("memory://", clock=clock, rng=random.Random(7)) as app:
        yield app


def runs_between(app: DelayQ, clock: FakeClock, start: float, end: float) -> list[float]:
    clock.advance(start - clock.time())
    return [r.run_at for r in drive(app, clock, end)]


# -- daylight saving time --------------------------------------------------------------
@pytest.mark.parametrize(
    ("zone", "spring_day"),
    [(BERLIN, (2026, 3, 29)), (NEW_YORK, (2026, 3, 8))],
    ids=["Europe/Berlin", "America/New_York"],
)
def test_a_0230_job_runs_once_at_0300_on_the_spring_forward_day(
    app: DelayQ, clock: FakeClock, zone: ZoneInfo, spring_day: tuple[int, int, int]
) -> None:
    y, m, d = spring_day
    clock.advance(at(zone, y, m, d - 2, 12, 0) - clock.time())
    app.recurring("nightly", cron="30 2 * * *", tz=zone.key)
    ran = [local(t, zone) for t in runs_between(app, clock, clock.time(), at(zone, y, m, d + 2, 0))]
    offset = "+02:00" if zone is BERLIN else "-04:00"
    winter = "+01:00" if zone is BERLIN else "-05:00"
    assert ran == [
        f"{y}-{m:02d}-{d - 1:02d}T02:30:00{winter}",
        f"{y}-{m:02d}-{d:02d}T03:00:00{offset}",  # 02:30 does not exist: once, after the gap
        f"{y}-{m:02d}-{d + 1:02d}T02:30:00{offset}",
    ]


@pytest.mark.parametrize(
    ("zone", "fall_day", "hour"),
    # The repeated hour: 02:00-03:00 in Berlin, 01:00-02:00 in New York.
    [(BERLIN, (2026, 10, 25), 2), (NEW_YORK, (2026, 11, 1), 1)],
    ids=["Europe/Berlin", "America/New_York"],
)
def test_a_job_in_the_repeated_hour_runs_once_on_the_fall_back_day(
    app: DelayQ, clock: FakeClock, zone: ZoneInfo, fall_day: tuple[int, int, int], hour: int
) -> None:
    day = date(*fall_day)
    before, after = day - timedelta(days=1), day + timedelta(days=1)
    clock.advance(at(zone, *before.timetuple()[:3], 12, 0) - clock.time())
    app.recurring("nightly", cron=f"30 {hour} * * *", tz=zone.key)
    ran = runs_between(app, clock, clock.time(), at(zone, *after.timetuple()[:3], 23, 0))
    first, second = at(zone, *fall_day, hour, 30, fold=0), at(zone, *fall_day, hour, 30, fold=1)
    assert second - first == 3600  # the local time happens twice that night
    assert ran == [first, at(zone, *after.timetuple()[:3], hour, 30)]  # the first only


def test_an_hourly_job_follows_real_hours_across_the_fall_back_day(
    app: DelayQ, clock: FakeClock
) -> None:
    clock.advance(at(NEW_YORK, 2026, 10, 31, 23, 59) - clock.time())
    app.recurring("hourly", cron="0 * * * *", tz="America/New_York")
    ran = runs_between(app, clock, clock.time(), at(NEW_YORK, 2026, 11, 1, 23, 59))
    assert len(ran) == 25  # the repeated 01:00 hour has its own run
    assert all(b - a == 3600 for a, b in itertools.pairwise(ran))


# -- calendars ----------------------------------------------------------------------------
def test_a_job_on_the_31st_skips_the_months_without_one(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("month.close", cron="0 18 31 * *", tz="Europe/Berlin")
    ran = runs_between(app, clock, clock.time(), at(BERLIN, 2026, 8, 1, 0, 0))
    assert [local(t, BERLIN)[:10] for t in ran] == [
        "2026-01-31",
        "2026-03-31",
        "2026-05-31",
        "2026-07-31",
    ]


def test_the_last_day_of_each_month_includes_a_leap_day(app: DelayQ, clock: FakeClock) -> None:
    clock.advance(at(UTC, 2027, 12, 15, 0, 0) - clock.time())  # type: ignore[arg-type]
    app.recurring("month.end", cron="0 0 L * *", tz="UTC")
    ran = runs_between(app, clock, clock.time(), at(UTC, 2028, 4, 1, 0, 0))  # type: ignore[arg-type]
    days = [datetime.fromtimestamp(t, UTC).date().isoformat() for t in ran]
    assert days == ["2027-12-31", "2028-01-31", "2028-02-29", "2028-03-31"]


def test_a_leap_day_schedule_runs_every_four_years(app: DelayQ, clock: FakeClock) -> None:
    schedule = app.recurring("leap", cron="0 9 29 2 *", tz="America/New_York")
    first = schedule.next_run(clock.time())
    assert first is not None and local(first, NEW_YORK) == "2028-02-29T09:00:00-05:00"
    second = schedule.next_after(first)
    assert second is not None and local(second, NEW_YORK) == "2032-02-29T09:00:00-05:00"


# -- every= and jitter ---------------------------------------------------------------------
def test_every_runs_at_fixed_intervals_from_the_next_whole_second(
    app: DelayQ, clock: FakeClock
) -> None:
    clock.advance(0.25)
    added = clock.time()
    app.recurring("poll", every=timedelta(minutes=5))
    ran = runs_between(app, clock, clock.time(), added + 3 * 300 + 1)
    first = float(int(added) + 1 + 300)
    assert ran == [first, first + 300, first + 600]


def test_jitter_delays_each_occurrence_by_the_injected_rng_and_keeps_its_id(
    clock: FakeClock,
) -> None:
    expected = random.Random(42)
    with DelayQ("memory://", clock=clock, rng=random.Random(42)) as app:
        app.recurring("poll", every=60, jitter=10)
        start = clock.time()
        ran = drive(app, clock, start + 5 * 60 + 30)
    assert len(ran) == 5
    for n, r in enumerate(ran, start=1):
        due = start + 60 * n
        assert r.id == occurrence_id("poll", due)
        assert r.run_at == due + expected.uniform(0.0, 10.0)
        assert due <= r.run_at <= due + 10


def test_start_and_end_bound_the_occurrences(app: DelayQ, clock: FakeClock) -> None:
    start = clock.time() + 3600
    app.recurring("bounded", every=600, start=start, end=start + 1800)
    ran = runs_between(app, clock, clock.time(), start + 7200)
    assert ran == [start, start + 600, start + 1200, start + 1800]
    schedule = app.get_recurring("bounded")
    assert schedule is not None and schedule.next_run(clock.time()) is None


# -- after downtime -----------------------------------------------------------------------
def _after_downtime(app: DelayQ, clock: FakeClock, misfire: str) -> list[float]:
    app.recurring("poll", every=60, misfire=misfire)
    begin = clock.time()
    clock.advance(10 * 60 + 30)  # ten occurrences missed: no worker ran
    ran = drive(app, clock, clock.time())
    assert all(r.id == occurrence_id("poll", r.run_at) for r in ran)
    return [r.run_at - begin for r in ran]


def test_latest_runs_the_latest_missed_occurrence_once(app: DelayQ, clock: FakeClock) -> None:
    assert _after_downtime(app, clock, "latest") == [600.0]
    now = clock.time()
    assert [r.run_at for r in drive(app, clock, now + 60)] == [now + 30]  # the chain goes on


def test_skip_runs_none_of_the_missed_occurrences(app: DelayQ, clock: FakeClock) -> None:
    assert _after_downtime(app, clock, "skip") == []
    assert len(drive(app, clock, clock.time() + 60)) == 1  # the chain goes on


def test_catchup_runs_a_bounded_number_oldest_first(app: DelayQ, clock: FakeClock) -> None:
    assert _after_downtime(app, clock, "catchup:3") == [480.0, 540.0, 600.0]


def test_plan_is_pure_and_answers_for_its_own_window() -> None:
    schedule = Schedule(name="p", handler="p", every=10.0, anchor=100.0, misfire="catchup:5")
    assert plan(schedule, 100.0, 100.0).runs == (100.0,)
    decision = plan(schedule, 100.0, 135.0)
    assert decision.runs == (100.0, 110.0, 120.0, 130.0)
    assert decision.next_tick == 140.0
    assert plan(schedule, 100.0, 10**6).runs[0] == 10**6 - 40  # O(5), not O(100000)
    assert plan(replace_paused(schedule), 100.0, 135.0).runs == ()


def replace_paused(schedule: Schedule) -> Schedule:
    return dataclasses.replace(schedule, paused=True)


# -- exactly one job per occurrence ----------------------------------------------------------
def test_ticks_run_twice_and_seeded_twice_still_make_one_job_per_occurrence(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("poll", every=60)
    app.recurring("poll", every=60)  # a second producer starting up: no change
    ran = drive(app, clock, clock.time() + 10 * 60 + 1, ticks_twice=True)
    assert len(ran) == 10
    assert len({r.id for r in ran}) == 10
    stored = app.get_recurring("poll")
    assert stored is not None and stored.version == 1


def test_occurrences_are_ordinary_jobs_of_the_handler_with_the_payload_and_options(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("report.eu", handler="report", every=60, payload={"region": "eu"}, max_attempts=2)
    [ran] = drive(app, clock, clock.time() + 61)
    job = app.get(ran.id)
    assert job is not None
    assert (job.name, job.payload, job.max_attempts) == ("report", {"region": "eu"}, 2)
    assert ran.id.startswith("report.eu@")


# -- runtime edits --------------------------------------------------------------------------
def test_pause_stops_occurrences_and_resume_skips_the_paused_ones(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("poll", every=60)
    begin = clock.time()
    assert len(drive(app, clock, begin + 121)) == 2
    assert app.pause_recurring("poll") is True
    assert drive(app, clock, begin + 600) == []
    assert app.resume_recurring("poll") is True
    ran = drive(app, clock, begin + 721)
    assert [r.run_at - begin for r in ran] == [660.0, 720.0]


def test_a_paused_schedule_stays_paused_when_its_definition_is_declared_again(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("poll", every=60)
    app.pause_recurring("poll")
    schedule = app.recurring("poll", every=60, payload={"changed": True})
    assert schedule.paused
    assert drive(app, clock, clock.time() + 600) == []


def test_changing_the_timing_takes_effect_without_a_restart(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("poll", every=60, payload={"v": 1})
    begin = clock.time()
    assert len(drive(app, clock, begin + 61)) == 1
    app.update_recurring("poll", every=10, payload={"v": 2})
    ran = drive(app, clock, begin + 121)
    gaps = {b.run_at - a.run_at for a, b in itertools.pairwise(ran)}
    assert gaps == {10.0}
    assert len(ran) == 6 and all(r.payload == {"v": 2} for r in ran)


def test_switching_from_every_to_cron(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("poll", every=60)
    schedule = app.update_recurring("poll", cron="0 * * * *")
    assert (schedule.cron, schedule.every) == ("0 * * * *", None)
    ran = drive(app, clock, clock.time() + 3 * 3600)
    assert [r.run_at % 3600 for r in ran] == [0.0, 0.0, 0.0]


def test_remove_stops_future_occurrences(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("poll", every=60)
    assert len(drive(app, clock, clock.time() + 61)) == 1
    assert app.remove_recurring("poll") is True
    assert app.remove_recurring("poll") is False
    assert drive(app, clock, clock.time() + 600) == []
    assert app.backend.next_due() is None  # the pending tick ended the chain


def test_list_shows_every_schedule_with_its_next_run(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("b", every=60)
    app.recurring("a", cron="0 3 * * *", tz="Europe/Berlin")
    listed = app.recurring_schedules()
    assert [s.name for s in listed] == ["a", "b"]
    info = listed[0].as_dict(clock.time())
    assert info["next_run"] == at(BERLIN, 2026, 1, 1, 3, 0)
    assert info["payload"] is None


def test_pausing_or_resuming_an_unknown_schedule_says_so(app: DelayQ) -> None:
    assert app.pause_recurring("nope") is False
    assert app.resume_recurring("nope") is False
    with pytest.raises(InvalidOption, match="no recurring schedule"):
        app.update_recurring("nope", every=5)


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cron": "61 * * * *"}, InvalidOption, "not a valid cron expression"),
        ({"cron": "* * *"}, InvalidOption, "not a valid cron expression"),
        ({"cron": "0 0 30 2 *"}, InvalidOption, "cron"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, InvalidOption, "not a known time zone"),
        ({"cron": "0 3 * * *", "tz": "../etc/passwd"}, InvalidOption, "not a known time zone"),
        ({}, InvalidOption, "exactly one of cron"),
        ({"cron": "0 3 * * *", "every": 60}, InvalidOption, "exactly one of cron"),
        ({"every": 0.5}, InvalidOption, "at least 1.0 second"),
        ({"every": "5m"}, InvalidDelay, "every"),
        ({"every": 60, "jitter": -1}, InvalidOption, "jitter"),
        ({"every": 60, "misfire": "sometimes"}, InvalidOption, "misfire"),
        ({"every": 60, "misfire": "catchup:0"}, InvalidOption, "misfire"),
        ({"every": 60, "start": datetime(2026, 1, 1)}, InvalidDelay, "naive"),
        ({"every": 60, "start": 2000.0, "end": 1000.0}, InvalidOption, "end"),
        ({"every": 60, "payload": {1, 2}}, InvalidPayload, "JSON"),
    ],
)
def test_bad_definitions_are_refused_at_the_call(
    app: DelayQ, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        app.recurring("job", **kwargs)  # type: ignore[arg-type]
    assert app.recurring_schedules() == []


def test_a_schedule_name_too_long_for_its_job_ids_is_refused(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match="at most 160"):
        app.recurring("x" * 161, every=60)


class _NoSchedules(MemoryBackend):
    """A store that does not declare the 'recurring' feature."""

    features: ClassVar[frozenset[str]] = frozenset({"clock"})


def test_a_store_without_schedules_says_so(clock: FakeClock) -> None:
    with DelayQ(backend=_NoSchedules(clock=clock), clock=clock) as app:
        with pytest.raises(ConfigurationError, match="recurring"):
            app.recurring("poll", every=60)
        assert app.list_jobs() == []


def test_missed_runs_specs_round_trip() -> None:
    for text in ("latest", "skip", "catchup:7"):
        assert MissedRuns.parse(text).to_spec() == text


def test_ids_name_the_schedule_and_the_utc_time() -> None:
    t = at(BERLIN, 2026, 3, 29, 3, 0)
    assert occurrence_id("report", t) == "report@2026-03-29T01:00:00Z"
    assert occurrence_id("fast", t + 0.25) == "fast@2026-03-29T01:00:00.250Z"
    assert tick_id("report", t) == f"{TICK_HANDLER}:report@2026-03-29T01:00:00Z"


def test_the_tick_handler_name_is_reserved(app: DelayQ) -> None:
    with pytest.raises(ConfigurationError, match="built-in"):
        app.register(TICK_HANDLER, lambda payload: None)
    handler = app.get_handler(TICK_HANDLER)
    assert handler is not None and handler.takes_context and not handler.is_async
    assert TICK_HANDLER not in app.handlers  # served, not registered


def test_a_tick_of_a_removed_schedule_ends_the_chain_quietly(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("poll", every=60)
    [tick] = app.list_jobs()
    app.remove_recurring("poll")
    clock.advance(tick.run_at - clock.time())
    [claim] = app.backend.claim(limit=1, lease=30)
    handler = app.get_handler(TICK_HANDLER)
    assert handler is not None
    assert "removed" in handler.call(claim.job.payload, context(claim))


def test_a_malformed_tick_payload_fails_loudly(app: DelayQ, clock: FakeClock) -> None:
    handler = app.get_handler(TICK_HANDLER)
    assert handler is not None
    app.schedule(TICK_HANDLER, {"nope": 1}, delay=0, job_id="bad-tick")
    [claim] = app.backend.claim(limit=1, lease=30)
    with pytest.raises(InvalidOption, match="recurring tick"):
        handler.call(claim.job.payload, context(claim))


def test_an_unreadable_stored_schedule_is_a_backend_error(app: DelayQ) -> None:
    store = app.backend
    assert isinstance(store, ScheduleStore)
    store.put_schedule("broken", '{"every": "soon"}', version=0)
    with pytest.raises(BackendError, match="'broken' is unreadable"):
        app.get_recurring("broken")


# -- occurrences enqueued ahead ----------------------------------------------------------------
def _enqueued_ahead(app: DelayQ, clock: FakeClock, **options: object) -> float:
    """Add ``poll`` (every 60 s) and run its first tick; return the first occurrence."""
    app.recurring("poll", every=60, **options)  # type: ignore[arg-type]
    first = clock.time() + 60
    drive(app, clock, first - LEAD / 2)
    job = app.get(occurrence_id("poll", first))
    assert job is not None and job.state is JobState.SCHEDULED and job.run_at == first
    return first


def test_an_occurrence_is_enqueued_ahead_and_claimed_at_its_time(
    app: DelayQ, clock: FakeClock
) -> None:
    first = _enqueued_ahead(app, clock)
    [ran] = drive(app, clock, first + 1)
    assert ran.claimed_at == ran.run_at == first


def test_a_pause_cancels_the_occurrence_enqueued_ahead_and_resume_restores_it(
    app: DelayQ, clock: FakeClock
) -> None:
    first = _enqueued_ahead(app, clock)
    app.pause_recurring("poll")
    job = app.get(occurrence_id("poll", first))
    assert job is not None and job.state is JobState.CANCELLED
    app.resume_recurring("poll")  # still before the occurrence: it runs after all
    assert [r.run_at for r in drive(app, clock, first + 1)] == [first]


def test_an_edit_applies_to_the_occurrence_enqueued_ahead(app: DelayQ, clock: FakeClock) -> None:
    first = _enqueued_ahead(app, clock, payload={"v": 1})
    app.update_recurring("poll", payload={"v": 2})
    [ran] = drive(app, clock, first + 1)
    assert (ran.run_at, ran.payload) == (first, {"v": 2})


def test_remove_cancels_the_occurrence_enqueued_ahead(app: DelayQ, clock: FakeClock) -> None:
    first = _enqueued_ahead(app, clock)
    app.remove_recurring("poll")
    assert drive(app, clock, first + 600) == []


@pytest.mark.parametrize("edit", ["pause", "change"])
def test_an_edit_racing_a_tick_leaves_nothing_of_the_old_definition(
    app: DelayQ, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, edit: str
) -> None:
    app.recurring("poll", every=60, payload={"v": 1})
    first = clock.time() + 60
    store = app.backend
    assert isinstance(store, ScheduleStore)
    read = store.get_schedule
    raced: list[bool] = []

    def read_then_edit(name: str) -> ScheduleRecord | None:
        record = read(name)
        if not raced:  # the tick's read: the edit commits (and settles) right after it
            raced.append(True)
            if edit == "pause":
                app.pause_recurring("poll")
            else:
                app.update_recurring("poll", payload={"v": 2})
        return record

    monkeypatch.setattr(store, "get_schedule", read_then_edit)
    ran = drive(app, clock, first + 1)
    assert raced
    assert [r.payload for r in ran] == ([] if edit == "pause" else [{"v": 2}])


def test_an_occurrence_already_due_runs_as_enqueued_when_the_timing_changes(
    app: DelayQ, clock: FakeClock
) -> None:
    first = _enqueued_ahead(app, clock)
    clock.advance(first + 0.5 - clock.time())  # due, not yet claimed
    app.update_recurring("poll", every=3600)
    ran = drive(app, clock, first + 2)
    assert [r.run_at for r in ran] == [first]


@pytest.mark.parametrize(
    ("misfire", "expected"),
    [("latest", [600.0]), ("skip", []), ("catchup:3", [480.0, 540.0, 600.0])],
)
def test_downtime_after_an_occurrence_was_enqueued_ahead_follows_the_policy(
    app: DelayQ, clock: FakeClock, misfire: str, expected: list[float]
) -> None:
    begin = clock.time()
    first = _enqueued_ahead(app, clock, misfire=misfire)
    assert first == begin + 60
    clock.advance(begin + 630 - clock.time())  # no worker from 59.5 s to 630 s
    assert [r.run_at - begin for r in drive(app, clock, clock.time())] == expected


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(name="e", handler="e", every=1.5, anchor=100.0, end=130.0),
        Schedule(name="h", handler="h", cron="0 * * * *", tz="America/New_York"),
        Schedule(name="d", handler="d", cron="30 2 * * *", tz="Europe/Berlin"),
    ],
    ids=["every-with-end", "hourly-new-york", "daily-berlin"],
)
def test_the_nth_next_occurrence_is_n_steps_of_next_after(schedule: Schedule) -> None:
    for t in (90.0, at(NEW_YORK, 2026, 10, 31, 22, 0), at(BERLIN, 2026, 3, 27, 12, 0)):
        stepped: float | None = t
        for n in range(1, 30):
            stepped = None if stepped is None else schedule.next_after(stepped)
            assert schedule.nth_after(t, n) == stepped, (t, n)


def test_a_schedule_added_again_right_after_removal_runs_its_next_occurrence(
    app: DelayQ, clock: FakeClock
) -> None:
    first = _enqueued_ahead(app, clock)
    app.remove_recurring("poll")
    app.recurring("poll", every=60, start=first)
    assert [r.run_at for r in drive(app, clock, first + 1)] == [first]


class _Envelope:
    """A producer hook that wraps every payload (as tracing does) and records the ids."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_enqueue(self, specs: list[JobSpec]) -> list[JobSpec]:
        self.seen.extend(s.id for s in specs)
        return [dataclasses.replace(s, payload=f'{{"wrapped":{s.payload}}}') for s in specs]

    def after_enqueue(self, specs: object, outcomes: object) -> None:
        pass

    def after_cancel(self, job_id: str, outcome: object) -> None:
        pass


def test_a_schedules_own_jobs_pass_by_the_producer_hooks(app: DelayQ, clock: FakeClock) -> None:
    hook = _Envelope()
    app.add_hook(hook)
    app.recurring("poll", every=60, payload={"n": 1})
    ran = drive(app, clock, clock.time() + 121)
    assert [r.payload for r in ran] == [{"n": 1}, {"n": 1}]
    assert hook.seen == []


@settings(max_examples=150)
@given(
    expr=st.sampled_from(
        ["30 2 * * *", "0 * * * *", "*/20 * * * *", "15 1,2,3 * * *", "0 0 L * *", "0 9 * * 1-5"]
    ),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]),
    start=st.floats(min_value=1.77e9, max_value=1.84e9),
)
def test_looking_back_finds_exactly_the_occurrences_looking_forward_found(
    expr: str, zone: str, start: float
) -> None:
    # A tick finds its own occurrence by looking back from now; the chain found it
    # by looking forward. Both walks must agree, DST transitions included.
    schedule = Schedule(name="p", handler="p", cron=expr, tz=zone)
    forward: list[float] = []
    at: float | None = start
    for _ in range(12):
        at = schedule.next_after(at) if at is not None else None
        if at is None:
            break
        forward.append(at)
    assert schedule.due_between(forward[0], forward[-1], 100) == forward
    for occurrence in forward:
        assert schedule.due_between(occurrence, occurrence, 1) == [occurrence]


def test_a_resume_racing_the_tick_that_saw_the_pause_keeps_the_chain(
    app: DelayQ, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.recurring("poll", every=60)
    first = clock.time() + 60
    app.pause_recurring("poll")
    store = app.backend
    assert isinstance(store, ScheduleStore)
    read = store.get_schedule
    raced: list[bool] = []

    def read_then_resume(name: str) -> ScheduleRecord | None:
        record = read(name)
        if not raced:  # the tick read "paused"; the resume commits before it ends
            raced.append(True)
            app.resume_recurring("poll")
        return record

    monkeypatch.setattr(store, "get_schedule", read_then_resume)
    ran = drive(app, clock, first + 121)
    assert raced
    assert [r.run_at for r in ran] == [first, first + 60, first + 120]


def test_resume_restarts_a_chain_whose_tick_was_dead_lettered(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("poll", every=60)
    begin = clock.time()
    [tick] = app.list_jobs()
    clock.advance(tick.run_at - clock.time())
    [claim] = app.backend.claim(limit=1, lease=30)
    app.backend.bury(claim, "BackendUnavailable: the store was down for hours")
    assert drive(app, clock, begin + 300) == []  # the chain stopped (loudly: a dead letter)
    assert [j.id for j in app.dead_letters()] == [tick.id]
    assert app.resume_recurring("poll") is True  # not paused: it restarts the chain
    assert [r.run_at - begin for r in drive(app, clock, begin + 421)] == [360.0, 420.0]
