"""The lease keeper: renews the lease of every claim the worker holds.

A claim's lease is renewed every ``lease / 3`` seconds while the worker holds
it (ready, running, or waiting for its result to be recorded), so a long
handler keeps its job and a crashed worker's jobs come back after one lease.
The dispatcher thread calls :meth:`LeaseKeeper.renew_due` between claims.
"""

from __future__ import annotations

import logging
import math

from delayq.backends import Backend
from delayq.clock import Clock
from delayq.errors import StaleClaim
from delayq.worker._inflight import InFlightTable

__all__ = ["LeaseKeeper"]

log = logging.getLogger("delayq.worker")


class LeaseKeeper:
    """Renews due leases (see the module docstring). Holds no state of its own."""

    def __init__(self, table: InFlightTable, backend: Backend, clock: Clock, *, lease: float):
        self._table = table
        self._backend = backend
        self._clock = clock
        self._lease = lease

    def renew_due(self) -> None:
        """Renew every lease whose renewal time has come.

        A renewal the store refuses as stale marks the claim lost (logged: the
        job may run again elsewhere); a failing store is retried soon, well
        within the lease.
        """
        table = self._table
        now = self._clock.monotonic()
        with table.lock:
            due = [
                rec
                for rec in table.records.values()
                if rec.renew_at <= now and not rec.lost and not rec.abandoned
            ]
        lease = self._lease
        for rec in due:
            with rec.lock:
                with table.lock:
                    if table.records.get(rec.key) is not rec:
                        continue  # recorded meanwhile
                    claim = rec.claim
                sent = self._clock.monotonic()
                try:
                    renewed = self._backend.extend(claim, lease)
                except StaleClaim:
                    log.warning(
                        "lost the lease of job %s (%s) while holding it; "
                        "it may run again elsewhere",
                        claim.job.id,
                        claim.job.name,
                    )
                    with table.lock:
                        rec.lost = True
                        rec.renew_at = math.inf  # nothing left to renew
                    continue
                except Exception:
                    log.exception("renewing the lease of job %s failed; retrying", claim.job.id)
                    with table.lock:
                        rec.renew_at = self._clock.monotonic() + min(1.0, lease / 10)
                    continue
                with table.lock:
                    rec.claim = renewed
                    rec.lease_deadline = sent + lease
                    rec.renew_at = sent + lease / 3
