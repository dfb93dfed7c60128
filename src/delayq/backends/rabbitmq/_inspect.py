"""``cancel``, ``reschedule`` and ``get`` by id, answered by the queue's log (``_log.py``).

A cancel is one record: its answer is what the log held when it came (a start
record before it means the job runs: ``running``; after it, the start loses and
the delivery is dropped when it comes). A reschedule reads the entry (up to a
marker), publishes the job again under a new version, then appends its record
naming the entry's change count: if anything changed in between, the record
loses, the copy is of a version nobody runs, and it tries again. ``get`` reads up
to a marker of its own, so it sees every change made before the call.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from delayq.backends._common import check_when
from delayq.backends.base import Completion
from delayq.backends.rabbitmq._arbiter import Arbiter
from delayq.backends.rabbitmq._claims import Held
from delayq.backends.rabbitmq._consumer import Delivery
from delayq.backends.rabbitmq._log import enqueued
from delayq.backends.rabbitmq._message import JobMessage, new_instance
from delayq.backends.rabbitmq._publisher import Outgoing
from delayq.clock import Clock
from delayq.errors import BackendError, InvalidOption, JobConflict, Unsupported
from delayq.job import CancelOutcome, EnqueueOutcome, Job, JobState, RescheduleOutcome

__all__ = ["RabbitMQInspection", "Starting"]

Starting = tuple[Delivery, JobMessage, int, Job]
"""A claim about to start: its delivery, message, attempt and job."""

_LOG_BATCH = 1000
"""Job messages per enqueue record of the log (a big batch takes several)."""

_TRIES = 20
"""Reschedule records a call appends, each losing to a change in between, before it gives up."""


def _job_id(job_id: object) -> str:
    if not isinstance(job_id, str):
        raise InvalidOption(f"job_id must be a str, got {job_id!r}")
    return job_id


class RabbitMQInspection:
    """The by-id calls of :class:`~delayq.backends.rabbitmq.RabbitMQBackend`, and the
    records its other calls append to the log."""

    _arbiter: Arbiter
    _clock: Clock
    _log_on: bool  # False: opened with log=false (no log: nothing by id)

    def _check_open(self) -> None:
        raise NotImplementedError

    def _outgoing(self, message: JobMessage, delay: float) -> Outgoing:
        raise NotImplementedError

    def _record(self, kind: str, **fields: Any) -> list[Outgoing]:
        """A log record nobody waits for, to publish in a batch (none without the log)."""
        return [self._arbiter.outgoing(kind, **fields)] if self._log_on else []

    def _by_id(self, what: str) -> None:
        if not self._log_on:
            raise Unsupported(
                f"the RabbitMQ store was opened with log=false, so it cannot {what}: open "
                f"it with its log (the default) to cancel, reschedule or get jobs by id"
            )

    def _start(self, starting: Sequence[Starting], lease_until: float, at: float) -> list[str]:
        """Append the start records of claims about to run: each one's start id where it
        won (its handler may run), "" where it lost (the delivery is dropped)."""
        if not starting:
            return []
        if not self._log_on:
            return ["-"] * len(starting)  # no log: every claim runs
        sids = [secrets.token_hex(8) for _ in starting]
        starts = [
            [m.id, m.ver, attempts, m.returns, lease_until, sid]
            for (_, m, attempts, _), sid in zip(starting, sids, strict=True)
        ]
        won = self._arbiter.append("S", "start a job", s=starts, at=at)
        return [sid if ok else "" for sid, ok in zip(sids, won, strict=True)]

    def _enqueued(self, messages: Sequence[JobMessage], now: float) -> list[Outgoing]:
        """The log's enqueue records of ``messages`` that nobody waits for (a requeued
        dead letter replaces its dead entry)."""
        return [self._arbiter.outgoing("E", **fields) for fields in self._batches(messages, now)]

    def _batches(
        self, messages: Sequence[JobMessage], now: float, **fields: Any
    ) -> list[dict[str, Any]]:
        if not self._log_on:
            return []
        items = [enqueued(m) for m in messages]
        return [
            {"m": items[i : i + _LOG_BATCH], "at": now, **fields}
            for i in range(0, len(items), _LOG_BATCH)
        ]

    def _enqueue_decided(
        self, messages: Sequence[JobMessage], jobs: Sequence[Outgoing], on_conflict: str, now: float
    ) -> list[EnqueueOutcome]:
        """Publish ``jobs`` (the messages' copies) after their enqueue records and return
        what the log decided for each (see ``View.enqueue``): every copy is published at
        once, and the copies of a refused or kept job lose their start when they come.
        A batch is decided 1,000 jobs (one record) at a time."""
        records = [("E", fields) for fields in self._batches(messages, now, c=on_conflict)]
        answers = self._arbiter.append_all(records, "schedule a job", after=jobs)
        outcomes: list[EnqueueOutcome] = []
        for answer in answers:
            if answer and answer[0] == "conflict":
                raise JobConflict(str(answer[1]))
            outcomes += [EnqueueOutcome(value) for value in answer]
        return outcomes

    @staticmethod
    def _ended(item: Completion, held: Held) -> list[Any]:
        """A finish record's entry: how the claim of ``held`` ended."""
        state = "released" if item.released else item.state.value
        run_at = item.run_at if state == "scheduled" else None
        note = item.outcome if item.state in (JobState.SUCCEEDED, JobState.SKIPPED) else item.error
        return [held.message.id, held.message.ver, held.sid, state, run_at, note]

    def cancel(self, job_id: str) -> CancelOutcome:
        job_id = _job_id(job_id)
        self._check_open()
        self._by_id("cancel a job by id")
        answer = self._arbiter.append("C", "cancel a job", id=job_id, at=self._clock.time())
        return CancelOutcome(answer)

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        at, after = check_when(run_at, delay)
        job_id = _job_id(job_id)
        self._check_open()
        self._by_id("reschedule a job by id")
        for _ in range(_TRIES):
            entry = self._arbiter.read(job_id, "reschedule a job")
            if entry is None:
                return RescheduleOutcome.NOT_FOUND
            now = self._clock.time()
            due = now + max(0.0, after) if after is not None else float(at or now)
            ver = new_instance()
            moved = entry.moved(ver, due, now)
            before: Sequence[Outgoing] = () if moved is None else [self._outgoing(moved, due - now)]
            fields: dict[str, Any] = {"id": job_id, "ver": ver, "run_at": due, "at": now}
            answer = self._arbiter.append("R", "reschedule a job", before, base=entry.seq, **fields)
            if answer is not None:
                return RescheduleOutcome(answer)
        raise BackendError(
            f"job {job_id!r} changed {_TRIES} times while it was being rescheduled; try again"
        )

    def get(self, job_id: str) -> Job | None:
        job_id = _job_id(job_id)
        self._check_open()
        self._by_id("look a job up by id")
        entry = self._arbiter.read(job_id, "look a job up by id")
        return None if entry is None else entry.job(self._clock.time())
