"""The group committer: records finished attempts in batches, and claims with them.

A handler thread whose attempt ended appends its result to a buffer; the first
thread to find no commit in progress becomes the flusher and records
everything buffered with ONE store call (one transaction, so one fsync on
SQLite FULL; one script call on Redis), repeating until the buffer is empty,
while the others only append and move on. Nothing waits on purpose: a batch
holds what finished while the previous one was being committed, one job when
idle, many under load.

While a backlog exists (the last claim was full) and the store does both in
one round trip (it overrides ``complete_and_claim``), the flusher also claims
the next jobs in the same call, as many as the worker has room for, so under
load one round trip both records results and refills the slots. With the
default two-call version the dispatcher claims instead, in parallel with the
commit.

A commit the store refuses (unreachable, busy) is not dropped: the claims
stay in flight, their leases kept renewed, and the commit is retried with a
growing pause, so a result (a dead letter's real error above all) is not
lost to a later "lease expired".
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from delayq.backends import Backend, combines_complete_and_claim
from delayq.backends.base import Completion, FiltersHandlers
from delayq.clock import Clock
from delayq.errors import BackendError, BackendUnavailable, StaleClaim
from delayq.job import Claim
from delayq.results import FINISHED_OUTCOMES, finished_jobs
from delayq.worker._decide import Decision, JobResult, Outcome
from delayq.worker._inflight import InFlight, InFlightTable

__all__ = ["GroupCommitter"]

log = logging.getLogger("delayq.worker")

_FIRST_PAUSE = 0.1
_MAX_PAUSE = 5.0

SPLIT_AFTER = 3
"""Failed commits of a result before it is tried alone: a result the store refuses
for what it is (not for being unreachable) must not hold its slot, nor the
results batched with it, for ever."""


@dataclass(eq=False, slots=True)
class _Finished:
    """A decided attempt waiting in the group-commit buffer."""

    rec: InFlight
    decision: Decision
    duration: float
    failures: int = 0  # commits of it that failed


class GroupCommitter:
    """Records decided attempts (see the module docstring).

    Its buffer and retry state live in the in-flight table's lock:
    ``_finished`` (the buffer), ``_flushing`` (a thread is committing),
    ``_failed`` / ``_retry_mono`` / ``_pause`` (commits to try again).
    """

    def __init__(
        self,
        table: InFlightTable,
        backend: Backend,
        clock: Clock,
        *,
        lease: float,
        batch: int,
        gather: int,
        on_result: Callable[[JobResult], None] | None,
        names: frozenset[str] | None = None,
    ) -> None:
        self._table = table
        self._backend = backend
        self._clock = clock
        self._lease = lease
        self._batch = batch
        self._gather = gather
        self._on_result = on_result
        self._finishes = finished_jobs(backend)  # wakes result() waiters of this process
        # Claiming with a commit pays only when the store does both in one round
        # trip; the default (complete, then claim) would only serialise the two
        # calls that the dispatcher otherwise makes in parallel with the commit.
        self.combines = combines_complete_and_claim(backend)
        self._complete_and_claim = backend.complete_and_claim if self.combines else None
        if self._complete_and_claim is not None and names is not None:
            # A worker serving some handlers (FiltersHandlers, checked by the Worker).
            self._complete_and_claim = functools.partial(
                cast("FiltersHandlers", backend).complete_and_claim, names=names
            )
        self._finished: list[_Finished] = []
        self._flushing = False
        # When the flusher's store call began (monotonic; None outside one) and what it
        # records: written by the flusher alone (plain assignments), read for health.
        self.call_started: float | None = None
        self._in_call: list[_Finished] = []
        self._failed: list[_Finished] = []
        self._retry_mono = 0.0
        self._pause = 0.0

    # -- handing results in ---------------------------------------------------------------
    def finish(
        self,
        rec: InFlight,
        decision: Decision,
        duration: float = 0.0,
        *,
        handler_slot: bool = False,
        timed_out: bool = False,
        hold: bool = False,
    ) -> bool:
        """Hand ``rec``'s decided attempt to the group commit.

        The first decision for a claim wins: False (and nothing done) when the
        attempt was already decided (a handler finishing after its timeout: its
        result is fenced) or abandoned. ``handler_slot`` frees the handler
        slot the attempt held. ``timed_out``: the handler goes on running
        (abandoned work, until :meth:`body_ended`); with ``hold`` its decision
        (a retry) is recorded only then, so a retry never runs beside it.
        """
        table = self._table
        with table.lock:
            if rec.done or rec.abandoned:
                return False
            rec.done = True
            if handler_slot:
                table.running -= 1
                # A ready claim may start now. A handler thread that only appends
                # below comes back for it itself; wake another when this one
                # is about to commit (or is not a handler thread: a timeout).
                if table.ready and (timed_out or not self._flushing):
                    table.work.notify()
            if timed_out:
                table.stats.timeouts += 1
                rec.body_alive = True
                table.abandoned += 1
            if hold:
                rec.held = _Finished(rec, decision, duration)
                table.holding += 1
                table.changed.notify_all()  # its slot is free for a claim
                return True
            self._finished.append(_Finished(rec, decision, duration))
            if self._flushing:
                return True  # the thread flushing now commits it in its next round
            self._flushing = True
            batch, self._finished = self._finished, []
        self._flush(batch)
        return True

    def body_ended(self, rec: InFlight) -> None:
        """The handler of a timed-out attempt really ended: it is no longer
        abandoned work, and a decision held for it is recorded now."""
        table = self._table
        with table.lock:
            if not rec.body_alive:
                return
            rec.body_alive = False
            table.abandoned -= 1
            entry = rec.held
            rec.held = None
            if isinstance(entry, _Finished):
                table.holding -= 1
            table.changed.notify_all()  # under the cap again: claiming may go on
            if not isinstance(entry, _Finished) or rec.abandoned:
                return
            self._finished.append(entry)
            if self._flushing:
                return
            self._flushing = True
            batch, self._finished = self._finished, []
        self._flush(batch)

    def finish_all(self, recs: Sequence[InFlight], decision: Decision) -> None:
        """Hand many unstarted claims to one commit with the same decision (a release)."""
        table = self._table
        with table.lock:
            for rec in recs:
                if not (rec.done or rec.abandoned):
                    rec.done = True
                    self._finished.append(_Finished(rec, decision, 0.0))
            if self._flushing or not self._finished:
                return
            self._flushing = True
            batch, self._finished = self._finished, []
        self._flush(batch)

    def retry_due(self, now: float) -> None:
        """Commit again the results whose earlier commit failed, once their pause is over."""
        table = self._table
        with table.lock:
            if not self._failed or now < self._retry_mono:
                return
            retry = [f for f in self._failed if not f.rec.abandoned]
            self._failed = []
            alone = [f for f in retry if f.failures >= SPLIT_AFTER]
            self._finished.extend(f for f in retry if f.failures < SPLIT_AFTER)
            batch: list[_Finished] = []
            if not self._flushing and self._finished:
                self._flushing = True
                batch, self._finished = self._finished, []
        for entry in alone:
            self._commit_alone(entry)
        if batch:
            self._flush(batch)

    def _commit_alone(self, entry: _Finished) -> None:
        """Record one result that failed in ``SPLIT_AFTER`` batches, on its own.

        A store that is unreachable (``BackendUnavailable``) gets it back for a
        later retry; one that refuses this very entry (any other error) gets it
        dead-lettered with the store's error instead, so the job ends with a
        reason rather than being retried for ever; if even that is refused, the
        claim is given up (its lease runs out and the job runs again).
        """
        table = self._table
        rec = entry.rec
        outcome: Outcome
        claim = rec.claim
        with rec.lock:
            with table.lock:
                if rec.abandoned or table.records.get(rec.key) is not rec:
                    return
                claim = rec.claim
            try:
                [stale] = self._backend.complete([entry.decision.completion(claim)])
                outcome = entry.decision.outcome if stale is None else "stale"
            except BackendUnavailable:
                with table.lock:
                    entry.failures += 1
                    self._failed.append(entry)
                    self._retry_mono = self._clock.monotonic() + max(self._pause, _FIRST_PAUSE)
                return
            except Exception as exc:
                # Only the store's answer, quoted: the refused text itself may be the trouble.
                refused = ascii(f"{type(exc).__name__}: {exc}")[:2000]
                error = (
                    f"the store refused to record this attempt's result "
                    f"({entry.decision.outcome}) {SPLIT_AFTER + 1} times, the last time alone: "
                    f"{refused}; dead-lettered instead"
                )
                log.error(
                    "job %s (%s): the store refuses its result, dead-lettering it: %s",
                    claim.job.id,
                    claim.job.name,
                    refused,
                )
                entry.decision = Decision("dead", error=error)
                try:
                    [stale] = self._backend.complete([Completion.bury(claim, error)])
                    outcome = "dead" if stale is None else "stale"
                except Exception:
                    log.exception(
                        "job %s (%s): the store refuses its dead letter too; giving the claim "
                        "up (the job runs again after its lease)",
                        claim.job.id,
                        claim.job.name,
                    )
                    outcome = "error"
        with table.lock:
            if table.records.pop(rec.key, None) is not None:
                table.stats.counts[outcome if outcome != "error" else "errors"] += 1
                if rec.started:
                    table.stats.duration.add(entry.duration)
            table.changed.notify_all()
        if outcome in FINISHED_OUTCOMES:
            self._finishes.notify([claim.job.id])
        if self._on_result is not None:
            self._report(entry, claim, outcome)

    def take_unrecorded_locked(self) -> dict[int, tuple[Decision, float]]:
        """Take every decided result not recorded yet and not being recorded now
        (buffered, failed, or held for an abandoned handler): record key ->
        (decision, duration). For a worker that exits now."""
        taken: dict[int, tuple[Decision, float]] = {}
        for entry in [*self._finished, *self._failed]:
            taken[entry.rec.key] = (entry.decision, entry.duration)
        self._finished, self._failed = [], []
        for rec in self._table.records.values():
            held = rec.held
            if isinstance(held, _Finished):
                taken[rec.key] = (held.decision, held.duration)
        return taken

    def oldest_waiting_locked(self) -> float | None:
        """When (monotonic) the oldest decided result waiting for the committer was
        decided: buffered, failed, or in the call under way; None when there is none.
        A result held for a handler that runs on past its timeout waits for that
        handler, not for the committer: it is not counted."""
        entries = [*self._finished, *self._failed, *self._in_call]
        return min(
            (
                e.rec.started_mono + e.duration if e.rec.started else e.rec.mono_claimed
                for e in entries
            ),
            default=None,
        )

    def flushing_locked(self) -> bool:
        """True while a commit is under way or results wait for one."""
        return self._flushing or bool(self._finished)

    def next_retry_locked(self) -> float | None:
        """When failed commits are due again (monotonic), or None."""
        return self._retry_mono if self._failed else None

    # -- committing -----------------------------------------------------------------------
    def _flush(self, batch: list[_Finished]) -> None:
        while batch:
            try:
                batch = self._commit(batch)
            except BaseException:
                # A bug in the worker: free the slots so nothing is stuck (the
                # leases run out and the jobs run again), then report it.
                table = self._table
                with table.lock:
                    for item in batch:
                        if table.records.pop(item.rec.key, None) is not None:
                            table.stats.counts["errors"] += 1
                    following, self._finished = self._finished, []
                    if not following:
                        self._flushing = False
                    table.changed.notify_all()
                log.exception("delayq worker: unexpected error while recording results")
                batch = following

    def _commit(self, batch: list[_Finished]) -> list[_Finished]:
        """Record ``batch`` in one store call (claiming too when a backlog exists),
        free the slots, report the results. Returns the next batch: what was
        buffered meanwhile (empty when this thread is no longer the flusher)."""
        table = self._table
        reports: list[tuple[_Finished, Claim, Outcome]] = []
        # Each claim's lock keeps its lease renewal out while it is being finished.
        locks = [entry.rec.lock for entry in batch]
        for lock in locks:
            lock.acquire()
        try:
            limit = 0
            with table.lock:
                room_before = table.room_locked()
                live = [(e, e.rec.claim) for e in batch if not e.rec.abandoned]
                if self.combines and table.backlog and not table.claiming and not table.stopping:
                    room = min(self._batch, table.room_locked() + len(live))
                    if room >= self._gather:
                        limit = room
                        table.claiming = True
            if len(live) < len(batch):
                for entry in batch:
                    if entry.rec.abandoned:
                        log.warning(
                            "job %s finished after the grace period; not recording it",
                            entry.rec.claim.job.id,
                        )
            completions: list[Completion] = []
            sent: list[tuple[_Finished, Claim]] = []
            for entry, claim in live:
                try:
                    completions.append(entry.decision.completion(claim))
                except Exception:
                    log.exception(
                        "job %s (%s): cannot record %r; it runs again after its lease",
                        claim.job.id,
                        claim.job.name,
                        entry.decision.outcome,
                    )
                    reports.append((entry, claim, "error"))
                else:
                    sent.append((entry, claim))
            claims: list[Claim] = []
            answers: list[StaleClaim | None] = []
            failure: Exception | None = None
            mono_sent = self._clock.monotonic()
            self._in_call = [entry for entry, _ in sent]
            self.call_started = mono_sent
            try:
                if limit:
                    assert self._complete_and_claim is not None
                    answers, claims = self._complete_and_claim(
                        completions, limit=limit, lease=self._lease
                    )
                elif completions:
                    answers = self._backend.complete(completions)
                if len(answers) != len(completions):
                    raise BackendError(
                        f"the store answered {len(answers)} results for "
                        f"{len(completions)} completions"
                    )
            except Exception as exc:
                failure = exc
                claims = []
            finally:
                self.call_started = None
                self._in_call = []
            failed = failure is not None
            pause = 0.0
            with table.lock:
                if limit:
                    if failed:
                        table.claim_failed_locked()
                    else:
                        table.add_claims_locked(
                            claims, mono_sent, self._lease, full=len(claims) >= limit
                        )
                counts = table.stats.counts
                durations = table.stats.duration
                if failed:
                    self._pause = min(_MAX_PAUSE, max(_FIRST_PAUSE, self._pause * 2))
                    self._retry_mono = self._clock.monotonic() + self._pause
                    for entry, _ in sent:
                        entry.failures += 1
                    self._failed.extend(entry for entry, _ in sent)
                    counts["errors"] += len(sent)
                    pause = self._pause
                else:
                    self._pause = 0.0
                    for (entry, claim), stale in zip(sent, answers, strict=True):
                        reports.append(
                            (entry, claim, entry.decision.outcome if stale is None else "stale")
                        )
                for entry, _, outcome in reports:
                    table.records.pop(entry.rec.key, None)
                    counts[outcome if outcome != "error" else "errors"] += 1
                    if entry.rec.started:
                        durations.add(entry.duration)
                following, self._finished = self._finished, []
                if not following:
                    self._flushing = False
                room = table.room_locked()
                if (
                    limit
                    or failed
                    or not table.records
                    or room_before < 1 <= room
                    or room_before < self._gather <= room
                    or (self.combines and not following)
                ):
                    # Only the changes the dispatcher waits for (see Dispatcher.dispatch):
                    # waking it after every commit would cost a thread switch per job.
                    table.changed.notify_all()
        finally:
            for lock in locks:
                lock.release()
        if failed:
            log.error(
                "recording %d result(s) failed; trying again in %.1fs (the leases are kept): %s",
                len(sent),
                pause,
                [claim.job.id for _, claim in sent][:10],
                exc_info=failure,
            )
        for _, claim, outcome in reports:
            if outcome == "stale":
                log.warning(
                    "job %s (%s): its lease expired before the result was recorded; "
                    "the job may run again (make handlers idempotent on ctx.id)",
                    claim.job.id,
                    claim.job.name,
                )
        if failed or any(outcome == "retried" for _, _, outcome in reports):
            # Wake this process's waiters: a retry (of the job, or of this commit)
            # may be due before they planned to wake.
            try:
                self._backend.interrupt()
            except Exception:
                log.exception("waking the dispatcher after a retry failed")
        self._finishes.notify(
            claim.job.id for _, claim, outcome in reports if outcome in FINISHED_OUTCOMES
        )
        if self._on_result is not None:
            for entry, claim, outcome in reports:
                self._report(entry, claim, outcome)
        return following

    def _report(self, entry: _Finished, claim: Claim, outcome: Outcome) -> None:
        assert self._on_result is not None
        decision = entry.decision
        rec = entry.rec
        result = JobResult(
            job_id=claim.job.id,
            name=claim.job.name,
            attempt=claim.attempt,
            outcome=outcome,
            lateness=claim.claimed_at - claim.due,
            duration=entry.duration,
            error=decision.error,
            retry_at=decision.retry_at,
            start_lateness=(
                claim.claimed_at + (rec.started_mono - rec.mono_claimed) - claim.due
                if rec.started
                else None
            ),
        )
        try:
            self._on_result(result)
        except BaseException:  # SystemExit too: results already recorded must not be stranded
            log.exception("on_result callback failed")
