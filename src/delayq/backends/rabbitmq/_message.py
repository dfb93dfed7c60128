"""The RabbitMQ store's message body: one job as JSON, and its decoding on delivery.

A message carries everything a worker needs: the spec, the producer's
estimate of the due time, how many attempts started before this message was
published, how often the broker returned it unfinished (``returns``: its worker
stopped or lost its connection), the last error, ``local``, the seconds of its
delay that the levels did not hold (waited out by the worker), ``more``, what a
delay longer than one pass has left, ``instance``, a random id of this one
publication (a retry or a copy is a new one), so a worker can recognise a
returned message it is still running, and ``ver``, the job's version in the
queue's log (``_log.py``): set at enqueue, kept by every copy, new on a
reschedule, so a copy of an older version loses its start and is dropped.

The body is UTF-8 JSON (``ensure_ascii=False``): a payload of non-ASCII text
takes about its own size, not up to three times as much.
"""

from __future__ import annotations

import json
import math
import secrets
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
    returns: int = 0  # times the broker returned this job unfinished (not attempts)
    instance: str = ""  # this publication's random id (set by ``encode`` when empty)
    ver: str = ""  # the job's version in the queue's log: set at enqueue, new on reschedule

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
            ver=new_instance(),
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


def new_instance() -> str:
    return secrets.token_hex(8)


def encode(message: JobMessage) -> bytes:
    body = {
        "v": 2,
        "i": message.instance or new_instance(),
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
        "returns": message.returns,
        "ver": message.ver,
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _finite(value: object, field: str) -> float:
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ValueError(f"{field} is not a finite number: {value!r}")
    return number


def decode(body: bytes) -> JobMessage:
    """The job of a delivered message; raises ValueError/TypeError/KeyError when unreadable
    (the caller also treats any other exception of a foreign body as unreadable)."""
    data = json.loads(body)
    if not isinstance(data, dict) or data.get("v") not in (1, 2):
        raise ValueError("not a delayq job message (version 1 or 2)")
    local = _finite(data["local"], "local")
    if not 0.0 <= local <= 2.0:  # under one base level (a first-layout message: 1.024 s)
        raise ValueError(f"local wait out of range: {local!r}")
    message = JobMessage(
        id=str(data["id"]),
        name=str(data["name"]),
        payload=str(data["payload"]),
        run_at=_finite(data["run_at"], "run_at"),
        max_attempts=int(data["max_attempts"]),
        backoff=dict(data["backoff"]),
        misfire=str(data["misfire"]),
        created_at=_finite(data["created_at"], "created_at"),
        attempts=max(0, int(data["attempts"])),
        last_error=None if data["last_error"] is None else str(data["last_error"]),
        local=local,
        more=max(0.0, _finite(data.get("more", 0.0), "more")),
        returns=max(0, int(data.get("returns", 0))),
        instance=str(data.get("i", "")),
        ver=str(data.get("ver", "")),
    )
    json.loads(message.payload)  # a payload that is not JSON text is unreadable too
    return message
