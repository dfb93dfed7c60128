"""Names, level arithmetic and declarations of the RabbitMQ store's exchanges and queues.

A delay is split in two: a broker part, a multiple of ``BASE_MS`` (32 ms)
carried through fixed-TTL *level* queues, and a local part (less than
``BASE_MS``) that the worker waits out on its own monotonic clock.

The broker part in units of ``BASE_MS`` is written in binary, one bit per level
``k`` (TTL ``2**k`` ms, from ``2**BASE_LEVEL`` up to ``2**TOP_LEVEL``; a delay
longer than all levels together, about 49 days, takes several passes). Every
level has a topic exchange and a queue; the routing key is the bits, highest
level first, then the delayq queue's name::

    "0.0. ... .1.0.1.orders"      (one word per level, TOP_LEVEL first)

Exchange ``L<k>`` routes a message whose bit ``k`` is 1 to queue ``L<k>`` and,
through an exchange-to-exchange binding, a message whose bit ``k`` is 0 on to
exchange ``L<k-1>``. Queue ``L<k>`` has a message TTL of ``2**k`` ms and
dead-letters (keeping the routing key) into exchange ``L<k-1>``; the lowest
level leads into the ``ready`` exchange, where each delayq queue's ready queue
is bound to ``<one * per level>.<queue>``. Every queue holds messages of a
single TTL, so a message never waits behind a longer one (no head-of-line
blocking), and a delay takes at most one hop per set bit. The levels are shared
by every delayq queue of a virtual host.

A message whose ready queue is gone (the queue was deleted while some of its
jobs were still in the levels) goes to the ready exchange's alternate exchange
and its ``orphans`` queue: every dead-lettered message is routable, so the
at-least-once dead-lettering of a level never stalls on one (it would retry it
forever and, past its prefetch, move nothing else). Each delayq queue has a
ready queue (``delayq.v2.ready.<queue>``), a stream of dead letters
(``delayq.v2.dead.<queue>``, read by offset, never consumed) and a stream, its
log (``delayq.v2.log.<queue>``, ``_log.py``); the three name
spaces are disjoint, so no queue name can stand for another queue's dead letters.
The ready queue dead-letters into that stream what the broker itself drops
(a TTL or length policy, a delivery limit), so such a drop is a visible dead
letter, not a silent loss.

Every name starts with ``delayq.v2.``: the first layout (``delayq.ready``,
``delayq.q.<queue>``, 1.024 s levels) is left alone (see docs/stores.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from delayq.errors import InvalidDelay

__all__ = [
    "BASE_LEVEL",
    "BASE_MS",
    "LEG",
    "MAX_DELAY",
    "TOP_LEVEL",
    "ORPHANS",
    "QueueType",
    "Route",
    "Topology",
    "ready_key",
    "route",
]

QueueType = Literal["quorum", "classic"]

BASE_LEVEL = 5
"""The lowest level: TTL ``2**5 = 32`` ms. Less than that is waited out by the worker.

The worker holds a delivery unacked during its local wait, so the wait bounds
how many deliveries a worker must hold to keep up: at most 32 ms each (16 ms on
average), so a prefetch of a few dozen carries thousands of jobs a second.
Every hop through a level adds the broker's dead-lettering time (a few ms on a
quorum queue, more under load) that the worker cannot see without trusting
wall clocks, so finer levels would make jobs later: a delay takes one hop per
set bit of its 32 ms units."""

TOP_LEVEL = 31
"""The highest level: TTL ``2**31`` ms (about 25 days; RabbitMQ caps a TTL at ``2**32 - 1``)."""

BASE_MS = 2**BASE_LEVEL
LEVELS = tuple(range(TOP_LEVEL, BASE_LEVEL - 1, -1))  # highest first, as in the routing key
_MAX_UNITS = 2 ** (TOP_LEVEL - BASE_LEVEL + 1) - 1
LEG = _MAX_UNITS * BASE_MS / 1000.0
"""The longest delay one pass through the levels carries, in seconds (about 49 days).
A longer delay takes several passes: the worker that receives the message
publishes it again with what is left (``Route.more``)."""

MAX_DELAY = 1000 * 365.25 * 86400.0
"""The longest delay accepted, in seconds (1,000 years)."""

_PREFIX = "delayq.v2"
ORPHANS = f"{_PREFIX}.orphans"
"""The alternate exchange of the ready exchange (fanout) and its queue: messages of
delayq queues that no longer exist."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where to publish a message delayed by some seconds, and what is left to wait locally."""

    exchange: str  # the first level with a set bit, or "" (the ready queue by name)
    routing_key: str
    broker_ms: int  # the part the level queues hold
    local: float  # seconds the worker waits after delivery (>= 0)
    more: float = 0.0  # seconds left for another pass (delays longer than LEG)


def ready_key(topology: Topology) -> str:
    """The ready exchange's routing key of a message with no broker delay left."""
    return "0." * len(LEVELS) + topology.queue


def route(topology: Topology, delay: float) -> Route:
    """The route of a message due ``delay`` seconds after it is published.

    The broker part is rounded down to ``BASE_MS``, so the levels never hold a
    message longer than its delay; the rest is waited out by the worker.
    """
    if not math.isfinite(delay):
        raise InvalidDelay(f"delay must be finite, got {delay!r}")
    delay = max(0.0, delay)
    if delay > MAX_DELAY:
        raise InvalidDelay(f"delay must be at most {MAX_DELAY:.0f} s (1,000 years), got {delay!r}")
    units = min(_MAX_UNITS, int(delay * 1000.0) // BASE_MS)
    broker_ms = units * BASE_MS
    bits = ["1" if units >> (k - BASE_LEVEL) & 1 else "0" for k in LEVELS]
    # Due within the local wait: straight to the ready queue through the default
    # exchange, so a missing ready queue is an error at publish (the ready exchange
    # would hand it to the orphans queue).
    exchange, key = "", topology.ready_queue
    if units:
        exchange = topology.level_exchange(units.bit_length() - 1 + BASE_LEVEL)
        key = ".".join(bits) + "." + topology.queue
    rest = max(0.0, delay - broker_ms / 1000.0)
    if units == _MAX_UNITS and rest >= BASE_MS / 1000.0:
        return Route(exchange, key, broker_ms, 0.0, rest)
    return Route(exchange, key, broker_ms, rest)


@dataclass(frozen=True, slots=True)
class Topology:
    """The names and arguments of one delayq queue's exchanges and queues."""

    queue: str
    queue_type: QueueType = "quorum"

    @property
    def ready_exchange(self) -> str:
        return f"{_PREFIX}.ready"

    @property
    def ready_queue(self) -> str:
        """The queue workers consume: messages whose broker part has passed."""
        return f"{_PREFIX}.ready.{self.queue}"

    @property
    def dead_queue(self) -> str:
        """The stream of this delayq queue's dead letters (and what requeued or purged them)."""
        return f"{_PREFIX}.dead.{self.queue}"

    @property
    def log_queue(self) -> str:
        """The stream of this delayq queue's log: enqueues, starts, finishes, cancels
        (``_log.py``), the arbiter of every race on a job."""
        return f"{_PREFIX}.log.{self.queue}"

    def level_exchange(self, level: int) -> str:
        return f"{_PREFIX}.{self.queue_type}.x{level}"

    def level_queue(self, level: int) -> str:
        return f"{_PREFIX}.{self.queue_type}.L{level}"

    def _queue_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": self.queue_type}

    def _at_least_once(self) -> dict[str, Any]:
        """Dead-lettering that lets a message go only once its target confirmed it
        (quorum queues, RabbitMQ 3.10+); classic queues dead-letter at most once."""
        if self.queue_type != "quorum":
            return {}
        return {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}

    def level_arguments(self, level: int) -> dict[str, Any]:
        """A level queue: TTL ``2**level`` ms, dead-lettering into the next level down."""
        below = self.level_exchange(level - 1) if level > BASE_LEVEL else self.ready_exchange
        return (
            self._queue_arguments()
            | {"x-message-ttl": 2**level, "x-dead-letter-exchange": below}
            | self._at_least_once()
        )

    def ready_arguments(self) -> dict[str, Any]:
        """The ready queue: what the broker drops from it becomes a dead letter."""
        return (
            self._queue_arguments()
            | {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": self.dead_queue}
            | self._at_least_once()
        )

    @staticmethod
    def dead_arguments() -> dict[str, Any]:
        return {"x-queue-type": "stream"}

    @staticmethod
    def ready_exchange_arguments() -> dict[str, Any]:
        return {"alternate-exchange": ORPHANS}

    def names(self) -> list[str]:
        """Every queue this topology declares (shared ones first)."""
        return [
            ORPHANS,
            *(self.level_queue(k) for k in LEVELS),
            self.ready_queue,
            self.dead_queue,
            self.log_queue,
        ]

    def declare_shared(self, channel: Any) -> None:
        """The exchanges and queues every delayq queue of the virtual host shares."""
        channel.exchange_declare(ORPHANS, "fanout", durable=True)
        channel.queue_declare(ORPHANS, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(ORPHANS, ORPHANS, "")
        channel.exchange_declare(
            self.ready_exchange, "topic", durable=True, arguments=self.ready_exchange_arguments()
        )
        stars = ""
        for level in LEVELS:
            channel.exchange_declare(self.level_exchange(level), "topic", durable=True)
        for level in LEVELS:
            name = self.level_queue(level)
            channel.queue_declare(name, durable=True, arguments=self.level_arguments(level))
            channel.queue_bind(name, self.level_exchange(level), stars + "1.#")
            below = self.level_exchange(level - 1) if level > BASE_LEVEL else self.ready_exchange
            channel.exchange_bind(below, self.level_exchange(level), stars + "0.#")
            stars += "*."

    def declare_own(self, channel: Any) -> None:
        """This delayq queue's ready queue (bound to the ready exchange), dead stream and log."""
        channel.queue_declare(self.dead_queue, durable=True, arguments=self.dead_arguments())
        channel.queue_declare(self.log_queue, durable=True, arguments=self.dead_arguments())
        channel.queue_declare(self.ready_queue, durable=True, arguments=self.ready_arguments())
        channel.queue_bind(self.ready_queue, self.ready_exchange, "*." * len(LEVELS) + self.queue)

    def check(self, channel: Any) -> None:
        """Passive declares: raise (a 404 channel close) unless the topology exists."""
        channel.exchange_declare(self.ready_exchange, passive=True)
        channel.exchange_declare(self.level_exchange(TOP_LEVEL), passive=True)
        channel.queue_declare(self.level_queue(BASE_LEVEL), passive=True)
        channel.queue_declare(self.ready_queue, passive=True)
        channel.queue_declare(self.dead_queue, passive=True)
        channel.queue_declare(self.log_queue, passive=True)

    def declare(self, channel: Any) -> None:
        """Declare every exchange, queue and binding (idempotent; same arguments everywhere)."""
        self.declare_shared(channel)
        self.declare_own(channel)
