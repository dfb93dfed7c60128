"""Checks and messages shared by the backends, so every store says the same thing.

Not public API: backends import from here; users see the errors it builds.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from delayq._validate import (
    MAX_ATTEMPTS,
    JsonScalar,
    PayloadPath,
    check_int,
    check_job_id,
    check_limit,
    check_list_cursor,
    check_payload_at,
    check_payload_contains,
    check_preview,
    check_run_at,
    finite_number,
    format_time,
    utf8_problem,
)
from delayq.backends.base import Completion
from delayq.clock import Clock, SystemClock
from delayq.errors import InvalidOption, InvalidPayload, JobConflict, StaleClaim
from delayq.flow import check_flow_key, check_priority
from delayq.job import Claim, EnqueueOutcome, Job, JobSpec, JobState, PayloadPreview

log = logging.getLogger("delayq.backends")

__all__ = [
    "is_expired",
    "CompletesAndClaims",
    "CompletesInBatches",
    "DEFAULT_RESULT_TTL",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_ERROR_CHARS",
    "MAX_QUEUE_NAME",
    "MAX_UNSTARTED",
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
    "check_payload_at",
    "check_payload_contains",
    "check_preview",
    "check_queue_name",
    "check_result_ttl",
    "check_run_at",
    "check_spec",
    "check_when",
    "clip_error",
    "complete_then_claim",
    "conflict_error",
    "encode_backoff",
    "extend_one_by_one",
    "filtered_page",
    "listed_payload",
    "payload_matches",
    "readable_json",
    "resolve_conflicts",
    "undecodable_error",
    "format_time",
    "lease_expired_error",
    "lease_expired_note",
    "stale_claim",
    "unstarted_expired_error",
    "unstarted_expired_note",
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

MAX_UNSTARTED = 5
"""Leases of one job that may run out with no recorded start (feature
``attempt_at_start``) before it is buried: such an expiry is no attempt, so this
bound is what stops a job that kills its worker before its start is recorded."""

TTL_STATES = frozenset({JobState.SUCCEEDED, JobState.CANCELLED, JobState.SKIPPED})
"""Final states purged after ``result_ttl``. DEAD is final too, but dead letters
stay until they are purged or requeued on purpose."""

_TTL_STATE_VALUES = frozenset(state.value for state in TTL_STATES)


def is_expired(state: str, updated_at: float, cutoff: float) -> bool:
    """A finished record past ``result_ttl`` (``updated_at <= cutoff``, the cutoff
    being now minus ``result_ttl``) counts as gone (``state`` is the stored text)."""
    return state in _TTL_STATE_VALUES and updated_at <= cutoff


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
    seconds = finite_number(lease)
    if seconds is None or seconds <= 0:
        raise InvalidOption(f"lease must be a finite number of seconds > 0, got {lease!r}")
    return seconds


def check_max_wait(max_wait: object) -> float:
    seconds = finite_number(max_wait)
    if seconds is None or seconds < 0:
        raise InvalidOption(f"max_wait must be a finite number of seconds >= 0, got {max_wait!r}")
    return seconds


def check_result_ttl(result_ttl: object) -> float:
    seconds = finite_number(result_ttl)
    if seconds is None or seconds < 0:
        raise InvalidOption(
            f"result_ttl must be a finite number of seconds >= 0, got {result_ttl!r}"
        )
    return seconds


def check_dead_ttl(dead_ttl: object) -> float | None:
    """Seconds dead letters are kept (None: until purged or requeued)."""
    if dead_ttl is None:
        return None
    seconds = finite_number(dead_ttl)
    if seconds is None or seconds < 0:
        raise InvalidOption(
            f"dead_ttl must be None or a finite number of seconds >= 0, got {dead_ttl!r}"
        )
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
    if finite_number(spec.created_at) is None:
        raise InvalidOption(f"job {job_id!r}: created_at must be finite epoch seconds")
    if spec.key is not None or spec.priority or spec.group is not None:
        check_flow_fields(spec, job_id)
    return spec


def check_flow_fields(spec: JobSpec, job_id: str) -> None:
    """The flow-control fields of a spec (``key``, ``priority``, ``group``)."""
    try:
        check_flow_key(spec.key, "key")
        check_priority(spec.priority)
        check_flow_key(spec.group, "group")
    except InvalidOption as exc:
        raise InvalidOption(f"job {job_id!r}: {exc}") from exc


MAX_ERROR_CHARS = 16_384
"""The longest ``last_error`` a store keeps (characters): a longer error (a deep
traceback) keeps its start and its end, where the exception is."""


def clip_error(text: str | None) -> str | None:
    """``text`` as a store keeps it: at most ``MAX_ERROR_CHARS`` characters, valid
    UTF-8 (a lone surrogate, e.g. from a file name, becomes ``\\udxxx``) and no
    NUL (PostgreSQL text cannot hold one; it becomes ``\\x00`` on every store,
    so the same error reads the same everywhere)."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if len(text) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2 - 40
        cut = len(text) - 2 * half
        text = f"{text[:half]}\n... [{cut} characters cut] ...\n{text[-half:]}"
    if not text.isascii() and utf8_problem(text) is not None:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def listed_payload(text: str, preview: int | None) -> Any:
    """A stored payload as a list shows it: decoded (:func:`readable_json`), or, past
    ``preview`` characters, a :class:`~delayq.job.PayloadPreview` of its text. A
    store that can cut the text where it reads passes the cut text and its full
    length (``chars``) instead."""
    if preview is None or len(text) <= preview:
        return readable_json(text)
    return PayloadPreview(text[:preview], len(text))


def payload_matches(
    text: str, contains: str | None, at: tuple[PayloadPath, JsonScalar] | None
) -> bool:
    """Whether a payload's stored JSON ``text`` holds ``contains`` and the value at
    the path of ``at`` (``list_jobs(payload_contains=, payload_at=)``; the rule
    the SQL stores follow: a string equals a string, a number a number, a
    boolean a boolean)."""
    if contains is not None and contains not in text:
        return False
    if at is None:
        return True
    path, wanted = at
    try:
        node: Any = json.loads(text)
    except ValueError:
        return False
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return False
        elif not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if isinstance(wanted, bool) or isinstance(node, bool):
        return isinstance(wanted, bool) and isinstance(node, bool) and node is wanted
    if isinstance(wanted, str) or isinstance(node, str):
        return isinstance(wanted, str) and isinstance(node, str) and node == wanted
    return isinstance(node, int | float) and node == wanted


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


def unstarted_expired_note(lease_until: float) -> str:
    """The note of a job whose lease ran out before its handler was recorded as
    started: due again at its own time, the attempt given back."""
    return (
        f"lease expired at {format_time(lease_until)} before the handler was recorded as "
        f"started: not an attempt; due again (the worker holding it stopped, paused or "
        f"lost the store)"
    )


def unstarted_expired_error(lease_until: float, count: int) -> str:
    """The error of a job buried after ``count`` leases ran out with no recorded start."""
    return (
        f"lease expired at {format_time(lease_until)}, the {count}th time with no recorded "
        f"start (MAX_UNSTARTED={MAX_UNSTARTED}): a job that stops its worker before it "
        f"starts? Requeue it once that is fixed"
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
    store: Any,
    batch: Sequence[Completion],
    *,
    limit: int,
    lease: float,
    names: Collection[str] | None = None,
) -> tuple[list[StaleClaim | None], list[Claim]]:
    """The default ``complete_and_claim``: ``store.complete(batch)``, then
    ``store.claim(limit=limit, lease=lease)`` (none when ``limit`` is 0), with
    ``names=`` passed on only when given (feature ``handler_filter``).

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
        claims: list[Claim] = (
            store.claim(limit=limit, lease=lease)
            if names is None
            else store.claim(limit=limit, lease=lease, names=names)
        )
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


def extend_one_by_one(
    store: Any, claims: Sequence[Claim], lease: float
) -> list[Claim | StaleClaim]:
    """The default ``extend_many``: ``store.extend`` per claim, a stale one reported
    in its slot. Records no start (a store with ``attempt_at_start`` overrides it)."""
    answers: list[Claim | StaleClaim] = []
    for claim in claims:
        try:
            answers.append(store.extend(claim, lease))
        except StaleClaim as exc:
            answers.append(exc)
    return answers


class CompletesAndClaims:
    """``complete_and_claim`` as :func:`complete_then_claim`, and ``extend_many`` as
    :func:`extend_one_by_one`, for stores that have no single round trip for them (yet)."""

    def complete_and_claim(
        self,
        batch: Sequence[Completion],
        *,
        limit: int,
        lease: float,
        names: Collection[str] | None = None,
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        return complete_then_claim(self, batch, limit=limit, lease=lease, names=names)

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        return extend_one_by_one(self, claims, check_lease(lease))


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


MAX_QUEUE_NAME = 200
"""The longest queue name (characters): RabbitMQ names are at most 255 bytes,
and the store adds a prefix and a suffix to it."""

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_:-]+(?:\.[A-Za-z0-9_:-]+)*")


def check_queue_name(queue: object) -> str:
    """``queue`` if every store can keep it as a queue name, else :class:`InvalidOption`.

    1-200 characters of ASCII letters, digits, ``_``, ``-`` and ``:``, in
    words joined by single dots. The narrowest store sets the rule so a name
    moves between stores: RabbitMQ routes on it (dots split the words of a
    topic routing key; ``*`` and ``#`` are its wildcards), Redis puts it in a
    ``{hash tag}`` (no braces), and plain ASCII keeps the byte length of every
    protocol's limit equal to the character count.
    """
    if (
        not isinstance(queue, str)
        or len(queue) > MAX_QUEUE_NAME
        or not _QUEUE_NAME.fullmatch(queue)
    ):
        raise InvalidOption(
            f"queue must be 1-{MAX_QUEUE_NAME} characters of letters, digits, '_', '-' and ':' "
            f"in words joined by single dots, got {queue!r}"
        )
    return queue


def conflict_error(job_id: str, state: str, on_conflict: str, *, note: str = "") -> JobConflict:
    """The ONE message of an enqueue that ``on_conflict`` refuses: ``state`` is
    the stored job's state (its value), ``note`` is added at the end."""
    if state == JobState.RUNNING and on_conflict == "replace":
        return JobConflict(
            f"job {job_id!r} is running and cannot be replaced; "
            f"cancel is not possible either: wait for it to finish{note}"
        )
    return JobConflict(
        f"job {job_id!r} already exists ({state}); pass "
        f"on_conflict='keep' or 'replace' to accept an existing id{note}"
    )


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_Spec = TypeVar("_Spec", bound=_HasId)


def resolve_conflicts(
    specs: Sequence[_Spec], existing: Mapping[str, JobState], on_conflict: str
) -> tuple[list[EnqueueOutcome], dict[str, _Spec]]:
    """The ``on_conflict`` decision table for a whole batch, decided before anything is stored
    (``specs``: anything with an ``id``: job specs, or a RabbitMQ log record's jobs).

    ``existing`` maps the batch's ids that are stored (and not expired) to their
    state. Returns each spec's outcome and the specs to store by id, in the
    order of their last appearance (a replaced job takes its latest place:
    FIFO); an id given twice meets its earlier spec as a scheduled job.

    ==============  ===========  ===================================
    stored state    keep         reject / replace
    ==============  ===========  ===================================
    none            CREATED      CREATED
    running         KEPT         JobConflict (replace cannot either)
    any other       KEPT         JobConflict / REPLACED
    ==============  ===========  ===================================

    Raises :class:`JobConflict` (see :func:`conflict_error`) before anything is
    decided for storing, so a refused batch stores nothing.
    """
    outcomes: list[EnqueueOutcome] = []
    final: dict[str, _Spec] = {}
    for spec in specs:
        state = JobState.SCHEDULED if spec.id in final else existing.get(spec.id)
        if state is None:
            outcomes.append(EnqueueOutcome.CREATED)
        elif on_conflict == "keep":
            outcomes.append(EnqueueOutcome.KEPT)
            continue
        elif on_conflict == "reject" or state is JobState.RUNNING:
            raise conflict_error(spec.id, state, on_conflict)
        else:
            outcomes.append(EnqueueOutcome.REPLACED)
        final.pop(spec.id, None)
        final[spec.id] = spec
    return outcomes, final
