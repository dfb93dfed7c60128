"""The backend contract: one protocol that every durable store implements.

Every store (memory, sqlite, redis, rabbitmq) passes the same contract test
suite (``tests/contract/``). The worker and the app only talk to this protocol.

Rules every implementation keeps:

* **Never early.** ``claim`` returns only jobs whose ``run_at`` is <= the
  backend's "now" (``now=`` if given, else the store's own clock; a
  distributed store uses ONE clock, the server's).
* **One live lease.** ``claim`` atomically moves due jobs to RUNNING with a lease
  and a fresh fencing token; a job is never held by two live leases.
* **Fencing.** ``ack`` / ``retry`` / ``bury`` / ``extend`` raise
  :class:`~delayq.errors.StaleClaim` when the token is no longer current.
* **Group commit.** ``complete`` finishes a batch of claims (each an ack, a
  retry or a bury: a :class:`Completion`) in ONE transaction (one fsync on
  SQLite, one script call on Redis). The batch is applied in order, as if each
  entry were the single call, except that a stale token does not raise: it is
  reported in that entry's slot of the result and the entry is skipped, while
  the others still apply. Nothing is applied when the store fails.
* **Complete, then claim.** ``complete_and_claim(batch, limit=, lease=)`` is
  ``complete(batch)`` followed by ``claim(limit=limit, lease=lease)``, in one
  transaction or script where the store allows it (a busy worker records its
  results and refills its slots in one round trip); ``limit=0`` claims nothing.
  If only the claim fails, the batch's answers are returned with no claims.
* **Expired leases come back.** A RUNNING job whose lease passed is returned to
  the due set by the next ``claim`` (so a crashed worker's job runs again), or,
  when it has used all ``max_attempts``, buried with an error saying so.
* **Nothing lost.** A job whose ``enqueue`` returned is stored durably (as the
  store's durability setting allows) and ends SUCCEEDED, SKIPPED, CANCELLED or
  DEAD with its last error.
* **Order.** Claims come in ``run_at`` order, ties in enqueue order (FIFO).
* **Definite answers.** ``cancel`` and ``reschedule`` report what happened.
* **Relative times on the store's clock.** A ``delay`` (``JobSpec.delay``,
  ``reschedule(delay=)``, ``requeue_dead(delay=)``) is added to the store's own
  "now" (the server's ``TIME`` on Redis), never to the caller's clock, so a
  producer with a skewed clock cannot make a job run early or late.
* **Checked input.** ``enqueue`` checks every spec (``_common.check_spec``:
  the payload is JSON text, the id a valid job id, ``1 <= max_attempts <=
  2**31-1``, a finite due time) and raises an
  :class:`~delayq.errors.InvalidInput` before storing anything. A stored job
  that cannot be read back anyway (a store edited by hand) is buried by
  ``claim`` with an error saying why, never handed out or left to break the
  other claims.
* **Batched renewals.** ``extend_many(claims, lease, started=)`` renews many
  leases in one round trip where the store allows it (one transaction or
  script), answering per claim like ``complete`` (a stale token is reported in
  its slot, the others still apply). The default in ``_common`` calls
  ``extend`` per claim.
* **Attempts count from the start** (feature ``attempt_at_start``). ``claim``
  counts the attempt it hands out, and ``extend_many(..., started=tokens)``
  records that those claims' handlers started. A lease that runs out with no
  recorded start is not an attempt: the attempt is given back, the job is due
  again at its own ``run_at`` (its place kept, like ``release``), and a separate
  count of such expiries buries it at ``_common.MAX_UNSTARTED`` (a job that
  kills its worker before its start is recorded cannot loop for ever). A lease
  that runs out after a recorded start is an attempt, as before. A result
  (ack, retry, bury) implies the start. A store without the feature counts
  every claim as an attempt (it ignores ``started``).
* **Release.** ``release`` gives an unstarted claim back: SCHEDULED again at its
  original ``run_at`` (so it keeps its place), the attempt it used given back,
  nothing recorded as an error.
* **Finished records** are kept for ``result_ttl`` seconds (a backend option) so
  ``get`` and ``cancel`` can say "finished"; dead letters stay until purged or
  requeued. With feature ``results`` a SUCCEEDED ack's ``Completion.result``
  (JSON text) is kept in the same record and reported as ``Job.result`` (None
  when none was given); a replace or a requeue drops it.
* **Flow control** (feature ``flow_control``, :class:`LimitStore`): ``claim``
  hands out due jobs by ``priority`` (higher first; equal priority in the
  order above), the groups of one priority in turn; it never gives a key
  more live leases than its limit's ``concurrency`` (such a job is passed
  over, the next one tried, and it is claimed once a slot frees; an expired
  lease frees its slot), and a job over its key's ``rate`` is given its next
  allowed time (``Job.throttled_until``) and waits, scheduled, until then.
  Limits are read in the claim's own atomic step, so an edit applies to the
  next claim of every handle.
* **Handler filter** (feature ``handler_filter``, :class:`FiltersHandlers`):
  ``claim``, ``complete_and_claim`` and ``wait_for_due`` take ``names=``, a set
  of handler names: the claim hands out only due jobs of those names (in the
  claim order above restricted to them), filtered in the store's own atomic
  claim step on an index by name, and leaves every other job untouched (it
  still returns expired leases of any name to the due set). The wait sleeps
  toward the earliest due time (or lease expiry) of those names only: a job of
  another name that is due, or arrives, may wake it, never keep it from
  sleeping.
* **No polling interval.** ``wait_for_due`` sleeps until the next due time (or
  lease expiry) and returns early when an earlier job is enqueued, rescheduled
  or requeued (at once in the same process; across processes as fast as the
  store allows), or when ``interrupt`` is called.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from delayq.errors import InvalidDelay, InvalidOption, StaleClaim
from delayq.flow import Limit, LimitRecord
from delayq.job import (
    CancelOutcome,
    Claim,
    EnqueueOutcome,
    Job,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    Stats,
)

__all__ = [
    "FEATURES",
    "WORKER_FORGET_AFTER",
    "Backend",
    "Completion",
    "FiltersHandlers",
    "LimitStore",
    "ReportsHealth",
    "ScheduleRecord",
    "ScheduleStore",
    "TellsFinishes",
    "WorkerBeat",
    "WorkerRegistry",
]

FEATURES: dict[str, str] = {
    "clock": "takes clock= and uses it for every time not passed as now= (tests)",
    "shared": "several handles (processes, hosts) on one store see the same jobs",
    "durable": "jobs survive closing and reopening the store (and a process crash)",
    "server_clock": "'due' is decided on one server's clock, never a worker's",
    "definite_cancel": "cancel / reschedule answer definitely, also racing a claim",
    "inspect": "get, list_jobs, stats and dead_letters see every job",
    "payload_search": (
        "list_jobs takes payload_contains= (a substring of the payload's JSON text) and "
        "payload_at=(path, value), filtered where the store reads (no payload reaches Python "
        "to be filtered)"
    ),
    "transactional_enqueue": "enqueue can join the caller's own database transaction",
    "recurring": "stores recurring schedules (cron / every)",
    "attempt_at_start": (
        "an attempt counts from its handler's recorded start: a lease that runs out "
        "unstarted gives its attempt back (bounded by MAX_UNSTARTED); release takes "
        "run_at= and note="
    ),
    "keyed": "enqueue_keyed: debounce, throttle, unique and append by key, atomically",
    "flow_control": "per-key concurrency and rate limits, priorities and fair shares, in the claim",
    "handler_filter": (
        "claim, complete_and_claim and wait_for_due take names= (FiltersHandlers): only "
        "those handlers' jobs are claimed, and the wait sleeps toward their next due time"
    ),
    "results": (
        "an ack's result (Completion.result, JSON text) is kept with the finished record "
        "for result_ttl and reported as Job.result"
    ),
}
"""The promises a store may declare in its class attribute ``features``.

Every store class declares ``features: ClassVar[frozenset[str]]`` with names
from this vocabulary; the contract suite runs every test whose features the
store declares, and the README shows one table of stores x promises.
"""

_COMPLETION_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.SKIPPED, JobState.SCHEDULED, JobState.DEAD}
)


@dataclass(frozen=True, slots=True)
class Completion:
    """How to finish one claim in a :meth:`Backend.complete` batch.

    ``state`` says which of the single calls it stands for: SUCCEEDED or
    SKIPPED is ``ack(claim, state=state, outcome=outcome)``, SCHEDULED is
    ``retry(claim, run_at, error)``, DEAD is ``bury(claim, error)``, and
    SCHEDULED with ``released=True`` is ``release(claim)`` (with ``run_at`` and
    ``error`` as its due time and note, for stores with ``attempt_at_start``). Build one with
    :meth:`ack`, :meth:`retry`, :meth:`bury` or :meth:`release`; the fields are
    checked at construction, so a bad entry never reaches the store.
    """

    claim: Claim
    state: JobState
    outcome: str | None = None  # ack: the note recorded with the job
    error: str | None = None  # retry / bury: the error recorded with the job
    run_at: float | None = None  # retry: the new due time (epoch seconds)
    released: bool = False  # release: an unstarted claim given back (state SCHEDULED)
    result: str | None = None  # a SUCCEEDED ack: the return value as JSON text, kept with it

    def __post_init__(self) -> None:
        state = self.state
        if (state is JobState.SUCCEEDED or state is JobState.SKIPPED) and (
            self.run_at is None
            and self.error is None
            and not self.released
            and (self.result is None or state is JobState.SUCCEEDED)
        ):
            return  # the common case, an ack, checked cheaply (results are hot)
        if self.result is not None and (
            self.state is not JobState.SUCCEEDED or not isinstance(self.result, str)
        ):
            raise InvalidOption(
                f"result (JSON text) is only for an ack as succeeded, got {self.result!r:.60} "
                f"with state {self.state!r}"
            )
        if self.released:
            if state is not JobState.SCHEDULED or self.outcome is not None:
                raise InvalidOption(
                    "a release is state=scheduled without an outcome; "
                    "build it with Completion.release(claim)"
                )
            if self.run_at is not None:
                due = self.run_at
                if (
                    isinstance(due, bool)
                    or not isinstance(due, int | float)
                    or not math.isfinite(due)
                ):
                    raise InvalidDelay(f"run_at must be finite epoch seconds, got {due!r}")
                object.__setattr__(self, "run_at", float(due))
            if self.error is not None and not isinstance(self.error, str):
                raise InvalidOption(f"a release's note must be a str, got {self.error!r}")
            return
        if isinstance(self.state, str) and not isinstance(self.state, JobState):
            with contextlib.suppress(ValueError):  # "succeeded" -> JobState.SUCCEEDED
                object.__setattr__(self, "state", JobState(self.state))
        if self.state not in _COMPLETION_STATES:
            raise InvalidOption(
                f"a completion's state must be succeeded, skipped (ack), scheduled (retry) or "
                f"dead (bury); got {self.state!r}"
            )
        if self.state is JobState.SCHEDULED:
            run_at = self.run_at
            if (
                isinstance(run_at, bool)
                or not isinstance(run_at, int | float)
                or not math.isfinite(run_at)
            ):
                raise InvalidDelay(f"run_at must be finite epoch seconds, got {run_at!r}")
            object.__setattr__(self, "run_at", float(run_at))
        elif self.run_at is not None:
            raise InvalidOption("run_at is only for a retry (state=scheduled)")
        if self.state in (JobState.SCHEDULED, JobState.DEAD):
            if not isinstance(self.error, str):
                raise InvalidOption(f"a retry or bury needs an error text, got {self.error!r}")
        elif self.error is not None:
            raise InvalidOption("error is only for a retry or a bury; an ack takes outcome=")

    @classmethod
    def ack(
        cls,
        claim: Claim,
        *,
        state: JobState = JobState.SUCCEEDED,
        outcome: str | None = None,
        result: str | None = None,
    ) -> Completion:
        """Finish as SUCCEEDED (or SKIPPED) with an optional note, like ``Backend.ack``;
        ``result`` (JSON text, SUCCEEDED only) is kept with the finished record by a
        store with the ``results`` feature."""
        if (
            state is not JobState.SUCCEEDED
            and state is not JobState.SKIPPED
            and state not in (JobState.SUCCEEDED, JobState.SKIPPED)
        ):
            raise InvalidOption(f"ack state must be JobState.SUCCEEDED or SKIPPED, got {state!r}")
        return cls(claim, state, outcome=outcome, result=result)

    @classmethod
    def retry(cls, claim: Claim, run_at: float, error: str) -> Completion:
        """Return to SCHEDULED at ``run_at`` with ``error``, like ``Backend.retry``."""
        return cls(claim, JobState.SCHEDULED, error=error, run_at=run_at)

    @classmethod
    def bury(cls, claim: Claim, error: str) -> Completion:
        """Move to the dead letters with ``error``, like ``Backend.bury``."""
        return cls(claim, JobState.DEAD, error=error)

    @classmethod
    def release(
        cls, claim: Claim, *, run_at: float | None = None, note: str | None = None
    ) -> Completion:
        """Give an unstarted claim back, like ``Backend.release``; with ``run_at``
        (epoch seconds) it is due then instead of at its own time, with ``note`` its
        ``last_error`` says why (a store with ``attempt_at_start`` keeps both; one
        without may ignore them)."""
        return cls(
            claim,
            JobState.SCHEDULED,
            run_at=run_at,
            error=note,
            released=True,
        )

    @staticmethod
    def batch(entries: Sequence[Completion]) -> list[Completion]:
        """``entries`` as a list, each checked to be a Completion (for implementations)."""
        items = list(entries)
        for i, item in enumerate(items):
            if not isinstance(item, Completion):
                raise InvalidOption(
                    f"complete() takes Completion entries (Completion.ack / retry / bury); "
                    f"entry {i} is a {type(item).__name__}"
                )
        return items


@runtime_checkable
class Backend(Protocol):
    """A durable store of delayed jobs. See the module docstring for the rules."""

    url: str
    """The URL this backend was opened with (credentials masked)."""

    features: frozenset[str]
    """The promises this store keeps (names from :data:`FEATURES`)."""

    # -- producers ----------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """Store ``jobs`` atomically (all or none), one outcome per job.

        A job id is unique in the queue. With ``on_conflict="reject"`` an existing
        id raises :class:`~delayq.errors.JobConflict` and nothing is stored;
        ``"keep"`` leaves the existing job alone; ``"replace"`` overwrites a
        scheduled or finished job (attempts reset) and raises ``JobConflict`` for
        a running one. Wakes waiting workers if a job became the earliest.

        A spec with ``delay`` is due at the store's "now" plus ``delay``. Every
        spec is checked first (``_common.check_spec``); a bad one raises an
        :class:`~delayq.errors.InvalidInput` and nothing is stored.
        """
        ...

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a scheduled job; otherwise say why not."""
        ...

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        """Move a scheduled job to ``run_at`` (epoch seconds) or to ``delay``
        seconds after the store's "now" (exactly one of the two)."""
        ...

    # -- workers ------------------------------------------------------------
    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        """Atomically claim up to ``limit`` due jobs for ``lease`` seconds.

        Increments each job's ``attempts``. Also returns expired leases to the
        due set first. ``now`` overrides the store's clock, for tests only: a store
        opened with a test clock (``clock=FakeClock()``) takes it, a store on the
        real clock refuses it with InvalidOption (a later "now" would claim jobs
        before they are due).
        """
        ...

    def ack(
        self, claim: Claim, *, state: JobState = JobState.SUCCEEDED, outcome: str | None = None
    ) -> None:
        """Finish a claimed job as SUCCEEDED (or SKIPPED), with an optional note."""
        ...

    def retry(self, claim: Claim, run_at: float, error: str) -> None:
        """Return a claimed job to SCHEDULED at ``run_at``, recording ``error``."""
        ...

    def bury(self, claim: Claim, error: str) -> None:
        """Move a claimed job to the dead-letter set with ``error``."""
        ...

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Finish every claim of ``batch`` in one transaction (group commit).

        Returns one entry per completion, in order: None when it was applied, or
        the :class:`~delayq.errors.StaleClaim` its single call would have raised
        (that entry is skipped; the rest still apply). A store failure raises and
        applies nothing. Retries wake waiting workers like :meth:`retry`. An
        empty batch does nothing.
        """
        ...

    def complete_and_claim(
        self, batch: Sequence[Completion], *, limit: int, lease: float
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        """``complete(batch)`` then ``claim(limit=limit, lease=lease)``, as one
        transaction / script where the store allows it; ``limit=0`` claims nothing.

        Returns ``(complete's answers, claims)``. A failure of the whole call
        raises and applies nothing; a store that makes two calls of it
        (``_common.complete_then_claim``) returns the answers with no claims
        when only the claim failed, so applied completions are never reported
        as failed.
        """
        ...

    def release(self, claim: Claim) -> None:
        """Give back a claim whose handler never started (a stopping worker).

        The job is SCHEDULED again at its original ``run_at``, so it keeps its
        place in the due order, and the attempt the claim took is given back
        (``attempts`` decremented): a ``max_attempts=1`` job still gets its one
        run. No backoff applies; ``last_error`` holds a note saying it was
        returned unstarted (it is not counted as a failure). Lateness
        (and so the misfire policy) is measured from the original ``run_at``
        as if the job had never been claimed: a job that is overdue when it is
        finally run counts as overdue by the whole wait, the same as when no
        worker had been there. Raises
        :class:`~delayq.errors.StaleClaim` like ``ack``. Also a
        :meth:`Completion.release` entry of ``complete``.
        """
        ...

    def extend(self, claim: Claim, lease: float) -> Claim:
        """Renew the lease to ``lease`` seconds from now; returns the updated claim."""
        ...

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        """Renew every lease of ``claims`` to ``lease`` seconds from now, in one round
        trip where the store allows it, and record that the handlers of the claims
        whose token is in ``started`` have started (feature ``attempt_at_start``;
        a store without it ignores ``started``).

        One answer per claim, in order: the renewed claim, or the
        :class:`~delayq.errors.StaleClaim` that its ``extend`` would have raised
        (that entry changes nothing; the others still apply). A store failure
        raises. An empty list does nothing.
        """
        ...

    def wait_for_due(self, max_wait: float) -> None:
        """Block until a job may be claimable, an earlier job arrives, ``interrupt``
        is called, or ``max_wait`` seconds pass."""
        ...

    def interrupt(self) -> None:
        """Wake every thread of this process blocked in ``wait_for_due``."""
        ...

    # -- inspection and dead letters ----------------------------------------
    def get(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        ...

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
        payload_contains: str | None = None,
        payload_at: tuple[str, object] | None = None,
    ) -> list[Job]:
        """Jobs (optionally of one state, handler ``name``, due in ``due_after <=
        run_at < due_before``), in ``run_at`` order, ties in enqueue order.

        ``preview`` (characters): a payload whose JSON text is longer comes back
        as a :class:`~delayq.job.PayloadPreview` (its first ``preview`` characters
        and its length), cut where the store reads when it can: a list of big
        payloads stays small (``get`` has the whole payload).

        With ``payload_search`` in ``features``: ``payload_contains`` keeps the
        jobs whose payload's JSON text holds that substring, and ``payload_at=(path,
        value)`` those holding ``value`` (a JSON string, number or boolean; a
        string matches a string only) at ``path`` (``$.customer.id``,
        ``items[0].sku``). These filter the rows the other filters select (a
        walk of them, no index): narrow by state, name or due window on a big
        store. Other stores take neither (the app refuses with
        :class:`~delayq.errors.Unsupported`).

        ``after`` is a keyset cursor, ``(run_at, id)`` of the last job of the
        previous page: the page starts just after that job in the same order, so
        pages cost the same however deep (a store walks its due-order index from
        the cursor, never counts or skips rows). When that job no longer exists
        the page starts at the first job due at ``run_at``: a page may repeat a
        job after concurrent changes, never skip one.
        """
        ...

    def next_due(self) -> float | None:
        """The earliest ``run_at`` of a scheduled job, or None when there is none."""
        ...

    def stats(self) -> Stats:
        """Counts by state and the next due time."""
        ...

    def dead_letters(self, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        """Dead jobs, most recently buried first (``preview`` as in :meth:`list_jobs`)."""
        ...

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        """Move a dead job back to SCHEDULED (attempts reset) at ``run_at`` or
        ``delay`` seconds after the store's "now" (exactly one); False if not dead."""
        ...

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs (all, those listed, or buried before ``older_than``)."""
        ...

    def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A stored recurring schedule: its name, its definition (JSON text, read by
    :mod:`delayq.recurring`; the store never looks inside) and its version (1 when
    created, one more on every write), for compare-and-set edits."""

    name: str
    data: str
    version: int


@runtime_checkable
class FiltersHandlers(Protocol):
    """A store whose claims can serve a subset of a queue's handlers (feature
    ``handler_filter``; see the module docstring). ``names=None`` is the plain
    call; an empty set is refused (``InvalidOption``). A worker started with
    ``handlers=`` makes every claim and wait through these."""

    def claim(
        self,
        *,
        limit: int,
        lease: float,
        now: float | None = None,
        names: Collection[str] | None = None,
    ) -> list[Claim]: ...

    def complete_and_claim(
        self,
        batch: Sequence[Completion],
        *,
        limit: int,
        lease: float,
        names: Collection[str] | None = None,
    ) -> tuple[list[StaleClaim | None], list[Claim]]: ...

    def wait_for_due(self, max_wait: float, *, names: Collection[str] | None = None) -> None: ...


@runtime_checkable
class ReportsHealth(Protocol):
    """The optional store capability of reporting parts that can fail unseen.

    A store that runs parts of its own beside the caller's threads (RabbitMQ's
    consumer thread) says how they are; the worker puts the answer in its health
    snapshot. ``alive`` False means the store cannot deliver jobs now.
    """

    def health(self) -> dict[str, object]:
        """A small mapping of facts, ``alive`` (bool) among them; cheap to call."""
        ...


@runtime_checkable
class TellsFinishes(Protocol):
    """The optional store capability of telling this process that jobs finished in
    another one (SQLite: datagrams beside its wake sockets; Redis: pub/sub).

    ``DelayQ.result`` calls :meth:`listen_for_finishes` before it waits; the store
    then calls ``on_finished(job_ids)`` (on a thread of its own) for jobs other
    processes finished with a stored result, so a waiter wakes at once instead of
    at its next read. Best effort: a lost notice costs a waiter its pause.
    """

    def listen_for_finishes(self, on_finished: Callable[[list[str]], None]) -> bool:
        """Start hearing finishes (once; later calls return at once). False when
        this store cannot tell them here."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """A worker's last heartbeat: its id, what it said about itself (JSON text,
    read by :mod:`delayq.observe.workers`; the store never looks inside) and when
    the store received it (the store's clock, epoch seconds)."""

    worker_id: str
    data: str
    seen: float


@runtime_checkable
class WorkerRegistry(Protocol):
    """The optional store capability of keeping workers' heartbeats.

    Each worker writes one small record every few seconds (a write as cheap as
    an ack); the dashboard and ``delayq workers`` list them, so "which workers
    are alive, and what do they hold" is answered from the store every process
    shares. Records not renewed for :data:`WORKER_FORGET_AFTER` are dropped.
    """

    def beat_worker(self, worker_id: str, data: str) -> None:
        """Store (or replace) ``worker_id``'s record, stamped with the store's now."""
        ...

    def list_workers(self) -> list[WorkerBeat]:
        """Every worker record, most recently seen first."""
        ...

    def forget_worker(self, worker_id: str) -> None:
        """Delete ``worker_id``'s record (a worker that stops cleanly)."""
        ...


WORKER_FORGET_AFTER = 86400.0
"""Seconds after which a worker's record that was not renewed is dropped."""


@runtime_checkable
class ScheduleStore(Protocol):
    """The optional store capability behind recurring jobs (feature ``recurring``).

    A store that declares ``recurring`` in ``features`` keeps schedule records
    next to its jobs (same file, same Redis hash tag), so they survive restarts
    and every process sees every edit. Writes are compare-and-set on the
    record's version, so two editors never silently overwrite each other.
    """

    def put_schedule(self, name: str, data: str, *, version: int) -> int | None:
        """Store ``data`` under ``name`` if the stored version is ``version`` (0: no
        record yet). Returns the new version, or None (nothing written) on a mismatch."""
        ...

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        """The record stored under ``name``, or None."""
        ...

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every record, by name."""
        ...

    def delete_schedule(self, name: str, *, version: int | None = None) -> bool:
        """Delete the record (only at ``version`` when given); False when nothing was deleted."""
        ...


@runtime_checkable
class LimitStore(Protocol):
    """The store capability behind flow control (feature ``flow_control``).

    Limits (:class:`~delayq.flow.Limit`) are records next to the jobs, keyed by
    their pattern; every handle's next claim applies an edit. Writes are
    compare-and-set on the record's version, like schedule records.
    """

    def put_limit(self, limit: Limit, *, version: int) -> int | None:
        """Store ``limit`` under its pattern if the stored version is ``version``
        (0: no record yet). Returns the new version, or None on a mismatch."""
        ...

    def get_limit(self, pattern: str) -> LimitRecord | None:
        """The record stored under ``pattern``, or None."""
        ...

    def list_limits(self) -> list[LimitRecord]:
        """Every record, by pattern."""
        ...

    def delete_limit(self, pattern: str, *, version: int | None = None) -> bool:
        """Delete the record (only at ``version`` when given); False when nothing was deleted."""
        ...
