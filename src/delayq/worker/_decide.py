"""What to do with a claimed attempt: a pure function of the claim and what happened.

:func:`decide` holds every rule that turns "this job, this attempt, this
handler result" into a store call (ack, retry, bury, release) and an
:data:`Outcome`, so the rules are tested as a table without threads or stores.
"""

from __future__ import annotations

import functools
import re
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from delayq._validate import format_time
from delayq.backends.base import Completion
from delayq.backoff import backoff_from_spec
from delayq.errors import InvalidInput
from delayq.job import Claim, JobState, Misfire

__all__ = [
    "DEFAULT_UNKNOWN_HANDLER_GRACE",
    "MAX_ERROR_CHARS",
    "Decision",
    "JobResult",
    "Outcome",
    "decide",
    "format_error",
    "timeout_error",
]

Outcome = Literal["succeeded", "retried", "dead", "skipped", "returned", "stale", "error"]
"""How one claimed attempt ended, from the worker's point of view.

``returned``: given back unstarted (a stop, or a lease that ran out before the
handler could start); ``stale``: the lease was lost before the result could be
recorded; ``error``: the worker could not record it (the job runs again after
its lease).
"""

MAX_ERROR_CHARS = 16_000
"""Longest error text (message + traceback) stored with a job; the middle is cut."""

DEFAULT_UNKNOWN_HANDLER_GRACE = 300.0
"""Seconds a job naming an unknown handler is retried before it is dead-lettered:
during a rolling deploy new producers schedule names that old workers do not
know yet."""

_SLOW_NOTE_AFTER = Misfire.SKIP_GRACE

_UNKNOWN_SINCE = re.compile(r"\[unknown handler since epoch (\d+(?:\.\d+)?)\]")


@dataclass(frozen=True, slots=True)
class JobResult:
    """What happened to one claimed attempt (passed to ``on_result``)."""

    job_id: str
    name: str
    attempt: int
    outcome: Outcome
    lateness: float  # seconds between the due time and the claim
    duration: float  # seconds the handler ran (0 when it did not run)
    error: str | None = None
    retry_at: float | None = None
    start_lateness: float | None = None  # seconds between the due time and the handler's start


@dataclass(frozen=True, slots=True)
class Decision:
    """How to finish an attempt: its outcome and the store call that records it."""

    outcome: Outcome
    note: str | None = None  # an ack's note (skipped, ran late)
    error: str | None = None  # a retry's or bury's error text
    retry_at: float | None = None  # a retry's new due time (epoch seconds)
    keep_attempt: bool = False  # a retry that gives its attempt back (it never started)
    result: str | None = None  # a success's return value, JSON text (a handler storing results)

    def completion(self, claim: Claim) -> Completion:
        """The store call for ``claim`` (the claim as it is at commit time)."""
        outcome = self.outcome
        if self.keep_attempt:
            assert self.retry_at is not None
            return Completion.release(claim, run_at=self.retry_at, note=self.error)
        if outcome == "succeeded":
            return Completion(claim, JobState.SUCCEEDED, outcome=self.note, result=self.result)
        if outcome == "skipped":
            return Completion(claim, JobState.SKIPPED, outcome=self.note)
        if outcome == "retried":
            assert self.retry_at is not None and self.error is not None
            return Completion.retry(claim, self.retry_at, self.error)
        if outcome == "dead":
            assert self.error is not None
            return Completion.bury(claim, self.error)
        if outcome == "returned":
            return Completion.release(claim)
        raise AssertionError(f"no store call records the outcome {outcome!r}")


RETURNED = Decision("returned")
SUCCEEDED = Decision("succeeded")


def format_error(exc: BaseException) -> str:
    """The error text stored with a job: the traceback, its middle cut past MAX_ERROR_CHARS."""
    return _cut("".join(traceback.format_exception(exc)).rstrip())


def timeout_error(name: str, timeout: float, *, killed: bool = False) -> str:
    """The error recorded for a handler that ran past its timeout (``killed``: its
    child process is killed, a process pool)."""
    fate = (
        "its child process is killed"
        if killed
        else "a sync handler's thread is left to finish and its result ignored"
    )
    return (
        f"HandlerTimeout: handler {name!r} ran past its timeout of {timeout:g}s; the attempt "
        f"counts as failed ({fate})"
    )


def _cut(text: str) -> str:
    if len(text) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2
        text = f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"
    return text


def decide(
    claim: Claim,
    now: float,
    *,
    ran: bool,
    error: str | None = None,
    handler_known: bool = True,
    registered: Sequence[str] = (),
    unknown_grace: float = DEFAULT_UNKNOWN_HANDLER_GRACE,
    started_at: float | None = None,
    keep_attempt: bool = False,
    result: str | None = None,
    final: bool = False,
) -> Decision | None:
    """Decide how ``claim``'s attempt ends; ``now`` is the store's time (estimated).

    Before the handler runs (``ran=False``, ``now`` is when it would start) it
    answers None for "run it", or ends the attempt without running: an unknown
    handler name is retried by the job's backoff until ``unknown_grace``
    seconds have passed since it was first found unknown (its due time, or the
    time noted in its last error), then dead-lettered (with ``keep_attempt``,
    for a store that can, the retry gives its attempt back: a worker that lacks
    the handler uses none of the job's attempts); an unreadable misfire policy
    is dead-lettered; a job overdue at ``now`` beyond its misfire policy is
    SKIPPED with a note (judged when the handler would start, not at the claim:
    a claim that waited for a slot counts its wait).

    After the handler ran (``ran=True``): no ``error`` is a success (noted
    when it started late, at ``started_at``, else at the claim), carrying
    ``result`` (the return value as JSON text) when the handler stores one; an
    error is retried at ``now`` plus the job's backoff for this attempt, or
    dead-lettered on the last attempt (``max_attempts``), when the backoff
    cannot be read, or at once when it is ``final`` (a return value that
    cannot be stored: the body ran, a retry would run its side effects again).
    """
    job = claim.job
    if ran:
        lateness = (claim.claimed_at if started_at is None else started_at) - claim.due
        if error is None:
            if lateness > _SLOW_NOTE_AFTER:
                return Decision(
                    "succeeded",
                    note=f"ran {lateness:.3f}s late (misfire policy {job.misfire})",
                    result=result,
                )
            return SUCCEEDED if result is None else Decision("succeeded", result=result)
        if final or claim.attempt >= job.max_attempts:
            return Decision("dead", error=error)
        return _retry(claim, now, error)
    if not handler_known:
        return _unknown_handler(claim, now, registered, unknown_grace, keep_attempt)
    if job.misfire == "run":
        return None  # the default policy: nothing to parse on the hot path
    lateness = now - claim.due
    try:
        misfire = _misfire(job.misfire)
    except InvalidInput as exc:
        return Decision(
            "dead", error=f"cannot read the job's misfire policy {job.misfire!r}: {exc}"
        )
    if not misfire.should_run(lateness):
        return Decision(
            "skipped", note=f"skipped: {lateness:.3f}s late (misfire policy {misfire.to_spec()})"
        )
    return None


@functools.lru_cache(maxsize=256)  # a few policies repeat across every job
def _misfire(spec: str) -> Misfire:
    return Misfire.parse(spec)


def _retry(claim: Claim, now: float, error: str, *, latest: float | None = None) -> Decision:
    job = claim.job
    try:
        delay = backoff_from_spec(job.backoff).delay(claim.attempt)
    except InvalidInput as exc:
        return Decision(
            "dead", error=f"{error}\n\ncannot read the job's backoff {job.backoff!r}: {exc}"
        )
    run_at = now + delay
    if latest is not None:
        run_at = max(now, min(run_at, latest))
    return Decision("retried", error=error, retry_at=run_at)


def _unknown_handler(
    claim: Claim, now: float, registered: Sequence[str], grace: float, keep_attempt: bool
) -> Decision:
    job = claim.job
    since = claim.due
    if job.last_error is not None and (m := _UNKNOWN_SINCE.search(job.last_error)):
        since = min(since, float(m.group(1)))
    known = ", ".join(sorted(registered)) or "none"
    reason = (
        f"UnknownHandler: no handler is registered under {job.name!r} in this worker "
        f"(registered: {known})"
    )
    if now - since >= grace:
        return Decision(
            "dead",
            error=f"{reason}; still unknown {now - since:.1f}s after {format_time(since)} "
            f"(unknown_handler_grace={grace:g}s). Requeue the job once a worker knows it",
        )
    note = (
        f"{reason}; retried until {format_time(since + grace)} in case a worker that knows it "
        f"starts (rolling deploy) [unknown handler since epoch {since!r}]"
    )
    decision = _retry(claim, now, note, latest=since + grace)
    if keep_attempt and decision.outcome == "retried":
        return Decision("retried", error=note, retry_at=decision.retry_at, keep_attempt=True)
    return decision
