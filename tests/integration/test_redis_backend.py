"""The Redis backend against real servers: waiting, recovery and durability.

The shared Redis is used under a per-test key prefix; tests that kill,
restart, reconfigure or ``SCRIPT FLUSH`` a server start a private
``redis-server`` of their own.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from delayq import DelayQ
from delayq.backends.redis import RedisBackend
from delayq.backends.redis import _store as redis_store_module
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError
from delayq.job import Claim, JobSpec, JobState, RescheduleOutcome
from delayq.testing import FakeClock
from tests._util import wait_until
from tests.redis_support import REDIS_URL, RedisServer, private_redis, redis_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def spec(job_id: str, run_at: float, *, max_attempts: int = 3) -> JobSpec:
    return JobSpec(
        id=job_id, name="test.job", payload='{"n": 1}', run_at=run_at, max_attempts=max_attempts
    )


def server_time(backend: RedisBackend) -> float:
    seconds, micros = backend._redis.time()
    return seconds + micros / 1_000_000


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix() as p:
        yield p


@pytest.fixture
def open_redis(prefix: str) -> Iterator[Callable[..., RedisBackend]]:
    """Open handles on the shared Redis under this test's prefix."""
    opened: list[RedisBackend] = []

    def open_(url: str = REDIS_URL, **options: object) -> RedisBackend:
        options.setdefault("prefix", prefix)
        backend = RedisBackend.from_url(url, **options)
        opened.append(backend)
        return backend

    yield open_
    for backend in opened:
        backend.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with private_redis(tmp_path) as s:
        yield s


class Waiter:
    """``wait_for_due`` in a thread, so the test can act while it blocks."""

    def __init__(self, backend: RedisBackend, max_wait: float) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(backend, max_wait), daemon=True)
        self._thread.start()

    def _run(self, backend: RedisBackend, max_wait: float) -> None:
        try:
            backend.wait_for_due(max_wait)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


# -- waiting without polling ---------------------------------------------------


def test_a_waiting_worker_wakes_when_another_process_enqueues_an_earlier_job(
    open_redis: Callable[..., RedisBackend],
) -> None:
    worker, producer = open_redis(), open_redis()
    producer.enqueue([spec("far", server_time(producer) + 3600)])
    worker._redis.delete(worker._keys["wake"])  # drop the token that enqueue left
    waiter = Waiter(worker, max_wait=60)
    assert wait_until(lambda: bool(worker._wakes._waiters), timeout=5)
    assert not waiter.done.wait(0.2)
    producer.enqueue([spec("near", server_time(producer) + 0.05)])
    assert waiter.done.wait(5), "the waiter was not woken by the earlier job"
    assert waiter.error is None


def test_wait_for_due_returns_at_the_due_time_on_the_server_clock(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    run_at = server_time(backend) + 0.3
    backend.enqueue([spec("j", run_at)])
    backend._redis.delete(backend._keys["wake"])  # the token enqueue left is not a wake-up
    wakeups = 0
    while not backend.claim(limit=1, lease=30):
        assert wakeups < 3, "woken more often than the head of the due set changed"
        backend.wait_for_due(30)
        wakeups += 1
    assert server_time(backend) >= run_at


def test_interrupt_wakes_a_thread_blocked_in_redis(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    waiter = Waiter(backend, max_wait=60)
    assert wait_until(lambda: (backend.interrupt(), waiter.done.is_set())[1], timeout=5)
    assert waiter.error is None


def test_close_wakes_a_blocked_waiter(open_redis: Callable[..., RedisBackend]) -> None:
    backend = open_redis()
    waiter = Waiter(backend, max_wait=60)
    assert wait_until(lambda: bool(backend._wakes._waiters), timeout=5)
    backend.close()
    assert waiter.done.wait(5)


def test_an_idle_worker_sends_a_handful_of_commands_per_wait(server: RedisServer) -> None:
    backend = RedisBackend.from_url(server.url)
    try:
        backend.enqueue([spec("in-an-hour", server_time(backend) + 3600)])
        backend.wait_for_due(0.05)  # loads the script and takes the token enqueue left
        admin = server.client()
        before = _calls(admin)
        backend.wait_for_due(1.5)  # nothing due for an hour: one blocking wait
        sent = {k: n - before.get(k, 0) for k, n in _calls(admin).items() if n != before.get(k)}
        sent.pop("info", None)
        # One script call (its TIME and ZRANGEs run inside it), one BLPOP sent
        # together with CLIENT ID, and a CLIENT UNBLOCK when the client's own
        # deadline passes before the server's ~100 ms timeout tick.
        from_client = {k: n for k, n in sent.items() if k not in ("time", "zrange")}
        assert from_client.pop("evalsha") == 1
        assert from_client.pop("blpop") == 1
        assert from_client.pop("client|id") == 1
        assert from_client.pop("client|unblock", 0) <= 1
        assert from_client == {}
    finally:
        backend.close()


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def test_a_job_replaced_twice_in_one_batch_has_one_due_entry(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    now = server_time(backend)
    backend.enqueue([spec("a", now - 2)])
    outcomes = backend.enqueue(
        [spec("a", now - 1), spec("b", now - 1), spec("a", now - 0.5)], on_conflict="replace"
    )
    assert [o.value for o in outcomes] == ["replaced", "created", "replaced"]
    assert backend._redis.zcard(backend._keys["due"]) == 2
    claims = backend.claim(limit=10, lease=30)
    assert [(c.job.id, c.job.run_at) for c in claims] == [("b", now - 1), ("a", now - 0.5)]


# -- scripts, connections and server settings -----------------------------------


def test_script_flush_during_a_run_is_recovered_by_the_next_calls(server: RedisServer) -> None:
    backend = RedisBackend.from_url(server.url)
    admin = server.client()
    try:
        now = server_time(backend)
        backend.enqueue([spec(f"j{i}", now - 1) for i in range(600)])
        acked: list[str] = []
        errors: list[BaseException] = []

        def drain() -> None:
            try:
                while len(acked) < 600:
                    for claim in backend.claim(limit=10, lease=30):
                        backend.ack(claim)
                        acked.append(claim.job.id)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=drain)
        thread.start()
        flushes = 0
        while thread.is_alive() and flushes < 50:
            admin.script_flush()
            flushes += 1
        thread.join(30)
        assert not errors
        assert sorted(acked) == sorted(f"j{i}" for i in range(600))
        admin.script_flush()
        assert backend.stats().succeeded == 600
    finally:
        backend.close()


def test_an_unreachable_server_raises_backend_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendUnavailable, match="unreachable"):
        RedisBackend.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1)


def test_calls_fail_with_backend_unavailable_while_the_server_is_down(
    server: RedisServer,
) -> None:
    backend = RedisBackend.from_url(server.url, socket_connect_timeout=1)
    try:
        backend.enqueue([spec("j", server_time(backend) + 60)])
        server.kill()
        with pytest.raises(BackendUnavailable):
            backend.claim(limit=1, lease=30)
        with pytest.raises(BackendUnavailable):
            backend.enqueue([spec("k", 0.0)])
        backend.wait_for_due(1)  # returns (after a short pause): claim reports the outage
    finally:
        backend.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_server_that_may_evict_any_key_is_refused(server: RedisServer, policy: str) -> None:
    server.client().config_set("maxmemory-policy", policy)
    with pytest.raises(ConfigurationError, match=f"maxmemory-policy {policy}"):
        RedisBackend.from_url(server.url)


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-ttl"])
def test_a_server_that_never_evicts_pending_jobs_is_accepted(
    server: RedisServer, policy: str
) -> None:
    server.client().config_set("maxmemory-policy", policy)
    RedisBackend.from_url(server.url).close()


def test_script_errors_are_wrapped_as_backend_errors(server: RedisServer) -> None:
    backend = RedisBackend.from_url(server.url)
    try:
        server.client().set(backend._keys["seq"], "not a number")
        with pytest.raises(BackendError, match="failed"):
            backend.enqueue([spec("j", 0.0)])
    finally:
        backend.close()


# -- the key-expiry trigger ---------------------------------------------------------


def test_expiry_events_need_the_server_setting_or_permission_to_set_it(
    server: RedisServer,
) -> None:
    server.client().config_set("notify-keyspace-events", "")
    with pytest.raises(ConfigurationError, match="notify-keyspace-events"):
        RedisBackend.from_url(server.url, expiry_events=True)
    RedisBackend.from_url(server.url, expiry_events=True, configure_server=True).close()
    flags = server.client().config_get("notify-keyspace-events")["notify-keyspace-events"]
    assert "E" in flags and "x" in flags


def test_shadow_keys_follow_the_due_set(server: RedisServer) -> None:
    backend = RedisBackend.from_url(server.url, expiry_events=True, configure_server=True)
    admin = server.client()
    shadow = backend._keys["shadow:"]
    try:
        now = server_time(backend)
        backend.enqueue([spec("soon", now + 30), spec("later", now + 60), spec("due", now - 1)])
        assert 29_000 < admin.pttl(shadow + "soon") <= 30_000
        assert backend.cancel("later").value == "cancelled"
        assert not admin.exists(shadow + "later")
        assert [c.job.id for c in backend.claim(limit=5, lease=30)] == ["due"]
        assert not admin.exists(shadow + "due")
    finally:
        backend.close()


def test_a_shadow_key_expiry_event_wakes_a_waiting_worker(server: RedisServer) -> None:
    backend = RedisBackend.from_url(server.url, expiry_events=True, configure_server=True)
    admin = server.client()
    try:
        waiter = Waiter(backend, max_wait=60)  # nothing scheduled: it would block 60 s

        def expire_a_shadow_key() -> bool:
            admin.set(backend._keys["shadow:"] + "x", "", px=20)
            return waiter.done.is_set()

        assert wait_until(expire_a_shadow_key, timeout=10, interval=0.2)
        assert waiter.error is None
    finally:
        backend.close()


# -- durability and dropped connections ---------------------------------------------


def test_every_enqueue_that_returned_survives_a_sigkill_of_an_aof_always_server(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always").start()
    try:
        backend = RedisBackend.from_url(server.url, socket_connect_timeout=1)
        returned: list[str] = []
        stopped = threading.Event()

        def produce() -> None:
            run_at = server_time(backend) + 3600
            try:
                for i in range(1_000_000):
                    backend.enqueue([spec(f"j{i}", run_at)])
                    returned.append(f"j{i}")
            except BackendError:
                pass
            finally:
                stopped.set()

        threading.Thread(target=produce, daemon=True).start()
        assert wait_until(lambda: len(returned) >= 300, timeout=20)
        server.kill()
        assert stopped.wait(10)
        backend.close()
        server.start()
        reopened = RedisBackend.from_url(server.url)
        try:
            assert wait_until(lambda: _loaded(reopened), timeout=10)
            missing = [j for j in returned if reopened.get(j) is None]
            assert missing == []
            assert reopened.stats().scheduled >= len(returned)
        finally:
            reopened.close()
    finally:
        server.stop()


def _loaded(backend: RedisBackend) -> bool:
    try:
        backend.stats()
    except BackendUnavailable:
        return False
    return True


class DroppingProxy:
    """A TCP proxy that, once armed, forwards one matching command, waits for the
    server's answer, and drops the client's connection instead of passing it on.

    Deterministic: the client sees its connection close only after the server
    has run the command, and ``dropped`` is set before that, so a client that
    retries at once always finds the first call's effects and the event set.
    """

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.trigger: bytes | None = None
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            armed = threading.Event()  # this connection's next reply is to be lost
            threading.Thread(
                target=self._pump_up, args=(client, upstream, armed), daemon=True
            ).start()
            threading.Thread(
                target=self._pump_down, args=(upstream, client, armed), daemon=True
            ).start()

    def _pump_up(
        self, client: socket.socket, upstream: socket.socket, armed: threading.Event
    ) -> None:
        while data := _recv(client):
            if self.trigger is not None and self.trigger in data:
                self.trigger = None
                armed.set()  # before the server can answer
            try:
                upstream.sendall(data)
            except OSError:
                break
        upstream.close()
        client.close()

    def _pump_down(
        self, upstream: socket.socket, client: socket.socket, armed: threading.Event
    ) -> None:
        while data := _recv(upstream):
            if armed.is_set():
                # The server ran the command and answered: lose the answer.
                self.dropped.set()
                # shutdown, not just close: another thread is blocked reading it
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                client.close()
                break
            try:
                client.sendall(data)
            except OSError:
                break
        upstream.close()

    def close(self) -> None:
        self._listener.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def test_a_claim_whose_reply_is_lost_is_retried_and_returns_the_same_claims(
    server: RedisServer,
) -> None:
    """The retry carries the first call's request id: it gets that call's jobs back
    (attempt 1, nothing leased to nobody), and every job still runs exactly once."""
    proxy = DroppingProxy(server.port)
    backend = RedisBackend.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    try:
        assert backend.claim(limit=1, lease=1.0) == []  # loads the script (nothing stored yet)
        now = server_time(backend)
        backend.enqueue([spec(f"j{i}", now - 10 + i, max_attempts=1) for i in range(6)])
        proxy.trigger = backend._conn.sha("claim").encode()
        first = backend.claim(limit=3, lease=30.0)  # the first attempt's reply is lost
        assert proxy.dropped.is_set()
        assert [c.job.id for c in first] == ["j0", "j1", "j2"]
        assert [c.attempt for c in first] == [1, 1, 1]
        runs: dict[str, list[Claim]] = {}
        for claim in first:
            runs.setdefault(claim.job.id, []).append(claim)
            backend.ack(claim)

        def drain() -> bool:
            for claim in backend.claim(limit=10, lease=30):
                runs.setdefault(claim.job.id, []).append(claim)
                backend.ack(claim)
            return len(runs) == 6

        assert wait_until(drain, timeout=10, interval=0.05)
        assert {job_id: len(claims) for job_id, claims in runs.items()} == dict.fromkeys(
            (f"j{i}" for i in range(6)), 1
        )
        for job_id, (claim,) in runs.items():
            assert claim.attempt == 1
            job = backend.get(job_id)
            assert job is not None and job.state is JobState.SUCCEEDED
            assert job.last_error is None
        assert backend.stats().dead == 0
    finally:
        backend.close()
        proxy.close()


# -- review regressions --------------------------------------------------------------


def test_a_producer_with_a_skewed_clock_schedules_a_delay_on_the_server_clock(
    open_redis: Callable[..., RedisBackend],
) -> None:
    """A producer host 5 s behind the Redis server asks for delay=10: the job is
    due 10 s after the server's now, not 5 s."""
    backend = open_redis()
    producer = DelayQ(backend=backend, clock=FakeClock(server_time(backend) - 5.0))
    before = server_time(backend)
    job_id = producer.schedule("x", None, delay=10)
    after = server_time(backend)
    job = backend.get(job_id)
    assert job is not None
    assert before + 10 <= job.run_at <= after + 10
    assert producer.reschedule(job_id, delay=20) is RescheduleOutcome.RESCHEDULED
    job = backend.get(job_id)
    assert job is not None and job.run_at >= after + 20


def test_an_unreadable_job_hash_is_buried_and_the_other_jobs_of_the_claim_are_claimed(
    open_redis: Callable[..., RedisBackend],
) -> None:
    backend = open_redis()
    now = server_time(backend)
    backend.enqueue([spec("a", now - 1), spec("bad", now - 1), spec("b", now - 1)])
    backend._redis.hset(backend._keys["job:"] + "bad", "payload", "{not json")
    claims = backend.claim(limit=10, lease=30)
    assert [c.job.id for c in claims] == ["a", "b"]
    [dead] = backend.dead_letters()
    assert (dead.id, dead.state, dead.payload) == ("bad", JobState.DEAD, "{not json")
    assert "cannot decode the stored job" in (dead.last_error or "")


def test_a_claim_drops_a_bounded_number_of_expired_finished_records(
    open_redis: Callable[..., RedisBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store_module, "PURGE_BATCH", 10)
    backend = open_redis()
    index = backend._keys["succeeded"]
    backend._redis.zadd(index, {f"old{i}": 1000.0 + i for i in range(25)})  # long expired
    backend.claim(limit=1, lease=30)
    assert backend._redis.zcard(index) == 15
    assert backend.stats().succeeded == 0  # expired records never count
    backend.claim(limit=1, lease=30)
    assert backend._redis.zcard(index) == 5
