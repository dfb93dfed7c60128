"""The RabbitMQ store against a broker's ``consumer_timeout`` (a private broker of its own).

RabbitMQ closes a channel whose oldest unacked delivery is older than
``consumer_timeout`` (30 minutes by default) and returns everything the channel
held. A worker whose handler runs longer, with more jobs waiting in its buffer,
must then consume again at once (pika raises nothing on a broker channel close
inside the I/O loop), must not charge the returned jobs an attempt (their
handlers never started), and must not run the long job a second time beside
itself. The shared broker's settings cannot be changed, so this test starts a
broker of its own on a free port, with ``consumer_timeout`` 3 s checked every
second, and stops it by its pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import DelayQ, JobContext
from delayq.worker import JobResult, Worker
from tests._util import wait_until
from tests.conftest import service_missing

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

START = 120.0  # real seconds for the broker to start on a loaded machine
DEADLINE = 120.0  # real seconds; reached only when something is broken


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A private RabbitMQ node (``consumer_timeout`` 3 s); its AMQP URL."""
    server = shutil.which("rabbitmq-server") or "/usr/sbin/rabbitmq-server"
    if not Path(server).exists():
        service_missing("a private RabbitMQ broker", "rabbitmq-server is not installed")
    if os.geteuid() != 0:
        service_missing("a private RabbitMQ broker", "starting one needs root (its own user)")
    # Under /tmp itself: the broker runs as its own user, which cannot enter pytest's
    # temporary folders (mode 0700, root's).
    home = Path(tempfile.mkdtemp(prefix="delayq-rabbitmq-"))
    port, dist = _free_port(), _free_port()
    (home / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{port}\nconsumer_timeout = 3000\n"
    )
    # The broker looks at consumer timeouts on each channel tick (every minute by default).
    (home / "advanced.config").write_text("[{rabbit, [{channel_tick_interval, 1000}]}].\n")
    (home / "enabled_plugins").write_text("[].\n")
    for sub in ("mnesia", "log"):
        (home / sub).mkdir()
    subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(home)], check=True)
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": f"delayq{os.getpid()}@localhost",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_PID_FILE": str(home / "pid"),
        "RABBITMQ_FEATURE_FLAGS_FILE": str(home / "feature_flags"),
        "RABBITMQ_PLUGINS_EXPAND_DIR": str(home / "plugins"),
    }
    out = (home / "server.out").open("w")
    proc = subprocess.Popen([server], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        if not wait_until(lambda: _listening(port) or proc.poll() is not None, START):
            pytest.fail(f"the private broker did not listen within {START:g}s")
        if not _listening(port):
            pytest.fail(f"the private broker ended: {(home / 'server.out').read_text()[-2000:]}")
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        pid_file = home / "pid"
        if pid_file.exists() and pid_file.read_text().strip():
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), 60)
        proc.terminate()
        proc.wait(60)
        out.close()
        shutil.rmtree(home, ignore_errors=True)


def test_a_consumer_timeout_costs_nothing_the_worker_consumes_again_at_once(broker: str) -> None:
    app = DelayQ(f"{broker}?queue=timeout")
    release = threading.Event()
    ran: list[tuple[int, int]] = []
    results: list[JobResult] = []

    @app.handler("work")
    def work(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append((payload["n"], ctx.attempt))
        if payload["n"] == 0:
            release.wait(DEADLINE)

    try:
        app.schedule("work", {"n": 0}, delay=0, max_attempts=3)
        for n in range(1, 4):  # held in the worker's buffer behind job 0, never started
            app.schedule("work", {"n": n}, delay=0, max_attempts=1)
        worker = Worker(app, concurrency=1, on_result=results.append).start()
        try:
            consumer = app.backend._consumer  # type: ignore[attr-defined]
            assert wait_until(lambda: ran == [(0, 1)] and consumer.buffered() == 3, DEADLINE)
            # The broker closes the channel 3 s after its first delivery; the consumer
            # subscribes again on a fresh one, with nobody acking anything meanwhile.
            assert wait_until(lambda: consumer.health()["channel_closes"] >= 1, DEADLINE)
            assert wait_until(lambda: consumer.alive and consumer.buffered() == 3, DEADLINE)
            release.set()
            assert wait_until(lambda: len(results) == 4, DEADLINE)
        finally:
            release.set()
            worker.stop(grace=5)
        assert sorted(ran) == [(0, 1), (1, 1), (2, 1), (3, 1)]  # each once, attempt 1
        outcomes = {r.outcome for r in results}
        assert outcomes == {"succeeded"}, [(r.job_id, r.outcome, r.error) for r in results]
        assert app.dead_letters() == []
    finally:
        app.close()
