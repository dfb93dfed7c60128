"""Checks and messages shared by the backends, so every store says the same thing.

Not public API: backends import from here; users see the errors it builds.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from delayq._validate import MAX_ATTEMPTS, check_int, check_job_id, check_limit, utf8_problem
from delayq.backends.base import Completion
from delayq.clock import Clock, SystemClock
from delayq.errors import InvalidDelay, InvalidOption, InvalidPayload, StaleClaim
from delayq.job import Claim, Job, JobSpec, JobState

log = logging.getLogger("delayq.backends")

__all__ = [
    "CompletesAndClaims",
    "CompletesInBatches",
    "DEFAULT_RESULT_TTL",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_ERROR_CHARS",
    "PURGE_BATCH",
    "RELEASED_NOTE",
    "TTL_STATES",
    "check_ack_state",
    "check_claim_now",
    "check_dead_ttl",
    "check_lease",
    "check_limit",
    "check_list_cursor",
    "check_max_wait",
    "check_result_ttl",
    "check_run_at",
    "check_spec",
    "check_when",
    "clip_error",
    "complete_then_claim",
    "encode_backoff",
    "filtered_page",
    "readable_json",
    "undecodable_error",
    "format_time",
    "lease_expired_error",
    "lease_expired_note",
    "stale_claim",
]

DEFAULT_RESULT_TTL = 7 * 24 * 3600.0
"""Finished records (succeeded, cancelled, skipped) are kept this long: 7 days."""

MAX_ATTEMPTS_LIMIT = MAX_ATTEMPTS
"""The largest ``max_attempts`` a store accepts (a 32-bit signed int everywhere)."""

PURGE_BATCH = 1000
"""Finished records purged per claim at most, so a lowered ``result_ttl`` on a
large store never holds the write lock (or the Redis script) for long; the rest
go in the next claims (reads already treat them as gone)."""

RELEASED_NOTE = (
    "returned unstarted: the worker released the claim before its handler started "
    "(the attempt was given back)"
)
"""The ``last_error`` note of a released job (a note, not a failure: no attempt is used)."""

TTL_STATES = frozenset({JobState.SUCCEEDED, JobState.CANCELLED, JobState.SKIPPED})
"""Final states purged after ``result_ttl``. DEAD is final too, but dead letters
stay until they are purged or requeued on purpose."""


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a finite real number (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range (10**400)
        return None
    return number if math.isfinite(number) else None


def check_claim_now(now: object, clock: Clock) -> float | None:
    """``claim(now=...)``: injected time, for tests only.

    A store on the real clock refuses it: a caller passing a later "now" would
    claim jobs before they are due. Tests open the store with a test clock
    (``clock=FakeClock()``) and may pass any ``now``.
    """
    if now is None:
        return None
    if isinstance(clock, SystemClock):
        raise InvalidOption(
            "claim(now=...) is injected time for tests: on the real clock it would claim "
            "jobs before they are due; open the store with a test clock "
            "(clock=delayq.testing.FakeClock()) to pass now="
        )
    return check_run_at(now, "now")


def check_list_cursor(after: object) -> tuple[float, str] | None:
    """A ``list_jobs(after=)`` keyset cursor: ``(run_at, job_id)`` of the last job
    of the previous page, or None."""
    if after is None:
        return None
    if not isinstance(after, tuple | list) or len(after) != 2 or not isinstance(after[1], str):
        raise InvalidOption(
            f"after must be (run_at, job_id) of the last job of the previous page, got {after!r}"
        )
    return check_run_at(after[0], "after[0] (run_at)"), after[1]


def filtered_page(
    read: Callable[[float | None, int], list[Job]],
    *,
    due_after: float | None,
    limit: int,
    name: str | None,
    after: tuple[float, str] | None,
) -> list[Job]:
    """``list_jobs(name=, after=)`` for a store that lists only by state and window.

    ``read(due_after, n)`` is the store's own listing (its order, its filters)
    of at most ``n`` jobs. Reads from the cursor's due time on, skips the jobs up
    to the cursor job itself (ties keep the store's order), filters by name, and
    reads a larger window until the page is full or the store has no more: a
    walk, like an index walk, never a sort of everything. When the cursor job is
    gone nothing is skipped (a page may repeat a job, never skip one).
    """
    limit = check_limit(limit)
    cursor = check_list_cursor(after)
    start = due_after
    if cursor is not None:
        start = cursor[0] if start is None else max(start, cursor[0])
    want = max(2 * limit, 100)
    while True:
        rows = read(start, want)
        ids = [job.id for job in rows]
        unread = rows[ids.index(cursor[1]) + 1 :] if cursor and cursor[1] in ids else rows
        page = [job for job in unread if name is None or job.name == name][:limit]
        if len(page) == limit or len(rows) < want:
            return page
        want *= 4


def check_lease(lease: object) -> float:
    seconds = _finite(lease)
    if seconds is None or seconds <= 0:
        raise InvalidOption(f"lease must be a finite number of seconds > 0, got {lease!r}")
    return seconds


def check_max_wait(max_wait: object) -> float:
    seconds = _finite(max_wait)
    if seconds is None or seconds < 0:
        raise InvalidOption(f"max_wait must be a finite number of seconds >= 0, got {max_wait!r}")
    return seconds


def check_result_ttl(result_ttl: object) -> float:
    seconds = _finite(result_ttl)
    if seconds is None or seconds < 0:
        raise InvalidOption(
            f"result_ttl must be a finite number of seconds >= 0, got {result_ttl!r}"
        )
    return seconds


def check_dead_ttl(dead_ttl: object) -> float | None:
    """Seconds dead letters are kept (None: until purged or requeued)."""
    if dead_ttl is None:
        return None
    seconds = _finite(dead_ttl)
    if seconds is None or seconds < 0:
        raise InvalidOption(
            f"dead_ttl must be None or a finite number of seconds >= 0, got {dead_ttl!r}"
        )
    return seconds


def check_run_at(run_at: object, name: str = "run_at") -> float:
    seconds = _finite(run_at)
    if seconds is None:
        raise InvalidDelay(f"{name} must be finite epoch seconds, got {run_at!r}")
    return seconds


def check_when(run_at: object, delay: object) -> tuple[float | None, float | None]:
    """``(run_at, delay)`` of a reschedule or requeue: exactly one is given and finite.

    A negative delay counts as 0 ("due now").
    """
    if (run_at is None) == (delay is None):
        raise InvalidOption("give exactly one of run_at= (epoch seconds) or delay= (seconds)")
    if delay is not None:
        return None, max(0.0, check_run_at(delay, "delay"))
    return check_run_at(run_at), None


encode_backoff = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
"""A backoff dict as compact JSON text (one encoder, built once: ``json.dumps``
with options builds a new one per call, several times slower)."""


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (only finite numbers are)")


_decode_payload = json.JSONDecoder(parse_constant=_not_json_constant).decode
"""JSON text to data, refusing NaN and infinities (one decoder, built once)."""


def _check_text(value: object, field: str, job_id: str) -> None:
    """A non-empty str a store can keep (valid UTF-8: no lone surrogates)."""
    if not isinstance(value, str) or not value:
        raise InvalidOption(f"job {job_id!r}: {field} must be a non-empty str, got {value!r}")
    problem = utf8_problem(value)
    if problem is not None:
        raise InvalidOption(f"job {job_id!r}: {field} {problem}")


def check_spec(spec: object) -> JobSpec:
    """Check one spec before it is stored: the ONE checker every store calls.

    The payload must be JSON text (valid UTF-8, no NaN or infinities, not
    nested past the decoder's depth), the id a valid job id, ``max_attempts``
    an int in ``1 .. 2**31-1``, the due time (or ``delay``) finite, name and
    misfire non-empty UTF-8 text and backoff a dict that encodes as JSON.
    Raises an ``InvalidInput`` naming the job, never a driver or codec error.
    """
    if not isinstance(spec, JobSpec):
        raise InvalidOption(f"enqueue takes JobSpec items, got {type(spec).__name__}")
    job_id = check_job_id(spec.id)
    _check_text(spec.name, "name", job_id)
    payload = spec.payload
    if not isinstance(payload, str):
        raise InvalidPayload(
            f"job {job_id!r}: payload must be JSON text (see delayq.codec.encode_payload), "
            f"got {type(payload).__name__}"
        )
    problem = utf8_problem(payload)
    if problem is not None:
        raise InvalidPayload(f"job {job_id!r}: payload {problem}")
    try:
        _decode_payload(payload)
    except ValueError as exc:
        raise InvalidPayload(f"job {job_id!r}: payload is not valid JSON text: {exc}") from exc
    except RecursionError as exc:
        raise InvalidPayload(f"job {job_id!r}: payload is nested too deeply") from exc
    try:
        check_int(spec.max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
    except InvalidOption as exc:
        raise InvalidOption(f"job {job_id!r}: {exc}") from exc
    if spec.delay is None:
        check_run_at(spec.run_at)
    else:
        check_run_at(spec.delay, "delay")
    if not isinstance(spec.backoff, dict):
        raise InvalidOption(f"job {job_id!r}: backoff must be a dict, got {spec.backoff!r}")
    try:
        encode_backoff(spec.backoff)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidOption(f"job {job_id!r}: backoff must be JSON data: {exc}") from exc
    _check_text(spec.misfire, "misfire", job_id)
    if _finite(spec.created_at) is None:
        raise InvalidOption(f"job {job_id!r}: created_at must be finite epoch seconds")
    return spec


MAX_ERROR_CHARS = 16_384
"""The longest ``last_error`` a store keeps (characters): a longer error (a deep
traceback) keeps its start and its end, where the exception is."""


def clip_error(text: str | None) -> str | None:
    """``text`` as a store keeps it: at most ``MAX_ERROR_CHARS`` characters, and
    valid UTF-8 (a lone surrogate, e.g. from a file name, becomes ``\\udxxx``)."""
    if text is None:
        return None
    if len(text) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2 - 40
        cut = len(text) - 2 * half
        text = f"{text[:half]}\n... [{cut} characters cut] ...\n{text[-half:]}"
    if not text.isascii() and utf8_problem(text) is not None:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def readable_json(text: str) -> Any:
    """Stored JSON for inspection (get, list_jobs, dead_letters): the raw text when
    it does not decode, so a broken record can still be looked at (claim buries
    such a job with the reason in ``last_error``)."""
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return text


def undecodable_error(exc: BaseException) -> str:
    """The error of a stored job that ``claim`` buried because it cannot be read."""
    return (
        f"cannot decode the stored job ({type(exc).__name__}: {exc}); it was buried "
        f"instead of being run. Fix the record and requeue it, or purge it"
    )


def check_ack_state(state: object) -> JobState:
    if state == JobState.SUCCEEDED:
        return JobState.SUCCEEDED
    if state == JobState.SKIPPED:
        return JobState.SKIPPED
    raise InvalidOption(f"ack state must be JobState.SUCCEEDED or SKIPPED, got {state!r}")


def format_time(epoch: float) -> str:
    """Epoch seconds as a readable UTC timestamp (for error messages)."""
    try:
        return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return repr(epoch)


def lease_expired_error(lease_until: float, attempts: int, max_attempts: int) -> str:
    """The error of a job buried because its last lease ran out."""
    return (
        f"lease expired at {format_time(lease_until)} after {attempts} attempts "
        f"(max_attempts={max_attempts}): the worker holding it stopped or hung"
    )


def lease_expired_note(lease_until: float, attempts: int) -> str:
    """The error recorded on a job returned to the due set by lease expiry."""
    return (
        f"lease expired at {format_time(lease_until)} during attempt {attempts}: "
        f"the worker holding it stopped or hung; returned to the due set"
    )


def stale_claim(claim: Claim, state: JobState | None, token: int | None) -> StaleClaim:
    """The error for an ack/retry/bury/extend whose token is no longer current."""
    if state is None:
        now = "no longer exists"
    elif state is JobState.RUNNING:
        now = f"is running under a newer claim (token {token})"
    else:
        now = f"is now {state.value}"
    return StaleClaim(
        f"claim on job {claim.job.id!r} (token {claim.token}) is stale: the job {now}; "
        f"its lease expired and the job was returned to the due set or finished elsewhere"
    )


def complete_then_claim(
    store: Any, batch: Sequence[Completion], *, limit: int, lease: float
) -> tuple[list[StaleClaim | None], list[Claim]]:
    """The default ``complete_and_claim``: ``store.complete(batch)``, then
    ``store.claim(limit=limit, lease=lease)`` (none when ``limit`` is 0).

    Two calls, not one transaction: when the claim fails after the batch was
    applied, the batch's answers are still returned (they happened), with no
    claims, and the claim's error is logged; the caller claims again later. A
    failing ``complete`` raises as usual (nothing claimed).
    """
    check_int(limit, "limit", minimum=0)
    answers: list[StaleClaim | None] = store.complete(batch) if batch else []
    if limit == 0:
        return answers, []
    try:
        claims: list[Claim] = store.claim(limit=limit, lease=lease)
    except Exception:
        if not answers:
            raise
        log.warning(
            "complete_and_claim: %d completion(s) recorded, the claim after them failed",
            len(answers),
            exc_info=True,
        )
        return answers, []
    return answers, claims


class CompletesAndClaims:
    """``complete_and_claim`` as :func:`complete_then_claim`, for stores that have no
    single round trip for it (yet)."""

    def complete_and_claim(
        self, batch: Sequence[Completion], *, limit: int, lease: float
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        return complete_then_claim(self, batch, limit=limit, lease=lease)


class CompletesInBatches(CompletesAndClaims):
    """``ack`` / ``retry`` / ``bury`` as one-entry batches of ``complete``.

    For stores whose single calls are just a batch of one (memory, SQLite), so
    the rules live in one place: the store's ``complete``.
    """

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        raise NotImplementedError

    def ack(
        self, claim: Claim, *, state: JobState = JobState.SUCCEEDED, outcome: str | None = None
    ) -> None:
        self._complete_one(Completion.ack(claim, state=check_ack_state(state), outcome=outcome))

    def retry(self, claim: Claim, run_at: float, error: str) -> None:
        self._complete_one(Completion.retry(claim, check_run_at(run_at), error))

    def bury(self, claim: Claim, error: str) -> None:
        self._complete_one(Completion.bury(claim, error))

    def release(self, claim: Claim) -> None:
        self._complete_one(Completion.release(claim))

    def _complete_one(self, completion: Completion) -> None:
        [stale] = self.complete([completion])
        if stale is not None:
            raise stale
