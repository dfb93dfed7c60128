"""The arbiter: appends records to the queue's log stream and tails it (``_log.py``).

Each store handle that needs an answer (a worker's claim, a producer's cancel,
reschedule or get) starts one thread with its own connection, consuming the
stream ``delayq.v2.log.<queue>`` over AMQP 0-9-1 (``basic.qos``, ``x-stream-offset``)
from its first record, and folds every record into its :class:`~._log.View`. A
writer appends a record with a random token (publisher confirms, through the
store's publisher), then waits until its own thread has folded that record: the
answer is decided by what came before it in the stream, the same in every
process. After a lost connection the thread consumes again from the next offset
it has not folded (a stream delivers from the start of a chunk: records before
that offset are skipped), so the view is never rebuilt twice.

Records a writer does not wait for (an enqueue, a finish) are handed to the
store's own publish batches (:meth:`Arbiter.outgoing`), so they cost no extra
round trip.

The stream keeps every record (no ``x-max-age``): a process that starts reading
folds the whole history (a record is small, a finished entry is forgotten
after ``result_ttl``, and the view keeps where a job's message is, not the message:
:meth:`Arbiter.read` fetches it by offset); ``x-max-age`` / ``x-max-length-bytes`` in a policy bound
it, at the price of forgetting the jobs whose enqueue record was dropped (a
cancel of one answers ``not_found``, and a start of one wins: no job is lost).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pika.exceptions

from delayq.backends.rabbitmq._connection import Settings, connect, map_errors
from delayq.backends.rabbitmq._log import Entry, View, record
from delayq.backends.rabbitmq._publisher import Outgoing
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import BackendUnavailable, QueueClosed

__all__ = ["Arbiter"]

log = logging.getLogger("delayq.rabbitmq")

_PREFETCH = 2000
"""Records the tailing consumer holds unacked (a stream needs acks for credit only)."""
_ACK_EVERY = 200
"""Records acked together (``multiple``): well under the prefetch, so credit never runs out."""
_PENDING = object()


class Arbiter:
    """One handle's writer and reader of the queue's log (see the module docstring).

    Lock rule: ``_cond`` (and its lock) guards ``_view``, ``_waiting``, ``_next``,
    ``_connection``, ``_closed`` and ``_problem``; the view is changed only by the
    reading thread, and no publish happens under the lock.
    """

    def __init__(
        self,
        settings: Settings,
        stream: str,
        publish: Callable[[Sequence[Outgoing], str], None],
        result_ttl: float,
    ) -> None:
        self._settings = settings
        self._stream = stream
        self._publish = publish
        self._cond = threading.Condition(threading.Lock())
        self._view = View(result_ttl, keep_messages=False)
        self._waiting: dict[str, Any] = {}  # token -> answer (_PENDING until folded)
        self._next = 0  # the offset of the next record to fold
        self._connection: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._problem = ""

    # -- records ---------------------------------------------------------------------
    def outgoing(self, kind: str, token: str = "", **fields: Any) -> Outgoing:
        """A record to publish with the store's own batch (nobody waits for its answer)."""
        return Outgoing("", self._stream, record(kind, token, **fields), kind)

    def append(self, kind: str, action: str, before: Sequence[Outgoing] = (), **fields: Any) -> Any:
        """Append a record (after ``before``, in the same batch) and return its answer, once
        this handle's reader has folded it."""
        [answer] = self.append_all([(kind, fields)], action, before)
        return answer

    def append_all(
        self,
        records: Sequence[tuple[str, dict[str, Any]]],
        action: str,
        before: Sequence[Outgoing] = (),
        after: Sequence[Outgoing] = (),
    ) -> list[Any]:
        """Append ``records`` (kind, fields) in one batch between ``before`` and ``after``
        and return their answers, once this handle's reader has folded them."""
        self.start()
        tokens = [secrets.token_hex(8) for _ in records]
        with self._cond:
            self._check_open()
            for token in tokens:
                self._waiting[token] = _PENDING
        try:
            appended = [
                self.outgoing(kind, token, **fields)
                for (kind, fields), token in zip(records, tokens, strict=True)
            ]
            self._publish([*before, *appended, *after], action)
            return [self._answer(token, action) for token in tokens]
        finally:
            with self._cond:
                for token in tokens:
                    self._waiting.pop(token, None)

    def _answer(self, token: str, action: str) -> Any:
        deadline = SYSTEM_CLOCK.monotonic() + self._settings.confirm_timeout
        with self._cond:
            while (answer := self._waiting.get(token, _PENDING)) is _PENDING:
                self._check_open()
                left = deadline - SYSTEM_CLOCK.monotonic()
                if left <= 0:
                    raise BackendUnavailable(
                        f"RabbitMQ at {self._settings.url} did not deliver the log stream "
                        f"{self._stream} up to this record within "
                        f"{self._settings.confirm_timeout:g} s while trying to {action} (the "
                        f"record is stored; its effect, if any, stands) {self._problem}".rstrip()
                    )
                SYSTEM_CLOCK.wait(self._cond, min(left, 1.0))
            return answer

    def read(self, job_id: str, action: str) -> Entry | None:
        """The entry of ``job_id`` as of now: read up to a marker appended by this call,
        its message read back from the stream (the view keeps only where it is)."""
        self.append("M", action)
        with self._cond:
            entry = self._view.snapshot(job_id)
        if entry is not None and entry.unread:
            assert entry.where is not None
            offset, index = entry.where
            entry.body = str(json.loads(self._fetch(offset, action))["m"][index][4])
        return entry

    def _fetch(self, offset: int, action: str) -> bytes:
        """The record at ``offset`` (a consumer of its own, from that offset)."""
        got: list[bytes] = []

        def on_record(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            channel.basic_ack(method.delivery_tag)
            if not got and int((properties.headers or {}).get("x-stream-offset", -1)) == offset:
                got.append(body)

        deadline = SYSTEM_CLOCK.monotonic() + self._settings.confirm_timeout
        with map_errors(self._settings, action):
            connection = connect(self._settings, name="log read")
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=100)
                channel.basic_consume(
                    self._stream, on_record, arguments={"x-stream-offset": offset}
                )
                while not got and SYSTEM_CLOCK.monotonic() < deadline:
                    connection.process_data_events(time_limit=0.2)
            finally:
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    connection.close()
        if not got:
            raise BackendUnavailable(
                f"RabbitMQ at {self._settings.url} did not deliver record {offset} of the log "
                f"stream {self._stream} within {self._settings.confirm_timeout:g} s while "
                f"trying to {action}"
            )
        return got[0]

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"the RabbitMQ store at {self._settings.url} is closed")

    # -- the reading thread ------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(
                target=self._run, name=f"delayq-rabbitmq-log-{self._settings.queue}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        pause = 0.1
        while True:
            with self._cond:
                if self._closed:
                    return
                start = self._next
            connection: Any = None
            try:
                connection = connect(self._settings, name="log")
                channel = connection.channel()
                channel.basic_qos(prefetch_count=_PREFETCH)
                offset: Any = start if start else "first"
                channel.basic_consume(
                    self._stream, self._on_record, arguments={"x-stream-offset": offset}
                )
                with self._cond:
                    self._connection, self._problem = connection, ""
                pause = 0.1
                while connection.is_open and channel.is_open:
                    with self._cond:
                        if self._closed:
                            break
                    connection.process_data_events(time_limit=None)
            except Exception as exc:
                with self._cond:
                    closed = self._closed
                    self._problem = f"(reading it failed: {exc!r})"[:300]
                if not closed:
                    log.warning(
                        "RabbitMQ log reader of %s lost its connection (%r); reconnecting",
                        self._settings.queue,
                        exc,
                    )
            finally:
                with self._cond:
                    self._connection = None
                if connection is not None and connection.is_open:
                    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                        connection.close()
            with self._cond:
                if not self._closed:
                    self._cond.wait(pause)
                if self._closed:
                    return
            pause = min(5.0, pause * 2)

    def _on_record(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        offset = int((properties.headers or {}).get("x-stream-offset", -1))
        if method.delivery_tag % _ACK_EVERY == 0:
            channel.basic_ack(method.delivery_tag, multiple=True)
        with self._cond:
            if offset < self._next:
                return  # before the offset asked for: folded already
            self._next = offset + 1
            try:
                token, answer = self._view.apply(body, offset)
            except Exception:
                log.warning("RabbitMQ log %s: record %d unreadable", self._stream, offset)
                return
            if token in self._waiting:
                self._waiting[token] = answer
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            connection, thread = self._connection, self._thread
            self._cond.notify_all()
        if connection is not None:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError, RuntimeError):
                connection.add_callback_threadsafe(lambda: None)  # wake the loop
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0)
