"""DelayQ: handler registry, scheduling, cancel / reschedule, inspection, dead letters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayq._present import job_dict
from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.backoff import ScheduleBackoff
from delayq.codec import decode_payload, encode_payload
from delayq.errors import (
    ConfigurationError,
    InvalidOption,
    InvalidPayload,
    JobConflict,
    PayloadTooLarge,
)
from delayq.job import CancelOutcome, JobContext, JobState, RescheduleOutcome
from delayq.keyed import KeyedOutcome
from delayq.testing import FakeClock

T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def app(clock: FakeClock) -> Iterator[DelayQ]:
    with DelayQ("memory://", clock=clock) as app:
        yield app


# -- scheduling ----------------------------------------------------------------
def test_schedule_with_delay_stores_the_job_due_after_the_delay(app: DelayQ) -> None:
    job_id = app.schedule("order.cancel", {"order": 42}, delay=30 * 60)
    job = app.get(job_id)
    assert job is not None
    assert job.state is JobState.SCHEDULED
    assert job.run_at == T0 + 1800
    assert job.payload == {"order": 42}
    assert job.name == "order.cancel"
    assert job.attempts == 0
    assert job.created_at == T0


def test_schedule_accepts_a_timedelta_delay(app: DelayQ) -> None:
    job = app.get(app.schedule("x", None, delay=timedelta(hours=24)))
    assert job is not None and job.run_at == T0 + 86400


def test_schedule_at_an_aware_datetime_uses_its_instant(app: DelayQ) -> None:
    at = datetime.fromtimestamp(T0 + 90, tz=UTC)
    job = app.get(app.schedule("x", [], at=at))
    assert job is not None and job.run_at == T0 + 90


def test_schedule_at_epoch_seconds(app: DelayQ) -> None:
    job = app.get(app.schedule("x", 1, at=T0 + 5))
    assert job is not None and job.run_at == T0 + 5


def test_schedule_with_neither_delay_nor_at_is_due_now(app: DelayQ) -> None:
    job = app.get(app.schedule("x", {"n": 1}))
    assert job is not None and job.run_at == T0 and job.state is JobState.SCHEDULED
    [first, second] = app.schedule_many([{"name": "x"}, {"name": "x", "payload": 2}])
    assert [j.id for j in app.list_jobs()] == [job.id, first, second]  # FIFO among "now"


def test_reschedule_still_needs_a_due_time(app: DelayQ) -> None:
    job_id = app.schedule("x")
    with pytest.raises(InvalidOption, match="exactly one"):
        app.reschedule(job_id)


def test_hooks_see_what_is_stored_and_cancelled_and_cannot_undo_it(app: DelayQ) -> None:
    seen: list[tuple[str, object]] = []

    class Hook:
        def before_enqueue(self, specs: list[Any]) -> list[Any]:
            seen.extend(("before", s.id) for s in specs)
            return specs

        def after_enqueue(self, specs: Any, outcomes: Any) -> None:
            seen.extend(("after", o) for o in outcomes)
            raise ValueError("an observer's bug")

        def after_cancel(self, job_id: str, outcome: CancelOutcome) -> None:
            seen.append(("cancel", outcome))

    app.add_hook(Hook())
    job_id = app.schedule("x", job_id="j1")
    assert app.get(job_id) is not None  # the hook's error did not unstore it
    assert app.cancel(job_id) is CancelOutcome.CANCELLED
    assert seen == [("before", "j1"), ("after", "created"), ("cancel", CancelOutcome.CANCELLED)]


def test_a_past_due_time_or_negative_delay_means_now(app: DelayQ) -> None:
    a = app.get(app.schedule("x", at=T0 - 3600))
    b = app.get(app.schedule("x", delay=-5))
    assert a is not None and b is not None
    assert a.run_at == b.run_at == T0


def test_scheduling_a_name_without_a_registered_handler_is_allowed(app: DelayQ) -> None:
    assert app.get_handler("not.imported.here") is None
    assert app.get(app.schedule("not.imported.here", delay=1)) is not None


def test_generated_job_ids_are_unique(app: DelayQ) -> None:
    ids = {app.schedule("x", delay=1) for _ in range(50)}  # the fake clock stands still
    assert len(ids) == 50
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_generated_job_ids_sort_by_creation_time(app: DelayQ, clock: FakeClock) -> None:
    first = app.schedule("x", delay=1)
    clock.advance(0.001)
    second = app.schedule("x", delay=1)
    assert first < second


def test_an_existing_job_id_is_rejected_by_default(app: DelayQ) -> None:
    app.schedule("x", {"v": 1}, delay=10, job_id="order-1")
    with pytest.raises(JobConflict, match="order-1"):
        app.schedule("x", {"v": 2}, delay=20, job_id="order-1")
    job = app.get("order-1")
    assert job is not None and job.payload == {"v": 1}


def test_on_conflict_keep_leaves_the_existing_job(app: DelayQ) -> None:
    app.schedule("x", {"v": 1}, delay=10, job_id="order-1")
    assert app.schedule("x", {"v": 2}, delay=20, job_id="order-1", on_conflict="keep") == "order-1"
    job = app.get("order-1")
    assert job is not None and job.payload == {"v": 1} and job.run_at == T0 + 10


def test_on_conflict_replace_debounces_the_job(app: DelayQ) -> None:
    app.schedule("x", {"v": 1}, delay=10, job_id="order-1")
    app.schedule("x", {"v": 2}, delay=20, job_id="order-1", on_conflict="replace")
    job = app.get("order-1")
    assert job is not None and job.payload == {"v": 2} and job.run_at == T0 + 20


def test_app_defaults_are_stored_with_each_job(clock: FakeClock) -> None:
    with DelayQ(
        "memory://", clock=clock, max_attempts=3, backoff="2s,5s,10s,20s", misfire="skip"
    ) as app:
        job = app.get(app.schedule("x", delay=1))
    assert job is not None
    assert job.max_attempts == 3
    assert job.backoff == {"kind": "schedule", "delays": [2.0, 5.0, 10.0, 20.0]}
    assert job.misfire == "skip"


def test_schedule_options_override_the_app_defaults(app: DelayQ) -> None:
    job = app.get(app.schedule("x", delay=1, max_attempts=7, backoff=[1, 2], misfire="grace:30"))
    assert job is not None
    assert job.max_attempts == 7
    assert job.backoff == {"kind": "schedule", "delays": [1.0, 2.0]}
    assert job.misfire == "grace:30.0"


def test_default_backoff_is_exponential(app: DelayQ) -> None:
    job = app.get(app.schedule("x", delay=1))
    assert job is not None and job.backoff["kind"] == "exponential"


def test_schedule_many_stores_every_job_and_returns_ids_in_order(app: DelayQ) -> None:
    ids = app.schedule_many(
        [
            {"name": "a", "payload": 1, "delay": 5},
            {"name": "b", "payload": 2, "at": T0 + 1, "job_id": "fixed"},
            {"name": "c", "delay": 0, "max_attempts": 2},
        ]
    )
    assert len(ids) == 3 and ids[1] == "fixed"
    jobs = [app.get(i) for i in ids]
    assert [j.name for j in jobs if j] == ["a", "b", "c"]
    assert app.stats().scheduled == 3


def test_schedule_many_with_one_bad_item_stores_nothing_and_names_it(app: DelayQ) -> None:
    with pytest.raises(InvalidPayload, match=r"jobs\[1\]"):
        app.schedule_many([{"name": "a", "delay": 1}, {"name": "b", "payload": {1, 2}, "delay": 1}])
    assert app.stats().scheduled == 0


def test_schedule_many_rejects_unknown_keys_and_repeated_ids(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match="unknown key"):
        app.schedule_many([{"name": "a", "delay": 1, "dealy": 3}])
    with pytest.raises(InvalidOption, match="more than once"):
        app.schedule_many(
            [{"name": "a", "delay": 1, "job_id": "j"}, {"name": "a", "delay": 2, "job_id": "j"}]
        )
    with pytest.raises(InvalidOption, match="name"):
        app.schedule_many([{"delay": 1}])
    assert app.stats().scheduled == 0


def test_schedule_many_of_nothing_returns_nothing(app: DelayQ) -> None:
    assert app.schedule_many([]) == []


def test_schedule_many_conflicting_with_a_stored_job_stores_nothing(app: DelayQ) -> None:
    app.schedule("x", delay=1, job_id="taken")
    with pytest.raises(JobConflict):
        app.schedule_many([{"name": "a", "delay": 1}, {"name": "a", "delay": 1, "job_id": "taken"}])
    assert app.stats().scheduled == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"order": 42, "items": ["a", "ü", None], "nested": {"ok": True, "x": 1.5}},
        [1, (2, 3), {"k": [{"deep": "er"}]}],
        "text",
        -7,
        None,
        {"big": 10**30},
    ],
)
def test_a_stored_payload_is_the_codecs_json_text(app: DelayQ, payload: Any) -> None:
    stored = app.build("x", payload, delay=0).payload
    assert stored == encode_payload(payload)
    [batched] = app.schedule_many([{"name": "x", "payload": payload, "delay": 0}])
    job = app.get(batched)
    assert job is not None and job.payload == decode_payload(encode_payload(payload))


class _Tagged(int):
    """An int subclass: JSON data, but not a plain type (takes the checked path)."""


def test_payloads_with_unusual_types_take_the_checked_path(app: DelayQ) -> None:
    assert app.build("x", {"n": _Tagged(3)}, delay=0).payload == '{"n":3}'
    with pytest.raises(InvalidPayload, match=r"\['bad'\]\[1\]"):
        app.build("x", {"bad": [1, float("nan")]}, delay=0)
    with pytest.raises(InvalidPayload, match="key 1"):
        app.build("x", {"ok": {1: "int key"}}, delay=0)
    with pytest.raises(InvalidPayload, match="500 levels"):
        deep: list[Any] = []
        for _ in range(600):
            deep = [deep]
        app.build("x", deep, delay=0)


def test_payload_size_is_checked_in_bytes_on_the_fast_path(clock: FakeClock) -> None:
    with DelayQ("memory://", clock=clock, max_payload_bytes=10) as small:
        assert small.build("x", "é" * 4, delay=0).payload == '"éééé"'  # 10 bytes
        with pytest.raises(PayloadTooLarge, match="11 bytes"):
            small.build("x", "é" * 4 + "x", delay=0)


def test_ids_generated_in_one_batch_are_unique_and_share_its_time_prefix(
    app: DelayQ, clock: FakeClock
) -> None:
    ids = app.schedule_many([{"name": "x", "delay": 0}] * 600)
    assert len(set(ids)) == 600
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert {i[:14] for i in ids} == {f"{int(T0 * 1_000_000):014x}"}
    clock.advance(1)
    later = app.schedule_many([{"name": "x", "delay": 0}])
    assert later[0] > max(ids)


def test_a_batch_parses_a_shared_backoff_once_but_never_a_mutable_one_stale(
    app: DelayQ, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[object] = []
    real = DelayQ._backoff_spec

    def counting(value: object) -> dict[str, Any]:
        parsed.append(value)
        return real(value)

    monkeypatch.setattr(DelayQ, "_backoff_spec", staticmethod(counting))
    shared = ScheduleBackoff((2.0, 5.0))
    ids = app.schedule_many([{"name": "x", "delay": 0, "backoff": shared}] * 3)
    assert parsed == [shared]
    assert {tuple(app.get(i).backoff["delays"]) for i in ids} == {(2.0, 5.0)}  # type: ignore[union-attr]

    delays = [1.0]

    def growing() -> Iterator[dict[str, Any]]:
        for n in range(3):
            yield {"name": "x", "delay": 0, "backoff": delays}
            delays.append(float(n + 2))

    ids = app.schedule_many(growing())
    assert [len(app.get(i).backoff["delays"]) for i in ids] == [1, 2, 3]  # type: ignore[union-attr]


def test_build_validates_without_storing(app: DelayQ) -> None:
    spec = app.build("x", {"a": 1}, delay=3, job_id="j1")
    assert spec.run_at == T0 + 3 and spec.payload == '{"a":1}'
    assert app.get("j1") is None
    assert app.enqueue([spec]) == ["created"]
    assert app.get("j1") is not None


# -- cancel and reschedule -------------------------------------------------------
def test_cancel_a_scheduled_job_reports_cancelled(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=10)
    assert app.cancel(job_id) is CancelOutcome.CANCELLED
    job = app.get(job_id)
    assert job is not None and job.state is JobState.CANCELLED


def test_cancel_twice_reports_finished(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=10)
    app.cancel(job_id)
    assert app.cancel(job_id) is CancelOutcome.FINISHED


def test_cancel_an_unknown_job_reports_not_found(app: DelayQ) -> None:
    assert app.cancel("nope") is CancelOutcome.NOT_FOUND


def test_cancel_after_claim_reports_running(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=0)
    assert len(app.backend.claim(limit=1, lease=30)) == 1
    assert app.cancel(job_id) is CancelOutcome.RUNNING


def test_reschedule_moves_the_due_time(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=10)
    assert app.reschedule(job_id, delay=60) is RescheduleOutcome.RESCHEDULED
    job = app.get(job_id)
    assert job is not None and job.run_at == T0 + 60
    assert app.reschedule(job_id, at=datetime.fromtimestamp(T0 + 5, tz=UTC)) == "rescheduled"
    job = app.get(job_id)
    assert job is not None and job.run_at == T0 + 5


def test_reschedule_reports_not_found_and_finished(app: DelayQ) -> None:
    assert app.reschedule("nope", delay=1) is RescheduleOutcome.NOT_FOUND
    job_id = app.schedule("x", delay=10)
    app.cancel(job_id)
    assert app.reschedule(job_id, delay=1) is RescheduleOutcome.FINISHED


def test_reschedule_needs_exactly_one_of_delay_and_at(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=10)
    with pytest.raises(InvalidOption, match="exactly one"):
        app.reschedule(job_id)
    with pytest.raises(InvalidOption, match="exactly one"):
        app.reschedule(job_id, delay=1, at=T0)


# -- inspection and dead letters ---------------------------------------------------
def _bury(app: DelayQ, job_id: str, error: str = "boom") -> None:
    (claim,) = [c for c in app.backend.claim(limit=100, lease=30) if c.job.id == job_id]
    app.backend.bury(claim, error)


def test_dead_letters_list_buried_jobs_with_their_error(app: DelayQ) -> None:
    job_id = app.schedule("x", {"n": 1}, delay=0)
    _bury(app, job_id, "ValueError: bad")
    dead = app.dead_letters()
    assert [j.id for j in dead] == [job_id]
    assert dead[0].last_error == "ValueError: bad"
    assert app.stats().dead == 1


def test_requeue_gives_a_dead_job_fresh_attempts(app: DelayQ, clock: FakeClock) -> None:
    job_id = app.schedule("x", delay=0)
    _bury(app, job_id)
    clock.advance(100)
    assert app.requeue(job_id) is True
    job = app.get(job_id)
    assert job is not None
    assert job.state is JobState.SCHEDULED and job.attempts == 0 and job.run_at == T0 + 100
    assert app.requeue(job_id) is False  # no longer dead


def test_requeue_with_a_delay(app: DelayQ) -> None:
    job_id = app.schedule("x", delay=0)
    _bury(app, job_id)
    assert app.requeue(job_id, delay=30)
    job = app.get(job_id)
    assert job is not None and job.run_at == T0 + 30


def test_purge_dead_by_id_by_age_and_all(app: DelayQ, clock: FakeClock) -> None:
    for _ in range(2):
        _bury(app, app.schedule("x", delay=0))
    clock.advance(3600)
    new = app.schedule("x", delay=0)
    _bury(app, new)
    assert app.purge_dead(older_than=1800) == 2
    assert [j.id for j in app.dead_letters()] == [new]
    assert app.purge_dead(job_ids=["unknown"]) == 0
    assert app.purge_dead(job_ids=[new]) == 1
    assert app.purge_dead() == 0


def test_purge_dead_rejects_a_negative_age(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match="older_than"):
        app.purge_dead(older_than=-1)


def test_list_jobs_by_state_and_due_window(app: DelayQ) -> None:
    a = app.schedule("x", delay=10)
    b = app.schedule("x", delay=20)
    c = app.schedule("x", delay=30)
    app.cancel(b)
    assert [j.id for j in app.list_jobs(state="scheduled")] == [a, c]
    assert [j.id for j in app.list_jobs(due_before=T0 + 25)] == [a, b]
    assert [j.id for j in app.list_jobs(due_after=T0 + 15, limit=1)] == [b]
    with pytest.raises(InvalidOption, match="state must be one of"):
        app.list_jobs(state="sleeping")
    with pytest.raises(InvalidOption, match="limit"):
        app.list_jobs(limit=0)


def test_stats_count_by_state(app: DelayQ) -> None:
    app.schedule("x", delay=0)
    app.schedule("x", delay=100)
    stats = app.stats()
    assert stats.scheduled == 2 and stats.due == 1 and stats.next_due == T0


# -- handlers ------------------------------------------------------------------------
def test_a_one_argument_handler_is_called_with_the_payload(app: DelayQ) -> None:
    seen: list[Any] = []

    @app.handler("h")
    def h(payload: Any) -> None:
        seen.append(payload)

    handler = app.get_handler("h")
    assert handler is not None and not handler.takes_context and not handler.is_async
    handler.call({"a": 1}, _ctx())
    assert seen == [{"a": 1}]


def test_a_two_argument_handler_also_gets_the_context(app: DelayQ) -> None:
    seen: list[tuple[Any, JobContext]] = []

    @app.handler("h")
    def h(payload: Any, ctx: JobContext) -> None:
        seen.append((payload, ctx))

    handler = app.get_handler("h")
    assert handler is not None and handler.takes_context
    ctx = _ctx()
    handler.call(1, ctx)
    assert seen == [(1, ctx)]


def test_async_handlers_and_async_callables_are_detected(app: DelayQ) -> None:
    @app.handler("a")
    async def a(payload: Any) -> None:
        return None

    class Callable:
        async def __call__(self, payload: Any, ctx: JobContext) -> None:
            return None

    app.register("b", Callable())
    ha, hb = app.get_handler("a"), app.get_handler("b")
    assert ha is not None and ha.is_async and not ha.takes_context
    assert hb is not None and hb.is_async and hb.takes_context


def test_the_decorator_returns_the_function_unchanged(app: DelayQ) -> None:
    def h(payload: Any) -> int:
        return 7

    assert app.handler("h")(h) is h
    assert set(app.handlers) == {"h"}


def test_registering_a_name_twice_needs_replace(app: DelayQ) -> None:
    app.register("h", lambda p: None)
    with pytest.raises(ConfigurationError, match="already registered"):
        app.register("h", lambda p: None)

    def newer(p: Any) -> None:
        return None

    app.register("h", newer, replace=True)
    handler = app.get_handler("h")
    assert handler is not None and handler.fn is newer


@pytest.mark.parametrize(
    "fn",
    [lambda: None, lambda a, b, c: None, lambda a, *, key: None],
    ids=["no-argument", "three-required", "required-keyword"],
)
def test_a_handler_with_an_unusable_signature_is_rejected(app: DelayQ, fn: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"\(payload\) or \(payload, ctx\)"):
        app.register("h", fn)


def test_a_handler_name_must_be_a_usable_string(app: DelayQ) -> None:
    for bad in ("", "  ", "a\nb", "x" * 201, 5):
        with pytest.raises(InvalidOption):
            app.register(bad, lambda p: None)  # type: ignore[arg-type]


def test_a_handler_must_be_callable(app: DelayQ) -> None:
    with pytest.raises(ConfigurationError, match="callable"):
        app.register("h", 42)  # type: ignore[arg-type]


def test_job_context_reports_lateness_and_last_attempt() -> None:
    ctx = _ctx(attempt=3, max_attempts=3)
    assert ctx.lateness == pytest.approx(0.25)
    assert ctx.is_last_attempt


# -- construction ---------------------------------------------------------------------
def test_url_and_backend_together_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        DelayQ("memory://", backend=MemoryBackend())


def test_a_non_backend_object_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="Backend protocol"):
        DelayQ(backend=object())  # type: ignore[arg-type]


def test_an_unknown_url_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown backend URL scheme"):
        DelayQ("mongodb://localhost")


def test_the_url_comes_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DELAYQ_URL", "memory://")
    with DelayQ() as app:
        assert app.url == "memory://"


def test_close_closes_an_owned_backend_but_not_a_given_one(clock: FakeClock) -> None:
    given = MemoryBackend(clock=clock)
    with DelayQ(backend=given, clock=clock) as app:
        app.schedule("x", delay=1)
    assert given.stats().scheduled == 1  # still open
    owned = DelayQ("memory://", clock=clock)
    owned.close()
    owned.close()  # idempotent
    with pytest.raises(Exception, match="closed"):
        owned.stats()


def test_bad_app_options_are_rejected() -> None:
    with pytest.raises(InvalidOption, match="max_payload_bytes"):
        DelayQ("memory://", max_payload_bytes=0)
    with pytest.raises(InvalidOption, match="max_attempts"):
        DelayQ("memory://", max_attempts=0)
    with pytest.raises(InvalidOption, match="backoff"):
        DelayQ("memory://", backoff={"kind": "fibonacci"})
    with pytest.raises(InvalidOption, match="misfire"):
        DelayQ("memory://", misfire="later")


def test_repr_names_the_store_and_handlers(app: DelayQ) -> None:
    app.register("h", lambda p: None)
    assert repr(app) == "DelayQ('memory://', handlers=['h'])"


def _ctx(*, attempt: int = 1, max_attempts: int = 5) -> JobContext:
    return JobContext(
        id="j",
        name="h",
        attempt=attempt,
        max_attempts=max_attempts,
        run_at=T0,
        claimed_at=T0 + 0.25,
        lease_until=T0 + 30,
        created_at=T0 - 1,
    )


# -- keyed calls ---------------------------------------------------------------
def test_schedule_debounces_by_job_id_and_schedule_keyed_says_what_it_did(
    app: DelayQ, clock: FakeClock
) -> None:
    assert (
        app.schedule("reindex", 1, delay=5, job_id="r:7", on_conflict="debounce", max_wait=60)
        == "r:7"
    )
    clock.advance(3)
    result = app.schedule_keyed(
        "reindex", 2, delay=5, job_id="r:7", on_conflict="debounce", max_wait=60
    )
    assert (result.id, result.outcome, result.run_at) == ("r:7", KeyedOutcome.EXTENDED, T0 + 8)
    job = app.get("r:7")
    assert job is not None and job.payload == 2 and job.keyed is not None
    assert (job.keyed.key, job.keyed.extended, job.keyed.calls) == ("r:7", 1, 2)


def test_keyed_options_that_do_not_fit_are_refused_at_the_call(app: DelayQ) -> None:
    with pytest.raises(InvalidOption, match="needs job_id"):
        app.schedule("x", on_conflict="debounce", max_wait=5)
    with pytest.raises(InvalidOption, match="max_items does not apply"):
        app.schedule("x", job_id="k", on_conflict="debounce", max_wait=5, max_items=3)
    with pytest.raises(InvalidOption, match="'#'"):
        app.schedule("x", job_id="a#2", on_conflict="append")
    with pytest.raises(InvalidOption, match="needs a keyed mode"):
        app.schedule_keyed("x", job_id="k", on_conflict="keep")


def test_an_appended_batch_is_one_job_whose_payload_is_the_list(app: DelayQ) -> None:
    for n in range(3):
        app.schedule("digest", {"event": n}, job_id="d", on_conflict="append", max_items=10)
    job = app.get("d")
    assert job is not None and job.payload == [{"event": 0}, {"event": 1}, {"event": 2}]
    assert job.keyed is not None and job.keyed.items == 3
    assert (
        job_dict(job)["keyed"]["mode"] == "append max_items=10"
    )  # what the dashboard and API show
