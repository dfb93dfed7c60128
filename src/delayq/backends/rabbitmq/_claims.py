"""What a due delivery becomes: a claim (with its attempt number), a dead letter, or a
message passed on for another pass through the levels. Pure: no I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from delayq.backends._common import undecodable_error
from delayq.backends.rabbitmq._consumer import Delivery
from delayq.backends.rabbitmq._message import JobMessage

__all__ = ["Held", "Verdict", "judge"]


@dataclass(slots=True)
class Held:
    """A delivery handed out by ``claim``, under a local lease."""

    delivery: Delivery
    message: JobMessage
    attempts: int
    lease_mono: float  # monotonic lease end: ``claim`` returns it to the broker after this


@dataclass(frozen=True, slots=True)
class Verdict:
    """``run`` (claim ``message`` as attempt ``attempts``), ``bury`` (``message`` is the
    dead letter; None for an unreadable body, with ``error``) or ``pass_on``."""

    kind: Literal["run", "bury", "pass_on"]
    message: JobMessage | None
    attempts: int = 0
    last_error: str | None = None
    error: str = ""


def returned_note(attempts: int) -> str:
    """The note of a job the broker returned (the same words as the other stores')."""
    return (
        f"lease expired during attempt {attempts - 1}: the worker holding it stopped, hung "
        f"or lost its connection; returned to the queue"
    )


def returned_error(attempts: int, max_attempts: int) -> str:
    return (
        f"lease expired after {attempts - 1} attempts (max_attempts={max_attempts}): the "
        f"workers holding it stopped, hung or lost their connections"
    )


def judge(delivery: Delivery) -> Verdict:
    """The verdict on a delivery whose local deadline passed.

    Its attempt number is the attempts started before the message was published
    plus the returns the broker counted (a worker killed or disconnected while
    holding it, a lease that ran out) plus one; past ``max_attempts`` a returned
    job is buried (it keeps killing its workers).
    """
    message = delivery.message
    if message is None:
        return Verdict("bury", None, error=undecodable_error(ValueError(delivery.error)))
    if message.more > 0:
        return Verdict("pass_on", message)  # a delay longer than one pass through the levels
    attempts = message.attempts + delivery.returns + 1
    if not delivery.returns:
        return Verdict("run", message, attempts, delivery.note or message.last_error)
    if attempts > message.max_attempts:
        error = returned_error(attempts, message.max_attempts)
        return Verdict("bury", replace(message, attempts=attempts - 1, last_error=error))
    return Verdict("run", message, attempts, returned_note(attempts))
