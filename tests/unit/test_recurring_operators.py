"""What operators of cron-like schedulers expect, on a fake clock: overlap policies,
run now, status and history, misfire as a grace, the nominal time in the context,
declarative sync, cron macros, and definitions refused at the call."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from delayq import DelayQ, MissedRuns
from delayq.errors import InvalidOption
from delayq.job import Claim, JobState
from delayq.recurring import TICK_HANDLER, occurrence_id, occurrence_time
from delayq.testing import FakeClock
from tests.recurring_support import LEASE, context, drive

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def app(clock: FakeClock) -> Iterator[DelayQ]:
    with DelayQ("memory://", clock=clock, rng=random.Random(7)) as app:
        yield app


def run_ticks_until(app: DelayQ, clock: FakeClock, until: float) -> list[Claim]:
    """Run the ticks due up to ``until``; claim each occurrence and leave it running
    (a long handler). Returns the claims of the occurrences."""
    backend = app.backend
    claimed = []
    while (head := backend.next_due()) is not None and head <= until:
        clock.advance(max(0.0, head - clock.time()))
        for claim in backend.claim(limit=10, lease=LEASE * 100, now=clock.time()):
            if claim.job.name == TICK_HANDLER:
                handler = app.get_handler(TICK_HANDLER)
                assert handler is not None
                handler.call(claim.job.payload, context(claim))
                backend.ack(claim)
            else:
                claimed.append(claim)
    clock.advance(max(0.0, until - clock.time()))
    return claimed


# -- overlap ------------------------------------------------------------------------------
def test_overlap_skip_runs_no_occurrence_while_the_previous_one_runs(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("slow", every=10, handler="h", overlap="skip")
    [first] = run_ticks_until(app, clock, T0 + 45)  # it runs for 40 s and more
    assert first.job.id == occurrence_id("slow", T0 + 10)
    assert [app.get(occurrence_id("slow", T0 + t)) for t in (20, 30, 40)] == [None] * 3
    app.backend.ack(first)  # it ends at T0+45: the next occurrence runs
    assert [c.job.id for c in run_ticks_until(app, clock, T0 + 61)] == [
        occurrence_id("slow", T0 + 50)
    ]


def test_overlap_replace_cancels_a_previous_occurrence_not_yet_started(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("r", every=10, handler="h", overlap="replace")
    backend = app.backend
    clock.advance(10 - 0.7)
    for claim in backend.claim(limit=10, lease=LEASE, now=clock.time()):  # the tick of T0+10
        app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
        backend.ack(claim)
    first = occurrence_id("r", T0 + 10)
    clock.advance(10)  # the occurrence waits (a backlog) when the next tick runs
    for claim in backend.claim(limit=10, lease=LEASE, now=clock.time()):
        if claim.job.name == TICK_HANDLER:
            app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
            backend.ack(claim)
        else:
            backend.release(claim)
    assert app.get(first).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert [r.id for r in drive(app, clock, T0 + 21)] == [occurrence_id("r", T0 + 20)]


def test_overlap_is_checked(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match="overlap"):
        app.recurring("o", every=10, overlap="never")
    with pytest.raises(InvalidOption, match="catchup"):
        app.recurring("o", every=10, overlap="skip", misfire="catchup:3")


# -- run now ------------------------------------------------------------------------------
def test_run_now_enqueues_an_occurrence_with_the_schedules_own_options(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("report", cron="0 3 * * *", handler="h", payload={"to": "ops"}, max_attempts=2)
    app.pause_recurring("report")
    clock.advance(0.25)
    job_id = app.run_recurring_now("report")
    assert job_id == occurrence_id("report", T0 + 0.25) == "report@2026-01-01T00:00:00.250Z"
    job = app.get(job_id)
    assert job is not None
    assert (job.name, job.payload, job.max_attempts, job.misfire) == ("h", {"to": "ops"}, 2, "run")
    [ran] = drive(app, clock, T0 + 1)
    assert ran.id == job_id
    with pytest.raises(InvalidOption, match="no recurring schedule"):
        app.run_recurring_now("nope")


# -- status and history --------------------------------------------------------------------
def test_status_lists_the_next_runs_the_last_run_and_recent_occurrences(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("s", every=60, handler="h")
    drive(app, clock, T0 + 185)
    status = app.recurring_status("s", runs=3, history=5)
    assert status is not None
    assert [t - T0 for t in status.next_runs] == [240.0, 300.0, 360.0]
    assert [(o.at - T0, o.state) for o in status.history] == [
        (180.0, "succeeded"),
        (120.0, "succeeded"),
        (60.0, "succeeded"),
    ]
    assert status.last_run is not None and status.last_run.at == T0 + 180
    data = status.as_dict(clock.time())
    assert data["last_run"]["job_id"] == occurrence_id("s", T0 + 180)
    assert app.recurring_status("nope") is None
    with pytest.raises(InvalidOption, match="runs"):
        app.recurring_status("s", runs=-1)


# -- misfire as a grace in seconds --------------------------------------------------------
@pytest.mark.parametrize(
    ("down_until", "expected"), [(4 * 3600 + 300, [4.0]), (4 * 3600 + 900, [])]
)
def test_a_misfire_grace_runs_the_latest_missed_occurrence_only_if_that_late(
    app: DelayQ, clock: FakeClock, down_until: float, expected: list[float]
) -> None:
    app.recurring("h", cron="0 * * * *", misfire=600, handler="h")
    drive(app, clock, T0 + 1800)
    clock.advance(T0 + down_until - clock.time())
    ran = drive(app, clock, clock.time())
    assert [(r.run_at - T0) / 3600 for r in ran] == expected
    assert MissedRuns.parse(600).to_spec() == "grace:600.0"
    assert MissedRuns.parse("grace:600.0") == MissedRuns.parse(600.0)


# -- the nominal time ----------------------------------------------------------------------
def test_the_context_has_the_nominal_time_apart_from_jitter(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("j", every=60, jitter=30, handler="h")
    run_ticks_until(app, clock, T0 + 59.5)
    backend = app.backend
    occ = occurrence_id("j", T0 + 60)
    clock.advance(35)
    [claim] = [c for c in backend.claim(limit=10, lease=LEASE, now=clock.time()) if c.job.id == occ]
    ctx = context(claim)
    assert ctx.run_at != T0 + 60 and ctx.scheduled_for == T0 + 60
    assert occurrence_time("job-1") is None and occurrence_time("a@b") is None


# -- declarative sync ----------------------------------------------------------------------
def test_sync_makes_the_stored_schedules_exactly_the_given_ones(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("a", every=60)
    app.recurring("b", every=60)
    wanted = [{"name": "a", "every": 120}, {"name": "c", "cron": "@daily", "payload": {"x": 1}}]
    plan = app.sync_recurring(wanted, dry_run=True)
    assert plan == {"created": ["c"], "changed": ["a"], "unchanged": [], "removed": ["b"]}
    assert [s.name for s in app.recurring_schedules()] == ["a", "b"]  # a dry run
    assert app.sync_recurring(wanted) == plan
    assert [(s.name, s.every, s.cron) for s in app.recurring_schedules()] == [
        ("a", 120.0, None),
        ("c", None, "@daily"),
    ]
    again = app.sync_recurring(wanted)
    assert again == {"created": [], "changed": [], "unchanged": ["a", "c"], "removed": []}
    ran = drive(app, clock, T0 + 86400 + 1)
    assert {r.id for r in ran if r.id.startswith("c@")} == {occurrence_id("c", T0 + 86400)}


@pytest.mark.parametrize(
    "bad",
    [
        [{"name": "a", "every": 60}, {"name": "a", "every": 30}],
        [{"name": "a", "every": 60}, {"name": "z", "cron": "61 * * * *"}],
        [{"name": "a", "every": 60, "colour": "red"}],
        [{"every": 60}],
    ],
    ids=["twice", "bad-cron", "unknown-field", "no-name"],
)
def test_sync_checks_every_definition_before_it_changes_anything(
    app: DelayQ, bad: list[dict[str, object]]
) -> None:
    app.recurring("b", every=60)
    with pytest.raises(InvalidOption):
        app.sync_recurring(bad)
    assert [s.name for s in app.recurring_schedules()] == ["b"]


# -- cron macros and the definitions refused -----------------------------------------------
@pytest.mark.parametrize(
    ("macro", "first"),
    [("@hourly", 3600), ("@daily", 86400), ("@weekly", 3 * 86400), ("@monthly", 31 * 86400)],
)
def test_cron_macros(app: DelayQ, clock: FakeClock, macro: str, first: float) -> None:
    schedule = app.recurring("m", cron=macro)
    assert schedule.next_run(clock.time()) == T0 + first  # 2026-01-01 is a Thursday


@pytest.mark.parametrize(
    ("expr", "first", "second"),
    [
        ("0 0 3 * * *", T0 + 3 * 3600, T0 + 27 * 3600),  # 03:00:00 daily
        ("0 3 * * * *", T0 + 180, T0 + 3600 + 180),  # hourly at minute 3
        ("30 0 3 * * *", T0 + 3 * 3600 + 30, T0 + 27 * 3600 + 30),
    ],
)
def test_six_fields_put_seconds_first(
    app: DelayQ, clock: FakeClock, expr: str, first: float, second: float
) -> None:
    schedule = app.recurring("six", cron=expr)
    assert schedule.nth_after(clock.time(), 1) == first
    assert schedule.nth_after(clock.time(), 2) == second


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("delayq.recurring:x", {}),
        ("delayq.recurring", {}),
        ("y", {"handler": "delayq.recurring"}),
        (" lead", {}),
        ("trail ", {}),
        ("e", {"end": T0 - 1}),
        ("e", {"start": T0 + 100, "end": T0 + 50}),
        ("j", {"jitter": 61}),
    ],
)
def test_definitions_refused_at_the_call(
    app: DelayQ, name: str, options: dict[str, object]
) -> None:
    with pytest.raises(InvalidOption):
        app.recurring(name, every=60, **options)  # type: ignore[arg-type]
    assert app.recurring_schedules() == []


def test_an_interval_finer_than_a_millisecond_is_refused_not_rounded(app: DelayQ) -> None:
    for every in (1.0004, timedelta(microseconds=1_000_400), 60.0000001):
        with pytest.raises(InvalidOption, match="every must be a whole number of milliseconds"):
            app.recurring("fine", every=every)
    assert app.recurring_schedules() == []
    assert app.recurring("fine", every=1.001).every == 1.001
    assert app.recurring("fine", every=timedelta(milliseconds=2001)).every == 2.001
    with pytest.raises(InvalidOption, match="whole number of milliseconds"):
        app.update_recurring("fine", every=2.0005)
    assert app.get_recurring("fine").every == 2.001  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("0 0 ? * MON", "'?' in the day-of-month field (field 3 of 5) is Quartz syntax"),
        ("0 0 12 ? * MON", "'?' in the day-of-month field (field 4 of 6)"),
        ("0 0 12 * * ?", "'?' in the day-of-week field (field 6 of 6)"),
        ("0 0 12 ? * 2", "number the days of the week as cron does"),
        ("? * * * *", "'?' in the minute field (field 1 of 5) is not cron syntax"),
        ("0 0 12 ? * MON 2030", "7 fields (Quartz's year field is not cron)"),
        ("@reboot", "'@reboot' is not a known macro"),
    ],
)
def test_quartz_syntax_is_refused_naming_the_field_it_is_in(
    app: DelayQ, expr: str, says: str
) -> None:
    with pytest.raises(InvalidOption) as refused:
        app.recurring("q", cron=expr)
    assert says in str(refused.value)
    assert app.recurring_schedules() == []


def test_the_cron_spelling_a_quartz_refusal_suggests_runs_as_quartz_would(
    app: DelayQ, clock: FakeClock
) -> None:
    with pytest.raises(InvalidOption, match="'\\*' means the same here: '0 0 12 \\* \\* MON'"):
        app.recurring("q", cron="0 0 12 ? * MON")  # Quartz: Mondays at 12:00
    schedule = app.recurring("q", cron="0 0 12 * * MON")
    runs = [schedule.nth_after(clock.time(), n) for n in (1, 2)]
    assert [datetime.fromtimestamp(t, UTC) for t in runs if t is not None] == [
        datetime(2026, 1, 5, 12, tzinfo=UTC),
        datetime(2026, 1, 12, 12, tzinfo=UTC),
    ]


def test_a_cron_jitter_is_at_most_a_day(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match="jitter"):
        app.recurring("j", cron="0 3 * * 1", jitter=86401)
    app.recurring("j", cron="0 3 * * 1", jitter=86400)


def test_a_schedule_past_its_end_may_be_declared_again_unchanged(
    app: DelayQ, clock: FakeClock
) -> None:
    first = app.recurring("e", every=60, end=T0 + 130)
    drive(app, clock, T0 + 200)
    again = app.recurring("e", every=60, end=T0 + 130)  # a start-up after the end: no error
    assert again.version == first.version


# -- the dashboard's jobs list ------------------------------------------------------------
def test_the_jobs_list_hides_tick_jobs_unless_asked(app: DelayQ, clock: FakeClock) -> None:
    from delayq.web import views  # noqa: PLC0415 - the web extra

    app.recurring("beat", every=1, handler="h")
    drive(app, clock, T0 + 30)
    app.schedule("h", {"one": "off"}, delay=5)
    names = {j.name for j in app.list_jobs(limit=500)}
    assert names == {"h", TICK_HANDLER}
    shown: list[str] = []
    filters = views.JobFilters.parse({"limit": "7"})
    while True:
        page, cursor = views.list_page(app, filters)
        shown += [j.id for j in page]
        assert len(page) <= 7
        if cursor is None:
            break
        filters = views.JobFilters.parse(
            {"limit": "7", "after_run_at": repr(cursor[0]), "after_id": cursor[1]}
        )
    expected = [j.id for j in app.list_jobs(limit=500) if j.name != TICK_HANDLER]
    assert shown == expected and len(expected) == 31
    with_ticks, _ = views.list_page(app, views.JobFilters.parse({"ticks": "1", "limit": "500"}))
    assert len(with_ticks) == len(app.list_jobs(limit=500))
    named, _ = views.list_page(app, views.JobFilters.parse({"name": TICK_HANDLER}))
    assert named and all(j.name == TICK_HANDLER for j in named)


def test_records_leave_new_fields_out_at_their_defaults_and_ignore_unknown_ones() -> None:
    import json  # noqa: PLC0415

    from delayq.backends.base import ScheduleRecord  # noqa: PLC0415
    from delayq.recurring import Schedule  # noqa: PLC0415

    schedule = Schedule(name="x", handler="x", every=60.0, anchor=T0)
    data = json.loads(schedule.to_json())
    assert "overlap" not in data and "generation" not in data  # an older delayq reads it
    data["from_the_future"] = 1
    read = Schedule.from_record(ScheduleRecord("x", json.dumps(data), 3))
    assert read.same_definition(schedule) and read.version == 3
