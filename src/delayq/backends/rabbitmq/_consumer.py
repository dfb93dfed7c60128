"""The consumer thread: deliveries held unacked until their local deadline, acks sent back.

The broker pushes a message to the ready queue once its level TTLs have
passed, which is ``local`` seconds (less than 1.024 s, see ``_topology.py``)
before it is due. The consumer's I/O thread owns one connection and channel
(``basic.qos`` prefetch bounds what it holds) and puts each delivery in a heap
keyed by its local deadline: the delivery instant on this host's monotonic
clock plus ``local``. Because the levels held the message for at least its
broker part, and the local part is measured from the delivery, a job is never
handed out early, whatever the hosts' wall clocks say.

Other threads never touch the channel: they take due deliveries from the heap
(:meth:`Consumer.take_due`) and settle them (ack, or nack to requeue) with
:meth:`Consumer.settle`, which hands them to the I/O thread through pika's
``add_callback_threadsafe``.

When the connection is lost, every delivery it held goes back to the broker:
the heap is emptied, the generation counter moves on (so claims taken under
the old connection are stale), and the thread reconnects with a growing pause.
An idle consumer only answers heartbeats.

A busy worker must not sit on due jobs another worker could run: when a
delivery has been due for ``HANDBACK`` seconds without a claim and the queue
has another consumer, the consumer stops consuming and publishes everything it
holds back to the ready queue (each copy keeping the local wait it had left),
acking the originals; its next claim consumes again. Publishing a copy rather
than returning the message keeps a quorum queue's delivery count, which counts
attempts, unchanged.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pika
import pika.exceptions

from delayq.backends.rabbitmq._connection import Settings, connect
from delayq.backends.rabbitmq._message import CONTENT_TYPE, JobMessage, decode, encode
from delayq.backends.rabbitmq._topology import Topology, ready_key
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import DelayqError

__all__ = ["RETURNS", "Consumer", "Delivery"]

RETURNS = "x-delayq-returns"
"""Header of a handed-back copy: the returns its original had counted."""

log = logging.getLogger("delayq.rabbitmq")

HANDBACK = 0.5
"""A delivery due this long that no claim took (its worker is busy) is handed back to the
queue for another worker, when the queue has another consumer."""


@dataclass(slots=True)
class Delivery:
    """One message held unacked by this consumer."""

    tag: int
    generation: int  # the connection it came on (tags are per channel)
    body: bytes
    returns: int  # earlier deliveries that ended without an ack (a crash, a lost connection)
    message: JobMessage | None  # None when the body cannot be read
    error: str | None = None  # why it cannot be read
    due: float = 0.0  # local deadline, monotonic seconds
    note: str | None = None  # the last error to report instead of the message's (a release)
    seq: int = 0  # arrival order: breaks ties between equal due times (FIFO)


def _due_time(delivery: Delivery) -> float:
    """The order of due deliveries: the job's due time (an unreadable one first)."""
    return delivery.message.run_at if delivery.message is not None else -math.inf


class Consumer:
    """Consumes one ready queue on its own thread (see the module docstring).

    Two heaps: ``_heap`` holds deliveries by local deadline (the never-early gate);
    once a deadline passes, the delivery moves to ``_ready``, ordered by the job's
    due time, so due jobs are claimed in due order even when the broker delivered
    them in another (a retry published after a later job).

    Lock rule: ``_cond`` (and its lock) guards ``_heap``, ``_ready``, ``_generation``,
    ``_wake_gen``, ``_connection``, ``_channel``, ``_consumer_tag``, ``_paused`` and
    ``_closed``.
    ``_generation`` and ``_channel`` change only on the I/O thread. No user
    code runs under the lock, and the I/O thread never waits for other threads.
    """

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self._settings = settings
        self._topology = topology
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Delivery]] = []  # (local deadline, seq, delivery)
        self._ready: list[tuple[float, int, Delivery]] = []  # (due time, seq, delivery)
        self._seq = itertools.count()
        self._generation = 0
        self._wake_gen = 0
        self._connection: Any = None
        self._channel: Any = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stop_wait = threading.Event()
        self._handback_channel: Any = None  # I/O thread only
        self._consumer_tag = ""
        self._paused = False  # consuming stopped by a hand-back, until the next claim
        self.connected = threading.Event()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start the I/O thread (idempotent)."""
        with self._cond:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"delayq-rabbitmq-{self._settings.queue}", daemon=True
            )
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread: deliveries no claim took are published back (a failure to do so
        leaves them to the broker, which returns them when the connection closes), then
        the connection closes, returning the claimed deliveries not finished."""
        with self._cond:
            self._closed = True
            connection = self._connection
            thread = self._thread
            self._wake_gen += 1
            self._cond.notify_all()
        self._stop_wait.set()
        if connection is not None:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError, RuntimeError):
                connection.add_callback_threadsafe(lambda: None)  # wake the loop
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def _run(self) -> None:
        pause = 0.1
        while True:
            with self._cond:
                if self._closed:
                    return
            connection: Any = None
            try:
                connection = connect(self._settings, name="consumer")
                channel = connection.channel()
                channel.basic_qos(prefetch_count=self._settings.prefetch)
                tag = channel.basic_consume(self._topology.ready_queue, self._on_message)
                handback = connection.channel()
                handback.confirm_delivery()
                self._handback_channel = handback
                connection.call_later(HANDBACK, self._hand_back)
                with self._cond:
                    self._generation += 1
                    self._connection, self._channel = connection, channel
                    self._consumer_tag, self._paused = tag, False
                self.connected.set()
                pause = 0.1
                while connection.is_open:
                    with self._cond:
                        if self._closed:
                            break
                    connection.process_data_events(time_limit=None)
                if connection.is_open:
                    self._give_back(channel)
            except (pika.exceptions.AMQPError, OSError, DelayqError) as exc:
                with self._cond:
                    closed = self._closed
                if not closed:
                    log.warning(
                        "RabbitMQ consumer of %s lost its connection (%r); reconnecting in %.1fs",
                        self._settings.queue,
                        exc,
                        pause,
                    )
            finally:
                self._disconnected(connection)
            if self._stop_wait.wait(pause):
                return
            pause = min(5.0, pause * 2)

    def _disconnected(self, connection: Any) -> None:
        """Forget every delivery of the lost connection (the broker returns them)."""
        self.connected.clear()
        with self._cond:
            self._generation += 1
            self._heap.clear()
            self._ready.clear()
            self._connection = self._channel = None
            self._wake_gen += 1
            self._cond.notify_all()
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()

    # -- I/O thread callbacks ----------------------------------------------------
    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        headers = properties.headers or {}
        count = headers.get("x-delivery-count")  # quorum queues count returns
        returns = int(count) if isinstance(count, int) else (1 if method.redelivered else 0)
        earlier = headers.get(RETURNS)  # returns before a hand-back (it restarts the count)
        returns += int(earlier) if isinstance(earlier, int) else 0
        try:
            message: JobMessage | None = decode(body)
            error = None
        except (ValueError, TypeError, KeyError) as exc:
            message, error = None, f"{type(exc).__name__}: {exc}"
        now = SYSTEM_CLOCK.monotonic()
        due = now + (message.local if message is not None else 0.0)
        with self._cond:
            delivery = Delivery(
                method.delivery_tag, self._generation, body, returns, message, error, due
            )
            delivery.seq = next(self._seq)
            first = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, delivery.seq, delivery))
            if first:
                self._wake_gen += 1
                self._cond.notify_all()

    def _hand_back(self) -> None:
        """Pause consuming and publish back everything held, when a delivery has been due
        for HANDBACK seconds without a claim and the queue has another consumer."""
        with self._cond:
            channel, connection = self._channel, self._connection
            if channel is None or self._closed:
                return
            now = SYSTEM_CLOCK.monotonic()
            cutoff = now - HANDBACK
            stale = not self._paused and (
                (bool(self._heap) and self._heap[0][0] <= cutoff)
                or any(entry[2].due <= cutoff for entry in self._ready)
            )
        if stale:
            others = channel.queue_declare(self._topology.ready_queue, passive=True)
            if others.method.consumer_count > 1:
                channel.basic_cancel(self._consumer_tag)
                with self._cond:
                    self._paused = True
                    held = self._drain_locked()
                for delivery in held:
                    self._publish_back(channel, delivery, max(0.0, delivery.due - now))
        connection.call_later(HANDBACK / 2, self._hand_back)

    def _publish_back(self, channel: Any, delivery: Delivery, local: float) -> None:
        """A copy to the ready queue (``local`` seconds still to wait), then ack the original."""
        if delivery.message is None:
            channel.basic_nack(delivery.tag, requeue=True)  # a claim buries it
            return
        headers = {RETURNS: delivery.returns} if delivery.returns else None
        self._handback_channel.basic_publish(
            self._topology.ready_exchange,
            ready_key(self._topology),
            encode(replace(delivery.message, local=local)),
            pika.BasicProperties(
                delivery_mode=2,
                content_type=CONTENT_TYPE,
                message_id=delivery.message.id,
                headers=headers,
            ),
            mandatory=True,
        )
        channel.basic_ack(delivery.tag)

    def _give_back(self, channel: Any) -> None:
        """On close: stop consuming and publish back what no claim took, each with the
        local wait it had left, so a worker that stops costs those jobs no attempt."""
        channel.basic_cancel(self._consumer_tag)
        now = SYSTEM_CLOCK.monotonic()
        with self._cond:
            held = self._drain_locked()
        for delivery in held:
            self._publish_back(channel, delivery, max(0.0, delivery.due - now))

    def _drain_locked(self) -> list[Delivery]:
        """Every delivery held and not claimed, taken out of both heaps (call locked)."""
        held = [entry[2] for entry in sorted(self._ready)]
        held += [entry[2] for entry in sorted(self._heap)]
        self._heap.clear()
        self._ready.clear()
        return held

    def _resume(self) -> None:
        with self._cond:
            channel, paused = self._channel, self._paused
        if channel is not None and paused:
            tag = channel.basic_consume(self._topology.ready_queue, self._on_message)
            with self._cond:
                self._consumer_tag, self._paused = tag, False

    def resume(self) -> None:
        """Consume again after a hand-back paused it (the worker has room for jobs now)."""
        with self._cond:
            connection = self._connection if self._paused else None
        if connection is not None:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError, RuntimeError):
                connection.add_callback_threadsafe(self._resume)

    def _send(self, items: Sequence[tuple[Delivery, bool]]) -> None:
        """Ack or return ``items`` on the channel they came on (skipped if it is gone)."""
        with self._cond:
            channel, generation = self._channel, self._generation
        if channel is None:
            return
        for delivery, requeue in items:
            if delivery.generation != generation:
                continue
            if requeue:
                channel.basic_nack(delivery.tag, requeue=True)
            else:
                channel.basic_ack(delivery.tag)

    # -- any thread ----------------------------------------------------------------
    def settle(self, items: Sequence[tuple[Delivery, bool]]) -> list[bool]:
        """Ack (``requeue=False``) or return (``True``) deliveries; True where it was sent.

        False means the delivery's connection is gone: the broker has already
        returned the message to the queue. The acks are handed to the I/O thread
        without waiting for it (a ``basic.ack`` has no reply, so waiting for the
        socket write would promise nothing more, and it would make every
        commit wait behind a burst of deliveries): when the connection closes
        before one is written, the broker returns that message (at least once).
        """
        if not items:
            return []
        with self._cond:
            connection, generation = self._connection, self._generation
        if connection is None:
            return [False] * len(items)
        results = [delivery.generation == generation for delivery, _ in items]
        sent = [item for item, ok in zip(items, results, strict=True) if ok]
        if sent:
            try:
                connection.add_callback_threadsafe(lambda: self._send(sent))
            except (pika.exceptions.AMQPError, OSError, RuntimeError):
                return [False] * len(items)
        return results

    def put_back(self, delivery: Delivery) -> bool:
        """Return an unstarted delivery to the heap at its own deadline; False when its
        connection is gone (the broker has returned it already)."""
        with self._cond:
            if delivery.generation != self._generation or self._channel is None:
                return False
            heapq.heappush(self._ready, (_due_time(delivery), delivery.seq, delivery))
            self._wake_gen += 1
            self._cond.notify_all()
            return True

    def take_due(self, limit: int, now: float) -> list[Delivery]:
        """Up to ``limit`` deliveries whose local deadline passed by ``now`` (monotonic),
        earliest due time first."""
        taken: list[Delivery] = []
        with self._cond:
            heap, ready = self._heap, self._ready
            while heap and heap[0][0] <= now:
                delivery = heapq.heappop(heap)[2]
                heapq.heappush(ready, (_due_time(delivery), delivery.seq, delivery))
            while ready and len(taken) < limit:
                taken.append(heapq.heappop(ready)[2])
        return taken

    def wait(self, deadline: float, extra: Callable[[], float | None]) -> None:
        """Block until a delivery is due, an earlier one arrives, ``interrupt``, ``extra()``
        (another monotonic deadline, read under the lock) passes, or ``deadline``."""
        clock = SYSTEM_CLOCK
        with self._cond:
            gen = self._wake_gen
            while not self._closed and self._wake_gen == gen:
                if self._ready:
                    return  # due deliveries a claim left for later
                now = clock.monotonic()
                until = deadline
                if self._heap:
                    until = min(until, self._heap[0][0])
                other = extra()
                if other is not None:
                    until = min(until, other)
                if until <= now:
                    return
                clock.wait(self._cond, until - now)

    def interrupt(self) -> None:
        with self._cond:
            self._wake_gen += 1
            self._cond.notify_all()

    def buffered(self) -> int:
        """How many deliveries wait for their local deadline (for tests and stats)."""
        with self._cond:
            return len(self._heap) + len(self._ready)
