"""The dispatcher: claims due jobs, a little ahead of free slots when a backlog exists.

One thread. It never polls: between claims it blocks in
``backend.wait_for_due``, which returns at the next due time or as soon as an
earlier job arrives, and it claims only what the worker has room for: free
handler slots, plus a small prefetch (``prefetch``) while the last claim was
full (a backlog). Prefetched claims are held under the same lease, kept
renewed, and handed back (``release``) at once when the worker stops.

While a backlog exists, on a store that records and claims in one round trip,
the group committer claims with each commit, so the dispatcher only claims
when no commit is under way;
when a freed slot is alone it waits up to ``COALESCE`` (2 ms) for a few more
to free, so one claim serves several jobs.

Prefetch never holds a job hostage: a ready claim that has waited
``ready_hold`` seconds (``min(1 s, lease / 3)``) while every slot is busy is
handed back (``release``: its place and attempt kept) for an idle worker to
take, and prefetching pauses for ``PREFETCH_PAUSE`` seconds (the handlers are
slow: claiming ahead only parks jobs here).

Between claims it also retries failed commits, waking for whichever comes
first. Leases are the lease keeper's, on its own thread. After a stop it hands
back the ready claims and drains: it waits for running handlers until they
finish or the grace period ends, then hands back what is left (see
:meth:`Dispatcher.abandon`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import cast

from delayq.backends import Backend
from delayq.backends.base import Completion, FiltersHandlers
from delayq.clock import Clock
from delayq.errors import QueueClosed
from delayq.job import Claim
from delayq.worker._commit import GroupCommitter
from delayq.worker._decide import RETURNED, Decision
from delayq.worker._inflight import InFlight, InFlightTable

__all__ = ["COALESCE", "PREFETCH_PAUSE", "STOPPED_NOTE", "Dispatcher", "ready_hold"]

log = logging.getLogger("delayq.worker")

COALESCE = 0.002
"""While more jobs are due than the worker has room for, the dispatcher waits up
to this long (seconds) for ``gather`` slots to free before claiming, so one claim
serves several jobs. Only under backlog: a job is then late anyway, by
queueing; an idle worker claims at once."""

STOPPED_NOTE = (
    "handed back: the worker stopped after its grace period while the handler still ran; "
    "the attempt was given back and the job runs again"
)
"""The note of a job whose handler the stopping worker left running past its grace."""

PREFETCH_PAUSE = 10.0
"""Seconds prefetching stays off after a prefetched claim had to be handed back."""


def ready_hold(lease: float) -> float:
    """Seconds a ready claim may wait while every slot is busy before it is handed
    back (in this process's ready claims, or queued in a child behind a running task)."""
    return min(1.0, lease / 3)


class Dispatcher:
    """The dispatcher thread's loop (see the module docstring). State lives in the table."""

    def __init__(
        self,
        table: InFlightTable,
        backend: Backend,
        clock: Clock,
        *,
        committer: GroupCommitter,
        lease: float,
        batch: int,
        gather: int,
        idle_wait: float,
        names: frozenset[str] | None = None,
    ) -> None:
        self._table = table
        self._backend = backend
        # Claims and waits, of ``names`` only when the worker serves some handlers
        # (FiltersHandlers, checked by the Worker): the store filters in its claim.
        self._claim: Callable[..., list[Claim]] = backend.claim
        self._wait: Callable[[float], None] = backend.wait_for_due
        if names is not None:
            filtered = cast("FiltersHandlers", backend)
            self._claim = functools.partial(filtered.claim, names=names)
            self._wait = functools.partial(filtered.wait_for_due, names=names)
        self._clock = clock
        self._committer = committer
        self._ready_hold = ready_hold(lease)
        self._lease = lease
        self._batch = batch
        self._gather = gather
        self._idle_wait = idle_wait

    def housekeeping(self) -> None:
        """Retry failed commits; hand back prefetched claims that waited too long."""
        table = self._table
        now = self._clock.monotonic()
        self._committer.retry_due(now)
        with table.lock:
            table.beats["dispatcher"] = now
            if table.prefetch_paused and now >= table.prefetch_resume:
                table.prefetch_paused = False
            stale = table.take_stale_ready_locked(now, self._ready_hold)
            if stale:
                table.prefetch_paused = True
                table.prefetch_resume = now + PREFETCH_PAUSE
        if stale:
            log.info(
                "handing back %d prefetched job(s) that waited %.1fs behind busy handlers %s",
                len(stale),
                self._ready_hold,
                [rec.claim.job.id for rec in stale][:10],
            )
            self._committer.finish_all(stale, RETURNED)

    def dispatch(self) -> None:
        """Claim and wait until a stop is requested or the store is closed."""
        table = self._table
        clock = self._clock
        error_pause = 0.0
        while True:
            self.housekeeping()
            with table.lock:
                if table.stopping:
                    return
                room = table.room_locked()
                busy = table.claiming or (
                    table.backlog and self._committer.combines and self._committer.flushing_locked()
                )
                if room <= 0 or busy:
                    # Full, or a commit will claim for us: wait for a change.
                    clock.wait(table.changed, self._budget_locked(self._idle_wait))
                    continue
                if table.backlog and room < self._gather:
                    # Saturated: let a few more slots free (at most COALESCE seconds)
                    # so one claim serves several jobs instead of one.
                    deadline = clock.monotonic() + COALESCE
                    while (
                        room < self._gather
                        and not table.stopping
                        and (left := deadline - clock.monotonic()) > 0
                    ):
                        clock.wait(table.changed, left)
                        room = table.room_locked()
                    if table.stopping or table.claiming or room <= 0:
                        continue
                limit = min(room, self._batch)
                table.claiming = True
            sent = clock.monotonic()
            with table.lock:
                table.stuck_call["dispatcher"] = sent
            try:
                claims = self._claim(limit=limit, lease=self._lease)
            except QueueClosed:
                with table.lock:
                    table.stuck_call.pop("dispatcher", None)
                    table.claim_failed_locked()
                self._store_closed()
                return
            except Exception:
                with table.lock:
                    table.stuck_call.pop("dispatcher", None)
                    table.claim_failed_locked()
                error_pause = min(5.0, max(0.1, error_pause * 2))
                log.exception("claim failed; trying again in %.1fs", error_pause)
                self._pause(error_pause)  # renewals go on
                continue
            full = len(claims) >= limit
            with table.lock:
                table.stuck_call.pop("dispatcher", None)
                table.add_claims_locked(claims, sent, self._lease, full=full)
            if not full:
                try:
                    self._wait(self._budget(self._idle_wait))
                except QueueClosed:
                    self._store_closed()
                    return
                except Exception:
                    # e.g. BackendUnavailable (SQLite busy timeout): like a failed
                    # claim, it must not end the worker; back off and claim again.
                    error_pause = min(5.0, max(0.1, error_pause * 2))
                    log.exception("waiting for due jobs failed; trying again in %.1fs", error_pause)
                    self._pause(error_pause)  # renewals go on
                    continue
            error_pause = 0.0

    def return_ready(self) -> None:
        """Hand back every claim whose handler has not started (a stop): at once,
        in one commit, each SCHEDULED again with its attempt given back."""
        table = self._table
        with table.lock:
            ready = list(table.ready)
            table.ready.clear()
        if ready:
            log.info("handing back %d claimed job(s) that had not started", len(ready))
            self._committer.finish_all(ready, RETURNED)

    def drain(self) -> None:
        """After a stop: retry commits (the lease keeper renews the leases) until
        every held claim is recorded or the grace period ends; then hand back
        what is left (see :meth:`_hand_back`)."""
        table = self._table
        clock = self._clock
        while True:
            self.housekeeping()
            with table.lock:
                if not table.records:
                    return
                assert table.stop_mono is not None
                left = table.stop_mono + table.grace - clock.monotonic()
                if left <= 0:
                    left_over = list(table.records.values())
                    for rec in left_over:
                        rec.abandoned = True  # a result arriving from now on is not recorded
                    unrecorded = self._committer.take_unrecorded_locked()
                    break
                clock.wait(table.changed, min(left, self._budget_locked(left)))
        self._hand_back(left_over, unrecorded)

    def _hand_back(
        self, left_over: list[InFlight], unrecorded: dict[int, tuple[Decision, float]]
    ) -> None:
        """The grace period is over: record the results that finished but were not
        recorded yet, and give back the claims whose handlers still run (their
        attempt given back: the worker stopped them, they did not fail), in one
        last store call, so nothing waits out its lease or uses an attempt."""
        completions: list[Completion] = []
        finished: list[str] = []
        running: list[str] = []
        keep = "attempt_at_start" in getattr(self._backend, "features", ())
        for rec in left_over:
            claim = rec.claim
            entry = unrecorded.get(rec.key)
            try:
                if entry is not None:
                    completions.append(entry[0].completion(claim))
                    finished.append(claim.job.id)
                elif not rec.done:
                    completions.append(
                        Completion.release(claim, note=STOPPED_NOTE)
                        if keep
                        else Completion.release(claim)
                    )
                    running.append(claim.job.id)
            except Exception:
                log.exception("job %s: cannot hand it back", claim.job.id)
        log.warning(
            "grace period over: %d job(s) still running %s are handed back (their attempt "
            "given back), %d finished result(s) not recorded yet %s are recorded now",
            len(running),
            sorted(running)[:10],
            len(finished),
            sorted(finished)[:10],
        )
        if not completions:
            return
        try:
            self._backend.complete(completions)
        except Exception:
            log.exception(
                "handing back %d job(s) at the end of the grace period failed; they run again "
                "after their leases expire",
                len(completions),
            )

    # -- helpers --------------------------------------------------------------------------
    def _budget_locked(self, cap: float) -> float:
        """Seconds the dispatcher may sleep: ``cap``, or less if something falls due."""
        table = self._table
        now = self._clock.monotonic()
        deadline = table.next_stale_ready_locked(now, self._ready_hold)
        retry = self._committer.next_retry_locked()
        if retry is not None:
            deadline = min(deadline, retry)
        if deadline == math.inf:
            return cap
        return max(0.0, min(cap, deadline - now))

    def _budget(self, cap: float) -> float:
        with self._table.lock:
            return self._budget_locked(cap)

    def _pause(self, seconds: float) -> None:
        table = self._table
        with table.lock:
            if not table.stopping:
                self._clock.wait(table.changed, self._budget_locked(seconds))

    def _store_closed(self) -> None:
        log.warning("the store %s was closed; the worker stops", self._backend.url)
        table = self._table
        with table.lock:
            table.stopping = True
            table.stop_mono = self._clock.monotonic()
            table.changed.notify_all()
