"""Script arguments and replies: job hashes to :class:`~delayq.job.Job`, due times to text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from delayq.backends._common import RELEASED_NOTE, clip_error, readable_json
from delayq.backends.base import Completion
from delayq.codec import decode_payload
from delayq.job import Job, JobSpec, JobState

__all__ = ["completion_args", "enqueue_args", "job_of", "optional_float", "pairs", "when_arg"]


def optional_float(text: str | None) -> float | None:
    return None if text is None or text == "" else float(text)


def pairs(flat: Sequence[str]) -> dict[str, str]:
    """A flat ``[field, value, ...]`` reply (HGETALL) as a dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def when_arg(run_at: float | None, delay: float | None) -> str:
    """A due-time argument of the scripts: epoch seconds, or "+<delay>" after the server's now."""
    return repr(run_at) if delay is None else f"+{delay!r}"


COMPACT_NOTE = "payload and error text dropped past max_finished; the record is kept to result_ttl"
"""The outcome ``get`` shows for a finished record kept compact (see ``trim_finished``)."""


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
        outcome=f.get("outcome") or (COMPACT_NOTE if "compact" in f else None),
        lease_until=optional_float(f.get("lease_until")),
        key=f.get("fkey"),
        priority=int(f.get("prio", 0)),
        group=f.get("grp"),
        throttled_until=optional_float(f.get("throttled")),
        result=f.get("result"),
    )


def enqueue_args(specs: Sequence[JobSpec], on_conflict: str, *, check_only: bool) -> list[Any]:
    """The arguments of ``enqueue.lua`` for ``specs`` (see its header)."""
    # Jobs of one batch usually share name, max_attempts, backoff, misfire and
    # created_at: send each such "profile" once and 4 fields per job, half the
    # arguments to pack, send and read.
    profiles: dict[tuple[Any, ...], int] = {}
    backoffs: dict[int, str] = {}  # JSON of each backoff dict (often one shared dict)
    flow = any(s.key is not None or s.priority or s.group is not None for s in specs)
    head: list[Any] = [on_conflict, len(specs), 0, "1" if check_only else "", "1" if flow else ""]
    body: list[Any] = []
    for spec in specs:
        backoff = backoffs.get(id(spec.backoff))
        if backoff is None:
            backoff = backoffs[id(spec.backoff)] = json.dumps(spec.backoff, separators=(",", ":"))
        key = (spec.name, spec.max_attempts, backoff, spec.misfire, spec.created_at)
        profile = profiles.get(key)
        if profile is None:
            profile = profiles[key] = len(profiles) + 1
            head += (
                spec.name,
                spec.max_attempts,
                backoff,
                spec.misfire,
                repr(float(spec.created_at)),
            )
        # A relative delay is due on the server's clock ("+<seconds>").
        when = repr(float(spec.run_at)) if spec.delay is None else f"+{float(spec.delay)!r}"
        body += (spec.id, spec.payload, when, profile)
        if flow:
            body += (spec.key or "", str(spec.priority), spec.group or "")
    head[2] = len(profiles)
    return head + body


def completion_args(items: Sequence[Completion]) -> list[Any]:
    """The arguments of a batch of completions: n, then 5 per entry (see ``complete.lua``)."""
    args: list[Any] = [len(items)]
    for item in items:
        retrying = item.state is JobState.SCHEDULED
        text = clip_error(item.error if retrying or item.state is JobState.DEAD else item.outcome)
        tag = item.state.value
        if item.released:
            tag = "release" if item.error is None else "release_note"
            text = RELEASED_NOTE if item.error is None else clip_error(item.error)
        args += (
            item.claim.job.id,
            item.claim.token,
            tag,
            repr(item.run_at) if item.run_at is not None else (item.result or ""),
            text or "",
        )
    return args
