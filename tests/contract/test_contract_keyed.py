"""Keyed calls (feature ``keyed``): debounce with a max wait, throttle, unique and
append, each decided and stored in one atomic step of the store."""

from __future__ import annotations

import contextlib
import itertools
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayq.backends.base import Backend
from delayq.backends.memory import MemoryBackend
from delayq.errors import InvalidOption, JobConflict
from delayq.job import JobState
from delayq.keyed import KeyedOutcome, KeyedResult, KeyPolicy
from delayq.testing import FakeClock
from tests.contract._registry import BackendFactory
from tests.contract._support import spec
from tests.contract.test_contract import Waiter

needs_keyed = pytest.mark.backend_features("keyed")
LEASE = 30.0
DEBOUNCE = KeyPolicy.build("debounce", max_wait=60)
THROTTLE = KeyPolicy.build("throttle", window=10)
TRAILING = KeyPolicy.build("throttle", window=10, trailing=True)
UNTIL_FINISHED = KeyPolicy.build("keep", unique="until_finished")
APPEND = KeyPolicy.build("append", max_items=3)


def call(
    backend: Backend, policy: KeyPolicy | None, payload: Any, *, delay: float = 5.0, key: str = "k"
) -> KeyedResult:
    assert policy is not None
    job = spec(key, 0.0, payload=payload)
    job = type(job)(**{**{f: getattr(job, f) for f in job.__slots__}, "delay": delay})
    return backend.enqueue_keyed(job, policy)  # type: ignore[attr-defined,no-any-return]


def payload_of(backend: Backend, job_id: str) -> Any:
    job = backend.get(job_id)
    assert job is not None
    return job.payload


@needs_keyed
def test_debounce_extends_until_the_max_wait_caps_it(backend: Backend, clock: FakeClock) -> None:
    t0 = clock.time()
    first = call(backend, DEBOUNCE, 1)
    assert (first.id, first.outcome, first.run_at) == ("k", KeyedOutcome.CREATED, t0 + 5)
    for step in range(1, 12):
        clock.advance(4)
        result = call(backend, DEBOUNCE, step + 1)
        assert result.id == "k"
    assert result.outcome is KeyedOutcome.EXTENDED and result.run_at == t0 + 44 + 5
    clock.advance(14)  # t0 + 58: now + 5 is past the cap t0 + 60
    capped = call(backend, DEBOUNCE, "last")
    assert (capped.outcome, capped.run_at) == (KeyedOutcome.CAPPED, t0 + 60)
    job = backend.get("k")
    assert job is not None and job.payload == "last" and job.run_at == t0 + 60
    assert (
        job.keyed is not None and job.keyed.extended == 12 and job.keyed.mode.startswith("debounce")
    )


@needs_keyed
def test_a_debounce_call_while_the_job_runs_creates_the_next_run(
    backend: Backend, clock: FakeClock
) -> None:
    call(backend, DEBOUNCE, "a", delay=0)
    [claim] = backend.claim(limit=1, lease=LEASE)
    result = call(backend, DEBOUNCE, "b")
    assert (result.id, result.outcome) == ("k#2", KeyedOutcome.CREATED)
    running = backend.get("k")
    assert running is not None and running.state is JobState.RUNNING and running.payload == "a"
    backend.ack(claim)
    assert call(backend, DEBOUNCE, "c").outcome is KeyedOutcome.EXTENDED
    assert payload_of(backend, "k#2") == "c"


@needs_keyed
def test_a_debounce_call_racing_the_claim_either_extends_or_makes_the_next_run(
    backend: Backend, clock: FakeClock
) -> None:
    call(backend, DEBOUNCE, "a", delay=0)
    results: list[KeyedResult] = []
    go = threading.Barrier(2)

    def producer() -> None:
        go.wait()
        results.append(call(backend, DEBOUNCE, "b", delay=0))

    thread = threading.Thread(target=producer)
    thread.start()
    go.wait()
    claims = backend.claim(limit=10, lease=LEASE)
    thread.join()
    [result] = results
    payloads = [c.job.payload for c in claims]
    if result.outcome is KeyedOutcome.EXTENDED:  # the call came first: the claim ran "b"
        if not payloads:  # or it skipped the row the call was writing (SKIP LOCKED)
            payloads = [c.job.payload for c in backend.claim(limit=10, lease=LEASE)]
        assert payloads == ["b"]
    else:  # the claim came first: "a" runs, "b" is the next run, untouched by the claim
        assert (result.id, result.outcome, payloads) == ("k#2", KeyedOutcome.CREATED, ["a"])
        assert [c.job.payload for c in backend.claim(limit=10, lease=LEASE)] == ["b"]


@needs_keyed
def test_throttle_runs_the_first_call_and_drops_the_rest_of_the_window(
    backend: Backend, clock: FakeClock
) -> None:
    assert call(backend, THROTTLE, 1, delay=0).outcome is KeyedOutcome.CREATED
    clock.advance(3)
    assert call(backend, THROTTLE, 2, delay=0).outcome is KeyedOutcome.DROPPED
    clock.advance(7)  # the window ended
    result = call(backend, THROTTLE, 3, delay=0)
    assert (result.id, result.outcome) == ("k#2", KeyedOutcome.CREATED)
    assert payload_of(backend, "k") == 1


@needs_keyed
def test_trailing_throttle_folds_the_window_into_one_run_at_its_end(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    call(backend, TRAILING, 1, delay=0)
    clock.advance(2)
    folded = call(backend, TRAILING, 2, delay=0)
    assert (folded.id, folded.outcome, folded.run_at) == ("k#2", KeyedOutcome.FOLDED, t0 + 10)
    clock.advance(2)
    again = call(backend, TRAILING, 3, delay=0)
    assert (again.id, again.outcome, again.run_at) == ("k#2", KeyedOutcome.FOLDED, t0 + 10)
    assert payload_of(backend, "k#2") == 3
    clock.advance(8)  # t0 + 12: in the window the trailing run opened at t0 + 10
    later = call(backend, TRAILING, 4, delay=0)
    assert (later.id, later.outcome, later.run_at) == ("k#3", KeyedOutcome.FOLDED, t0 + 20)


@needs_keyed
def test_unique_until_finished_keeps_through_retries_and_frees_on_finish(
    backend: Backend, clock: FakeClock
) -> None:
    call(backend, UNTIL_FINISHED, 1, delay=0)
    [claim] = backend.claim(limit=1, lease=LEASE)
    assert call(backend, UNTIL_FINISHED, 2).outcome is KeyedOutcome.KEPT
    backend.retry(claim, clock.time(), "boom")
    assert call(backend, UNTIL_FINISHED, 3).outcome is KeyedOutcome.KEPT
    [claim] = backend.claim(limit=1, lease=LEASE)
    backend.bury(claim, "dead")  # a dead-lettered job frees the key
    result = call(backend, UNTIL_FINISHED, 4)
    assert (result.id, result.outcome) == ("k#2", KeyedOutcome.CREATED)
    reject = KeyPolicy.build("reject", unique="until_finished")
    assert reject is not None
    with pytest.raises(JobConflict):
        call(backend, reject, 5)


@needs_keyed
def test_unique_until_started_and_for_a_period(backend: Backend, clock: FakeClock) -> None:
    started = KeyPolicy.build("keep", unique="until_started")
    call(backend, started, 1, delay=0, key="s")
    assert call(backend, started, 2, key="s").outcome is KeyedOutcome.KEPT
    backend.claim(limit=1, lease=LEASE)
    assert call(backend, started, 3, key="s").outcome is KeyedOutcome.CREATED
    period = KeyPolicy.build("keep", unique=100)
    call(backend, period, 1, key="p")
    clock.advance(99)
    assert call(backend, period, 2, key="p").outcome is KeyedOutcome.KEPT
    clock.advance(1)
    assert call(backend, period, 3, key="p").outcome is KeyedOutcome.CREATED


@needs_keyed
def test_append_collects_payloads_into_one_list_capped_at_max_items(
    backend: Backend, clock: FakeClock
) -> None:
    t0 = clock.time()
    outcomes = [call(backend, APPEND, {"n": n}) for n in range(4)]
    assert [r.outcome for r in outcomes] == ["created", "appended", "appended", "created"]
    assert [r.id for r in outcomes] == ["k", "k", "k", "k#2"]
    assert payload_of(backend, "k") == [{"n": 0}, {"n": 1}, {"n": 2}]
    job = backend.get("k#2")
    assert job is not None and job.payload == [{"n": 3}] and job.run_at == t0 + 5
    assert job.keyed is not None and job.keyed.items == 1


@needs_keyed
def test_two_producers_appending_at_once_lose_no_item(backend: Backend) -> None:
    policy = KeyPolicy.build("append", max_items=50)
    go = threading.Barrier(2)

    def produce(who: str) -> None:
        go.wait()
        for n in range(40):
            call(backend, policy, f"{who}{n}", delay=100)

    threads = [threading.Thread(target=produce, args=(w,)) for w in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = payload_of(backend, "k") + payload_of(backend, "k#2")
    assert len(payload_of(backend, "k")) == 50
    assert sorted(items) == sorted(f"{w}{n}" for w in "ab" for n in range(40))
    assert json.dumps(items)  # every item is plain JSON


def test_bad_keyed_options_are_refused_at_the_call() -> None:
    with pytest.raises(InvalidOption, match="max_wait"):
        KeyPolicy.build("debounce")
    with pytest.raises(InvalidOption, match="window"):
        KeyPolicy.build("replace", window=3)
    with pytest.raises(InvalidOption, match="unique"):
        KeyPolicy.build("keep", unique="forever")
    with pytest.raises(InvalidOption, match="max_items"):
        KeyPolicy.build("append", max_items=0)


POLICIES = [
    DEBOUNCE,
    KeyPolicy.build("debounce", max_wait=12),
    THROTTLE,
    TRAILING,
    UNTIL_FINISHED,
    KeyPolicy.build("reject", unique="until_finished"),
    KeyPolicy.build("keep", unique="until_started"),
    KeyPolicy.build("keep", unique=4),
    APPEND,
]
CALL = st.tuples(
    st.just("call"), st.sampled_from(["k", "j"]), st.sampled_from([0.0, 3.0, 8.0, 20.0])
)
STEPS = st.lists(
    st.one_of(
        CALL,
        CALL,
        CALL,
        st.tuples(st.just("claim")),
        st.tuples(st.sampled_from(["ack", "retry", "bury"]), st.integers(0, 3)),
        st.tuples(st.just("cancel"), st.sampled_from(["k", "j", "k#2", "j#2", "k#3"])),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 2.0, 4.0, 11.0])),
    ),
    min_size=4,
    max_size=40,
)
EXAMPLES = {"memory": 20, "sqlite": 100, "redis": 200}


def _outcome(store: Backend, policy: KeyPolicy | None, n: int, key: str, delay: float) -> Any:
    try:
        r = call(store, policy, n, key=key, delay=delay)
    except JobConflict:
        return "conflict"
    job = store.get(r.id)
    assert job is not None
    return r, job.payload, job.run_at, job.keyed


@needs_keyed
def test_every_store_decides_keyed_calls_as_the_reference_does(factory: BackendFactory) -> None:
    """Random keyed calls on two keys (a policy each), claims, finishes, cancels and
    clock steps: the store answers each call as the memory store (the reference)
    does, job for job."""
    stores = itertools.count()

    @settings(
        max_examples=EXAMPLES.get(factory.name, 30),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(policies=st.tuples(*[st.integers(0, len(POLICIES) - 1)] * 2), steps=STEPS)
    def run(policies: tuple[int, int], steps: list[tuple[Any, ...]]) -> None:
        clock = FakeClock()
        reference = MemoryBackend(clock=clock)
        with tempfile.TemporaryDirectory() as root, contextlib.ExitStack() as stack:
            store = stack.enter_context(factory.open(clock, str(Path(root) / f"k{next(stores)}")))
            running: list[tuple[Any, Any]] = []  # (store's claim, reference's claim)
            for n, step in enumerate(steps):
                if step[0] == "call":
                    _, key, delay = step
                    policy = POLICIES[policies[key == "j"]]
                    expected = _outcome(reference, policy, n, key, delay)
                    assert _outcome(store, policy, n, key, delay) == expected, step
                elif step[0] == "claim":
                    got = sorted(store.claim(limit=10, lease=1000), key=lambda c: c.job.id)
                    want = sorted(reference.claim(limit=10, lease=1000), key=lambda c: c.job.id)
                    assert [c.job.id for c in got] == [c.job.id for c in want]
                    assert [c.job.payload for c in got] == [c.job.payload for c in want]
                    running += zip(got, want, strict=True)
                elif step[0] in ("ack", "retry", "bury") and running:
                    pair = running.pop(step[1] % len(running))
                    for each, claim in zip((store, reference), pair, strict=True):
                        if step[0] == "ack":
                            each.ack(claim)
                        elif step[0] == "retry":
                            each.retry(claim, clock.time() + 3, "again")
                        else:
                            each.bury(claim, "dead")
                elif step[0] == "cancel":
                    assert store.cancel(step[1]) == reference.cancel(step[1])
                elif step[0] == "advance":
                    clock.advance(step[1])
        reference.close()

    run()


# -- keys released with their run (the records are the keys in use) ------------------


def _purge(backend: Backend, clock: FakeClock, seconds: float) -> None:
    """Let ``seconds`` pass, then a claim (its housekeeping purges)."""
    clock.advance(seconds)
    backend.claim(limit=1, lease=LEASE, now=clock.time())


@needs_keyed
def test_a_keys_next_call_after_its_run_was_purged_starts_again_at_run_1(
    open_backend: Any, clock: FakeClock
) -> None:
    backend = open_backend(result_ttl=60)
    call(backend, DEBOUNCE, "a", delay=0)
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    backend.ack(claim)
    assert call(backend, DEBOUNCE, "b").id == "k#2"  # still kept: the next run
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time() + 5)
    backend.ack(claim)
    _purge(backend, clock, 120)  # both runs' records are past result_ttl: released
    result = call(backend, DEBOUNCE, "c")
    assert (result.id, result.outcome) == ("k", KeyedOutcome.CREATED)
    job = backend.get("k")
    assert job is not None and job.keyed is not None and job.keyed.run == 1
    assert job.keyed.calls == 1 and job.payload == "c"


@needs_keyed
def test_a_released_key_never_overwrites_an_earlier_runs_dead_letter(
    open_backend: Any, clock: FakeClock
) -> None:
    backend = open_backend(result_ttl=60)
    call(backend, DEBOUNCE, "first", delay=0)
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    backend.bury(claim, "boom")  # run 1 ("k") is a dead letter, kept past result_ttl
    assert call(backend, DEBOUNCE, "second", delay=0).id == "k#2"
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    backend.ack(claim)
    _purge(backend, clock, 120)  # run 2 purged: the key is released
    result = call(backend, DEBOUNCE, "third")
    assert (result.id, result.outcome) == ("k#2", KeyedOutcome.CREATED)  # past "k"
    dead = backend.get("k")
    assert dead is not None and dead.state is JobState.DEAD and dead.payload == "first"


@needs_keyed
def test_a_throttle_window_outlives_its_runs_purge(open_backend: Any, clock: FakeClock) -> None:
    backend = open_backend(result_ttl=0)
    window = KeyPolicy.build("throttle", window=600)
    assert call(backend, window, "a", delay=0).outcome is KeyedOutcome.CREATED
    [claim] = backend.claim(limit=1, lease=LEASE, now=clock.time())
    backend.ack(claim)
    _purge(backend, clock, 5)  # the run is gone (result_ttl=0), its window is not
    assert backend.get("k") is None
    assert call(backend, window, "b").outcome is KeyedOutcome.DROPPED
    _purge(backend, clock, 600)  # the window ended: released
    result = call(backend, window, "c", delay=0)
    assert result.outcome is KeyedOutcome.CREATED


@needs_keyed
def test_an_append_call_on_a_key_whose_open_run_is_not_a_batch_starts_its_own(
    backend: Backend,
) -> None:
    call(backend, DEBOUNCE, {"plain": 1})
    result = call(backend, APPEND, "e1")
    assert (result.id, result.outcome) == ("k#2", KeyedOutcome.CREATED)
    assert payload_of(backend, "k") == {"plain": 1}  # untouched, still a plain payload
    assert call(backend, APPEND, "e2").outcome is KeyedOutcome.APPENDED
    assert payload_of(backend, "k#2") == ["e1", "e2"]


@needs_keyed
def test_a_new_run_skips_an_id_a_plain_job_already_holds(
    backend: Backend, clock: FakeClock
) -> None:
    backend.enqueue([spec("k#2", clock.time() + 1000, payload="plain")])
    call(backend, DEBOUNCE, "a", delay=0)
    [claim] = backend.claim(limit=1, lease=LEASE)
    assert claim.job.id == "k"  # running: the next call creates the next run...
    result = call(backend, DEBOUNCE, "b")
    assert (result.id, result.outcome) == ("k#3", KeyedOutcome.CREATED)  # ...past k#2
    assert payload_of(backend, "k#2") == "plain" and payload_of(backend, "k#3") == "b"


# -- waking -----------------------------------------------------------------------


@needs_keyed
@pytest.mark.backend_features("clock")
@pytest.mark.parametrize(
    "policy", [DEBOUNCE, THROTTLE, UNTIL_FINISHED, APPEND], ids=lambda p: p.describe()
)
def test_a_keyed_call_into_an_empty_due_set_wakes_a_waiting_worker(
    backend: Backend, clock: FakeClock, policy: KeyPolicy
) -> None:
    # An idle worker sleeps until its longest wait: the call that gives the due set
    # its only job must wake it (its due time is the new head).
    waiter = Waiter(backend, max_wait=7200)
    assert clock.wait_for_waiters(1)
    assert not waiter.done.is_set()
    call(backend, policy, {"n": 1}, delay=60)
    assert waiter.finished()
