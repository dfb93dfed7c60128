"""The lease keeper: renews the lease of every claim the worker holds, on its own thread.

A claim's lease is renewed every ``lease / 3`` seconds while the worker holds
it (ready, running, or waiting for its result to be recorded), so a long
handler keeps its job and a crashed worker's jobs come back after one lease.
The keeper has a thread of its own, so a slow claim or commit never delays a
renewal, and it renews everything due in ONE ``extend_many`` call per pass
(one round trip, not one per claim).

The same call tells the store which handlers have started (stores with the
feature ``attempt_at_start``): a handler still running ``MARK_AFTER`` seconds
(at most ``lease / 10``) after its start is reported in the next pass, so a
lease that later runs out counts as an attempt; a claim that never started does
not. A handler that ends sooner needs no mark: its result says it ran.

When a lease is lost (the store refuses a renewal, or the lease ran out on
the local clock with no renewal), the claim's ``lease_lost`` event is set and
the runner is told (``on_lease_lost``), so the handler can stop or fence its
side effects.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from delayq.backends import Backend
from delayq.clock import Clock
from delayq.errors import StaleClaim
from delayq.job import Claim
from delayq.worker._inflight import InFlight, InFlightTable

__all__ = ["MARK_AFTER", "LeaseKeeper"]

log = logging.getLogger("delayq.worker")

MARK_AFTER = 1.0
"""A handler still running this long after its start (seconds; at most ``lease / 10``)
is reported to the store as started in the next renewal pass."""

ExtendMany = Callable[..., Sequence[Claim | StaleClaim]]


def _one_by_one(backend: Backend) -> ExtendMany:
    """``extend_many`` for a store object that lacks it: ``extend`` per claim."""

    def extend_many(
        claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        answers: list[Claim | StaleClaim] = []
        for claim in claims:
            try:
                answers.append(backend.extend(claim, lease))
            except StaleClaim as exc:
                answers.append(exc)
        return answers

    return extend_many


class LeaseKeeper:
    """Renews due leases on its own thread (see the module docstring).

    Its only state of its own is ``_until`` (when its thread will wake next),
    guarded by the table's lock; it waits on ``table.leases`` (same lock).
    """

    def __init__(
        self,
        table: InFlightTable,
        backend: Backend,
        clock: Clock,
        *,
        lease: float,
        name: str = "delayq-worker",
        on_lease_lost: Callable[[InFlight], None] | None = None,
    ) -> None:
        self._table = table
        self._backend = backend
        self._clock = clock
        self._lease = lease
        self._name = name
        self._on_lease_lost = on_lease_lost
        method: Any = getattr(backend, "extend_many", None)
        self._extend_many: ExtendMany = method if method is not None else _one_by_one(backend)
        self._marks = "attempt_at_start" in getattr(backend, "features", ())
        self._retry_after = min(1.0, lease / 10)
        self._thread: threading.Thread | None = None
        table.keeper_until = math.inf

    # -- the thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-leases", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        table = self._table
        clock = self._clock
        while True:
            with table.lock:
                while True:
                    if table.closed:
                        return
                    now = clock.monotonic()
                    table.beats["leases"] = now
                    deadline = self._next_deadline_locked()
                    if deadline <= now:
                        break
                    # Idle (nothing held): wait untimed, woken when claims arrive.
                    table.keeper_until = deadline
                    clock.wait_until(table.leases, None if deadline == math.inf else deadline)
                table.keeper_until = math.inf
            try:
                self.renew_due()
            except Exception:
                log.exception("delayq worker: unexpected error while renewing leases")
                with table.lock:
                    if not table.closed:
                        clock.wait(table.leases, self._retry_after)

    def _next_deadline_locked(self) -> float:
        table = self._table
        deadline = math.inf
        if self._marks and table.records:
            # Handlers that start while it sleeps are reported within two periods.
            deadline = self._clock.monotonic() + table.mark_after
        for rec in table.records.values():
            if rec.lost or rec.abandoned:
                continue
            deadline = min(deadline, rec.renew_at)
            if rec.started and not rec.done:
                if self._marks and not rec.marked and rec.mark_at < deadline:
                    deadline = rec.mark_at
                if not rec.lease_lost.is_set() and rec.lease_deadline < deadline:
                    deadline = rec.lease_deadline
        return deadline

    # -- one pass -------------------------------------------------------------------------
    def renew_due(self) -> None:
        """Renew every lease whose renewal time has come (and report started handlers),
        in one store call.

        A renewal the store refuses as stale marks the claim lost (logged: the
        job may run again elsewhere); a failing store is retried soon, well
        within the lease. A claim being recorded right now (its lock taken by
        the group commit) is skipped: its lease is renewed after, if it is
        still held.
        """
        table = self._table
        clock = self._clock
        now = clock.monotonic()
        lost_locally: list[InFlight] = []
        with table.lock:
            due: list[InFlight] = []
            for rec in table.records.values():
                if rec.lost or rec.abandoned:
                    continue
                unmarked = self._marks and rec.started and not rec.marked and not rec.done
                if rec.renew_at <= now or (unmarked and rec.mark_at <= now):
                    due.append(rec)
                if (
                    rec.started
                    and not rec.done
                    and rec.lease_deadline <= now
                    and not rec.lease_lost.is_set()
                ):
                    lost_locally.append(rec)
        for rec in lost_locally:
            log.warning(
                "job %s (%s): its lease ran out with no renewal while its handler runs; "
                "it may run again elsewhere (ctx.lease_lost is set)",
                rec.claim.job.id,
                rec.claim.job.name,
            )
            self._lose(rec)
        if not due:
            return
        held: list[InFlight] = []
        try:
            busy: list[InFlight] = []
            for rec in due:
                (held if rec.lock.acquire(blocking=False) else busy).append(rec)
            with table.lock:
                # Being recorded right now: looked at again shortly, not spun on.
                later = now + min(0.05, self._lease / 100)
                for rec in busy:
                    rec.renew_at = max(rec.renew_at, later)
                    rec.mark_at = max(rec.mark_at, later)
                live = [rec for rec in held if table.records.get(rec.key) is rec]
                claims = [rec.claim for rec in live]
                started = {
                    rec.claim.token
                    for rec in live
                    if self._marks and rec.started and not rec.marked and not rec.done
                }
                if claims:
                    table.stuck_call["leases"] = clock.monotonic()
            if not claims:
                return
            sent = clock.monotonic()
            try:
                if started:
                    answers = self._extend_many(claims, self._lease, started=started)
                else:
                    answers = self._extend_many(claims, self._lease)
                if len(answers) != len(claims):
                    raise ValueError(
                        f"extend_many answered {len(answers)} times for {len(claims)} claims"
                    )
            except Exception:
                log.exception(
                    "renewing %d lease(s) failed; retrying in %.1fs",
                    len(claims),
                    self._retry_after,
                )
                with table.lock:
                    table.stuck_call.pop("leases", None)
                    retry = clock.monotonic() + self._retry_after
                    for rec in live:
                        rec.renew_at = min(rec.renew_at, retry) if rec.renew_at > now else retry
                        rec.mark_at = max(rec.mark_at, retry)
                return
            lease = self._lease
            lost: list[InFlight] = []
            with table.lock:
                table.stuck_call.pop("leases", None)
                for rec, answer in zip(live, answers, strict=True):
                    if isinstance(answer, StaleClaim):
                        rec.lost = True
                        rec.renew_at = math.inf  # nothing left to renew
                        lost.append(rec)
                        continue
                    if rec.claim.token in started:
                        rec.marked = True
                    rec.claim = answer
                    rec.lease_deadline = sent + lease
                    rec.renew_at = sent + lease / 3
        finally:
            for rec in held:
                rec.lock.release()
        for rec in lost:
            log.warning(
                "lost the lease of job %s (%s) while holding it; it may run again elsewhere",
                rec.claim.job.id,
                rec.claim.job.name,
            )
            self._lose(rec)

    def _lose(self, rec: InFlight) -> None:
        rec.lease_lost.set()
        if self._on_lease_lost is not None:
            try:
                self._on_lease_lost(rec)
            except Exception:
                log.exception("delayq worker: unexpected error handling a lost lease")
