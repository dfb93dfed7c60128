"""What a due delivery becomes: a claim (with its attempt number), a dead letter, a
message passed on for another pass through the levels, or a returned message counted
and published again. Pure: no I/O, no clock.

Attempts and returns are two counts carried in the message, never read from the
broker (``x-delivery-count`` counts different things on RabbitMQ 3.x, 4.0-4.2
and 4.3+, and classic queues have only a flag):

* ``attempts``: handler starts. A claim is attempt ``attempts + 1``; a retry or
  an expired lease (the handler started and its worker is still there)
  publishes the message again with that attempt counted.
* ``returns``: deliveries the broker handed back because the worker holding
  them stopped or lost its connection (the ``redelivered`` flag). Such a worker
  may have held the message without starting it, so a return is never an
  attempt; it is counted against ``max_returns`` instead, so a job that kills
  every worker that runs it still ends in the dead letters after a bounded
  number of tries. A returned delivery is published again with the count
  raised, then acked, before it can run (the count survives the next return).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from delayq.backends._common import undecodable_error
from delayq.backends.rabbitmq._consumer import Delivery
from delayq.backends.rabbitmq._message import JobMessage

__all__ = [
    "DEFAULT_MAX_RETURNS",
    "EARLY_GUARD",
    "STAMP_STEP",
    "Held",
    "Verdict",
    "due_on_worker",
    "expired",
    "judge",
]

DEFAULT_MAX_RETURNS = 10
"""Returns (a worker stopped or disconnected while holding the job) before a job is buried."""

EARLY_GUARD = 2.0
"""A delivery whose due time is this many seconds ahead of the worker's wall clock came
early (a ``message-ttl`` policy shortened a level, a broker node's clock jumped, hosts'
clocks disagree by more than this): it is delayed again by what is left, never run early.
Host clocks are assumed to agree within this bound."""

STAMP_STEP = 1.0
"""The resolution of the broker's dead-letter stamp (``x-death`` ``time``: whole seconds)."""


@dataclass(slots=True)
class Held:
    """A delivery handed out by ``claim``, under a local lease."""

    delivery: Delivery
    message: JobMessage
    attempts: int  # the attempt this claim is
    lease_mono: float  # monotonic lease end: ``claim`` publishes it again after this
    sid: str = ""  # its start record in the queue's log (``_log.py``)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``run`` (claim ``message`` as attempt ``attempts``), ``bury`` (``message`` is the
    dead letter; None for an unreadable body, with ``error``), ``pass_on`` (publish
    the rest of a long delay) or ``again`` (publish ``message`` to the ready queue
    at once: a returned delivery with its return counted)."""

    kind: Literal["run", "bury", "pass_on", "again"]
    message: JobMessage | None
    attempts: int = 0
    last_error: str | None = None
    error: str = ""


def returned_note(returns: int, max_returns: int) -> str:
    return (
        f"returned to the queue unfinished ({returns} of max_returns={max_returns}): the "
        f"worker holding it stopped or lost its connection, before or while running it "
        f"(not counted as an attempt)"
    )


def returned_error(returns: int, max_returns: int) -> str:
    return (
        f"returned to the queue unfinished {returns} times (max_returns={max_returns}): each "
        f"time the worker holding it stopped or lost its connection, as a job that kills its "
        f"worker makes it do"
    )


def expired_note(attempt: int) -> str:
    """The note of a claim whose lease ran out (the same words as the other stores')."""
    return (
        f"lease expired during attempt {attempt}: the worker holding it stopped, hung "
        f"or lost its connection; returned to the queue"
    )


def expired_error(attempt: int, max_attempts: int) -> str:
    return (
        f"lease expired after {attempt} attempts (max_attempts={max_attempts}): the "
        f"workers holding it stopped, hung or lost their connections"
    )


def judge(
    delivery: Delivery, max_returns: int = DEFAULT_MAX_RETURNS, wall: float | None = None
) -> Verdict:
    """The verdict on a delivery whose local deadline passed (``wall``: the worker's
    wall clock, for the early guard)."""
    message = delivery.message
    if message is None:
        return Verdict("bury", None, error=undecodable_error(ValueError(delivery.error)))
    if message.more > 0:
        return Verdict("pass_on", message)  # a delay longer than one pass through the levels
    returns = message.returns + (1 if delivery.redelivered else 0)
    if returns > max_returns:
        error = returned_error(returns, max_returns)
        return Verdict("bury", replace(message, returns=returns, last_error=error))
    if delivery.redelivered:
        note = returned_note(returns, max_returns)
        return Verdict("again", replace(message, returns=returns, last_error=note))
    if wall is not None and message.run_at - wall > EARLY_GUARD:
        early = message.run_at - wall
        return Verdict("pass_on", replace(message, more=early), error=f"early by {early:.3f} s")
    attempts = message.attempts + 1
    return Verdict("run", message, attempts, delivery.note or message.last_error)


def expired(held: Held) -> tuple[Literal["again", "bury"], JobMessage]:
    """What a claim whose lease ran out becomes: its attempt counted (the handler
    started), published again, or buried once its attempts are used up."""
    message, attempt = held.message, held.attempts
    if attempt >= message.max_attempts:
        error = expired_error(attempt, message.max_attempts)
        return "bury", replace(message, attempts=attempt, last_error=error)
    return "again", replace(message, attempts=attempt, last_error=expired_note(attempt))


def due_on_worker(
    run_at: float, wall: float, held_late: float, entered: float | None, local: float
) -> float:
    """When a job claimed at ``wall`` (this worker's wall clock) fell due, on that clock.

    The clocks that decide "due" are the broker's (the levels' TTLs) and this
    worker's monotonic clock (the local wait); the producer's wall clock only set
    ``run_at``. A job is judged late by ``wall - run_at`` (the producer's clock,
    the one that also sees time spent waiting in the ready queue) while that
    agrees with the broker: ``entered``, when the last level dead-lettered it
    (``x-death``, whole seconds, None for a message published to the ready queue
    directly), bounds its lateness at ``wall - entered - local``. A producer
    claiming more (its clock is behind) is overruled by the broker's lower
    bound (``STAMP_STEP`` less: never more late than it was). Never less late
    than ``held_late``, the seconds this worker held the delivery past its local
    deadline (monotonic).
    """
    late = wall - run_at
    if entered is not None and late > wall - entered - local:
        late = wall - entered - STAMP_STEP - local
    return wall - max(late, held_late, 0.0)
