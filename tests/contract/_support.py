"""Small builders shared by the contract tests."""

from __future__ import annotations

import json
from typing import Any

from delayq.job import JobSpec


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
