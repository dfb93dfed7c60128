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
from delayq.backends.rabbitmq._publisher import Outgoing, Publisher, send
from delayq.job import Job, JobState

__all__ = ["BURIED_AT", "ERROR", "DeadLetter", "DeadLetters", "read_dead"]

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


class DeadLetters:
    """List, requeue and purge the dead-letter queue ``queue`` through ``publisher``'s
    connection (under its lock)."""

    def __init__(self, publisher: Publisher, queue: str) -> None:
        self._publisher = publisher
        self._queue = queue

    def list(self, limit: int) -> list[Job]:
        found: list[Job] = []

        def collect(_private: Any, letters: list[DeadLetter]) -> int:
            letters.sort(key=lambda d: d.buried_at, reverse=True)
            found.extend(d.job() for d in letters[:limit])
            return 0

        self._publisher.run("list dead letters", lambda ch: read_dead(ch, self._queue, collect))
        return found

    def requeue(self, job_id: str, again: Callable[[JobMessage], Outgoing]) -> bool:
        """Publish ``again(message)`` for the dead letter of ``job_id``, then ack it."""

        def requeue(confirming: Any, private: Any, letters: list[DeadLetter]) -> int:
            for letter in letters:
                if letter.message is not None and letter.message.id == job_id:
                    send(confirming, [again(letter.message)])
                    private.basic_ack(letter.tag)
                    return 1
            return 0

        return bool(
            self._publisher.run(
                "requeue a dead letter",
                lambda ch: read_dead(ch, self._queue, lambda p, ls: requeue(ch, p, ls)),
            )
        )

    def purge(self, ids: set[str] | None, cutoff: float | None) -> int:
        """Ack (delete) the dead letters in ``ids`` (all when None) buried before ``cutoff``."""

        def purge(private: Any, letters: list[DeadLetter]) -> int:
            count = 0
            for letter in letters:
                job_id = letter.message.id if letter.message is not None else None
                if ids is not None and job_id not in ids:
                    continue
                if cutoff is not None and letter.buried_at >= cutoff:
                    continue
                private.basic_ack(letter.tag)
                count += 1
            return count

        return self._publisher.run(
            "purge dead letters", lambda ch: read_dead(ch, self._queue, purge)
        )
