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
* **Expired leases come back.** A RUNNING job whose lease passed is returned to
  the due set by the next ``claim`` (so a crashed worker's job runs again), or,
  when it has used all ``max_attempts``, buried with an error saying so.
* **Nothing lost.** A job whose ``enqueue`` returned is stored durably (as the
  store's durability setting allows) and ends SUCCEEDED, SKIPPED, CANCELLED or
  DEAD with its last error.
* **Order.** Claims come in ``run_at`` order, ties in enqueue order (FIFO).
* **Definite answers.** ``cancel`` and ``reschedule`` report what happened.
* **Finished records** are kept for ``result_ttl`` seconds (a backend option) so
  ``get`` and ``cancel`` can say "finished"; dead letters stay until purged or
  requeued.
* **No polling interval.** ``wait_for_due`` sleeps until the next due time (or
  lease expiry) and returns early when an earlier job is enqueued, rescheduled
  or requeued (at once in the same process; across processes as fast as the
  store allows), or when ``interrupt`` is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

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

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """A durable store of delayed jobs. See the module docstring for the rules."""

    url: str
    """The URL this backend was opened with (credentials masked)."""

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
        """
        ...

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a scheduled job; otherwise say why not."""
        ...

    def reschedule(self, job_id: str, run_at: float) -> RescheduleOutcome:
        """Move a scheduled job to ``run_at`` (epoch seconds)."""
        ...

    # -- workers ------------------------------------------------------------
    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        """Atomically claim up to ``limit`` due jobs for ``lease`` seconds.

        Increments each job's ``attempts``. Also returns expired leases to the
        due set first. ``now`` overrides the store's clock (tests).
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

    def extend(self, claim: Claim, lease: float) -> Claim:
        """Renew the lease to ``lease`` seconds from now; returns the updated claim."""
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
    ) -> list[Job]:
        """Jobs (optionally of one state, due in a window), in ``run_at`` order."""
        ...

    def next_due(self) -> float | None:
        """The earliest ``run_at`` of a scheduled job, or None when there is none."""
        ...

    def stats(self) -> Stats:
        """Counts by state and the next due time."""
        ...

    def dead_letters(self, *, limit: int = 100) -> list[Job]:
        """Dead jobs, most recently buried first."""
        ...

    def requeue_dead(self, job_id: str, run_at: float) -> bool:
        """Move a dead job back to SCHEDULED (attempts reset); False if not dead."""
        ...

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs (all, those listed, or buried before ``older_than``)."""
        ...

    def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...
