"""The runner's process-pool handlers: a handler thread drives one child at a time.

A started attempt's handler runs in a child (``_process.ProcessPool``) while its
thread waits for the answer. When more claims are ready than the handlers have
slots (a backlog) the thread queues the next one in the same child, behind the
running task, so the child starts it the moment the first ends instead of
waiting for this process to record the first and send another: the child is
never idle between tasks, and the answers that pile up meanwhile are read in
one wake-up. A queued claim is treated as still ready until the child says it
starts it (its timeout, lateness and ``rec.started`` count from there); if the
running task has not ended by the time the queued claim has waited the
worker's ``ready_hold`` (or its lease is about to run out), it is revoked and
goes back to the ready claims, where the dispatcher hands it back as it does
any prefetched claim held behind slow handlers. Only claims whose handler this
process knows and whose misfire policy is ``run`` are queued (a misfire is
judged when the handler starts). A part of :class:`Runner` (``_runner``), which
holds the state named below.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from delayq.job import Handler, JobContext
from delayq.worker._inflight import InFlight
from delayq.worker._process import ChildFailed, ProcessPool, Ran, Task
from delayq.worker._runner_state import RunnerState

__all__ = ["ChildHandlers"]


class ChildHandlers(RunnerState):
    """Handlers run in child processes (mixed into ``Runner``)."""

    if TYPE_CHECKING:  # provided by Runner and its other parts

        def _timeout_of(self, handler: Handler) -> float | None: ...

        def _watch_locked(self, rec: InFlight, deadline: float) -> None: ...

        def _finish(
            self,
            rec: InFlight,
            exc: BaseException | None,
            duration: float,
            *,
            error: str | None = None,
            result: str | None = None,
            final: bool = False,
        ) -> bool: ...

        def _give_up(self, rec: InFlight, *, slot: bool = True) -> None: ...

    def _execute_in_child(
        self, pool: ProcessPool, rec: InFlight, handler: Handler, ctx: JobContext
    ) -> bool:
        """Run a started attempt's handler in a child process, and the claims queued
        behind it, and record each answer. Its timeout starts when a child takes it
        (a wait for a child being started does not use it up)."""
        timeout = self._timeout_of(handler)
        table = self._table
        lane = _Lane(self)
        lane.recs[rec.key] = rec

        def begin() -> bool:  # a child is ready: the handler starts now, unless decided
            with table.lock:
                if rec.done or rec.abandoned:
                    return False
                if timeout is not None:
                    self._watch_locked(rec, self._clock.monotonic() + timeout)
                return True

        first = Task(rec.key, handler.name, rec.claim.job.payload, ctx)
        try:
            pool.run(first, lane, begin=begin)
        except BaseException:
            for other in lane.recs.values():
                if other is not rec:  # a queued claim holds a slot once it started
                    self._give_up(other, slot=other.started)
            raise
        return True

    def _queue_next(self) -> tuple[InFlight, Handler, float] | None:
        """Take the oldest ready claim to queue behind a running task, when it would
        wait for a slot anyway (every slot busy) and may start as it is; with the
        monotonic time by which it must have started. None otherwise."""
        table = self._table
        with table.lock:
            if table.stopping or not table.ready or table.running < table.concurrency:
                return None
            rec = table.ready[0]
            job = rec.claim.job
            handler = self._app.get_handler(job.name)
            if handler is None or job.misfire != "run":
                return None
            start_by = min(rec.mono_claimed + self._ready_hold, rec.lease_deadline)
            if self._clock.monotonic() >= start_by:
                return None  # the dispatcher hands it back, or a slot takes it
            table.ready.popleft()
        return rec, handler, start_by


class _Lane:
    """The :class:`~delayq.worker._process.Driver` of one ``ProcessPool.run``: the
    claims it ran or queued (``recs``, by key), recorded through the runner."""

    def __init__(self, runner: ChildHandlers) -> None:
        self._runner = runner
        self.recs: dict[int, InFlight] = {}

    def ahead(self) -> tuple[Task, float] | None:
        runner = self._runner
        got = runner._queue_next()
        if got is None:
            return None
        rec, handler, start_by = got
        self.recs[rec.key] = rec
        # The child judges nothing: it is told to start by, on its own monotonic clock.
        revoke_at = time.monotonic() + (start_by - runner._clock.monotonic())
        task = Task(rec.key, handler.name, rec.claim.job.payload, rec.claim.context(rec.lease_lost))
        return task, revoke_at

    def started(self, key: int) -> None:
        runner = self._runner
        rec = self.recs[key]
        table = runner._table
        handler = runner._app.get_handler(rec.claim.job.name)
        timeout = None if handler is None else runner._timeout_of(handler)
        with table.lock:
            mono = runner._clock.monotonic()
            table.running += 1  # the slot of the task that just ended passes to it
            rec.started = True
            rec.started_mono = mono
            rec.mark_at = mono + table.mark_after
            claim = rec.claim
            table.stats.start_lateness.add(
                claim.claimed_at + (mono - rec.mono_claimed) - claim.job.run_at
            )
            if timeout is not None and not (rec.done or rec.abandoned):
                runner._watch_locked(rec, mono + timeout)

    def unstarted(self, key: int) -> None:
        rec = self.recs.pop(key)
        table = self._runner._table
        with table.lock:
            if rec.done or rec.abandoned or table.records.get(key) is not rec:
                return
            table.ready.appendleft(rec)  # ready again, first in line
            table.work.notify()
            table.changed.notify_all()  # the dispatcher looks at how long it waited

    def ended(self, key: int, ran: Ran) -> None:
        runner = self._runner
        rec = self.recs.pop(key)
        duration = runner._clock.monotonic() - rec.started_mono
        with runner._table.lock:
            # Decided meanwhile: by its timeout (the child was killed for it) or
            # at shutdown (abandoned); its result is not the attempt's.
            decided = rec.done or rec.abandoned
        if decided:
            runner._committer.body_ended(rec)  # a retry held for it is recorded now
            return
        if ran.failed is None:
            runner._finish(rec, None, duration, result=ran.result)
            return
        summary, error = ran.failed
        runner._finish(rec, ChildFailed(summary), duration, error=error, final=ran.final)
