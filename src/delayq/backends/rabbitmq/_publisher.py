"""Publishing with confirms and ``mandatory``: a message the broker cannot route is an error.

One connection and one channel in confirm mode, shared by every thread of the
store under ``_lock`` (pika's blocking connection is not thread-safe). A
publish returns only once the broker has confirmed it (for a quorum queue: a
Raft majority has it on disk); a message no queue would take comes back as
``basic.return`` and raises, so ``schedule`` never loses a job silently.

A connection idle longer than the heartbeat interval may have been closed by
the broker; before each use the publisher lets pika read what arrived
(heartbeats, a close) and opens a new connection when the old one is gone.
A connection the broker closed since its last use is replaced and the call
made once more (a message the broker had received before is then there
twice: at least once); any other failure is raised (``BackendUnavailable``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pika
import pika.exceptions

from delayq.backends.rabbitmq._connection import Settings, connect, map_errors
from delayq.backends.rabbitmq._message import CONTENT_TYPE
from delayq.backends.rabbitmq._topology import Topology
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import QueueClosed

__all__ = ["Outgoing", "Publisher", "send"]

log = logging.getLogger("delayq.rabbitmq")

IDLE_CHECK = 5.0
"""After this many idle seconds the connection is checked (heartbeats read) before use."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish."""

    exchange: str
    routing_key: str
    body: bytes
    message_id: str
    headers: dict[str, Any] | None = None


def send(channel: Any, messages: Sequence[Outgoing]) -> None:
    """Publish on a confirm-mode ``channel``; each call returns once the broker confirmed."""
    for m in messages:
        channel.basic_publish(
            m.exchange,
            m.routing_key,
            m.body,
            pika.BasicProperties(
                delivery_mode=2,
                content_type=CONTENT_TYPE,
                message_id=m.message_id,
                headers=m.headers,
            ),
            mandatory=True,
        )


class Publisher:
    """The store's publishing connection (see the module docstring).

    Lock rule: ``_lock`` guards ``_connection`` and ``_channel``; every use of
    them happens while holding it.
    """

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self._settings = settings
        self._topology = topology
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._closed = False
        self._used = 0.0  # monotonic time of the last use of the connection

    def open(self) -> None:
        """Connect and declare the topology now, so a bad URL fails at once."""
        self.run("declare the queues", lambda channel: None)

    def _ensure(self) -> Any:
        connection = self._connection
        now = SYSTEM_CLOCK.monotonic()
        if connection is not None and connection.is_open and now - self._used > IDLE_CHECK:
            try:
                connection.process_data_events(0)  # heartbeats, or the broker's close
            except pika.exceptions.AMQPError:
                connection = None
        self._used = now
        if connection is None or not connection.is_open or not self._channel.is_open:
            self._drop()
            connection = connect(self._settings, name="publisher")
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                self._topology.declare(channel)
            except BaseException:
                connection.close()
                raise
            self._connection, self._channel = connection, channel
        return self._channel

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()

    def run(self, action: str, fn: Callable[[Any], T]) -> T:
        """Call ``fn(channel)`` on the publishing channel under the lock, errors mapped."""
        with self._lock:
            if self._closed:
                raise QueueClosed(f"the RabbitMQ store at {self._settings.url} is closed")
            with map_errors(self._settings, action):
                reused = self._connection is not None
                try:
                    return fn(self._ensure())
                except pika.exceptions.AMQPConnectionError:
                    self._drop()
                    if not reused:
                        raise
                    # The broker closed a connection opened earlier (a restart, an
                    # operator, a network blip): once more on a new one. A message it
                    # did receive before is then there twice (at least once).
                    log.warning("RabbitMQ publisher connection lost; reconnecting", exc_info=True)
                except (pika.exceptions.AMQPError, OSError):
                    # The channel (or the socket) is unusable now.
                    self._drop()
                    raise
                try:
                    return fn(self._ensure())
                except (pika.exceptions.AMQPError, OSError):
                    self._drop()
                    raise

    def publish(self, messages: Sequence[Outgoing], action: str = "publish a job") -> None:
        """Publish each message, waiting for the broker's confirm (raises on a return or nack)."""
        if not messages:
            return

        self.run(action, lambda channel: send(channel, messages))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
