"""RabbitMQ for tests: a private virtual host per test process, per-test queue names, cleanup.

Tests use the server at ``DELAYQ_AMQP_URL`` (default guest on 127.0.0.1:5672).
Each test process creates its own virtual host with ``rabbitmqctl`` (the
management plugin may be off), gives guest every permission on it, and
deletes it at exit; each test uses queue names of its own in it. Nothing is
created on the server's default virtual host.

The broker is shared by every test run on the machine, so the helpers keep its
resources bounded: every ``rabbitmqctl`` call has a server-side timeout
(``-t 30``) and is killed with its whole process group at 35 s (a hung CLI holds
one of the few distribution ports the CLI may use); the helpers that read or
delete queues share ONE connection per test process (no heartbeat: it may sit
idle between tests), reopened when the broker closed it and closed at exit,
before the vhost is deleted.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import pika
import pytest

from tests.conftest import service_missing

AMQP_URL = os.environ.get("DELAYQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")

CTL_TIMEOUT = 30
"""Seconds the broker gives one ``rabbitmqctl`` command (its ``-t``)."""
CTL_KILL_AFTER = 35
"""Seconds after which a ``rabbitmqctl`` process group still running is killed."""

_lock = threading.Lock()  # guards _vhost
_vhost: str | None = None
_cleanup_lock = threading.Lock()  # guards _cleanup (one user of the connection at a time)
_cleanup: pika.BlockingConnection | None = None
T = TypeVar("T")


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    command = ["rabbitmqctl", "-q", "-t", str(CTL_TIMEOUT), *args]
    # Its own session: the wrapper script starts su, sh and an Erlang VM, and a
    # timeout must end all of them, not only the script.
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=CTL_KILL_AFTER)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err = f"rabbitmqctl {' '.join(args[:1])} killed after {CTL_KILL_AFTER} s. {err}"
        return subprocess.CompletedProcess(command, -signal.SIGKILL, out, err)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


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
            atexit.register(_delete_vhost, name)
            os.environ[VHOST_ENV] = name  # processes the tests start use the same vhost
            _vhost = name
        return _vhost


def vhost_url(vhost: str | None = None, **query: str) -> str:
    """The test server's URL on ``vhost`` (this process's test vhost by default).

    With ``policies=off`` unless given: a store checks the vhost's policies at open
    with ``rabbitmqctl``, and the suite's many stores must not start that many CLIs
    (only the tests of the check itself ask for it)."""
    name = private_vhost() if vhost is None else vhost
    query.setdefault("policies", "off")
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


def _delete_vhost(name: str) -> None:
    _close_cleanup()  # first: a connection to a vhost being deleted slows the deletion
    _rabbitmqctl("delete_vhost", name)


def _close_cleanup() -> None:
    global _cleanup
    with _cleanup_lock:
        connection, _cleanup = _cleanup, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()


atexit.register(_close_cleanup)  # also in child processes, which delete no vhost


def channel_call(fn: Callable[[Any], T]) -> T:
    """``fn(channel)`` on a fresh channel of this process's cleanup connection.

    The connection is opened on first use and kept; if the broker closed it (a
    test closes every connection of the vhost), it is opened again once. A
    channel error (a passive declare of a missing queue) closes only the channel.
    """
    global _cleanup  # noqa: PLW0603 - one cleanup connection per test process
    with _cleanup_lock:
        for again in (False, True):
            if _cleanup is None or not _cleanup.is_open:
                if _cleanup is not None:
                    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                        _cleanup.close()  # release the socket of a connection the broker closed
                params = pika.URLParameters(vhost_url().split("?")[0])
                params.heartbeat = 0
                params.blocked_connection_timeout = CTL_TIMEOUT
                _cleanup = pika.BlockingConnection(params)
            try:
                channel = _cleanup.channel()
            except (pika.exceptions.ConnectionClosed, pika.exceptions.StreamLostError):
                if again:
                    raise
                _cleanup = None
                continue
            try:
                return fn(channel)
            finally:
                if channel.is_open:
                    with contextlib.suppress(pika.exceptions.AMQPError):
                        channel.close()
        raise AssertionError("unreachable")


def queue_depth(name: str) -> int:
    """Messages ready in queue ``name`` of the test vhost."""

    def count(channel: Any) -> int:
        return int(channel.queue_declare(name, passive=True).method.message_count)

    return channel_call(count)


def delete_queues(queue: str) -> None:
    """Delete a test queue's ready queue, dead stream and log (the shared levels stay with the
    vhost; messages still in them go to its orphans queue)."""

    def delete(channel: Any) -> None:
        for name in (ready_queue(queue), dead_stream(queue), f"delayq.v2.log.{queue}"):
            channel.queue_delete(name)

    with contextlib.suppress(pika.exceptions.AMQPError):
        channel_call(delete)


def close_connections(vhost: str | None = None) -> None:
    """Close every client connection to the test vhost (rabbitmqctl close_all_connections)."""
    name = private_vhost() if vhost is None else vhost
    _close_cleanup()  # closed by us, not left half-closed by the broker
    done = _rabbitmqctl("close_all_connections", "-p", name, "delayq test: connection closed")
    if done.returncode != 0:
        pytest.fail(f"rabbitmqctl close_all_connections failed: {done.stderr.strip()}")
