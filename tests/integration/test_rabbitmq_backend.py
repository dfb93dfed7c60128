"""The RabbitMQ store on the real broker: claims, retries, leases, dead letters, bad input."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pika
import pytest
from click.testing import CliRunner

from delayq import DelayQ
from delayq.backends.base import Completion
from delayq.backends.rabbitmq import RabbitMQBackend
from delayq.cli import cli
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    InvalidDelay,
    InvalidInput,
    InvalidOption,
    InvalidPayload,
    JobConflict,
    StaleClaim,
    Unsupported,
)
from delayq.job import Claim, JobSpec, JobState
from tests._util import wait_until
from tests.rabbitmq_support import (
    AMQP_URL,
    close_connections,
    delete_queues,
    queue_depth,
    ready_queue,
    unique_queue,
    vhost_url,
)

pytestmark = [pytest.mark.rabbitmq]


@pytest.fixture
def queue() -> Iterator[str]:
    name = unique_queue()
    yield name
    delete_queues(name)


@pytest.fixture
def backend(queue: str) -> Iterator[RabbitMQBackend]:
    b = RabbitMQBackend(vhost_url(), queue=queue)
    yield b
    b.close()


def job(job_id: str, delay: float, max_attempts: int = 3) -> JobSpec:
    return JobSpec(
        id=job_id,
        name="x",
        payload=json.dumps({"id": job_id}),
        run_at=0.0,
        max_attempts=max_attempts,
        delay=delay,
    )


def claim_within(
    backend: RabbitMQBackend, count: int, timeout: float = 10.0, lease: float = 30.0
) -> list[Claim]:
    """Claim until ``count`` claims came or ``timeout`` real seconds passed."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    claims: list[Claim] = []
    while len(claims) < count:
        left = deadline - SYSTEM_CLOCK.monotonic()
        if left <= 0:
            break
        backend.wait_for_due(min(left, 1.0))
        claims += backend.claim(limit=count - len(claims), lease=lease)
    return claims


def test_a_job_runs_after_its_delay_never_before(backend: RabbitMQBackend) -> None:
    start = SYSTEM_CLOCK.monotonic()
    backend.enqueue([job("soon", 0.3)])
    [claim] = claim_within(backend, 1)
    assert SYSTEM_CLOCK.monotonic() - start >= 0.3
    assert (claim.job.id, claim.attempt, claim.job.state) == ("soon", 1, JobState.RUNNING)
    assert claim.job.payload == {"id": "soon"}
    backend.ack(claim)
    with pytest.raises(StaleClaim):
        backend.ack(claim)


def test_a_retry_comes_back_after_its_backoff_with_the_error_and_the_next_attempt(
    backend: RabbitMQBackend,
) -> None:
    backend.enqueue([job("flaky", 0)])
    [first] = claim_within(backend, 1)
    retried = SYSTEM_CLOCK.monotonic()
    backend.retry(first, SYSTEM_CLOCK.time() + 0.2, "HTTP 503")
    [second] = claim_within(backend, 1)
    assert SYSTEM_CLOCK.monotonic() - retried >= 0.2
    assert (second.attempt, second.job.last_error) == (2, "HTTP 503")
    backend.ack(second)


def test_release_gives_the_attempt_back(backend: RabbitMQBackend) -> None:
    backend.enqueue([job("r", 0, max_attempts=1)])
    [first] = claim_within(backend, 1)
    backend.release(first)
    [again] = claim_within(backend, 1)
    assert again.attempt == 1 and again.job.last_error is not None
    assert "returned unstarted" in again.job.last_error


def test_an_expired_lease_returns_the_job_with_the_next_attempt_and_the_old_claim_is_stale(
    backend: RabbitMQBackend,
) -> None:
    backend.enqueue([job("slow", 0)])
    [first] = claim_within(backend, 1, lease=0.2)
    [second] = claim_within(backend, 1)
    assert second.job.id == "slow" and second.attempt == 2
    assert second.job.last_error is not None and "lease expired" in second.job.last_error
    with pytest.raises(StaleClaim):
        backend.ack(first)
    backend.ack(second)


def test_a_job_returned_more_often_than_its_attempts_is_buried(backend: RabbitMQBackend) -> None:
    backend.enqueue([job("doomed", 0, max_attempts=2)])
    claim_within(backend, 1, lease=0.1)
    claim_within(backend, 1, lease=0.1)
    assert claim_within(backend, 1, timeout=1.0) == []
    [dead] = backend.dead_letters()
    assert dead.id == "doomed" and dead.state is JobState.DEAD
    assert dead.last_error is not None and "max_attempts=2" in dead.last_error


def test_dead_letters_can_be_listed_requeued_and_purged(backend: RabbitMQBackend) -> None:
    backend.enqueue([job("d1", 0), job("d2", 0), job("d3", 0)])
    claims = claim_within(backend, 3)
    for claim in claims:
        backend.bury(claim, f"{claim.job.id} failed")
    dead = backend.dead_letters()
    assert sorted(j.id for j in dead) == ["d1", "d2", "d3"]
    assert {j.last_error for j in dead} == {"d1 failed", "d2 failed", "d3 failed"}
    assert len(backend.dead_letters(limit=2)) == 2
    assert backend.requeue_dead("d2", delay=0) is True
    assert backend.requeue_dead("nope", delay=0) is False
    [again] = claim_within(backend, 1)
    assert again.job.id == "d2" and again.attempt == 1
    backend.ack(again)
    assert backend.purge_dead(job_ids=["d1", "d2"]) == 1
    assert [j.id for j in backend.dead_letters()] == ["d3"]
    assert backend.purge_dead() == 1
    assert backend.dead_letters() == []


def test_a_message_that_no_queue_takes_is_an_error_at_schedule(queue: str) -> None:
    app = DelayQ(vhost_url(), queue=queue)
    try:
        delete_queues(queue)  # the ready queue is gone: nothing would receive the job
        with pytest.raises(BackendError, match="did not accept"):
            app.schedule("x", {}, delay=0)
    finally:
        app.close()


def test_classic_queues_work_too() -> None:
    queue = unique_queue()
    b = RabbitMQBackend(vhost_url(), queue=queue, queue_type="classic", allow_at_most_once=True)
    try:
        b.enqueue([job("c", 0.1)])
        [claim] = claim_within(b, 1)
        b.ack(claim)
    finally:
        b.close()
        delete_queues(queue)


def test_one_queue_name_with_another_queue_type_is_a_configuration_error(
    backend: RabbitMQBackend, queue: str
) -> None:
    with pytest.raises(ConfigurationError, match="other arguments"):
        RabbitMQBackend(vhost_url(), queue=queue, queue_type="classic", allow_at_most_once=True)


def test_bad_input_is_rejected_at_the_call(backend: RabbitMQBackend, queue: str) -> None:
    app = DelayQ(backend=backend)
    with pytest.raises(InvalidDelay):
        app.schedule("x", {}, delay=float("nan"))
    with pytest.raises(InvalidDelay, match="1,000 years"):
        backend.enqueue([job("far", 1e12)])
    with pytest.raises(InvalidPayload):
        backend.enqueue([JobSpec(id="p", name="x", payload="{not json", run_at=0.0)])
    with pytest.raises(Unsupported, match="keeps no index"):
        backend.stats()
    with pytest.raises(InvalidOption, match="job_id"):
        backend.cancel(7)  # type: ignore[arg-type]


def test_a_taken_job_id_is_refused_kept_or_replaced_as_on_conflict_says(
    backend: RabbitMQBackend, queue: str
) -> None:
    app = DelayQ(backend=backend)
    assert app.schedule("x", {"v": 1}, delay=60, job_id="k") == "k"
    with pytest.raises(JobConflict, match="'k' already exists"):
        app.schedule("x", {"v": 2}, delay=60, job_id="k")  # reject, the default
    assert app.schedule("x", {"v": 3}, delay=60, job_id="k", on_conflict="keep") == "k"
    kept = backend.get("k")
    assert kept is not None and kept.payload == {"v": 1}
    app.schedule("x", {"v": 4}, delay=0, job_id="k", on_conflict="replace")
    [claim] = claim_within(backend, 1)
    assert claim.job.payload == {"v": 4}  # the copies of the first job never start
    backend.ack(claim)
    unchecked = RabbitMQBackend(vhost_url(), queue=queue, log=False)
    try:
        with pytest.raises(Unsupported, match="log=false"):
            unchecked.enqueue([job("k", 60)], on_conflict="keep")
    finally:
        unchecked.close()


def test_an_unreachable_broker_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(BackendUnavailable, match="unreachable"):
        DelayQ(f"amqp://guest:guest@127.0.0.1:{port}/?connection_attempts=1")


def test_wrong_credentials_and_an_unknown_vhost_are_configuration_errors() -> None:
    host = AMQP_URL.split("@")[-1].rstrip("/")
    with pytest.raises(ConfigurationError, match=r"user or password|refused"):
        DelayQ(f"amqp://guest:wrong@{host}/")
    with pytest.raises(ConfigurationError, match="virtual host"):
        DelayQ(f"amqp://guest:guest@{host}/no-such-vhost-{unique_queue()}")


def test_the_url_opens_the_store_through_open_backend(queue: str) -> None:
    app = DelayQ(vhost_url(queue=queue))
    try:
        assert isinstance(app._backend, RabbitMQBackend)
        assert "guest:***@" in app._backend.url and app._backend.queue == queue
    finally:
        app.close()


def test_the_broker_returns_a_closed_handles_unacked_deliveries(queue: str) -> None:
    one = RabbitMQBackend(vhost_url(), queue=queue)
    one.enqueue([job("held", 0)])
    claim_within(one, 1)
    one.close()
    two = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        [again] = claim_within(two, 1)
        assert again.job.id == "held" and again.attempt == 2
    finally:
        two.close()


def test_pika_is_the_driver() -> None:
    assert pika.__version__


def test_a_closing_handle_gives_back_what_it_held_unclaimed_without_using_an_attempt(
    queue: str,
) -> None:
    start = SYSTEM_CLOCK.monotonic()
    one = RabbitMQBackend(vhost_url(), queue=queue)
    one.enqueue([job("waiting", 0.8)])  # delivered at once, then held for its local wait
    assert one.claim(limit=1, lease=30) == []
    assert wait_until(lambda: one._consumer.buffered() == 1, timeout=10)
    one.close()
    two = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        [claim] = claim_within(two, 1)
        assert SYSTEM_CLOCK.monotonic() - start >= 0.8
        assert claim.job.id == "waiting" and claim.attempt == 1
    finally:
        two.close()


def test_the_command_line_schedules_and_reads_dead_letters(queue: str) -> None:
    runner = CliRunner()
    url = vhost_url(queue=queue)
    scheduled = runner.invoke(cli, ["--url", url, "schedule", "x", "{}", "--delay", "5s"])
    assert scheduled.exit_code == 0, scheduled.output
    assert "scheduled" in scheduled.output
    listed = runner.invoke(cli, ["--url", url, "dead", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    stats = runner.invoke(cli, ["--url", url, "stats"])
    assert stats.exit_code != 0 and "Unsupported" in stats.output


def test_a_busy_handle_hands_its_due_jobs_to_another_without_using_an_attempt(
    queue: str,
) -> None:
    busy = RabbitMQBackend(vhost_url(), queue=queue)
    idle = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        busy.enqueue([job(f"j{i}", 0) for i in range(5)])
        [first] = claim_within(busy, 1)  # then it claims nothing more: it is busy
        assert wait_until(lambda: busy._consumer.buffered() == 4, timeout=10)
        others = claim_within(idle, 4, timeout=15)
        assert sorted(c.job.id for c in others) == sorted(
            {f"j{i}" for i in range(5)} - {first.job.id}
        )
        assert {c.attempt for c in others} == {1}
        idle.complete([Completion.ack(c) for c in others])
        busy.ack(first)
    finally:
        busy.close()
        idle.close()


@pytest.mark.parametrize(
    "bad",
    [
        JobSpec(id="", name="x", payload="{}", run_at=0.0),
        JobSpec(id="b", name="x", payload="{nope", run_at=0.0),
        JobSpec(id="b", name="x", payload="{}", run_at=float("nan")),
        JobSpec(id="b", name="x", payload="{}", run_at=0.0, max_attempts=0),
        JobSpec(id="b", name="", payload="{}", run_at=0.0),
    ],
)
def test_a_batch_with_a_bad_spec_publishes_nothing(backend: RabbitMQBackend, bad: JobSpec) -> None:
    with pytest.raises(InvalidInput):
        backend.enqueue([job("good", 0), bad])
    assert ready_messages(backend) == 0  # "good" (due now) would be in the ready queue


def ready_messages(backend: RabbitMQBackend) -> int:
    return ready_messages_of(backend.queue)


def test_schedule_goes_on_after_the_broker_closed_the_producers_connection(queue: str) -> None:
    app = DelayQ(vhost_url(), queue=queue)
    try:
        app.schedule("x", {}, delay=0, job_id="before")
        close_connections()
        app.schedule("x", {}, delay=0, job_id="after")  # a new connection, no error
        assert wait_until(lambda: ready_messages_of(queue) >= 2, timeout=10)
    finally:
        app.close()


def ready_messages_of(queue: str) -> int:
    return queue_depth(ready_queue(queue))
