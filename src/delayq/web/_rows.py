"""What a list shows of a job: a bounded row, never the whole payload.

A list page or ``GET /api/jobs`` carries :func:`job_row` per job: the error
summary instead of the traceback, a payload preview of at most
:data:`PREVIEW_CHARS` characters (the store reads no more than that of a big
payload: ``list_jobs(preview=)``), and what an operator must notice at a glance
(a running job whose lease ran out, a scheduled job that is retrying). The
whole payload and traceback are on the job's page and ``GET /api/jobs/{id}``.
"""

from __future__ import annotations

import json
from typing import Any

from delayq._present import error_summary, iso
from delayq.job import Job, JobState, PayloadPreview

__all__ = ["PREVIEW_CHARS", "RUNNING_SCAN", "attention", "job_row", "lease_expired_for"]

PREVIEW_CHARS = 200

RUNNING_SCAN = 500
"""The most running jobs the overview reads to count expired leases (running
jobs are bounded by the workers' concurrency; past this it says "500+")."""


def payload_preview(payload: Any) -> tuple[str, int]:
    """The payload as compact JSON cut to :data:`PREVIEW_CHARS`, and its full length
    (a :class:`~delayq.job.PayloadPreview` the store cut: its text, its length)."""
    if isinstance(payload, PayloadPreview):
        return payload.text[: PREVIEW_CHARS - 1] + "…", payload.chars
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    if len(text) <= PREVIEW_CHARS:
        return text, len(text)
    return text[: PREVIEW_CHARS - 1] + "…", len(text)


def lease_expired_for(job: Job, now: float) -> float | None:
    """Seconds since a running job's lease ran out (its worker is gone or stuck:
    the next claim gives it to another worker), else None."""
    if job.state is not JobState.RUNNING or job.lease_until is None or job.lease_until > now:
        return None
    return now - job.lease_until


def job_row(job: Job, now: float) -> dict[str, Any]:
    """One job as a list shows it (JSON-ready)."""
    preview, size = payload_preview(job.payload)
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "run_at": job.run_at,
        "run_at_iso": iso(job.run_at),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "updated_at": job.updated_at,
        "lease_until": job.lease_until,
        "lease_expired_for": lease_expired_for(job, now),
        "retrying": job.state is JobState.SCHEDULED and job.attempts > 0,
        "error_summary": error_summary(job.last_error),
        "outcome": job.outcome,
        "payload_preview": preview,
        "payload_chars": size,
    }


def attention(running: list[Job], now: float) -> dict[str, Any]:
    """Running jobs whose lease expired: how many (of those read) and the oldest."""
    expired = [(lease_expired_for(j, now), j) for j in running]
    late = sorted(((age, j) for age, j in expired if age is not None), key=lambda x: -x[0])
    return {
        "expired_leases": len(late),
        "expired_leases_capped": len(running) >= RUNNING_SCAN,
        "oldest_expired_lease": None
        if not late
        else {"id": late[0][1].id, "name": late[0][1].name, "expired_for": late[0][0]},
    }
