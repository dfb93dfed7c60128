"""Recurring schedules under backlog, operator action and racing edits, on a fake
clock: the latest occurrence runs however late, pause and remove stop what is
already due, concurrent edits merge, and an occurrence never runs twice."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from delayq import DelayQ
from delayq.backends.base import ScheduleStore
from delayq.backends.memory import MemoryBackend
from delayq.errors import BackendUnavailable, InvalidOption
from delayq.job import JobSpec, JobState, Misfire
from delayq.recurring import TICK_HANDLER, occurrence_id
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


def hm(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%d %H:%M")


def lagged(app: DelayQ, clock: FakeClock, lag: float, horizon: float) -> tuple[list[str], int]:
    """Run every job ``lag`` seconds after its due time (a backlog that never
    clears), one at a time; return the occurrences that ran and the skipped count."""
    backend = app.backend
    ran: list[str] = []
    skipped = 0
    end = clock.time() + horizon
    while (head := backend.next_due()) is not None and head + lag <= end:
        if head + lag > clock.time():
            clock.advance(head + lag - clock.time())
        for claim in backend.claim(limit=1, lease=LEASE, now=clock.time()):
            job = claim.job
            if job.name == TICK_HANDLER:
                handler = app.get_handler(TICK_HANDLER)
                assert handler is not None
                handler.call(job.payload, context(claim))
            elif not Misfire.parse(job.misfire).should_run(claim.claimed_at - job.run_at):
                backend.ack(claim, state=JobState.SKIPPED, outcome="late")
                skipped += 1
                continue
            else:
                ran.append(job.id)
            backend.ack(claim)
    return ran, skipped


# -- a backlog longer than the interval ---------------------------------------------------
@pytest.mark.parametrize("misfire", ["latest", "catchup:1"])
@pytest.mark.parametrize("lag", [61.0, 90.0, 200.0])
def test_the_latest_occurrence_runs_however_long_a_backlog_keeps_every_job_late(
    app: DelayQ, clock: FakeClock, misfire: str, lag: float
) -> None:
    app.recurring("warm", every=60, misfire=misfire)
    ran, skipped = lagged(app, clock, lag, 3600)
    assert skipped == 0
    assert len(ran) == len(set(ran))
    # each tick enqueues the latest due occurrence and it runs: one per tick's window
    assert len(ran) >= 3600 // (lag + 60) - 1, ran


def test_a_late_tick_supersedes_the_earlier_occurrence_still_waiting(
    app: DelayQ, clock: FakeClock
) -> None:
    app.recurring("warm", every=60, handler="h")
    backend = app.backend
    # the tick of T0+60 ran late and enqueued that occurrence, which still waits
    clock.advance(60.5)
    for claim in backend.claim(limit=1, lease=LEASE, now=clock.time()):
        app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
        backend.ack(claim)
    first = app.get(occurrence_id("warm", T0 + 60))
    assert first is not None and first.state is JobState.SCHEDULED
    # the backlog lasts: the next tick runs after the next occurrence is due
    clock.advance(T0 + 125 - clock.time())
    tick = [c for c in backend.claim(limit=10, lease=LEASE, now=clock.time())]
    for claim in tick:
        if claim.job.name == TICK_HANDLER:
            app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
            backend.ack(claim)
        else:
            backend.release(claim)
    assert app.get(occurrence_id("warm", T0 + 60)).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert [r.run_at - T0 for r in drive(app, clock, T0 + 150)] == [120.0]


# -- pause and remove stop occurrences that are already due ------------------------------
@pytest.mark.parametrize(
    ("misfire", "action"),
    [("catchup:5", "pause"), ("catchup:5", "remove"), ("latest", "pause"), ("latest", "remove")],
)
def test_pause_and_remove_cancel_catch_up_occurrences_waiting_behind_a_backlog(
    app: DelayQ, clock: FakeClock, misfire: str, action: str
) -> None:
    app.recurring("h", cron="0 * * * *", misfire=misfire, handler="report")
    drive(app, clock, T0 + 1800)
    clock.advance(T0 + 3.5 * 3600 - clock.time())  # down from 00:30 to 03:30
    backend = app.backend
    for claim in backend.claim(limit=10, lease=LEASE, now=clock.time()):
        if claim.job.name == TICK_HANDLER:  # the late tick runs first ...
            app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
            backend.ack(claim)
        else:
            backend.release(claim)
    waiting = [j.id for j in backend.list_jobs(state="scheduled") if j.name == "report"]
    assert waiting  # ... and what it enqueued waits behind a backlog
    clock.advance(5)
    assert getattr(app, f"{action}_recurring")("h") is True
    assert drive(app, clock, T0 + 6 * 3600) == []
    assert all(app.get(job_id).state is JobState.CANCELLED for job_id in waiting)  # type: ignore[union-attr]


# -- concurrent edits ------------------------------------------------------------------------
def test_two_concurrent_partial_edits_both_take_effect(
    app: DelayQ, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.recurring("r", cron="0 3 * * *", payload={"v": 1})
    store = app.backend
    assert isinstance(store, ScheduleStore)
    put = store.put_schedule
    raced: list[bool] = []

    def put_after_another_edit(name: str, data: str, *, version: int) -> int | None:
        if not raced:  # A has read the record; B's whole edit lands before A writes
            raced.append(True)
            app.update_recurring("r", cron="30 4 * * *")
        return put(name, data, version=version)

    monkeypatch.setattr(store, "put_schedule", put_after_another_edit)
    app.update_recurring("r", payload={"v": 2})
    schedule = app.get_recurring("r")
    assert raced and schedule is not None
    assert (schedule.cron, schedule.payload) == ("30 4 * * *", '{"v":2}')


# -- what an edit does to the timing --------------------------------------------------------
def daily_at_0300(app: DelayQ, clock: FakeClock) -> None:
    """A daily schedule created at 03:00 (its first run the next day), edited at 17:30."""
    clock.advance(3 * 3600)
    app.recurring("d", every=86400)
    assert [hm(r.run_at) for r in drive(app, clock, T0 + 86400 + 17.5 * 3600)] == ["02 03:00"]


def test_changing_only_the_end_keeps_an_interval_schedule_in_place(
    app: DelayQ, clock: FakeClock
) -> None:
    daily_at_0300(app, clock)
    app.update_recurring("d", end=T0 + 10 * 86400)
    ran = drive(app, clock, T0 + 4 * 86400 + 6 * 3600)
    assert [hm(r.run_at) for r in ran] == ["03 03:00", "04 03:00", "05 03:00"]


def test_a_time_zone_with_an_interval_is_refused(app: DelayQ, clock: FakeClock) -> None:
    daily_at_0300(app, clock)
    with pytest.raises(InvalidOption, match="tz"):
        app.update_recurring("d", tz="Europe/Berlin")
    with pytest.raises(InvalidOption, match="tz"):
        app.recurring("e", every=60, tz="Europe/Berlin")


def test_a_new_interval_counts_from_the_last_occurrence(app: DelayQ, clock: FakeClock) -> None:
    daily_at_0300(app, clock)
    app.update_recurring("d", every=3600)
    ran = drive(app, clock, T0 + 86400 + 20 * 3600 + 1)
    assert [hm(r.run_at) for r in ran] == ["02 18:00", "02 19:00", "02 20:00"]


def test_two_definitions_declared_in_turn_by_old_and_new_processes_keep_it_running(
    app: DelayQ, clock: FakeClock
) -> None:
    ran = []
    for i in range(15):  # a process starts every 20 minutes for 5 hours, old and new in turn
        app.recurring("hourly", every=3600 if i % 2 else 3540)
        ran += drive(app, clock, T0 + (i + 1) * 1200)
    assert len(ran) >= 4, [hm(r.run_at) for r in ran]


def test_a_cron_edit_of_the_end_only_keeps_what_is_due(app: DelayQ, clock: FakeClock) -> None:
    app.recurring("c", cron="0 3 * * *")
    drive(app, clock, T0 + 17 * 3600)
    before = app.get_recurring("c")
    after = app.update_recurring("c", end=T0 + 10 * 86400)
    assert before is not None and after.not_before == before.not_before


# -- start-up declarations -----------------------------------------------------------------
def test_conflict_keep_leaves_a_stored_definition_as_it_is(app: DelayQ, clock: FakeClock) -> None:
    first = app.recurring("k", every=2, conflict="keep")
    again = app.recurring("k", every=3, conflict="keep")
    assert again.every == first.every == 2.0 and again.version == first.version
    assert app.recurring("k", every=3).every == 3.0  # replace (the default) changes it
    with pytest.raises(InvalidOption, match="conflict"):
        app.recurring("k", every=3, conflict="maybe")


def test_payload_key_order_is_not_a_change(app: DelayQ) -> None:
    first = app.recurring("p", every=60, payload={"a": 1, "b": 2})
    again = app.recurring("p", every=60, payload={"b": 2, "a": 1})
    assert again.version == first.version


# -- an occurrence runs once ---------------------------------------------------------------
def test_a_resume_racing_an_edit_never_runs_a_finished_occurrence_again(
    app: DelayQ, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.recurring("d", every=10, handler="h", payload={"v": 1})
    drive(app, clock, T0 + 9.5)  # the occurrence of T0+10 is enqueued ahead
    occ = occurrence_id("d", T0 + 10)
    app.pause_recurring("d")
    store = app.backend
    assert isinstance(store, MemoryBackend)
    get = store.get
    runs: list[Any] = []
    armed = [True]
    other = DelayQ(backend=store, clock=clock)

    def get_then_race(job_id: str) -> Any:
        job = get(job_id)
        if armed and job_id == occ and job is not None and job.state is JobState.CANCELLED:
            armed.clear()
            # the resume read CANCELLED; an edit revives the occurrence, which runs
            other.update_recurring("d", payload={"v": 2})
            clock.advance(T0 + 10 - clock.time())
            for claim in store.claim(limit=10, lease=LEASE, now=clock.time()):
                if claim.job.id == occ:
                    runs.append(claim.job.payload)
                    store.ack(claim)
                else:
                    store.release(claim)
        return job

    monkeypatch.setattr(store, "get", get_then_race)
    app.resume_recurring("d")
    monkeypatch.undo()
    runs += [r.payload for r in drive(app, clock, T0 + 10.9) if r.id == occ]
    assert runs == [{"v": 2}]


def test_a_tick_racing_a_remove_and_create_runs_nothing_of_the_old_schedule(
    app: DelayQ, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.recurring("z", every=10, handler="old.handler", payload={"def": "old"})
    backend = app.backend
    clock.advance(10 - 0.7)
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    enqueue = backend.enqueue
    raced: list[bool] = []

    def enqueue_after_recreate(specs: list[JobSpec], **kw: Any) -> Any:
        if not raced and any(s.name == "old.handler" for s in specs):
            raced.append(True)  # between the tick's read and its enqueue
            app.remove_recurring("z")
            app.recurring("z", cron="0 3 * * *", handler="new.handler", payload={"def": "new"})
        return enqueue(specs, **kw)

    monkeypatch.setattr(backend, "enqueue", enqueue_after_recreate)
    app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
    backend.ack(claim)
    monkeypatch.undo()
    assert raced
    assert [r.name for r in drive(app, clock, T0 + 30)] == []


def test_retrying_an_edit_that_failed_half_way_restores_its_occurrence(
    app: DelayQ, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.recurring("e", every=10, handler="h", payload={"v": 1})
    drive(app, clock, T0 + 9.5)
    occ = occurrence_id("e", T0 + 10)
    backend = app.backend
    enqueue = backend.enqueue
    failed: list[bool] = []

    def flaky(specs: list[JobSpec], **kw: Any) -> Any:
        if not failed and any(s.id == occ for s in specs):
            failed.append(True)
            raise BackendUnavailable("store hiccup")
        return enqueue(specs, **kw)

    monkeypatch.setattr(backend, "enqueue", flaky)
    with pytest.raises(BackendUnavailable):
        app.update_recurring("e", payload={"v": 2})
    monkeypatch.undo()
    app.update_recurring("e", payload={"v": 2})  # the caller retries
    ran = drive(app, clock, T0 + 30.5)
    assert [(r.id, r.payload) for r in ran][:1] == [(occ, {"v": 2})]
    assert len(ran) == 3


def test_a_retried_tick_does_not_enqueue_again_an_occurrence_whose_record_is_gone(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # finished records last 1 s here (as on a busy store that caps them)
    backend = MemoryBackend(clock=clock, result_ttl=1.0)
    app = DelayQ(backend=backend, clock=clock)
    app.recurring("w", every=10, handler="h")
    clock.advance(10 - 0.7)
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    get_schedule = backend.get_schedule
    calls: list[str] = []

    def fail_second_read(name: str) -> Any:
        calls.append(name)
        if len(calls) == 2:  # the tick's re-read after its enqueue
            raise BackendUnavailable("store hiccup")
        return get_schedule(name)

    monkeypatch.setattr(backend, "get_schedule", fail_second_read)
    with pytest.raises(BackendUnavailable):
        app.get_handler(TICK_HANDLER).call(claim.job.payload, context(claim))  # type: ignore[union-attr]
    monkeypatch.undo()
    backend.retry(claim, run_at=T0 + 13, error="store hiccup")
    ran = drive(app, clock, T0 + 19)  # the occurrence runs, its record expires, the tick retries
    assert Counter(r.id for r in ran) == {occurrence_id("w", T0 + 10): 1}
