"""Script arguments and replies: job hashes to :class:`~delayq.job.Job`, due times to text."""

from __future__ import annotations

import json
from collections.abc import Sequence

from delayq.backends._common import readable_json
from delayq.codec import decode_payload
from delayq.job import Job, JobState

__all__ = ["job_of", "optional_float", "pairs", "when_arg"]


def optional_float(text: str | None) -> float | None:
    return None if text is None or text == "" else float(text)


def pairs(flat: Sequence[str]) -> dict[str, str]:
    """A flat ``[field, value, ...]`` reply (HGETALL) as a dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def when_arg(run_at: float | None, delay: float | None) -> str:
    """A due-time argument of the scripts: epoch seconds, or "+<delay>" after the server's now."""
    return repr(run_at) if delay is None else f"+{delay!r}"


def job_of(job_id: str, f: dict[str, str], *, strict: bool = False) -> Job:
    """The job of a hash's fields. ``strict`` (claim) raises on a payload or backoff
    that does not decode; otherwise (inspection) such a field is its raw text."""
    return Job(
        id=job_id,
        name=f["name"],
        payload=decode_payload(f["payload"]) if strict else readable_json(f["payload"]),
        run_at=float(f["run_at"]),
        state=JobState(f["state"]),
        attempts=int(f["attempts"]),
        max_attempts=int(f["max_attempts"]),
        backoff=json.loads(f["backoff"]) if strict else readable_json(f["backoff"]),
        misfire=f["misfire"],
        created_at=float(f["created_at"]),
        updated_at=float(f["updated_at"]),
        last_error=f.get("last_error"),
        outcome=f.get("outcome"),
        lease_until=optional_float(f.get("lease_until")),
    )
