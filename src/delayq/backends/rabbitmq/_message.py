"""The RabbitMQ store's message body: one job as JSON, and its decoding on delivery.

A message carries everything a worker needs (there is no other record of the
job): the spec, the producer's estimate of the due time, how many attempts
started before this message was published, the last error, and ``local``, the
seconds of its delay that the levels did not hold (waited out by the worker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from delayq.codec import decode_payload
from delayq.job import Job, JobSpec, JobState

__all__ = ["JobMessage", "decode", "encode"]

CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class JobMessage:
    """One job as it travels through the levels."""

    id: str
    name: str
    payload: str  # JSON text
    run_at: float  # the due time on the publisher's clock (an estimate for reports)
    max_attempts: int
    backoff: dict[str, Any]
    misfire: str
    created_at: float
    attempts: int = 0  # attempts started before this message was published
    last_error: str | None = None
    local: float = 0.0  # seconds to wait after delivery (the delay the levels did not hold)
    more: float = 0.0  # seconds of delay left for another pass through the levels

    @classmethod
    def from_spec(cls, spec: JobSpec, run_at: float, now: float) -> JobMessage:
        return cls(
            id=spec.id,
            name=spec.name,
            payload=spec.payload,
            run_at=run_at,
            max_attempts=spec.max_attempts,
            backoff=dict(spec.backoff),
            misfire=spec.misfire,
            created_at=spec.created_at or now,
        )

    def job(self, state: JobState, attempts: int, updated_at: float, **fields: Any) -> Job:
        """The job as a claim or a dead letter reports it (payload decoded; raises if it cannot)."""
        job = Job(
            id=self.id,
            name=self.name,
            payload=decode_payload(self.payload),
            run_at=self.run_at,
            state=state,
            attempts=attempts,
            max_attempts=self.max_attempts,
            backoff=json.loads(json.dumps(self.backoff)),
            misfire=self.misfire,
            created_at=self.created_at,
            updated_at=updated_at,
            last_error=self.last_error,
        )
        return replace(job, **fields) if fields else job


def encode(message: JobMessage) -> bytes:
    body = {
        "v": 1,
        "id": message.id,
        "name": message.name,
        "payload": message.payload,
        "run_at": message.run_at,
        "max_attempts": message.max_attempts,
        "backoff": message.backoff,
        "misfire": message.misfire,
        "created_at": message.created_at,
        "attempts": message.attempts,
        "last_error": message.last_error,
        "local": message.local,
        "more": message.more,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode(body: bytes) -> JobMessage:
    """The job of a delivered message; raises ValueError/TypeError/KeyError when unreadable."""
    data = json.loads(body)
    if not isinstance(data, dict) or data.get("v") != 1:
        raise ValueError("not a delayq job message (version 1)")
    message = JobMessage(
        id=str(data["id"]),
        name=str(data["name"]),
        payload=str(data["payload"]),
        run_at=float(data["run_at"]),
        max_attempts=int(data["max_attempts"]),
        backoff=dict(data["backoff"]),
        misfire=str(data["misfire"]),
        created_at=float(data["created_at"]),
        attempts=int(data["attempts"]),
        last_error=None if data["last_error"] is None else str(data["last_error"]),
        local=max(0.0, float(data["local"])),
        more=max(0.0, float(data.get("more", 0.0))),
    )
    json.loads(message.payload)  # a payload that is not JSON text is unreadable too
    return message
