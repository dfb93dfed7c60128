"""Publishing with confirms and ``mandatory``: a message the broker cannot route is an error.

A batch is published without waiting for each confirm, then its confirms are
awaited together under a deadline (``confirm_timeout``), so ``schedule_many``
costs one round trip and a broker that cannot confirm (a quorum queue without
a leader, a minority partition) makes the call fail with ``BackendUnavailable``
("may or may not be stored") instead of blocking it and every thread behind it.
A message no queue would take comes back as ``basic.return`` and raises, so
``schedule`` never loses a job silently.

One connection and one channel, shared by every thread of the store under
``_lock`` (pika's blocking connection is not thread-safe). A connection idle
longer than the heartbeat interval may have been closed by the broker; before
each use the publisher lets pika read what arrived (heartbeats, a close) and
opens a new connection when the old one is gone. A connection the broker
closed since its last use is replaced and what was not confirmed yet is
published once more (a message the broker had received but not confirmed is
then there twice: at least once); any other failure is raised.

The shared part of the topology is declared once per process and virtual host
(``declare=passive`` only checks that it exists, for users without the
``configure`` permission).
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

from delayq.backends.rabbitmq._connection import ConfirmTimeout, Settings, connect, map_errors
from delayq.backends.rabbitmq._message import CONTENT_TYPE
from delayq.backends.rabbitmq._topology import Topology
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import QueueClosed

__all__ = ["Confirms", "Outgoing", "Publisher"]

log = logging.getLogger("delayq.rabbitmq")

IDLE_CHECK = 5.0
"""After this many idle seconds the connection is checked (heartbeats read) before use."""

T = TypeVar("T")

_DECLARED: set[tuple[str, str]] = set()
"""(broker URL, queue type) whose shared levels this process declared."""
_DECLARED_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish."""

    exchange: str
    routing_key: str
    body: bytes
    message_id: str
    headers: dict[str, Any] | None = None


class Confirms:
    """A confirm-mode channel on ``connection`` that publishes many messages and waits
    for their confirms together, up to a deadline.

    It drives pika's channel object under the blocking channel (``_impl``) and the
    blocking channel's I/O loop (``_flush_output``), which is what pika's own
    one-at-a-time ``basic_publish`` does; use it only on the thread that owns
    ``connection``.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.channel = connection.channel()
        impl = self.channel._impl
        impl.confirm_delivery(ack_nack_callback=self._on_confirm)  # no wait for select-ok
        impl.add_on_return_callback(self._on_return)
        self._tag = 0
        self._pending: dict[int, int] = {}  # delivery tag -> index in the batch
        self._failed: dict[int, str] = {}  # index -> "returned" or "nacked"
        self._returned: set[int] = set()  # delivery tags returned (their ack follows)

    @property
    def is_open(self) -> bool:
        return bool(self.channel.is_open and self.connection.is_open)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        nacked = isinstance(method, pika.spec.Basic.Nack)
        tags = (
            [t for t in self._pending if t <= method.delivery_tag]
            if method.multiple
            else [method.delivery_tag]
        )
        for tag in tags:
            index = self._pending.pop(tag, None)
            if index is None:
                continue
            if nacked:
                self._failed[index] = "nacked"
            elif tag in self._returned:
                self._failed[index] = "returned"
            self._returned.discard(tag)

    def _on_return(self, _channel: Any, _method: Any, properties: Any, _body: bytes) -> None:
        with contextlib.suppress(TypeError, ValueError):
            self._returned.add(int(properties.correlation_id))

    def send(self, messages: Sequence[Outgoing], timeout: float, done: set[int]) -> None:
        """Publish the messages whose index is not in ``done`` and wait for their confirms;
        each confirmed index is added to ``done``.

        Raises ``ConfirmTimeout`` when some are still unconfirmed after ``timeout``
        seconds, pika's ``UnroutableError`` / ``NackError`` when the broker returned or
        refused some (the others are confirmed), and pika's connection or channel
        errors (``done`` then says what was confirmed before).
        """
        impl = self.channel._impl
        self._pending.clear()
        self._failed.clear()
        self._returned.clear()
        for index, m in enumerate(messages):
            if index in done:
                continue
            self._tag += 1
            self._pending[self._tag] = index
            impl.basic_publish(
                m.exchange,
                m.routing_key,
                m.body,
                pika.BasicProperties(
                    delivery_mode=2,
                    content_type=CONTENT_TYPE,
                    message_id=m.message_id,
                    correlation_id=str(self._tag),
                    headers=m.headers,
                ),
                mandatory=True,
            )
        deadline = SYSTEM_CLOCK.monotonic() + timeout
        waiting = dict(self._pending)
        timer = self.connection.call_later(timeout, lambda: None)  # wakes the I/O wait
        try:
            self.channel._flush_output(
                lambda: not self._pending or SYSTEM_CLOCK.monotonic() >= deadline
            )
        finally:
            with contextlib.suppress(Exception):
                self.connection.remove_timeout(timer)
            done.update(i for t, i in waiting.items() if t not in self._pending)
            for index in self._failed:
                done.discard(index)
        if self._failed:
            failed = sorted(self._failed.items())
            if any(kind == "nacked" for _, kind in failed):
                raise pika.exceptions.NackError([messages[i] for i, _ in failed])
            raise pika.exceptions.UnroutableError([messages[i] for i, _ in failed])
        if self._pending:
            raise ConfirmTimeout(len(self._pending), timeout)


class Publisher:
    """The store's publishing connection (see the module docstring).

    Lock rule: ``_lock`` guards ``_connection`` and ``_confirms``; every use of
    them happens while holding it.
    """

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self._settings = settings
        self._topology = topology
        self._lock = threading.Lock()
        self._connection: Any = None
        self._confirms: Confirms | None = None
        self._closed = False
        self._used = 0.0  # monotonic time of the last use of the connection

    def open(self) -> None:
        """Connect and declare the topology now, so a bad URL fails at once."""
        self.run("declare the queues", lambda confirms: None)

    def _declare(self, connection: Any) -> None:
        channel = connection.channel()
        try:
            if self._settings.declare == "passive":
                self._topology.check(channel)
                return
            key = (self._settings.pika_url, self._topology.queue_type)
            with _DECLARED_LOCK:
                shared = key not in _DECLARED
            if shared:
                self._topology.declare_shared(channel)
            self._topology.declare_own(channel)
            with _DECLARED_LOCK:
                _DECLARED.add(key)
        finally:
            if channel.is_open:
                channel.close()

    def _ensure(self) -> Confirms:
        connection = self._connection
        now = SYSTEM_CLOCK.monotonic()
        if connection is not None and connection.is_open and now - self._used > IDLE_CHECK:
            try:
                connection.process_data_events(0)  # heartbeats, or the broker's close
            except pika.exceptions.AMQPError:
                connection = None
        self._used = now
        if connection is None or self._confirms is None or not self._confirms.is_open:
            self._drop()
            connection = connect(self._settings, name="publisher")
            try:
                self._declare(connection)
                confirms = Confirms(connection)
            except BaseException:
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    connection.close()
                raise
            self._connection, self._confirms = connection, confirms
        return self._confirms

    def _drop(self) -> None:
        connection, self._connection, self._confirms = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()

    def run(self, action: str, fn: Callable[[Confirms], T]) -> T:
        """Call ``fn(confirms)`` on the publishing channel under the lock, errors mapped;
        once more on a new connection when the broker had closed the old one."""
        with self._lock:
            if self._closed:
                raise QueueClosed(f"the RabbitMQ store at {self._settings.url} is closed")
            with map_errors(self._settings, action):
                reused = self._connection is not None
                try:
                    return fn(self._ensure())
                except pika.exceptions.ConnectionBlockedTimeout:
                    self._drop()
                    raise
                except pika.exceptions.AMQPConnectionError:
                    self._drop()
                    if not reused:
                        raise
                    # The broker closed a connection opened earlier (a restart, an
                    # operator, a network blip): once more on a new one.
                    log.warning("RabbitMQ publisher connection lost; reconnecting", exc_info=True)
                except (pika.exceptions.AMQPError, OSError, ConfirmTimeout):
                    # The channel (or the socket) is unusable now, or in doubt.
                    self._drop()
                    raise
                try:
                    return fn(self._ensure())
                except (pika.exceptions.AMQPError, OSError, ConfirmTimeout):
                    self._drop()
                    raise

    def publish(self, messages: Sequence[Outgoing], action: str = "publish a job") -> None:
        """Publish every message and wait for the broker's confirms (raises on a return, a
        nack or the confirm deadline); after a reconnect only the unconfirmed ones again."""
        if not messages:
            return
        done: set[int] = set()
        timeout = self._settings.confirm_timeout
        self.run(action, lambda confirms: confirms.send(messages, timeout, done))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
