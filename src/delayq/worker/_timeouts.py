"""The runner's timeouts: one watcher thread sleeps until the earliest handler deadline.

A handler running past its timeout counts as failed at once: an async handler
is cancelled; a sync one cannot be interrupted, so its thread is left to it
and a new thread takes its place; in a process pool its child is killed. Its
retry is recorded only when the abandoned body really ends. The same watcher
looks at the event loop's health (``_async``). A part of :class:`Runner`
(``_runner``), which holds the state named below.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING

from delayq.job import Handler
from delayq.worker._decide import Decision, decide, timeout_error
from delayq.worker._inflight import InFlight
from delayq.worker._runner_state import RunnerState

__all__ = ["TimeoutWatcher"]

log = logging.getLogger("delayq.worker")


class TimeoutWatcher(RunnerState):
    """Handler deadlines and the thread that expires them (mixed into ``Runner``)."""

    if TYPE_CHECKING:  # provided by Runner and its other parts

        def _spawn(self) -> None: ...

        def _check_loop(self, now: float) -> None: ...

    def _timeout_of(self, handler: Handler) -> float | None:
        return handler.timeout if handler.timeout is not None else self._timeout

    def _arm_timeout(self, rec: InFlight, deadline: float) -> None:
        with self._table.lock:
            if not rec.done:
                self._watch_locked(rec, deadline)

    def _disarm_timeout(self, rec: InFlight) -> None:
        with self._table.lock:
            rec.timeout_at = math.inf

    def _watch_locked(self, rec: InFlight, deadline: float) -> None:
        """Give ``rec`` a timeout deadline; wake (or start) the watcher if it is the earliest."""
        rec.timeout_at = deadline
        if deadline < self._watching_until:
            self._timeouts_changed.notify()
        self._start_watcher_locked()

    def _start_watcher_locked(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch_timeouts, name=f"{self._name}-timeouts", daemon=True
            )
            self._watcher.start()

    def _watch_timeouts(self) -> None:
        """The watcher's loop: sleep until the earliest handler deadline (or the next
        look at the event loop), expire timeouts, check that the loop runs."""
        table = self._table
        clock = self._clock
        while True:
            with table.lock:
                while True:
                    if table.closed:
                        return
                    now = clock.monotonic()
                    deadline = min(
                        (
                            r.timeout_at
                            for r in table.records.values()
                            if not r.done and not r.abandoned
                        ),
                        default=math.inf,
                    )
                    check = self._loop_check_at
                    if deadline <= now or check <= now:
                        break
                    wake = min(deadline, check)
                    self._watching_until = wake
                    clock.wait_until(self._timeouts_changed, None if wake == math.inf else wake)
                self._watching_until = math.inf
            try:
                if deadline <= now:
                    self.expire_timeouts()
                if check <= now:
                    self._check_loop(now)
            except Exception:
                log.exception("delayq worker: unexpected error while expiring handler timeouts")

    def expire_timeouts(self) -> None:
        """Fail every running handler past its timeout (the watcher calls this)."""
        table = self._table
        now = self._clock.monotonic()
        with table.lock:
            expired = [
                rec
                for rec in table.records.values()
                if rec.timeout_at <= now and not rec.done and not rec.abandoned
            ]
        for rec in expired:
            claim = rec.claim
            handler = self._app.get_handler(claim.job.name)
            timeout = self._timeout if handler is None else self._timeout_of(handler)
            assert timeout is not None  # only a handler with a timeout has a deadline
            error = timeout_error(claim.job.name, timeout, killed=self._pool is not None)
            decision = decide(
                claim, claim.claimed_at + (now - rec.mono_claimed), ran=True, error=error
            )
            assert decision is not None
            self._on_timeout(rec, decision, now - rec.timeout_at + timeout)

    def _on_timeout(self, rec: InFlight, decision: Decision, duration: float) -> None:
        """``rec``'s handler ran past its timeout: fail the attempt, free its slot.

        The handler cannot be stopped at once (a sync one not at all, a cancelled
        coroutine only at its next ``await``), so it counts as abandoned work until
        it ends, and a retry is recorded only then: the next attempt never runs
        beside this one. A last attempt is dead-lettered at once (nothing runs next).
        """
        claim = rec.claim
        hold = decision.outcome == "retried"
        if not self._committer.finish(
            rec, decision, duration, handler_slot=True, timed_out=True, hold=hold
        ):
            return  # it finished meanwhile
        table = self._table
        with table.lock:
            is_async, cancel = rec.is_async, rec.cancel
            abandoned, cap = table.abandoned, table.abandoned_cap
        log.warning(
            "job %s (%s): attempt %d ran past its timeout; %s",
            claim.job.id,
            claim.job.name,
            claim.attempt,
            "retried once its handler ends" if hold else "dead-lettered",
        )
        if abandoned >= cap:
            log.error(
                "%d handler(s) run on past their timeout (max_abandoned=%d): this worker "
                "claims no more jobs until some end, and reports itself unhealthy",
                abandoned,
                cap,
            )
        if self._pool is not None:
            self._pool.kill(rec.key)  # its thread serves again once the child is gone
        elif is_async:
            if cancel is not None:
                cancel()
        else:
            self._spawn()  # the stuck thread is left to its handler
