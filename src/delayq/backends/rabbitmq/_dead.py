"""Dead letters: a stream per queue, read from its first offset, never consumed.

A dead letter is a job message (its ``last_error`` set) appended to the queue's
dead-letter stream with an ``x-delayq-buried-at`` header; the ready queue also
dead-letters into it what the broker itself drops (a TTL or length policy, a
delivery limit), so such a message shows up here with the broker's reason.

A stream is append-only and reading it changes nothing (no delivery count, no
``delivery-limit`` on any RabbitMQ version, no other reader kept from seeing a
message), so listing is safe to repeat and to run from many processes at once.
Requeueing or purging appends a *tombstone* naming the offsets it removes; a
read applies them. A read first appends a *marker* of its own and reads up to it,
so it sees everything appended before the call. The stream's size grows with what
was ever buried; ``x-max-age`` / ``x-max-length-bytes`` (a policy on
``delayq.v2.dead.*``) bound it, at the price of dropping the oldest dead letters.

These calls use a connection of their own (never the publisher's lock), and cost a
read of the whole stream: meant for operators' commands and dashboards.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pika.exceptions

from delayq.backends._common import readable_json
from delayq.backends.rabbitmq._connection import Settings, connect, map_errors
from delayq.backends.rabbitmq._message import JobMessage, decode
from delayq.backends.rabbitmq._publisher import Confirms, Outgoing
from delayq.backends.rabbitmq._topology import Topology
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import BackendUnavailable
from delayq.job import Job, JobState

__all__ = ["BURIED_AT", "ERROR", "DeadLetter", "DeadLetters"]

BURIED_AT = "x-delayq-buried-at"  # epoch milliseconds
ERROR = "x-delayq-error"  # why an unreadable message was buried
KIND = "x-delayq-kind"  # absent: a dead letter; "tomb": removes offsets; "marker": a read's end
TOKEN = "x-delayq-token"  # a marker's random token
_READ_PREFETCH = 1000


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter of the stream, at ``offset``."""

    offset: int
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
            last_error=self.error or message.last_error,
        )


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _broker_drop(headers: dict[str, Any]) -> tuple[float, str] | None:
    """(when, why) of a message the broker dead-lettered out of the ready queue."""
    reason = headers.get("x-first-death-reason")
    if reason is None:
        return None
    when = 0.0
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        stamp = deaths[0].get("time")
        if isinstance(stamp, datetime.datetime):
            when = stamp.replace(tzinfo=stamp.tzinfo or datetime.UTC).timestamp()
        elif isinstance(stamp, int | float):
            when = float(stamp)
    queue = _text(headers.get("x-first-death-queue", "?"))
    return when, (
        f"dropped by the broker from {queue} ({_text(reason)}): a policy (message-ttl, "
        f"max-length, delivery-limit) applies to that queue"
    )


def _letter(offset: int, headers: dict[str, Any], body: bytes) -> DeadLetter:
    try:
        message: JobMessage | None = decode(body)
    except Exception:
        message = None
    stamp = headers.get(BURIED_AT)
    error = headers.get(ERROR)
    buried_at = float(stamp) / 1000.0 if isinstance(stamp, int) else 0.0
    note = _text(error) if error else None
    dropped = _broker_drop(headers)
    if dropped is not None and stamp is None:
        buried_at, note = dropped
    return DeadLetter(offset, buried_at, message, body, note)


class DeadLetters:
    """List, requeue and purge one queue's dead-letter stream (see the module docstring).

    Lock rule: ``_lock`` guards ``_connection`` and ``_confirms`` (one call at a time
    per handle; other handles and processes read in parallel).
    """

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self._settings = settings
        self._stream = topology.dead_queue
        self._lock = threading.Lock()
        self._connection: Any = None
        self._confirms: Confirms | None = None

    def _ensure(self) -> Confirms:
        if self._confirms is None or not self._confirms.is_open:
            self._drop()
            self._connection = connect(self._settings, name="dead letters")
            self._confirms = Confirms(self._connection)
        return self._confirms

    def _run(self, action: str, fn: Callable[[Confirms], Any]) -> Any:
        with self._lock, map_errors(self._settings, action):
            try:
                return fn(self._ensure())
            except (pika.exceptions.AMQPError, OSError, BackendUnavailable):
                self._drop()
                raise

    def _publish(self, confirms: Confirms, messages: Sequence[Outgoing]) -> None:
        confirms.send(messages, self._settings.confirm_timeout, set())

    def _read(self, confirms: Confirms) -> tuple[dict[int, DeadLetter], int]:
        """Every dead letter not tombstoned, by offset, and the offset of this read's marker."""
        token = secrets.token_hex(8)
        marker = Outgoing("", self._stream, b"", "marker", {KIND: "marker", TOKEN: token})
        self._publish(confirms, [marker])
        letters: dict[int, DeadLetter] = {}
        removed: set[int] = set()
        end: list[int] = []
        channel = confirms.connection.channel()

        def on_record(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            headers = dict(properties.headers or {})
            offset = int(headers.get("x-stream-offset", -1))
            ch.basic_ack(method.delivery_tag)
            kind = _text(headers[KIND]) if KIND in headers else None
            if kind == "marker":
                if _text(headers.get(TOKEN, "")) == token:
                    end.append(offset)
            elif kind == "tomb":
                with contextlib.suppress(ValueError, TypeError):
                    removed.update(int(o) for o in json.loads(body))
            elif not end:
                letters[offset] = _letter(offset, headers, body)

        try:
            channel.basic_qos(prefetch_count=_READ_PREFETCH)
            channel.basic_consume(self._stream, on_record, arguments={"x-stream-offset": "first"})
            deadline = SYSTEM_CLOCK.monotonic() + self._settings.confirm_timeout
            while not end:
                left = deadline - SYSTEM_CLOCK.monotonic()
                if left <= 0:
                    raise BackendUnavailable(
                        f"RabbitMQ at {self._settings.url} did not deliver the dead-letter "
                        f"stream {self._stream} within {self._settings.confirm_timeout:g} s"
                    )
                confirms.connection.process_data_events(time_limit=min(left, 1.0))
        finally:
            if channel.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    channel.close()
        for offset in removed:
            letters.pop(offset, None)
        return letters, end[0]

    def _tomb(self, offsets: list[int]) -> Outgoing:
        return Outgoing("", self._stream, json.dumps(offsets).encode(), "tomb", {KIND: "tomb"})

    def list(self, limit: int) -> list[Job]:
        """The most recently buried ``limit`` dead letters, newest first."""

        def read(confirms: Confirms) -> list[Job]:
            letters, _ = self._read(confirms)
            newest = sorted(letters.values(), key=lambda d: (d.buried_at, d.offset), reverse=True)
            return [d.job() for d in newest[:limit]]

        jobs: list[Job] = self._run("list dead letters", read)
        return jobs

    def requeue(self, job_id: str, again: Callable[[JobMessage], Sequence[Outgoing]]) -> bool:
        """Publish the messages ``again(message)`` for the newest dead letter of ``job_id``, then
        tombstone it (a crash in between leaves it both requeued and dead: at least once)."""

        def requeue(confirms: Confirms) -> bool:
            letters, _ = self._read(confirms)
            found = [d for d in letters.values() if d.message and d.message.id == job_id]
            if not found:
                return False
            letter = max(found, key=lambda d: (d.buried_at, d.offset))
            assert letter.message is not None
            self._publish(confirms, again(letter.message))
            self._publish(confirms, [self._tomb([letter.offset])])
            return True

        return bool(self._run("requeue a dead letter", requeue))

    def purge(self, ids: set[str] | None, cutoff: float | None) -> Sequence[str]:
        """Tombstone the dead letters in ``ids`` (all when None) buried before ``cutoff``;
        the ids of those purged ("?" for an unreadable one)."""

        def purge(confirms: Confirms) -> list[str]:
            letters, _ = self._read(confirms)
            chosen = [
                d
                for d in letters.values()
                if (ids is None or (d.message.id if d.message else None) in ids)
                and (cutoff is None or d.buried_at < cutoff)
            ]
            offsets = sorted(d.offset for d in chosen)
            for start in range(0, len(offsets), 10_000):
                self._publish(confirms, [self._tomb(offsets[start : start + 10_000])])
            return [d.message.id if d.message else "?" for d in chosen]

        purged: list[str] = self._run("purge dead letters", purge)
        return purged

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        connection, self._connection, self._confirms = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()
