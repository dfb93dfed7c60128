"""Redis for tests: the shared server's URL, per-test key prefixes, and cleanup.

Tests use the server at ``DELAYQ_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``)
under their own key prefix, delete their keys afterwards, and never flush it.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests._util import wait_until
from tests.conftest import service_missing

REDIS_URL = os.environ.get("DELAYQ_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_client(url: str = REDIS_URL) -> redis.Redis:
    """A redis-py client on ``url``; skips (or fails in CI) when it does not answer."""
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        service_missing("Redis", f"{url}: {exc}")
    return client


def unique_prefix(seed: str | None = None) -> str:
    """A key prefix no other test uses (stable for one ``seed``)."""
    if seed is None:
        seed = uuid.uuid4().hex
    return "delayqtest:" + hashlib.sha1(seed.encode()).hexdigest()[:12]


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` (SCAN, never FLUSH)."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.delete(*batch)
            batch.clear()
    if batch:
        deleted += client.delete(*batch)
    return deleted


@contextmanager
def redis_prefix(seed: str | None = None, url: str = REDIS_URL) -> Iterator[str]:
    """A fresh key prefix on the test Redis, whose keys are deleted afterwards."""
    client = redis_client(url)
    prefix = unique_prefix(seed)
    try:
        yield prefix
    finally:
        delete_prefix(client, prefix)
        client.close()


class RedisServer:
    """A private ``redis-server`` process on a free loopback port (stopped by its PID).

    For tests that must restart, kill, reconfigure or ``SCRIPT FLUSH`` a server
    without touching the shared one.
    """

    def __init__(self, directory: Path, *args: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_missing("redis-server", "the redis-server binary is not on PATH")
        self.binary = str(binary)
        self.directory = directory
        self.args = args
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                str(self.directory / "redis.log"),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=1)
        try:
            ok = wait_until(lambda: _pings(client), timeout=10.0, interval=0.02)
        finally:
            client.close()
        if not ok:
            self.stop()
            pytest.fail(f"redis-server on port {self.port} did not start; see {self.directory}")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


PRIVATE_PORTS = range(17000, 17100)
"""Ports for private redis-servers of the tests (their cluster bus ports are +10000)."""
SENTINEL_PORTS = range(26400, 26500)
"""Ports for private sentinels of the tests."""


def free_port(ports: range = PRIVATE_PORTS) -> int:
    """A port of ``ports`` nobody listens on now (tried from a random start, so
    parallel test processes rarely race for the same one)."""
    start = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    pytest.fail(f"no free port in {ports.start}-{ports.stop - 1} for a private redis-server")


@contextmanager
def private_redis(directory: Path, *args: str) -> Iterator[RedisServer]:
    """Run a private redis-server for the duration of the block."""
    server = RedisServer(directory, *args).start()
    try:
        yield server
    finally:
        server.stop()
