"""The RabbitMQ store under everyday faults: deleted queues, blips, kills, policies, bad bodies.

Each test runs on this test process's virtual host with queues of its own; the
policies a test sets match only its own queues and are cleared after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika
import pytest

from delayq.backends.base import Completion
from delayq.backends.rabbitmq import RabbitMQBackend
from delayq.backends.rabbitmq._publisher import Confirms
from delayq.clock import SYSTEM_CLOCK, SystemClock
from delayq.errors import BackendUnavailable, PayloadTooLarge, StaleClaim
from delayq.job import Claim, JobSpec
from delayq.worker._decide import Decision, decide
from tests._util import wait_until
from tests.integration.test_rabbitmq_backend import claim_within
from tests.rabbitmq_support import (
    channel_call,
    close_connections,
    delete_queues,
    private_vhost,
    queue_depth,
    rabbitmqctl,
    unique_queue,
    vhost_url,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue() -> Iterator[str]:
    name = unique_queue()
    yield name
    delete_queues(name)


def job(job_id: str, delay: float, max_attempts: int = 3) -> JobSpec:
    return JobSpec(
        id=job_id,
        name="x",
        payload=json.dumps({"id": job_id}),
        run_at=0.0,
        max_attempts=max_attempts,
        delay=delay,
    )


class Policy:
    """A policy on the test vhost for the given queue names only, cleared on exit."""

    def __init__(self, names: list[str], definition: dict[str, object]) -> None:
        self.name = f"t-{unique_queue()}"
        self.pattern = "^(" + "|".join(re.escape(n) for n in names) + ")$"
        self.definition = json.dumps(definition)

    def __enter__(self) -> Policy:
        done = rabbitmqctl(
            "set_policy", "-p", private_vhost(), "--priority", "100", "--apply-to", "queues",
            self.name, self.pattern, self.definition,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return self

    def __exit__(self, *exc: object) -> None:
        rabbitmqctl("clear_policy", "-p", private_vhost(), self.name)


# -- a deleted queue never freezes another ------------------------------------------


def test_a_queue_deleted_with_jobs_in_the_levels_does_not_stall_another_queue() -> None:
    gone, live = unique_queue(), unique_queue()
    doomed = RabbitMQBackend(vhost_url(), queue=gone)
    doomed.enqueue([job(f"g{i}", 1.5) for i in range(40)])  # in the levels for a while
    doomed.close()
    delete_queues(gone)  # before its jobs come out of the levels: they have nowhere to go
    other = RabbitMQBackend(vhost_url(), queue=live)
    try:
        other.enqueue([job("live", 1.5)])  # through the same levels, after the doomed ones
        assert [c.job.id for c in claim_within(other, 1, timeout=30)] == ["live"]
        assert wait_until(lambda: queue_depth("delayq.v2.orphans") >= 40, timeout=30)
    finally:
        other.close()
        delete_queues(live)


# -- deliveries that never started are never charged an attempt ----------------------


def test_a_connection_blip_charges_no_attempt_to_deliveries_that_never_started(
    queue: str,
) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue, prefetch=20)
    try:
        backend.enqueue([job(f"j{i:02}", 0, max_attempts=1) for i in range(20)])
        # started; the other 19 wait in the consumer. A lease that outlasts the test's
        # waits (up to 70 s on a loaded machine): its ack must find it held.
        [first] = claim_within(backend, 1, lease=600)
        assert wait_until(lambda: backend._consumer.buffered() == 19, timeout=10)
        close_connections()
        assert wait_until(lambda: adopted(backend), timeout=30)
        claims = claim_within(backend, 19, timeout=30)
        assert sorted(c.job.id for c in [*claims, first]) == [f"j{i:02}" for i in range(20)]
        assert {c.attempt for c in claims} == {1}
        assert backend.dead_letters() == []
        backend.ack(first)  # its claim took the broker's redelivery over
    finally:
        backend.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_a_job_that_kills_its_worker_ends_dead_after_max_returns(
    queue: str, queue_type: str, tmp_path: Path
) -> None:
    record = tmp_path / "ran.txt"
    record.touch()
    url = vhost_url(max_returns="2", queue_type=queue_type, allow_at_most_once="true")
    producer = RabbitMQBackend(url, queue=queue)
    try:
        producer.enqueue([JobSpec(id="poison", name="kill", payload="{}", run_at=0.0, delay=0)])
        command = [sys.executable, "-m", "tests.integration.rabbitmq_worker_proc", url, queue]
        for _ in range(3):  # each run kills its worker
            worker = subprocess.Popen([*command, str(record)], cwd=ROOT)
            assert worker.wait(timeout=120) == -signal.SIGKILL
        last = subprocess.Popen([*command, str(record)], cwd=ROOT)  # buries it
        try:
            assert wait_until(lambda: producer.dead_letters() != [], timeout=60)
        finally:
            last.terminate()
            last.wait(timeout=60)
        runs = [line.split()[:2] for line in record.read_text().splitlines()]
        assert runs == [["poison", "1"]] * 3  # a return is not an attempt
        [dead] = producer.dead_letters()
        assert dead.id == "poison" and dead.last_error is not None
        assert "max_returns=2" in dead.last_error
    finally:
        producer.close()


# -- dead letters: reading never removes them (RabbitMQ 4.x's default delivery limit) --


def bury_all(backend: RabbitMQBackend, ids: list[str]) -> None:
    backend.enqueue([job(i, 0) for i in ids])
    for claim in claim_within(backend, len(ids)):
        backend.bury(claim, f"{claim.job.id} failed")


def test_reading_dead_letters_again_and_again_never_removes_them(queue: str) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    # RabbitMQ 4.x gives quorum queues a delivery limit of 20; 3 here, on every name the
    # dead letters could live under.
    names = [backend._topology.dead_queue, f"delayq.q.{queue}.dead"]
    try:
        with Policy(names, {"delivery-limit": 3}):
            bury_all(backend, ["d1", "d2", "d3"])
            for _ in range(6):
                assert sorted(j.id for j in backend.dead_letters()) == ["d1", "d2", "d3"]
    finally:
        backend.close()


def test_a_delivery_limit_on_the_ready_queue_loses_no_job_across_returns(queue: str) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue, prefetch=10)
    names = [backend._topology.ready_queue, f"delayq.q.{queue}"]
    try:
        with Policy(names, {"delivery-limit": 1}):
            backend.enqueue([job(f"r{i}", 0, max_attempts=10) for i in range(5)])
            assert backend.claim(limit=1, lease=30) == []  # start consuming, claim nothing
            for _ in range(3):  # held unclaimed, returned by the broker each time
                assert wait_until(lambda: backend._consumer.buffered() == 5, timeout=30)
                before = backend._consumer.generation
                close_connections()
                assert wait_until(lambda b=before: backend._consumer.generation > b, timeout=30)
            claims = claim_within(backend, 5, timeout=30)
            assert sorted(c.job.id for c in claims) == [f"r{i}" for i in range(5)]
            assert {c.attempt for c in claims} == {1}
            assert backend.dead_letters() == []
    finally:
        backend.close()


def test_two_readers_at_once_both_see_every_dead_letter(queue: str) -> None:
    one = RabbitMQBackend(vhost_url(), queue=queue, prefetch=250)  # holds 200 claims at once
    two = RabbitMQBackend(vhost_url(), queue=queue)
    ids = [f"d{i:03}" for i in range(200)]
    try:
        bury_all(one, ids)
        start = threading.Barrier(2)
        seen: dict[str, list[str]] = {}

        def read(name: str, backend: RabbitMQBackend) -> None:
            start.wait()
            seen[name] = sorted(j.id for j in backend.dead_letters(limit=1000))

        threads = [threading.Thread(target=read, args=(n, b)) for n, b in (("1", one), ("2", two))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(seen["1"]) == len(seen["2"]) == len(ids), (len(seen["1"]), len(seen["2"]))
        assert seen == {"1": ids, "2": ids}
        assert two.requeue_dead("d007", delay=0) is True
        assert one.requeue_dead("d007", delay=0) is False  # requeued already
        assert [c.job.id for c in claim_within(one, 1)] == ["d007"]
        assert one.purge_dead(job_ids=["d001", "d002"]) == 2
        assert len(two.dead_letters(limit=1000)) == 197
        assert two.purge_dead() == 197
        assert one.dead_letters() == []
    finally:
        one.close()
        two.close()


def test_a_dead_letter_read_in_progress_never_holds_up_schedule(queue: str) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    scheduled = threading.Event()

    def schedule() -> None:
        backend.enqueue([job("j", 0)])
        scheduled.set()

    try:
        with backend._dead._lock:  # a listing of the dead letters holds it while it reads
            producer = threading.Thread(target=schedule)
            producer.start()
            assert scheduled.wait(30)
        producer.join()
    finally:
        backend.close()


def test_a_job_the_broker_drops_from_the_ready_queue_becomes_a_dead_letter(queue: str) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        with Policy([backend._topology.ready_queue], {"message-ttl": 1}):
            backend.enqueue([job("dropped", 0)])  # no worker consumes: the TTL drops it
            assert wait_until(lambda: backend.dead_letters() != [], timeout=30)
        [dead] = backend.dead_letters()
        assert dead.id == "dropped" and dead.last_error is not None
        assert "expired" in dead.last_error and "policy" in dead.last_error
    finally:
        backend.close()


# -- a queue's name never stands for another queue's dead letters ----------------------


def test_a_queue_named_like_another_queues_dead_letters_is_a_queue_of_its_own(
    queue: str,
) -> None:
    orders = RabbitMQBackend(vhost_url(), queue=queue)
    shadow = RabbitMQBackend(vhost_url(), queue=f"{queue}.dead")
    try:
        bury_all(orders, ["pay-1"])
        shadow.enqueue([job("fresh", 0)])
        assert [c.job.id for c in claim_within(shadow, 1)] == ["fresh"]
        assert [j.id for j in orders.dead_letters()] == ["pay-1"]
        assert shadow.dead_letters() == []
    finally:
        orders.close()
        shadow.close()
        delete_queues(f"{queue}.dead")


# -- a vhost policy that changes delayq's queues is caught when a store opens -----------


def test_a_policy_on_delayqs_queues_is_refused_or_warned_of_at_open(
    queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    from delayq.backends.rabbitmq import _policies  # noqa: PLC0415
    from delayq.errors import ConfigurationError  # noqa: PLC0415

    refuse, warn = vhost_url(policies="refuse"), vhost_url(policies="warn")
    first = RabbitMQBackend(refuse, queue=queue)  # no policy yet
    names = [first._topology.level_queue(12), first._topology.ready_queue]
    first.close()
    with Policy(names, {"message-ttl": 3000}):
        _policies._cache.clear()  # read again now, not a minute later
        with pytest.raises(ConfigurationError, match="message-ttl"):
            RabbitMQBackend(refuse, queue=queue)
        _policies._cache.clear()
        with caplog.at_level(logging.WARNING, "delayq.rabbitmq"):
            warned = RabbitMQBackend(warn, queue=queue)  # opens, and warns
            try:
                assert wait_until(lambda: "sets message-ttl" in caplog.text, timeout=60)
            finally:
                warned.close()
    _policies._cache.clear()
    RabbitMQBackend(refuse, queue=queue).close()


# -- the consumer survives what a delivery or the broker does to it ---------------------


def publish_raw(backend: RabbitMQBackend, body: bytes) -> None:
    """A message from another publisher, straight into the ready queue."""
    ready = backend._topology.ready_queue
    channel_call(
        lambda ch: ch.basic_publish("", ready, body, pika.BasicProperties(delivery_mode=2))
    )


def test_a_body_that_is_not_a_delayq_message_is_buried_and_the_consumer_goes_on(
    queue: str,
) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        deep = b'{"v":1,"id":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        publish_raw(backend, deep)
        publish_raw(backend, b'{"v":2,"local":1e308}')
        backend.enqueue([job("after", 0)])
        assert [c.job.id for c in claim_within(backend, 1)] == ["after"]
        assert backend._consumer.alive
        assert wait_until(lambda: len(backend.dead_letters()) == 2, timeout=30)
    finally:
        backend.close()


@contextlib.contextmanager
def consumer_channels_suspended() -> Iterator[None]:
    """The broker's processes of the consuming channels of the test vhost (this test's
    own) suspended, found and suspended in one step, then resumed."""
    find = (
        f'V = <<"{private_vhost()}">>, Ps = [P || P <- rabbit_channel:list_local(), '
        "[{vhost, V0}, {consumer_count, N}] <- [rabbit_channel:info(P, [vhost, consumer_count])], "
        "V0 =:= V, N > 0], [sys:suspend(P) || P <- Ps], [pid_to_list(P) || P <- Ps]."
    )
    done = rabbitmqctl("eval", find)
    assert done.returncode == 0, done.stderr
    pids = re.findall(r"<\d+\.\d+\.\d+>", done.stdout)
    assert len(pids) == 1, done.stdout  # the worker's consumer
    try:
        yield
    finally:
        for pid in pids:
            rabbitmqctl("eval", f'sys:resume(list_to_pid("{pid}")).')


@pytest.mark.parametrize("the_channel_learns_late", [False, True])
def test_a_consumer_the_broker_cancels_consumes_again(
    queue: str, the_channel_learns_late: bool
) -> None:
    """Deleting the queue cancels its consumer, or (when the queue exists again before the
    consumer's channel on the broker learns of the deletion) leaves it deaf with no
    cancel: either way the worker consumes the queue declared again."""
    worker = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        assert worker.claim(limit=1, lease=30) == []
        assert wait_until(worker._consumer.connected.is_set, timeout=10)
        late = consumer_channels_suspended() if the_channel_learns_late else nullcontext()
        with late:
            delete_queues(queue)  # the broker cancels the consumer
            producer = RabbitMQBackend(vhost_url(), queue=queue)  # declares the queue again
        try:
            producer.enqueue([job("after-recreate", 0)])
        finally:
            producer.close()
        assert [c.job.id for c in claim_within(worker, 1, timeout=30)] == ["after-recreate"]
        health = worker.health()
        assert health["alive"] and health["cancels"] + health["resubscribes"] >= 1, health
    finally:
        worker.close()


# -- misfire and lateness on the clocks that decide "due" ------------------------------


class Behind(SystemClock):
    """A producer host's wall clock, 3 s slow (NTP not converged yet, a VM resumed)."""

    __slots__ = ()

    def time(self) -> float:
        return SYSTEM_CLOCK.time() - 3.0


def test_a_producer_whose_clock_is_behind_makes_no_job_late_or_skipped(queue: str) -> None:
    producer = RabbitMQBackend(vhost_url(), queue=queue, clock=Behind())
    worker = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        producer.enqueue([replace(job("j", 0.3), misfire="skip")])  # skipped if 1 s late
        [claim] = claim_within(worker, 1)
        assert claim.claimed_at - claim.job.run_at > 2.5  # what the two wall clocks say
        assert claim.claimed_at - claim.due < 1.0
        assert decide(claim, claim.claimed_at, ran=False) is None  # it runs
    finally:
        worker.close()
        producer.close()


def test_a_job_left_waiting_in_the_ready_queue_is_late_whatever_the_producers_clock(
    queue: str,
) -> None:
    producer = RabbitMQBackend(vhost_url(), queue=queue, clock=Behind())
    worker = RabbitMQBackend(vhost_url(), queue=queue)  # not consuming until its claim
    try:
        producer.enqueue([replace(job("j", 0.3), misfire="skip")])
        started = SYSTEM_CLOCK.monotonic()
        assert wait_until(lambda: queue_depth(worker._topology.ready_queue) == 1, timeout=30)
        assert wait_until(lambda: SYSTEM_CLOCK.monotonic() - started > 4.5, timeout=30)
        [claim] = claim_within(worker, 1)
        assert 2.5 < claim.claimed_at - claim.due < 10.0  # about 4.2 s: due, not consumed
        verdict = decide(claim, claim.claimed_at, ran=False)
        assert isinstance(verdict, Decision) and verdict.outcome == "skipped"
    finally:
        worker.close()
        producer.close()


# -- a busy worker hands back what it cannot start, not the jobs due first -------------


def test_a_busy_worker_keeps_its_due_jobs_while_a_backlog_waits_in_the_queue(
    queue: str,
) -> None:
    busy = RabbitMQBackend(vhost_url(), queue=queue, prefetch=4)
    peer = RabbitMQBackend(vhost_url(), queue=queue, prefetch=1)
    try:
        busy.enqueue([job(f"j{i}", 0) for i in range(10)])
        assert _claims_ids(claim_within(busy, 1)) == ["j0"]  # its only slot is taken
        assert wait_until(lambda: busy._consumer.buffered() == 3, timeout=30)  # j1-j3
        assert _claims_ids(claim_within(peer, 1)) == ["j4"]  # the other worker is full too
        assert wait_until(lambda: busy.health()["kept_in_backlog"] >= 2, timeout=30)
        assert busy.health()["handed_back"] == 0  # j1-j3 not sent behind j5-j9
        assert _claims_ids(claim_within(busy, 1)) == ["j1"]
    finally:
        peer.close()
        busy.close()


def test_a_busy_worker_hands_its_due_jobs_to_a_worker_with_room(queue: str) -> None:
    busy = RabbitMQBackend(vhost_url(), queue=queue, prefetch=10)
    peer = RabbitMQBackend(vhost_url(), queue=queue, prefetch=2)
    try:
        busy.enqueue([job(f"j{i}", 0) for i in range(3)])
        assert _claims_ids(claim_within(busy, 1)) == ["j0"]
        assert wait_until(lambda: busy._consumer.buffered() == 2, timeout=30)
        assert peer.claim(limit=2, lease=30) == []  # a second consumer, with room
        assert sorted(_claims_ids(claim_within(peer, 2, timeout=30))) == ["j1", "j2"]
        assert busy.health()["handed_back"] == 2
    finally:
        peer.close()
        busy.close()


# -- a reconnect in the middle of a batch sends only what was not confirmed -------------


def test_a_connection_lost_mid_batch_sends_again_only_the_unconfirmed_jobs(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue, log=False)
    real_send = Confirms.send
    sent: list[int] = []

    def lost_halfway(self: Confirms, messages: Any, timeout: float, done: set[int]) -> None:
        sent.append(len(messages) - len(done))
        if len(sent) > 1:
            return real_send(self, messages, timeout, done)
        second_half = set(range(len(messages) // 2, len(messages)))
        confirmed = set(second_half)
        real_send(self, messages, timeout, confirmed)  # the first half, confirmed
        done.update(confirmed - second_half)
        raise pika.exceptions.AMQPConnectionError("the connection closed mid-batch")

    monkeypatch.setattr(Confirms, "send", lost_halfway)
    try:
        backend.enqueue([job(f"j{i}", 0) for i in range(200)])
        assert sent == [200, 100]
        assert wait_until(lambda: queue_depth(backend._topology.ready_queue) == 200, timeout=30)
    finally:
        monkeypatch.undo()
        backend.close()


# -- a publish that the broker does not confirm fails by its deadline -------------------


def test_schedule_fails_by_its_confirm_deadline_when_the_broker_does_not_confirm(
    queue: str,
) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue, confirm_timeout=1.0)
    try:
        ready = backend._topology.ready_queue
        vhost = private_vhost()
        # Suspend the ready queue's Raft server for 10 s (it resumes by itself).
        erl = (
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, '
            f'<<"{ready}">>)), {{Name, _}} = amqqueue:get_pid(Q), P = whereis(Name), '
            f"spawn(fun() -> timer:sleep(10000), sys:resume(P) end), sys:suspend(P), ok."
        )
        done = rabbitmqctl("eval", erl)
        assert done.returncode == 0, done.stderr
        with pytest.raises(BackendUnavailable, match="may or may not be stored"):
            backend.enqueue([job("stuck", 0)])
    finally:
        backend.close()


def test_a_message_larger_than_the_broker_takes_is_a_payload_error() -> None:
    from delayq.backends.rabbitmq._connection import Settings, map_errors  # noqa: PLC0415

    settings = Settings.parse("amqp://h/")
    refused = pika.exceptions.ChannelClosedByBroker(
        406, "PRECONDITION_FAILED - message size 140000000 is larger than configured max size"
    )
    with pytest.raises(PayloadTooLarge, match="message size"), map_errors(settings, "schedule"):
        raise refused
    blocked = pika.exceptions.ConnectionBlockedTimeout()
    with pytest.raises(BackendUnavailable, match="resource alarm"), map_errors(settings, "x"):
        raise blocked


def _claims_ids(claims: list[Claim]) -> list[str]:
    return [c.job.id for c in claims]


# -- a blip never makes a live worker run a job twice or lose its finish ----------------


def claims_until(backend: RabbitMQBackend, sentinel: str) -> list[str]:
    """Claim (acking) until ``sentinel`` comes; the ids claimed, in order."""
    seen: list[str] = []
    while sentinel not in seen:
        claims = claim_within(backend, 1, timeout=30)
        assert claims, f"{sentinel!r} did not come; claimed {seen}"
        seen += [c.job.id for c in claims]
        backend.complete([Completion.ack(c) for c in claims])
    return seen


@pytest.mark.parametrize("finish_during_the_blip", [False, True])
def test_a_job_running_through_a_connection_blip_runs_once_and_its_ack_counts(
    queue: str, finish_during_the_blip: bool
) -> None:
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        backend.enqueue([job("long", 0)])
        [running] = claim_within(backend, 1)
        before = backend._consumer.generation
        close_connections()  # the broker returns "long" while its handler runs here
        assert wait_until(lambda: backend._consumer.generation > before, timeout=30)
        if finish_during_the_blip:
            with contextlib.suppress(StaleClaim):
                backend.ack(running)
        else:
            assert wait_until(lambda: adopted(backend), timeout=30)
            backend.ack(running)  # the claim took the redelivery over: not stale
        backend.enqueue([job("next", 0)])
        assert claims_until(backend, "next") == ["next"]
    finally:
        backend.close()


def adopted(backend: RabbitMQBackend) -> bool:
    """The one claim held is on the consumer's current connection again."""
    with backend._lock:
        [held] = backend._held.values()
    return held.delivery.generation == backend._consumer.generation


# -- operations: verify, setup, teardown ------------------------------------------------


def test_the_rabbitmq_command_sets_up_verifies_and_tears_down_a_queue(queue: str) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from delayq.cli import cli  # noqa: PLC0415
    from delayq.errors import ConfigurationError  # noqa: PLC0415

    runner = CliRunner()
    url = vhost_url(queue=queue)
    with pytest.raises(ConfigurationError, match="delayq rabbitmq setup"):
        RabbitMQBackend(url, declare="passive")  # nothing declared yet for this queue
    missing = runner.invoke(cli, ["rabbitmq", "verify", url, "--no-policies"])
    assert missing.exit_code == 1 and "missing" in missing.output, missing.output
    done = runner.invoke(cli, ["rabbitmq", "setup", url])
    assert done.exit_code == 0, done.output
    fit = runner.invoke(cli, ["rabbitmq", "verify", url, "--no-policies"])
    assert fit.exit_code == 0 and "RabbitMQ 3." in fit.output, fit.output
    passive = RabbitMQBackend(url, declare="passive")
    try:
        passive.enqueue([job("p", 0)])
        names = [passive._topology.level_queue(12), passive._topology.ready_queue]
        with Policy(names, {"message-ttl": 3000}):
            risky = runner.invoke(cli, ["rabbitmq", "verify", url])
        assert risky.exit_code == 1 and "message-ttl" in risky.output, risky.output
        refused = runner.invoke(cli, ["rabbitmq", "teardown", url])
        assert refused.exit_code == 1 and "holds 1 job" in refused.output, refused.output
    finally:
        passive.close()
    gone = runner.invoke(cli, ["rabbitmq", "teardown", url, "--force"])
    assert gone.exit_code == 0 and "delayq.v2.ready." in gone.output, gone.output
    again = runner.invoke(cli, ["rabbitmq", "verify", url, "--no-policies"])
    assert again.exit_code == 1 and "missing" in again.output


def test_verify_reports_a_feature_flag_the_store_needs_that_is_not_enabled(queue: str) -> None:
    from delayq.backends.rabbitmq import admin  # noqa: PLC0415

    settings = admin.Settings.parse(vhost_url(queue=queue))
    admin.setup(settings)
    fit = admin.verify(settings)  # this broker: every feature flag enabled
    assert not [p for p in fit.problems if "feature flag" in p], fit.problems
    flags = {"quorum_queue": "enabled", "stream_queue": "disabled"}
    unfit = admin.verify(settings, policies=lambda vhost: [], feature_flags=lambda: flags)
    assert [p for p in unfit.problems if "stream_queue is disabled" in p], unfit.problems
