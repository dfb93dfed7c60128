"""The dead-letter queue: listed, requeued and purged by reading it on a private channel.

A dead letter is a job message (its ``last_error`` set) published to the
queue's ``.dead`` queue with an ``x-delayq-buried-at`` header. RabbitMQ has no
index over a queue, so these calls read the whole queue on a channel of their
own, holding every message unacked, and settle only what they act on; closing
the channel returns the rest unchanged. Their cost grows with the number of
dead letters (meant for an operator's commands, not a hot path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delayq.backends._common import readable_json
from delayq.backends.rabbitmq._message import JobMessage, decode
from delayq.job import Job, JobState

__all__ = ["BURIED_AT", "ERROR", "DeadLetter", "read_dead"]

BURIED_AT = "x-delayq-buried-at"  # epoch milliseconds
ERROR = "x-delayq-error"  # why an unreadable message was buried


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message of the dead-letter queue, held unacked on the reading channel."""

    tag: int
    buried_at: float  # epoch seconds
    message: JobMessage | None
    body: bytes
    error: str | None = None  # the reason an unreadable message was buried

    def job(self) -> Job:
        """The dead job (a body that cannot be decoded shows as its raw text)."""
        message = self.message
        if message is None:
            text = self.body.decode("utf-8", "replace")
            return Job(
                id="?",
                name="?",
                payload=text,
                run_at=0.0,
                state=JobState.DEAD,
                attempts=0,
                max_attempts=1,
                backoff={},
                misfire="run",
                created_at=0.0,
                updated_at=self.buried_at,
                last_error=self.error or "cannot decode the dead letter",
            )
        return Job(
            id=message.id,
            name=message.name,
            payload=readable_json(message.payload),
            run_at=message.run_at,
            state=JobState.DEAD,
            attempts=message.attempts,
            max_attempts=message.max_attempts,
            backoff=dict(message.backoff),
            misfire=message.misfire,
            created_at=message.created_at,
            updated_at=self.buried_at,
            last_error=message.last_error,
        )


def read_dead(channel: Any, queue: str, act: Callable[[Any, list[DeadLetter]], int]) -> int:
    """Read every message of ``queue`` on a new channel of ``channel``'s connection,
    call ``act(private_channel, letters)``, then close that channel (returning
    whatever ``act`` did not ack)."""
    private = channel.connection.channel()
    try:
        letters: list[DeadLetter] = []
        while True:
            method, properties, body = private.basic_get(queue, auto_ack=False)
            if method is None:
                break
            headers = properties.headers or {}
            stamp = headers.get(BURIED_AT)
            try:
                message: JobMessage | None = decode(body)
            except (ValueError, TypeError, KeyError):
                message = None
            buried_at = float(stamp) / 1000.0 if isinstance(stamp, int) else 0.0
            error = headers.get(ERROR)
            error = error.decode() if isinstance(error, bytes) else error
            letters.append(
                DeadLetter(method.delivery_tag, buried_at, message, body, error if error else None)
            )
        return act(private, letters)
    finally:
        if private.is_open:
            private.close()
