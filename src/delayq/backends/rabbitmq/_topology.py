"""Names, level arithmetic and declarations of the RabbitMQ store's exchanges and queues.

A delay is split in two: a broker part, a multiple of ``BASE_MS`` (1.024 s)
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
    "QueueType",
    "Route",
    "Topology",
    "ready_key",
    "route",
]

QueueType = Literal["quorum", "classic"]

BASE_LEVEL = 10
"""The lowest level: TTL ``2**10 = 1024`` ms. Less than that is waited out by the worker.

Every hop through a level adds the broker's dead-lettering time (a few ms on a
quorum queue, tens under load) that the worker cannot see without trusting
wall clocks, so the levels carry only whole seconds: a job due within 1.024 s
goes straight to the ready queue, and a longer delay takes one hop per set bit
of its whole 1.024 s units."""

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

_PREFIX = "delayq"


@dataclass(frozen=True, slots=True)
class Route:
    """Where to publish a message delayed by some seconds, and what is left to wait locally."""

    exchange: str  # the first level with a set bit, or the ready exchange
    routing_key: str
    broker_ms: int  # the part the level queues hold
    local: float  # seconds the worker waits after delivery (>= 0)
    more: float = 0.0  # seconds left for another pass (delays longer than LEG)


def ready_key(topology: Topology) -> str:
    """The routing key of a message with no broker delay left (straight to the ready queue)."""
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
    key = ".".join(bits) + "." + topology.queue
    exchange = topology.ready_exchange
    if units:
        exchange = topology.level_exchange(units.bit_length() - 1 + BASE_LEVEL)
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
        return f"{_PREFIX}.q.{self.queue}"

    @property
    def dead_queue(self) -> str:
        """Dead letters of this delayq queue, each carrying its last error."""
        return f"{_PREFIX}.q.{self.queue}.dead"

    def level_exchange(self, level: int) -> str:
        return f"{_PREFIX}.{self.queue_type}.x{level}"

    def level_queue(self, level: int) -> str:
        return f"{_PREFIX}.{self.queue_type}.L{level}"

    def _queue_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": self.queue_type}

    def level_arguments(self, level: int) -> dict[str, Any]:
        """A level queue: TTL ``2**level`` ms, dead-lettering into the next level down."""
        below = self.level_exchange(level - 1) if level > BASE_LEVEL else self.ready_exchange
        arguments = self._queue_arguments() | {
            "x-message-ttl": 2**level,
            "x-dead-letter-exchange": below,
        }
        if self.queue_type == "quorum":
            # At-least-once dead-lettering between levels (RabbitMQ 3.10+): a
            # message leaves a level only once the next one has confirmed it.
            arguments |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        return arguments

    def declare(self, channel: Any) -> None:
        """Declare every exchange, queue and binding (idempotent; same arguments everywhere)."""
        channel.exchange_declare(self.ready_exchange, "topic", durable=True)
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
        channel.queue_declare(self.ready_queue, durable=True, arguments=self._queue_arguments())
        channel.queue_bind(self.ready_queue, self.ready_exchange, stars + self.queue)
        channel.queue_declare(self.dead_queue, durable=True, arguments=self._queue_arguments())
