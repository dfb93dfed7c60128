"""Small builders shared by the contract tests."""

from __future__ import annotations

import json
from typing import Any

from delayq.backends.base import Backend
from delayq.job import Claim, JobSpec


def spec(
    job_id: str,
    run_at: float,
    *,
    name: str = "test.job",
    payload: Any = None,
    max_attempts: int = 3,
    created_at: float = 0.0,
) -> JobSpec:
    """A JobSpec with JSON-encoded ``payload`` (``{"id": job_id}`` by default)."""
    body = {"id": job_id} if payload is None else payload
    return JobSpec(
        id=job_id,
        name=name,
        payload=json.dumps(body),
        run_at=run_at,
        max_attempts=max_attempts,
        created_at=created_at,
    )


def started(backend: Backend, claim: Claim, lease: float) -> Claim:
    """Record that ``claim``'s handler started (a store with ``attempt_at_start``;
    others count the attempt at the claim anyway): its lease renewed to ``lease``."""
    if "attempt_at_start" not in backend.features:
        return claim
    [answer] = backend.extend_many([claim], lease, started={claim.token})
    assert isinstance(answer, Claim), answer
    return answer
