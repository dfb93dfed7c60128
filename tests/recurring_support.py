"""A deterministic harness for recurring schedules: a fake clock and a hand-run worker loop."""

from __future__ import annotations

from dataclasses import dataclass

from delayq.app import DelayQ
from delayq.job import Claim, JobContext, JobState, Misfire
from delayq.recurring import TICK_HANDLER
from delayq.testing import FakeClock

__all__ = ["Ran", "context", "drive"]

LEASE = 30.0


@dataclass(frozen=True)
class Ran:
    """One occurrence job that ran: its id, handler, payload and due time."""

    id: str
    name: str
    payload: object
    run_at: float
    claimed_at: float


def context(claim: Claim) -> JobContext:
    job = claim.job
    return JobContext(
        id=job.id,
        name=job.name,
        attempt=claim.attempt,
        max_attempts=job.max_attempts,
        run_at=job.run_at,
        claimed_at=claim.claimed_at,
        lease_until=claim.lease_until,
        created_at=job.created_at,
    )


def drive(app: DelayQ, clock: FakeClock, until: float, *, ticks_twice: bool = False) -> list[Ran]:
    """Run every job due up to ``until`` in due order, advancing ``clock`` to each due
    time (a worker that is never late) and skipping a job by its misfire policy
    as the worker does; return the occurrence jobs that ran.

    ``ticks_twice`` runs every tick's handler twice (a tick retried after a lost
    ack, or two workers racing), which must not add occurrences.
    """
    backend = app.backend
    ran: list[Ran] = []
    while True:
        head = backend.next_due()
        if head is None or head > until:
            break
        if head > clock.time():
            clock.advance(head - clock.time())
        for claim in backend.claim(limit=100, lease=LEASE, now=clock.time()):
            job = claim.job
            if job.name == TICK_HANDLER:
                handler = app.get_handler(TICK_HANDLER)
                assert handler is not None
                for _ in range(2 if ticks_twice else 1):
                    handler.call(job.payload, context(claim))
            elif not Misfire.parse(job.misfire).should_run(claim.claimed_at - job.run_at):
                backend.ack(claim, state=JobState.SKIPPED, outcome="skipped: late")
                continue
            else:
                ran.append(Ran(job.id, job.name, job.payload, job.run_at, claim.claimed_at))
            backend.ack(claim)
    if until > clock.time():
        clock.advance(until - clock.time())
    return ran
