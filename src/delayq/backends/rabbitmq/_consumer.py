"""The consumer thread: deliveries held unacked until their local deadline, acks sent back.

(One module of about 600 lines: everything that touches the consumer's channel
runs on its I/O thread, and keeping that thread's code together keeps the
threading rule checkable.)

The broker pushes a message to the ready queue once its level TTLs have
passed, which is ``local`` seconds (less than 32 ms, see ``_topology.py``)
before it is due. The consumer's I/O thread owns one connection and channel
(``basic.qos`` prefetch bounds what it holds) and puts each delivery in a heap
keyed by its local deadline: the delivery instant on this host's monotonic
clock plus ``local``. Because the levels held the message for at least its
broker part, and the local part is measured from the delivery, a job is never
handed out early by the worker's clock (the levels' TTLs run on the broker
nodes' clocks).

Other threads never touch the channel: they take due deliveries from the heap
(:meth:`Consumer.take_due`) and settle them (ack, or nack to requeue) with
:meth:`Consumer.settle`, which hands them to the I/O thread through pika's
``add_callback_threadsafe``.

When the connection is lost, every delivery it held goes back to the broker:
the heap is emptied, the generation counter moves on (so claims taken under
the old connection are stale), and the thread reconnects with a growing pause.
An idle consumer only answers heartbeats. The thread survives anything a
delivery can do to it (a body that is not a delayq message is handed out to be
buried), and it reconnects when the broker cancels its consumer (the queue was
deleted or moved) or closes its channel (``consumer_timeout``); ``alive``
says whether it is connected and consuming, and ``health()`` what the thread
has been through, for the worker's health.

A consumer can also go deaf with no word from the broker: on RabbitMQ 3.10 the
channel learns that its quorum queue was deleted only when it handles the Raft
leader's exit, and when a queue of the same name exists again by then (any
publisher declares it on connect), the channel takes the exit for a leader
change and keeps its consumer, which the new queue delivers to without the
channel ever passing anything on: no ``basic.cancel``, no deliveries, and the
jobs it was given stay unacked on the broker. So a consumer that holds nothing
and had no delivery for ``RESUBSCRIBE_IDLE`` seconds subscribes again on a
fresh channel and closes the old one (which returns anything a deaf consumer
was given): an idle worker pays four round trips per interval, a busy one none.

A busy worker must not sit on due jobs another worker could run: when a
delivery has been due for ``HANDBACK`` seconds without a claim and the queue
has another consumer and no message waiting (so another worker has room), the
consumer stops consuming and publishes everything it holds back to the ready
queue (each copy keeping the local wait it had left), acking the originals; its
next claim consumes again. While messages wait in the ready queue every
consumer is full, so a hand-back would only send the jobs due first to the
tail of the queue (again and again, under a backlog): the worker keeps them. A closing consumer does
the same with what it holds unclaimed, so stopping costs those jobs nothing.
Copies are published together and their confirms awaited together.
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
from datetime import datetime
from typing import Any, Literal

import pika
import pika.exceptions

from delayq.backends.rabbitmq._connection import Settings, connect
from delayq.backends.rabbitmq._message import JobMessage, decode, encode
from delayq.backends.rabbitmq._publisher import Confirms, Outgoing
from delayq.backends.rabbitmq._topology import Topology
from delayq.clock import SYSTEM_CLOCK

__all__ = ["Adopted", "Consumer", "Delivery"]

_EVENTS = (
    "reconnects",
    "cancels",
    "channel_closes",
    "resubscribes",
    "handed_back",
    "kept_in_backlog",
)

Adopted = Literal["held", "ack", "release"] | Outgoing | None
"""What became of a returned delivery that this process knows: a claim still running
took it over, its claim had finished (ack it, or publish the retry / dead letter first),
or was released; None when unknown (count the return)."""

log = logging.getLogger("delayq.rabbitmq")

RESUBSCRIBE_IDLE = 5.0
"""An idle consumer (holding nothing, no delivery for this long) subscribes again on a
fresh channel, so one the broker left deaf hears again (see the module docstring)."""

HANDBACK = 0.5
"""A delivery due this long that no claim took (its worker is busy) is handed back to the
queue for another worker, when the queue has another consumer."""


@dataclass(slots=True)
class Delivery:
    """One message held unacked by this consumer."""

    tag: int
    generation: int  # the connection it came on (tags are per channel)
    body: bytes
    redelivered: bool  # the broker delivered it before (a worker stopped or disconnected)
    message: JobMessage | None  # None when the body cannot be read
    error: str | None = None  # why it cannot be read
    due: float = 0.0  # local deadline, monotonic seconds
    note: str | None = None  # the last error to report instead of the message's (a release)
    seq: int = 0  # arrival order: breaks ties between equal due times (FIFO)
    entered: float | None = None  # broker's wall clock (whole s) it left the levels; None: direct


ENTERED = "delayq-entered"
"""Header of a copy a worker publishes back (a hand-back, a counted return): the
stamp of the delivery it copies, which has no ``x-death`` of its own."""


def _entered(properties: Any) -> float | None:
    """When the last level dead-lettered the message into the ready queue, on the
    broker's wall clock: the newest ``x-death`` entry's ``time`` (an AMQP timestamp,
    whole seconds), or the stamp a copy carries (``ENTERED``); None for a message
    published to the ready queue directly."""
    headers = getattr(properties, "headers", None)
    if not isinstance(headers, dict):
        return None
    deaths = headers.get("x-death")
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
        copied = headers.get(ENTERED)
        return float(copied) if isinstance(copied, int) and not isinstance(copied, bool) else None
    stamp = deaths[0].get("time")
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    return float(stamp) if isinstance(stamp, int | float) else None


def _due_time(delivery: Delivery) -> float:
    """The order of due deliveries: the job's due time (an unreadable one first)."""
    return delivery.message.run_at if delivery.message is not None else -math.inf


class Consumer:
    """Consumes one ready queue on its own thread (see the module docstring).

    Two heaps: ``_heap`` holds deliveries by local deadline (the never-early gate);
    once a deadline passes, the delivery moves to ``_ready``, ordered by the job's
    due time, so due jobs are claimed in due order even when the broker delivered
    them in another (a retry published after a later job).

    Lock rule: ``_cond`` (and its lock) guards ``_heap``, ``_ready``, ``_returned``,
    ``_generation``, ``_wake_gen``, ``_connection``, ``_channel``, ``_consumer_tag``,
    ``_paused``, ``_closed`` and ``_events``. ``_generation`` and ``_channel`` change
    only on the I/O thread; ``_unsettled`` and ``_quiet_since`` are the I/O thread's
    alone. No user code runs under the lock, and the I/O thread never waits for other
    threads.
    """

    def __init__(
        self,
        settings: Settings,
        topology: Topology,
        adopt: Callable[[Delivery], Adopted] | None = None,
    ) -> None:
        self._settings = settings
        self._topology = topology
        self._adopt = adopt  # called on the I/O thread, no lock held
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
        self._handback: Confirms | None = None  # I/O thread only
        self._cancelled = False  # I/O thread only: the broker cancelled the consumer
        self._returned: list[Delivery] = []  # returned deliveries waiting for _recount
        self._consumer_tag = ""
        self._paused = False  # consuming stopped by a hand-back, until the next claim
        self._unsettled = 0  # deliveries of the current channel not yet acked or nacked
        self._quiet_since = 0.0  # monotonic: the last delivery or subscription
        self._events: dict[str, int] = dict.fromkeys(_EVENTS, 0)
        self._last_problem = ""
        self.connected = threading.Event()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start the I/O thread (idempotent)."""
        with self._cond:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
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
    def alive(self) -> bool:
        """The I/O thread runs, is connected and consumes (or paused by a hand-back)."""
        with self._cond:
            thread = self._thread
        return thread is not None and thread.is_alive() and self.connected.is_set()

    def health(self) -> dict[str, object]:
        """What the consumer has been through: ``alive`` (consuming, or not started:
        nothing to consume yet), the counts of ``reconnects``, ``cancels`` (by the
        broker), ``channel_closes``, ``resubscribes`` (an idle consumer's fresh
        channel), ``handed_back`` (deliveries published back for other workers) and
        ``kept_in_backlog`` (hand-backs not made: messages waited in the queue), and
        ``last_problem`` (empty when none)."""
        with self._cond:
            started = self._thread is not None
        alive = self.alive or not started
        with self._cond:
            return {"alive": alive, **self._events, "last_problem": self._last_problem}

    def _note(self, event: str, problem: str = "") -> None:
        with self._cond:
            self._events[event] += 1
            if problem:
                self._last_problem = problem

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
                channel.add_on_cancel_callback(self._on_cancel)
                self._cancelled = False
                tag = channel.basic_consume(self._topology.ready_queue, self._on_message)
                self._handback = Confirms(connection)
                connection.call_later(HANDBACK, self._hand_back)
                connection.call_later(RESUBSCRIBE_IDLE, lambda c=connection: self._check(c))
                self._unsettled, self._quiet_since = 0, SYSTEM_CLOCK.monotonic()
                with self._cond:
                    self._generation += 1
                    self._connection, self._channel = connection, channel
                    self._consumer_tag, self._paused = tag, False
                self.connected.set()
                pause = 0.1
                while connection.is_open and self._channel.is_open and not self._cancelled:
                    with self._cond:
                        if self._closed:
                            break
                    connection.process_data_events(time_limit=None)
                channel = self._channel  # a resubscription may have replaced it
                if self._cancelled:
                    problem = "the broker cancelled the consumer (its queue was deleted or moved)"
                    log.warning(
                        "RabbitMQ consumer of %s: %s; consuming again",
                        self._settings.queue,
                        problem,
                    )
                    self._note("cancels", problem)
                elif not channel.is_open and connection.is_open:
                    problem = "the broker closed the consumer's channel (consumer_timeout?)"
                    log.warning(
                        "RabbitMQ consumer of %s: %s; consuming again",
                        self._settings.queue,
                        problem,
                    )
                    self._note("channel_closes", problem)
                elif connection.is_open:
                    self._give_back(channel)
                    connection.process_data_events(0)  # acks handed over before close
            except Exception as exc:
                with self._cond:
                    closed = self._closed
                if not closed:
                    log.warning(
                        "RabbitMQ consumer of %s lost its connection (%r); reconnecting in %.1fs",
                        self._settings.queue,
                        exc,
                        pause,
                    )
                    self._note("reconnects", f"connection lost: {exc!r}"[:300])
            finally:
                self._disconnected(connection)
            if self._stop_wait.wait(pause):
                return
            pause = min(5.0, pause * 2)

    def _on_cancel(self, _frame: Any) -> None:
        self._cancelled = True

    def _check(self, connection: Any) -> None:
        """Every RESUBSCRIBE_IDLE: an idle consumer subscribes again on a fresh channel."""
        with self._cond:
            if connection is not self._connection or self._closed:
                return  # a timer of an earlier connection
            paused = self._paused
        quiet = SYSTEM_CLOCK.monotonic() - self._quiet_since
        if not paused and self._unsettled == 0 and quiet >= RESUBSCRIBE_IDLE:
            self._resubscribe(connection)
            quiet = 0.0
        later = max(0.05, RESUBSCRIBE_IDLE - quiet)
        connection.call_later(later, lambda: self._check(connection))

    def _resubscribe(self, connection: Any) -> None:
        """Consume on a fresh channel and close the old one. Call only when nothing is
        held: the generation moves on, as after a reconnect."""
        old = self._channel
        with contextlib.suppress(pika.exceptions.AMQPError):
            old.close()  # returns whatever a deaf consumer was given
        channel = connection.channel()
        channel.basic_qos(prefetch_count=self._settings.prefetch)
        channel.add_on_cancel_callback(self._on_cancel)
        tag = channel.basic_consume(self._topology.ready_queue, self._on_message)
        self._unsettled, self._quiet_since = 0, SYSTEM_CLOCK.monotonic()
        with self._cond:
            self._generation += 1
            self._channel, self._consumer_tag = channel, tag
            self._events["resubscribes"] += 1

    def _settled(self, channel: Any, tag: int, *, requeue: bool | None = None) -> None:
        """Ack (``requeue`` None) or nack a delivery of the current channel."""
        if requeue is None:
            channel.basic_ack(tag)
        else:
            channel.basic_nack(tag, requeue=requeue)
        self._unsettled -= 1

    def _disconnected(self, connection: Any) -> None:
        """Forget every delivery of the lost connection (the broker returns them)."""
        self.connected.clear()
        with self._cond:
            self._generation += 1
            self._heap.clear()
            self._ready.clear()
            self._returned.clear()
            self._connection = self._channel = None
            self._wake_gen += 1
            self._cond.notify_all()
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()

    # -- I/O thread callbacks ----------------------------------------------------
    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        try:
            message: JobMessage | None = decode(body)
            error = None
        except Exception as exc:
            message, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
        now = SYSTEM_CLOCK.monotonic()
        due = now + (message.local if message is not None else 0.0)
        self._unsettled += 1
        self._quiet_since = now
        with self._cond:
            delivery = Delivery(
                method.delivery_tag,
                self._generation,
                body,
                bool(method.redelivered),
                message,
                error,
                due,
            )
            delivery.seq = next(self._seq)
            delivery.entered = _entered(properties)
            if delivery.redelivered and message is not None:
                # Returned by the broker: count the return in a copy before anything
                # else (so the count survives the next return), see _claims.py.
                self._returned.append(delivery)
                if len(self._returned) == 1:
                    channel.connection.call_later(0, self._recount)
                return
            first = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, delivery.seq, delivery))
            if first:
                self._wake_gen += 1
                self._cond.notify_all()

    def _recount(self) -> None:
        """Publish the returned deliveries again with their return counted, then ack them;
        except those this process still runs or finished on a lost connection (``adopt``:
        they are not run twice, and their finish is not lost)."""
        with self._cond:
            channel, returned, self._returned = self._channel, self._returned, []
        if channel is None or not returned:
            return
        count: list[Delivery] = []
        finish: list[Outgoing] = []
        finished: list[Delivery] = []
        for delivery in returned:
            verdict = self._adopt(delivery) if self._adopt is not None else None
            if verdict is None:
                count.append(delivery)
            elif verdict == "release":
                delivery.redelivered = False  # given back unstarted: no return to count
                self.put_back(delivery)
            elif verdict == "ack":
                self._settled(channel, delivery.tag)
            elif isinstance(verdict, Outgoing):
                finish.append(verdict)
                finished.append(delivery)
            # "held": a claim of this process took it over
        if finish:
            assert self._handback is not None
            self._handback.send(finish, self._settings.confirm_timeout, set())
            for delivery in finished:
                self._settled(channel, delivery.tag)
        if count:
            self._publish_back(channel, count, SYSTEM_CLOCK.monotonic())

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
            state = channel.queue_declare(self._topology.ready_queue, passive=True).method
            if state.consumer_count > 1 and state.message_count == 0:
                channel.basic_cancel(self._consumer_tag)
                with self._cond:
                    self._paused = True
                    held = self._drain_locked()
                    self._events["handed_back"] += len(held)
                self._publish_back(channel, held, now)
            elif state.consumer_count > 1:
                with self._cond:  # every consumer is full: the tail is no better
                    self._events["kept_in_backlog"] += 1
        connection.call_later(HANDBACK / 2, self._hand_back)

    def _publish_back(self, channel: Any, held: list[Delivery], now: float) -> None:
        """Copies to the ready queue (each with the local wait it had left; a returned one
        with its return counted), published together, then ack the originals."""
        copies: list[Outgoing] = []
        originals: list[Delivery] = []
        for delivery in held:
            message = delivery.message
            if message is None:
                self._settled(channel, delivery.tag, requeue=True)  # a claim buries it
                continue
            copy = replace(
                message,
                local=max(0.0, delivery.due - now),
                returns=message.returns + (1 if delivery.redelivered else 0),
                instance="",
            )
            headers = None if delivery.entered is None else {ENTERED: int(delivery.entered)}
            copies.append(Outgoing("", self._topology.ready_queue, encode(copy), copy.id, headers))
            originals.append(delivery)
        if not copies:
            return
        assert self._handback is not None
        done: set[int] = set()
        try:
            self._handback.send(copies, self._settings.confirm_timeout, done)
        finally:
            for index in sorted(done):
                self._settled(channel, originals[index].tag)

    def _give_back(self, channel: Any) -> None:
        """On close: stop consuming and publish back what no claim took, each with the
        local wait it had left, so a worker that stops costs those jobs nothing."""
        channel.basic_cancel(self._consumer_tag)
        now = SYSTEM_CLOCK.monotonic()
        with self._cond:
            held = self._drain_locked()
        self._publish_back(channel, held, now)

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
            self._settled(channel, delivery.tag, requeue=True if requeue else None)

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

    def _barrier_locked(self) -> float:
        """The earliest due time among deliveries still in their local wait. A due
        delivery due later than that waits for it (at most one local wait, under
        32 ms), so a worker hands jobs out in due order even when a message that sat
        in the ready queue serves its local wait again on delivery."""
        return min((_due_time(entry[2]) for entry in self._heap), default=math.inf)

    def take_due(self, limit: int, now: float) -> list[Delivery]:
        """Up to ``limit`` deliveries whose local deadline passed by ``now`` (monotonic),
        earliest due time first."""
        taken: list[Delivery] = []
        with self._cond:
            heap, ready = self._heap, self._ready
            while heap and heap[0][0] <= now:
                delivery = heapq.heappop(heap)[2]
                heapq.heappush(ready, (_due_time(delivery), delivery.seq, delivery))
            barrier = self._barrier_locked()
            while ready and len(taken) < limit and ready[0][0] <= barrier:
                taken.append(heapq.heappop(ready)[2])
        return taken

    def wait(self, deadline: float, extra: Callable[[], float | None]) -> None:
        """Block until a delivery is due, an earlier one arrives, ``interrupt``, ``extra()``
        (another monotonic deadline, read under the lock) passes, or ``deadline``."""
        clock = SYSTEM_CLOCK
        with self._cond:
            gen = self._wake_gen
            while not self._closed and self._wake_gen == gen:
                if self._ready and self._ready[0][0] <= self._barrier_locked():
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
