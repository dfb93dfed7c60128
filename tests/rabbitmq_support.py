"""RabbitMQ for tests: a private virtual host per test process, per-test queue names, cleanup.

Tests use the server at ``DELAYQ_AMQP_URL`` (default guest on 127.0.0.1:5672).
Each test process creates its own virtual host with ``rabbitmqctl`` (the
management plugin may be off), gives guest every permission on it, and
deletes it at exit; each test uses queue names of its own in it. Nothing is
created on the server's default virtual host.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from urllib.parse import quote, urlsplit

import pika
import pytest

from tests.conftest import service_missing

AMQP_URL = os.environ.get("DELAYQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")

_lock = threading.Lock()
_vhost: str | None = None


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=120, check=False
    )


def rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``rabbitmqctl -q ARGS`` (for policies and connections of the test vhost only)."""
    return _rabbitmqctl(*args)


def _reachable() -> str | None:
    parts = urlsplit(AMQP_URL)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2):
            return None
    except OSError as exc:
        return f"{AMQP_URL}: {exc}"


VHOST_ENV = "DELAYQ_TEST_VHOST"
"""Set to the test vhost for processes a test starts (they use it, never delete it)."""


def private_vhost() -> str:
    """This process's virtual host (created on first use, deleted at exit); skips when absent."""
    global _vhost  # noqa: PLW0603 - one vhost per test process
    problem = _reachable()
    if problem is None and shutil.which("rabbitmqctl") is None:
        problem = "rabbitmqctl is not on PATH (needed to create a test virtual host)"
    if problem is not None:
        service_missing("RabbitMQ", problem)
    with _lock:
        if _vhost is None and os.environ.get(VHOST_ENV):
            _vhost = os.environ[VHOST_ENV]  # a child process of a test: its parent's vhost
        if _vhost is None:
            name = f"delayqtest-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            made = _rabbitmqctl("add_vhost", name)
            if made.returncode != 0:
                service_missing("RabbitMQ", f"rabbitmqctl add_vhost failed: {made.stderr.strip()}")
            user = urlsplit(AMQP_URL).username or "guest"
            _rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
            atexit.register(_rabbitmqctl, "delete_vhost", name)
            os.environ[VHOST_ENV] = name  # processes the tests start use the same vhost
            _vhost = name
        return _vhost


def vhost_url(vhost: str | None = None, **query: str) -> str:
    """The test server's URL on ``vhost`` (this process's test vhost by default)."""
    name = private_vhost() if vhost is None else vhost
    base = AMQP_URL.rstrip("/")
    parts = urlsplit(base)
    url = f"{parts.scheme}://{parts.netloc}/{quote(name, safe='')}"
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return url


def unique_queue(seed: str | None = None) -> str:
    """A queue name no other test uses (stable for one ``seed``)."""
    if seed is None:
        seed = uuid.uuid4().hex
    return "t" + hashlib.sha1(seed.encode()).hexdigest()[:12]


def ready_queue(queue: str) -> str:
    return f"delayq.v2.ready.{queue}"


def dead_stream(queue: str) -> str:
    return f"delayq.v2.dead.{queue}"


def delete_queues(queue: str) -> None:
    """Delete a test queue's ready queue and dead stream (the shared levels stay with the
    vhost; messages still in them go to its orphans queue)."""
    try:
        connection = pika.BlockingConnection(pika.URLParameters(vhost_url()))
    except pika.exceptions.AMQPError:
        return
    try:
        channel = connection.channel()
        for name in (ready_queue(queue), dead_stream(queue)):
            channel.queue_delete(name)
    finally:
        connection.close()


def close_connections(vhost: str | None = None) -> None:
    """Close every client connection to the test vhost (rabbitmqctl close_all_connections)."""
    name = private_vhost() if vhost is None else vhost
    done = _rabbitmqctl("close_all_connections", "-p", name, "delayq test: connection closed")
    if done.returncode != 0:
        pytest.fail(f"rabbitmqctl close_all_connections failed: {done.stderr.strip()}")
