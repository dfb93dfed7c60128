"""Schedule records (``ScheduleStore``, feature ``recurring``) and recurring chains,
checked against every store that declares the feature."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from delayq.app import DelayQ
from delayq.backends.base import Backend, ScheduleRecord, ScheduleStore
from delayq.errors import InvalidOption
from delayq.recurring import occurrence_id
from delayq.testing import FakeClock
from tests.recurring_support import drive

needs_recurring = pytest.mark.backend_features("recurring")


def schedules(backend: Backend) -> ScheduleStore:
    assert isinstance(backend, ScheduleStore)
    return backend


@needs_recurring
def test_a_new_record_starts_at_version_1_and_reads_back(backend: Backend) -> None:
    store = schedules(backend)
    assert store.get_schedule("nightly") is None
    assert store.put_schedule("nightly", '{"cron":"0 3 * * *"}', version=0) == 1
    assert store.get_schedule("nightly") == ScheduleRecord("nightly", '{"cron":"0 3 * * *"}', 1)


@needs_recurring
def test_a_write_at_a_stale_version_changes_nothing(backend: Backend) -> None:
    store = schedules(backend)
    assert store.put_schedule("s", "1", version=0) == 1
    assert store.put_schedule("s", "2", version=0) is None  # exists already
    assert store.put_schedule("s", "2", version=1) == 2
    assert store.put_schedule("s", "3", version=1) is None  # someone else wrote version 2
    assert store.get_schedule("s") == ScheduleRecord("s", "2", 2)


@needs_recurring
def test_records_list_by_name_and_keep_any_text(backend: Backend) -> None:
    store = schedules(backend)
    for name in ("b", "a:x", "c@1", "ünï"):
        store.put_schedule(name, f'{{"name":"{name}","colon":"a:b"}}', version=0)
    listed = store.list_schedules()
    assert [r.name for r in listed] == sorted(["b", "a:x", "c@1", "ünï"])
    assert all(r.data.endswith('"colon":"a:b"}') and r.version == 1 for r in listed)


@needs_recurring
def test_delete_removes_the_record_once_and_honours_a_version(backend: Backend) -> None:
    store = schedules(backend)
    store.put_schedule("s", "{}", version=0)
    assert store.delete_schedule("s", version=2) is False
    assert store.delete_schedule("s", version=1) is True
    assert store.delete_schedule("s") is False
    assert store.get_schedule("s") is None
    assert store.put_schedule("s", "{}", version=0) == 1  # a new record starts over


@needs_recurring
@pytest.mark.parametrize(
    ("name", "data", "version"),
    [("", "{}", 0), ("x" * 161, "{}", 0), ("s", b"{}", 0), ("s", "{}", -1), ("s", "{}", True)],
)
def test_bad_arguments_are_refused(
    backend: Backend, name: object, data: object, version: object
) -> None:
    store = schedules(backend)
    with pytest.raises(InvalidOption):
        store.put_schedule(name, data, version=version)  # type: ignore[arg-type]
    assert store.list_schedules() == []


@pytest.mark.backend_features("recurring", "shared")
def test_an_edit_through_one_handle_is_seen_by_another(
    backend: Backend, open_another: Callable[..., Backend]
) -> None:
    store = schedules(backend)
    other = schedules(open_another())
    store.put_schedule("s", "1", version=0)
    assert other.put_schedule("s", "2", version=1) == 2
    assert store.get_schedule("s") == ScheduleRecord("s", "2", 2)
    assert other.delete_schedule("s") is True
    assert store.list_schedules() == []


@pytest.mark.backend_features("recurring", "durable")
def test_records_survive_reopening_the_store(open_another: Callable[..., Backend]) -> None:
    first = open_another()
    schedules(first).put_schedule("s", "kept", version=0)
    first.close()
    assert schedules(open_another()).get_schedule("s") == ScheduleRecord("s", "kept", 1)


@needs_recurring
def test_a_chain_makes_one_job_per_occurrence_however_often_ticks_run(
    backend: Backend, clock: FakeClock
) -> None:
    schedules(backend)
    with DelayQ(backend=backend, clock=clock) as app:
        app.recurring("poll", every=60, payload={"n": 1})
        begin = clock.time()
        ran = drive(app, clock, begin + 5 * 60 + 1, ticks_twice=True)
        assert [r.id for r in ran] == [
            occurrence_id("poll", math.ceil(begin) + 60.0 * n) for n in range(1, 6)
        ]
        assert all(r.payload == {"n": 1} for r in ran)
        app.pause_recurring("poll")
        assert drive(app, clock, clock.time() + 300) == []
        app.resume_recurring("poll")
        assert len(drive(app, clock, clock.time() + 61)) == 1
        assert app.remove_recurring("poll") is True
        assert drive(app, clock, clock.time() + 600) == []
