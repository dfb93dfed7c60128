"""The Redis store under faults: big claims, lost writes, lost wake-ups, out of memory.

Servers that are restarted, reconfigured or filled up are private
``redis-server`` processes (stopped by PID); the shared server is only used
under a per-test key prefix.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from delayq import DelayQ
from delayq.backends.redis import RedisBackend
from delayq.errors import BackendError, ConfigurationError, StaleClaim
from delayq.job import CancelOutcome, JobSpec, JobState
from tests._util import wait_until
from tests.redis_support import REDIS_URL, RedisServer, private_redis, redis_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def spec(job_id: str, run_at: float, *, max_attempts: int = 3) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload="{}", run_at=run_at, max_attempts=max_attempts)


def server_time(backend: RedisBackend) -> float:
    seconds, micros = backend._redis.time()
    return float(seconds) + micros / 1e6


@pytest.fixture
def open_redis() -> Iterator[Callable[..., RedisBackend]]:
    opened: list[RedisBackend] = []
    with redis_prefix() as prefix:

        def open_(**options: object) -> RedisBackend:
            backend = RedisBackend.from_url(REDIS_URL, prefix=prefix, **options)  # type: ignore[arg-type]
            opened.append(backend)
            return backend

        try:
            yield open_
        finally:
            for backend in opened:
                backend.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with private_redis(tmp_path) as s:
        yield s


class Sleeper:
    """``wait_for_due`` in a thread, so the test can act while it blocks."""

    def __init__(self, backend: RedisBackend, max_wait: float) -> None:
        self.backend = backend
        self.done = threading.Event()
        self._thread = threading.Thread(target=backend.wait_for_due, args=(max_wait,))
        self._thread.daemon = True
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        self._thread.start()
        self._thread.join()
        self.done.set()

    @property
    def blocked(self) -> bool:
        return bool(self.backend._wakes._in_redis)


# -- any claim limit ------------------------------------------------------------------


def test_a_claim_of_ten_thousand_jobs_claims_them_all_and_its_retry_returns_them(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    now = server_time(backend)
    backend.enqueue([spec(f"j{i}", now - 1, max_attempts=1) for i in range(10_000)])
    request = f"{backend._keys['claim:']}{uuid.uuid4().hex}"

    def claim() -> list[str]:
        reply = backend._run("claim", [10_000, "60", 1000, 30_000, 1000], keys=[request])
        return [str(reply[i]) for i in range(4, len(reply), 2)]

    first = claim()
    assert len(first) == 10_000 and first[:2] == ["j0", "j1"]
    assert claim() == first  # the retry of a call whose reply was lost: the same jobs
    assert backend.stats().running == 10_000


# -- fencing tokens survive lost writes ------------------------------------------------


def test_fencing_tokens_stay_unique_when_the_server_comes_back_with_older_data(
    server: RedisServer,
) -> None:
    backend = RedisBackend.from_url(server.url)
    try:
        now = server_time(backend)
        backend.enqueue([spec("order-1", now)])
        server.client().save()  # the snapshot the server will come back with
        [stale] = backend.claim(limit=1, lease=60.0)
    finally:
        backend.close()
    server.kill()  # the claim was never saved: it is lost
    server.start()
    backend = RedisBackend.from_url(server.url)
    try:
        [live] = backend.claim(limit=1, lease=60.0)
        assert live.job.id == "order-1"
        assert live.token > stale.token
        with pytest.raises(StaleClaim):
            backend.ack(stale)  # the worker the lost write knew of
        backend.ack(live)
        job = backend.get("order-1")
        assert job is not None and job.state is JobState.SUCCEEDED
    finally:
        backend.close()


def test_fencing_tokens_stay_unique_after_a_restart_without_persistence(
    server: RedisServer,
) -> None:
    backend = RedisBackend.from_url(server.url)
    try:
        backend.enqueue([spec("idempotent-id", server_time(backend))])
        [old] = backend.claim(limit=1, lease=60.0)
    finally:
        backend.close()
    server.kill()  # everything is gone
    server.start()
    backend = RedisBackend.from_url(server.url)
    try:
        backend.enqueue([spec("idempotent-id", server_time(backend))])  # scheduled again
        [new] = backend.claim(limit=1, lease=60.0)
        assert new.token != old.token
        with pytest.raises(StaleClaim):
            backend.ack(old)  # an old worker's ack cannot finish the new job
    finally:
        backend.close()


# -- no lost wake-up token ------------------------------------------------------------


def test_every_sleeping_worker_hears_of_an_earlier_job_so_none_depends_on_one_staying_up(
    open_redis: Callable[..., RedisBackend],
) -> None:
    producer = open_redis()
    sleepers = [Sleeper(open_redis(), max_wait=60), Sleeper(open_redis(), max_wait=60)]
    assert wait_until(lambda: all(s.blocked for s in sleepers), timeout=5)
    producer.enqueue([spec("later", server_time(producer) + 30)])  # one token
    # The first sleeper took the token; it passed it on before going back to
    # sleep, so the second also knows of the job (and runs it if the first dies).
    assert wait_until(lambda: all(s.done.is_set() for s in sleepers), timeout=5)


def test_a_worker_left_alone_after_the_token_holder_stops_wakes_at_the_due_time(
    open_redis: Callable[..., RedisBackend],
) -> None:
    producer = open_redis()
    holder, other = open_redis(), open_redis()
    first = Sleeper(holder, max_wait=60)
    assert wait_until(lambda: first.blocked, timeout=5)
    second = Sleeper(other, max_wait=60)
    assert wait_until(lambda: second.blocked, timeout=5)
    due = server_time(producer) + 1.0
    producer.enqueue([spec("j", due)])
    assert wait_until(lambda: first.done.is_set() and second.done.is_set(), timeout=5)
    holder.close()  # the worker that took the token stops
    # The other one's waits (a worker's loop: a spare token may end one at once)
    # end at the due time, not at its idle timeout.
    for _ in range(5):
        again = Sleeper(other, max_wait=60)
        assert again.done.wait(10), "the job waited for the other worker's idle timeout"
        if server_time(producer) >= due - 0.1:
            break
    else:
        pytest.fail("the waits kept ending before the due time")


def test_a_waiter_woken_by_an_interrupt_leaves_the_shared_token_for_another(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    wakes = backend._wakes
    private = f"{backend._keys['wake:']}{uuid.uuid4().hex}"
    shared = backend._keys["wake"]
    backend._redis.delete(shared)
    backend._redis.lpush(private, "1")
    backend._redis.lpush(shared, "1")  # both arrived together
    assert wakes._block(private, 1.0) == "private"
    assert backend._redis.llen(shared) == 1


def test_a_waiter_that_is_stopping_when_it_takes_the_shared_token_puts_it_back(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    shared = backend._keys["wake"]
    backend._redis.delete(shared)
    stopping = threading.Event()
    stopping.set()
    backend._wakes._took_shared(stopping, None)
    assert backend._redis.llen(shared) == 1


# -- out of memory ----------------------------------------------------------------------


def test_out_of_memory_refuses_new_work_whole_and_lets_running_work_finish(
    server: RedisServer,
) -> None:
    backend = RedisBackend.from_url(server.url)
    idle = RedisBackend.from_url(server.url, queue="idle")  # a worker with nothing due
    admin = server.client()
    try:
        now = server_time(backend)
        backend.enqueue([spec(f"j{i}", now) for i in range(4)] + [spec("later", now + 60)])
        a, b = backend.claim(limit=2, lease=30.0)
        sleeper = Sleeper(idle, max_wait=60)
        assert wait_until(lambda: sleeper.blocked, timeout=5)
        admin.config_set("maxmemory", "1")  # every memory-growing command is refused now
        with pytest.raises(BackendError, match="out of memory"):
            backend.enqueue([spec("new-1", now), spec("new-2", now)])
        assert backend.get("new-1") is None and backend.get("new-2") is None
        extended = backend.extend(a, 60.0)  # leases are renewed: no handler runs twice
        assert extended.lease_until > a.lease_until
        backend.ack(extended)
        backend.retry(b, now, "boom")
        assert backend.cancel("later") is CancelOutcome.CANCELLED
        assert len(backend.claim(limit=10, lease=30.0)) == 3  # workers still drain
        idle.interrupt()  # the wake-up push is refused: CLIENT UNBLOCK ends the wait
        assert sleeper.done.wait(5), "stop() did not wake the waiter blocked in Redis"
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
        idle.close()
        backend.close()


# -- expiry events and far-future due times ----------------------------------------------


def test_expiry_events_with_a_far_future_due_time_store_the_whole_batch(
    server: RedisServer,
) -> None:
    backend = RedisBackend.from_url(server.url, expiry_events=True, configure_server=True)
    try:
        now = server_time(backend)
        backend.enqueue([spec("soon", now + 10), spec("far", 1e20), spec("after", now + 20)])
        stats = backend.stats()
        assert stats.scheduled == 3
        for job_id in ("soon", "far", "after"):
            job = backend.get(job_id)
            assert job is not None and job.state is JobState.SCHEDULED
        assert backend.reschedule("soon", 1e19).rescheduled
    finally:
        backend.close()


# -- restricted ACLs and outages ------------------------------------------------------------


def test_without_client_unblock_waits_fall_back_to_bounded_blpops_and_still_wake(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = server.client()
    admin.acl_setuser(
        "limited",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-client"],
    )
    admin.close()
    url = f"redis://limited:pw@127.0.0.1:{server.port}/0"
    with caplog.at_level(logging.WARNING, logger="delayq.redis"):
        backend = RedisBackend.from_url(url)
    producer = RedisBackend.from_url(url)
    try:
        assert not backend._wakes.unblock
        assert "restricted ACL" in caplog.text and "pw" not in caplog.text
        started = server_time(backend)
        backend.wait_for_due(0.4)  # nothing due: the whole wait, and not late
        assert 0.35 <= server_time(backend) - started < 1.0
        sleeper = Sleeper(backend, max_wait=60)
        assert wait_until(lambda: sleeper.blocked, timeout=5)
        producer.enqueue([spec("j", server_time(producer))])  # its token wakes the waiter
        assert sleeper.done.wait(5)
        assert len(backend.claim(limit=1, lease=60.0)) == 1
        backend._redis.delete(backend._keys["wake"])  # the token that claim left
        sleeper = Sleeper(backend, max_wait=60)
        assert wait_until(lambda: sleeper.blocked, timeout=5)
        backend.interrupt()
        assert sleeper.done.wait(5)
    finally:
        producer.close()
        backend.close()


def test_a_wait_during_an_outage_returns_soon_and_claims_work_once_redis_is_back(
    server: RedisServer,
) -> None:
    backend = RedisBackend.from_url(server.url)
    try:
        backend.enqueue([spec("j", server_time(backend) + 3600)])
        server.stop()
        sleeper = Sleeper(backend, max_wait=30)
        assert sleeper.done.wait(5), "a wait during an outage must not block for max_wait"
        server.start()
        backend.enqueue([spec("now", 0.0)])  # everything lost; the store works again
        assert [c.job.id for c in backend.claim(limit=5, lease=30.0)] == ["now"]
    finally:
        backend.close()


def test_an_evicting_policy_set_while_workers_run_is_logged_by_the_next_check(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="delayq.redis"):
        backend = RedisBackend.from_url(server.url)
    try:
        assert "appendonly no" in caplog.text  # the private server has no AOF
        admin = server.client()
        admin.config_set("maxmemory-policy", "allkeys-lru")
        admin.close()
        backend._server._next_check = 0.0  # the check is due
        with caplog.at_level(logging.ERROR, logger="delayq.redis"):
            backend.claim(limit=1, lease=30.0)
        assert "maxmemory-policy allkeys-lru" in caplog.text
    finally:
        backend.close()


def test_a_unix_socket_url_works_through_delayq(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"
    with private_redis(tmp_path, "--unixsocket", str(socket_path), "--unixsocketperm", "700"):
        app = DelayQ(f"unix://{socket_path}?db=0&queue=q")
        try:
            job_id = app.schedule("t", {"a": 1}, delay=60)
            job = app.backend.get(job_id)
            assert job is not None and job.payload == {"a": 1}
        finally:
            app.close()


# -- WAIT / WAITAOF ---------------------------------------------------------------------------


def test_wait_replicas_returns_once_a_replica_has_the_jobs_and_says_so_when_none_does(
    tmp_path: Path,
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "r").mkdir()
    with private_redis(tmp_path / "m") as master:
        replica = RedisServer(tmp_path / "r", "--replicaof", "127.0.0.1", str(master.port))
        replica.start()
        admin = master.client()
        follower = replica.client()
        up = lambda: follower.info("replication").get("master_link_status") == "up"  # noqa: E731
        assert wait_until(up, timeout=20), "the replica did not sync"
        follower.close()
        backend = RedisBackend.from_url(f"{master.url}?wait_replicas=1&wait_timeout=2")
        try:
            backend.enqueue([spec("a", 0.0)])
            assert replica.client().exists(backend._keys["job:"] + "a")  # there already
            replica.stop()
            assert wait_until(lambda: admin.info("replication")["connected_slaves"] == 0)
            with pytest.raises(BackendError, match="0 of 1 replicas"):
                backend.enqueue([spec("b", 0.0)])
            assert backend.get("b") is not None  # stored on the master, as it says
        finally:
            backend.close()
            admin.close()
            replica.stop()


def test_wait_aof_needs_a_server_that_has_waitaof(server: RedisServer) -> None:
    version = server.client().info("server")["redis_version"]
    if tuple(int(x) for x in version.split(".")[:2]) >= (7, 2):
        pytest.skip(f"Redis {version} has WAITAOF")
    with pytest.raises(ConfigurationError, match="WAITAOF"):
        RedisBackend.from_url(server.url, wait_aof=True)
