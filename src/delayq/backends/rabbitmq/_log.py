"""The queue's log: one stream of records that decides every race on a job, and its fold.

Pure: no I/O, no clock (record times come in the records). ``_arbiter.py``
appends records and tails the stream; every process that tails it folds the
same records in the same order into the same :class:`View`, so whichever of
two competing records comes first in the stream wins, everywhere.

Records (JSON bodies, ``k`` their kind; ``t`` the token its writer waits on, ``at``
the writer's wall clock):

* ``E`` enqueue: ``[id, ver, run_at, attempts, message]`` per job of one ``enqueue``
  (or a requeued dead letter, :func:`enqueued`), and ``c``, the call's ``on_conflict``
  (``replace`` when absent: a requeue, or an older writer); the record is decided
  whole by the one rule every store keeps (``_common.resolve_conflicts``) against
  the entries it meets: refused (its answer is the ``JobConflict`` message, nothing
  applied), or each job a SCHEDULED entry at its version ``ver`` (its message, JSON
  text, decoded only when a call needs it), kept or replaced; the answer is the
  outcomes. An entry of the same ``ver`` is this very job (a start came first, or
  the record was sent again after a reconnect).
* ``S`` start: ``[id, ver, attempt, returns, lease_until, sid]`` per claimed delivery,
  appended before its handler runs; each wins (the claim runs) or loses (the
  delivery is dropped): see :meth:`View.start`.
* ``F`` finish: ``[id, ver, sid, state, run_at, note]`` per completion (no answer
  awaited; ``note`` the error of a retry, burial or release, the outcome of an ack);
  ``sid`` empty for a burial that did not come from a claim.
* ``P`` purge: the ids of dead letters purged (their dead entries are forgotten).
* ``L`` lease: ``[id, sid, lease_until]`` per renewed claim; False when the claim lost
  its job (a cancel or reschedule took effect after its lease ran out).
* ``C`` cancel and ``R`` reschedule (``id``; ``R`` also ``ver``, the new version,
  ``run_at`` and ``base``, the entry's change count its writer read: it loses to any
  change in between and is tried again).
* ``M`` marker: changes nothing; a read up to one's own marker sees every record
  appended before the call (``get``).

Finished entries are kept ``result_ttl`` seconds after they finished (by the times
in later records) and at most ``FINISHED_KEEP`` of them, oldest first. A view fed
with stream offsets (``keep_messages=False``, the arbiter's) keeps where each job's
message is (``Entry.where``) instead of the message, so its memory does not grow
with payload sizes; a reader that needs the message fetches that record.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from delayq.backends._common import RELEASED_NOTE, clip_error, resolve_conflicts
from delayq.backends.rabbitmq._claims import EARLY_GUARD, expired_error, expired_note
from delayq.backends.rabbitmq._message import JobMessage, decode, encode
from delayq.errors import JobConflict
from delayq.job import CancelOutcome, Job, JobState, RescheduleOutcome

__all__ = ["FINISHED_KEEP", "SKEW", "Entry", "View", "enqueued", "record"]

FINISHED_KEEP = 100_000
"""Finished entries a view keeps at most (the oldest forgotten first)."""

SKEW = EARLY_GUARD
"""Seconds by which a lease must have run out on a writer's clock before a cancel,
reschedule or start takes the job from its holder (a lease end is the holder's wall
clock; hosts' clocks are assumed to agree within this, as ``EARLY_GUARD`` assumes)."""

_FINISHED = frozenset({JobState.SUCCEEDED, JobState.SKIPPED, JobState.DEAD, JobState.CANCELLED})
_ENDS = {"succeeded": JobState.SUCCEEDED, "skipped": JobState.SKIPPED, "dead": JobState.DEAD}


def enqueued(message: JobMessage) -> list[Any]:
    """An enqueue record's entry for ``message``."""
    text = encode(replace(message, local=0.0, more=0.0)).decode()
    return [message.id, message.ver, message.run_at, message.attempts, text, message.max_attempts]


def record(kind: str, token: str = "", **fields: Any) -> bytes:
    """A record's body."""
    return json.dumps({"k": kind, "t": token, **fields}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class _Enqueued:
    """One job of an enqueue record."""

    id: str
    ver: str
    run_at: float
    attempts: int
    text: str
    max_attempts: int
    index: int  # its place in the record


def _max_attempts(item: Sequence[Any]) -> int:
    """An enqueue item's ``max_attempts`` (an older writer's item: read from its message)."""
    if len(item) > 5:
        return int(item[5])
    return int(json.loads(str(item[4]))["max_attempts"])


@dataclass(slots=True)
class Entry:
    """What the log says of one job id."""

    id: str
    body: str | None  # the live version's message as JSON text (None: not held, see ``where``)
    ver: str
    state: JobState
    run_at: float
    attempts: int  # attempts started (the running one included)
    updated_at: float
    returns: int = 0
    sid: str = ""  # the start that runs it (RUNNING)
    lease_until: float = 0.0
    last_error: str | None = None
    outcome: str | None = None
    seq: int = 0  # changes so far (a reschedule's base)
    decoded: JobMessage | None = None  # ``body`` decoded, once needed
    max_attempts: int = 0  # the message's (0: no enqueue record seen)
    where: tuple[int, int] | None = None  # (stream offset, index) of its enqueue record's job

    @property
    def message(self) -> JobMessage | None:
        """The live version's message (None: a start came before its enqueue record, or
        the view does not hold it: :attr:`unread`)."""
        if self.decoded is None and self.body is not None:
            self.decoded = decode(self.body.encode())
        return self.decoded

    @message.setter
    def message(self, message: JobMessage) -> None:
        self.decoded, self.body, self.where = message, None, None

    @property
    def unread(self) -> bool:
        """Its message is in the stream only (at :attr:`where`), not in the view."""
        return self.where is not None and self.body is None and self.decoded is None

    def expired(self, at: float) -> bool:
        """A running entry whose lease ran out by ``at`` (a writer's clock), by more than
        the clock skew hosts are assumed to stay within."""
        return self.state is JobState.RUNNING and self.lease_until + SKEW <= at

    def used_up(self) -> bool:
        return self.max_attempts > 0 and self.attempts >= self.max_attempts

    def job(self, now: float) -> Job | None:
        """The job as ``get`` shows it at ``now`` (a lapsed lease settled as a claim would)."""
        if self.message is None:
            return None
        state, error, lease = self.state, self.last_error, self.lease_until
        if self.expired(now):
            state = JobState.DEAD if self.used_up() else JobState.SCHEDULED
            error = (
                expired_error(self.attempts, self.max_attempts)
                if state is JobState.DEAD
                else expired_note(self.attempts)
            )
        job = replace(self.message, run_at=self.run_at, last_error=error).job(
            state, self.attempts, self.updated_at, outcome=self.outcome
        )
        return replace(job, lease_until=lease) if state is JobState.RUNNING else job

    def movable(self, at: float) -> bool:
        """Can a reschedule at ``at`` move it (it has a message, is not finished, and is
        not running under a live lease)?"""
        if (self.message is None and self.where is None) or self.state in _FINISHED:
            return False
        return not (self.state is JobState.RUNNING and not self.expired(at))

    def moved_error(self) -> str | None:
        """The last error a moved job carries."""
        return expired_note(self.attempts) if self.state is JobState.RUNNING else self.last_error

    def moved(self, ver: str, run_at: float, at: float) -> JobMessage | None:
        """The message a reschedule to ``run_at`` publishes (None: nothing to move, or
        its message is not read: :attr:`unread`)."""
        if not self.movable(at) or self.message is None:
            return None
        return replace(
            self.message, ver=ver, run_at=run_at, attempts=self.attempts,
            last_error=self.moved_error(),
        )  # fmt: skip


class View:
    """The fold of one queue's log: an entry per job id (see the module docstring).

    Not thread-safe: the arbiter calls it under its lock.
    """

    def __init__(self, result_ttl: float, *, keep_messages: bool = True) -> None:
        self.result_ttl = result_ttl
        # False: an entry keeps where its message is in the stream, not the message (a
        # process's memory then grows by a small entry per job, whatever its payload).
        self.keep_messages = keep_messages
        self.entries: dict[str, Entry] = {}
        self._finished: deque[tuple[float, str, int]] = deque()  # (at, id, seq)
        # Versions of refused enqueue records: their copies lose their start even where
        # no entry has their id (a start of an unknown id wins otherwise).
        self._refused: dict[str, float] = {}  # ver -> when refused, oldest first
        self.applied = 0  # records folded

    # -- the fold -------------------------------------------------------------------
    def apply(self, body: bytes, offset: int | None = None) -> tuple[str, Any]:
        """Fold one record (``offset``: its place in the stream); returns its token and its
        answer (None for an unreadable one)."""
        self.applied += 1
        try:
            data = json.loads(body)
            kind, token, at = data["k"], str(data.get("t", "")), float(data.get("at", 0.0))
        except (ValueError, TypeError, KeyError):
            return "", None
        self._forget(at)
        if kind == "E":
            return token, self.enqueue(data["m"], str(data.get("c", "replace")), at, offset)
        if kind == "S":
            return token, [self.start(item, at) for item in data["s"]]
        if kind == "F":
            for item in data["f"]:
                self.finish(item, at)
            return token, None
        if kind == "L":
            return token, [self.lease(str(i[0]), str(i[1]), float(i[2])) for i in data["l"]]
        if kind == "P":
            self.purge(data["ids"])
            return token, None
        if kind == "C":
            return token, self.cancel(str(data["id"]), at)
        if kind == "R":
            return token, self.reschedule(
                str(data["id"]), str(data["ver"]), float(data["run_at"]), int(data["base"]), at
            )
        return token, None  # "M", or a kind a newer writer added

    def _change(self, entry: Entry, state: JobState, at: float) -> None:
        entry.state, entry.updated_at = state, at
        entry.seq += 1
        if state in _FINISHED:
            self._finished.append((at, entry.id, entry.seq))

    def _forget(self, at: float) -> None:
        """Drop finished entries past ``result_ttl`` (or past ``FINISHED_KEEP``)."""
        while self._finished and (
            self._finished[0][0] + self.result_ttl <= at or len(self._finished) > FINISHED_KEEP
        ):
            _, job_id, seq = self._finished.popleft()
            entry = self.entries.get(job_id)
            if entry is not None and entry.seq == seq:
                del self.entries[job_id]
        while self._refused:
            ver, refused_at = next(iter(self._refused.items()))
            if refused_at + self.result_ttl > at and len(self._refused) <= FINISHED_KEEP:
                break
            del self._refused[ver]

    def enqueue(
        self, items: Sequence[Sequence[Any]], on_conflict: str, at: float, offset: int | None = None
    ) -> Any:
        """Fold one enqueue record: its outcomes (values of ``EnqueueOutcome``), or
        ``["conflict", message]`` when ``on_conflict`` refuses it (nothing applied).

        ``items``: ``[id, ver, run_at, attempts, message]`` each (:func:`enqueued`)."""
        jobs = [
            _Enqueued(str(i[0]), str(i[1]), float(i[2]), int(i[3]), str(i[4]), _max_attempts(i), n)
            for n, i in enumerate(items)
        ]
        existing: dict[str, JobState] = {}
        for job in jobs:
            entry = self.entries.get(job.id)
            if entry is None or entry.ver == job.ver:
                continue  # new, or this very job (its start came first, a record sent again)
            if entry.state is JobState.RUNNING and entry.expired(at):
                existing[job.id] = JobState.DEAD if entry.used_up() else JobState.SCHEDULED
            else:
                existing[job.id] = entry.state
        try:
            outcomes, final = resolve_conflicts(jobs, existing, on_conflict)
        except JobConflict as exc:
            for job in jobs:
                self._refused[job.ver] = at
            return ["conflict", str(exc)]
        for job in final.values():
            entry = self.entries.get(job.id)
            if entry is None or entry.ver != job.ver:
                # New, or replacing: the old version's copies are dropped when they come.
                seq = entry.seq + 1 if entry is not None else 0
                entry = Entry(
                    job.id, None, job.ver, JobState.SCHEDULED, job.run_at, job.attempts, at,
                    seq=seq,
                )  # fmt: skip
                self.entries[job.id] = entry
            elif entry.body is not None or entry.decoded is not None or entry.where is not None:
                continue  # this very job, enqueued again (a record sent twice)
            # Its message (or where it is), also for an entry its start made first.
            entry.max_attempts = job.max_attempts
            if self.keep_messages or offset is None:
                entry.body = job.text
            else:
                entry.where = (offset, job.index)
        return [outcome.value for outcome in outcomes]

    def start(self, item: Sequence[Any], at: float) -> bool:
        """Does this start win? A scheduled job's next attempt does; a running one's only
        for a later attempt or return (its holder lost it) or after its lease ran out;
        a copy of another version, or of a finished job, never does.

        ``item``: ``[id, ver, attempt, returns, lease_until, sid]``."""
        job_id, ver, sid = str(item[0]), str(item[1]), str(item[5])
        attempt, returns, lease_until = int(item[2]), int(item[3]), float(item[4])
        entry = self.entries.get(job_id)
        if entry is None and ver in self._refused:
            return False  # a copy of a job whose enqueue was refused
        if entry is None:  # no enqueue seen (its record is not in the log): never lose a job
            entry = Entry(job_id, None, ver, JobState.SCHEDULED, 0.0, attempt - 1, at)
            self.entries[job_id] = entry
        if entry.ver != ver or entry.state in _FINISHED:
            return False
        if entry.state is JobState.SCHEDULED:
            won = attempt > entry.attempts
        else:
            won = (attempt, returns) > (entry.attempts, entry.returns) or entry.expired(at)
        if won:
            entry.attempts, entry.returns, entry.sid = attempt, returns, sid
            entry.lease_until = lease_until
            self._change(entry, JobState.RUNNING, at)
        return won

    def finish(self, item: Sequence[Any], at: float) -> None:
        """``item``: ``[id, ver, sid, state, run_at, note]`` (see the module docstring)."""
        job_id, ver, sid, state = (str(v) for v in item[:4])
        run_at = None if item[4] is None else float(item[4])
        note = None if item[5] is None else clip_error(str(item[5]))
        entry = self.entries.get(job_id)
        if entry is None or entry.ver != ver or entry.state in _FINISHED:
            return
        if sid and (entry.state is not JobState.RUNNING or entry.sid != sid):
            return  # that claim lost its job
        if state == "released":
            entry.attempts = max(0, entry.attempts - 1)
            entry.last_error = note or entry.last_error or RELEASED_NOTE  # an earlier one kept
            self._change(entry, JobState.SCHEDULED, at)
        elif state == "scheduled":
            entry.run_at, entry.last_error = float(run_at or at), note
            self._change(entry, JobState.SCHEDULED, at)
        elif state == "dead":
            entry.last_error = note
            self._change(entry, JobState.DEAD, at)
        elif state in _ENDS:
            entry.outcome = note
            self._change(entry, _ENDS[state], at)

    def purge(self, ids: Sequence[Any]) -> None:
        for job_id in ids:
            entry = self.entries.get(str(job_id))
            if entry is not None and entry.state is JobState.DEAD:
                del self.entries[str(job_id)]

    def lease(self, job_id: str, sid: str, lease_until: float) -> bool:
        entry = self.entries.get(job_id)
        if entry is None or entry.state is not JobState.RUNNING or entry.sid != sid:
            return False
        entry.lease_until = lease_until
        return True

    def _lapse(self, entry: Entry, at: float) -> bool:
        """A running entry whose lease ran out on its last attempt is dead (True)."""
        if entry.expired(at) and entry.used_up():
            entry.last_error = expired_error(entry.attempts, entry.max_attempts)
            self._change(entry, JobState.DEAD, at)
            return True
        return False

    def cancel(self, job_id: str, at: float) -> CancelOutcome:
        entry = self.entries.get(job_id)
        if entry is None:
            return CancelOutcome.NOT_FOUND
        if entry.state in _FINISHED or self._lapse(entry, at):
            return CancelOutcome.FINISHED
        if entry.state is JobState.RUNNING and not entry.expired(at):
            return CancelOutcome.RUNNING
        entry.outcome = "cancelled"
        self._change(entry, JobState.CANCELLED, at)
        return CancelOutcome.done(entry.attempts)

    def reschedule(
        self, job_id: str, ver: str, run_at: float, base: int, at: float
    ) -> RescheduleOutcome | None:
        """The answer, or None when the entry changed since its writer read it (base)."""
        entry = self.entries.get(job_id)
        if entry is None:
            return RescheduleOutcome.NOT_FOUND
        if entry.seq != base:
            return None
        if entry.state in _FINISHED or self._lapse(entry, at):
            return RescheduleOutcome.FINISHED
        if not entry.movable(at):
            return RescheduleOutcome.RUNNING
        # The message stays the first version's: the entry's fields override it.
        entry.ver, entry.run_at, entry.last_error = ver, run_at, entry.moved_error()
        self._change(entry, JobState.SCHEDULED, at)
        if entry.attempts:
            return RescheduleOutcome.RESCHEDULED_AFTER_ATTEMPT
        return RescheduleOutcome.RESCHEDULED

    # -- reads ---------------------------------------------------------------------
    def snapshot(self, job_id: str) -> Entry | None:
        entry = self.entries.get(job_id)
        return None if entry is None else replace(entry)
