"""The Redis store on a real 3-master Redis Cluster and behind Sentinel.

Both are started by the tests on private ports (servers 17000-17099, their
cluster bus +10000, sentinels 26400-26499) and stopped by PID afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from delayq import DelayQ
from delayq.backends.base import Completion
from delayq.backends.redis import RedisBackend, queue_keys
from delayq.errors import BackendError
from delayq.job import CancelOutcome, JobSpec, JobState
from delayq.keyed import KeyedOutcome, KeyPolicy
from tests._util import wait_until
from tests.conftest import service_missing
from tests.redis_support import SENTINEL_PORTS, RedisServer, free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def spec(job_id: str, run_at: float) -> JobSpec:
    return JobSpec(id=job_id, name="t", payload="{}", run_at=run_at)


def server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


# -- Redis Cluster ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    cli = shutil.which("redis-cli")
    if cli is None:
        service_missing("redis-cli", "the redis-cli binary is not on PATH")
    servers: list[RedisServer] = []
    try:
        for i in range(3):
            directory = tmp_path_factory.mktemp(f"cluster{i}")
            servers.append(
                RedisServer(
                    directory, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"
                ).start()
            )
        subprocess.run(
            [
                str(cli),
                "--cluster",
                "create",
                *(f"127.0.0.1:{s.port}" for s in servers),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

        def ready() -> bool:
            for s in servers:
                client = s.client()
                try:
                    if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                        return False
                finally:
                    client.close()
            return True

        assert wait_until(ready, timeout=30, interval=0.1), "the cluster did not become ready"
        yield servers
    finally:
        for s in servers:
            s.stop()


def _queues_on_every_node(servers: list[RedisServer]) -> list[str]:
    """One queue name per master: its hash tag's slot is served by that master."""
    client = servers[0].client()
    try:
        ranges = client.execute_command("CLUSTER", "SLOTS")
    finally:
        client.close()
    owner = {}
    for start, end, master, *_ in ranges:
        owner[(int(start), int(end))] = int(master[1])
    found: dict[int, str] = {}
    for i in range(1000):
        name = f"q{i}"
        slot = key_slot(queue_keys("delayq", name)["due"].encode())
        port = next(p for (a, b), p in owner.items() if a <= slot <= b)
        found.setdefault(port, name)
        if len(found) == len(servers):
            break
    return list(found.values())


class _Waiter:
    def __init__(self, backend: RedisBackend) -> None:
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(backend,), daemon=True).start()

    def _run(self, backend: RedisBackend) -> None:
        backend.wait_for_due(30)
        self.done.set()


def test_a_queue_on_every_master_of_a_cluster_runs_its_whole_job_cycle(
    cluster: list[RedisServer],
) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster[0].port},127.0.0.1:{cluster[1].port}"
    queues = _queues_on_every_node(cluster)
    assert len(queues) == 3
    for queue in queues:
        backend = RedisBackend.from_url(url, queue=queue)
        producer = RedisBackend.from_url(url, queue=queue)
        try:
            now = server_time(backend._conn.node())
            producer.enqueue([spec(f"j{i}", now - 1) for i in range(4)] + [spec("x", now + 60)])
            first = backend.claim(limit=2, lease=30.0)
            answers, more = backend.complete_and_claim(
                [Completion.ack(c) for c in first], limit=5, lease=30.0
            )
            assert answers == [None, None] and [c.job.id for c in more] == ["j2", "j3"]
            backend.complete([Completion.ack(c) for c in more])
            assert backend.cancel("x") is CancelOutcome.CANCELLED
            job = backend.get("j0")
            assert job is not None and job.state is JobState.SUCCEEDED
            stats = backend.stats()
            assert (stats.scheduled, stats.running, stats.succeeded) == (0, 0, 4)
            # A keyed call: the key's record is in the queue's slot too.
            append = KeyPolicy.build("append", max_items=5)
            assert append is not None
            results = [
                producer.enqueue_keyed(
                    JobSpec(id="batch", name="t", payload=str(n), run_at=now - 1), append
                )
                for n in range(2)
            ]
            assert [r.outcome for r in results] == [KeyedOutcome.CREATED, KeyedOutcome.APPENDED]
            [claim] = backend.claim(limit=1, lease=30.0)
            assert claim.job.payload == [0, 1]
            backend.ack(claim)
            batch = backend.get("batch")
            assert batch is not None and batch.keyed is not None and batch.keyed.items == 2
            # A waiter blocked on this queue's node is woken by an enqueue elsewhere.
            backend._redis.delete(backend._keys["wake"])  # the tokens of the calls above
            waiter = _Waiter(backend)
            assert wait_until(lambda b=backend: bool(b._wakes._in_redis), timeout=5)
            producer.enqueue([spec("now", server_time(producer._conn.node()))])
            assert waiter.done.wait(10), "the waiter was not woken"
        finally:
            producer.close()
            backend.close()


def test_delayq_schedules_on_a_cluster_through_its_url(cluster: list[RedisServer]) -> None:
    app = DelayQ(f"redis+cluster://127.0.0.1:{cluster[2].port}?queue=orders")
    try:
        job_id = app.schedule("t", {"n": 1}, delay=30)
        job = app.backend.get(job_id)
        assert job is not None and job.payload == {"n": 1}
    finally:
        app.close()


# -- Sentinel --------------------------------------------------------------------------


@pytest.fixture
def sentinel_setup(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer, int]]:
    master = (
        RedisServer(tmp_path / "master").start() if (tmp_path / "master").mkdir() is None else None
    )
    assert master is not None
    replica_dir = tmp_path / "replica"
    replica_dir.mkdir()
    replica = RedisServer(replica_dir, "--replicaof", "127.0.0.1", str(master.port)).start()
    port = free_port(SENTINEL_PORTS)
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
        "sentinel down-after-milliseconds mymaster 1000\n"
        "sentinel failover-timeout mymaster 5000\n"
    )
    binary = shutil.which("redis-server")
    assert binary is not None
    sentinel = subprocess.Popen(
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)

        def knows_replica() -> bool:
            try:
                replicas = client.execute_command("SENTINEL", "REPLICAS", "mymaster")
            except redis.RedisError:
                return False
            return any("s_down" not in str(r) for r in replicas)

        assert wait_until(knows_replica, timeout=30, interval=0.1), "sentinel saw no replica"
        client.close()
        yield master, replica, port
    finally:
        sentinel.terminate()
        sentinel.wait(timeout=10)
        replica.stop()
        master.stop()


def test_a_store_behind_sentinel_follows_a_failover_to_the_replica(
    sentinel_setup: tuple[RedisServer, RedisServer, int],
) -> None:
    master, replica, port = sentinel_setup
    backend = RedisBackend.from_url(f"redis+sentinel://127.0.0.1:{port}/mymaster/0")
    try:
        now = server_time(backend._conn.node())
        backend.enqueue([spec("before", now - 1)])
        on_master = master.client()
        assert on_master.exists(backend._keys["job:"] + "before")  # not some other server
        on_master.execute_command("WAIT", 1, 5000)  # the replica has it
        on_master.close()
        admin = redis.Redis(port=port, decode_responses=True)
        admin.execute_command("SENTINEL", "FAILOVER", "mymaster")

        def promoted() -> bool:
            addr = admin.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
            return int(addr[1]) == replica.port

        assert wait_until(promoted, timeout=30, interval=0.1), "no failover"
        admin.close()

        def enqueued() -> bool:
            try:
                backend.enqueue([spec("after", now - 1)], on_conflict="keep")
            except BackendError:
                return False  # the old master's connection: the next call reconnects
            return True

        assert wait_until(enqueued, timeout=30, interval=0.2)
        claimed = {c.job.id for c in backend.claim(limit=5, lease=30.0)}
        assert claimed == {"before", "after"}
    finally:
        backend.close()
