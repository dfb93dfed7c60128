"""The app's results: ``app.result(job_id)`` and ``await app.aresult(job_id)``.

A base of :class:`~delayq.app.DelayQ` (see :mod:`delayq.results` for the model).
Waiting reads ``get``, then waits for a finish in this process or a growing
pause on the app's clock, so a test's fake clock decides when a wait runs out.
"""

from __future__ import annotations

import asyncio
from typing import Any

from delayq._validate import check_job_id, check_option_seconds
from delayq.backends import Backend
from delayq.backends.base import TellsFinishes
from delayq.clock import Clock
from delayq.errors import ResultTimeout, Unsupported
from delayq.results import FinishedJobs, finished_jobs, job_result, poll_pauses

__all__ = ["AppResults"]


class AppResults:
    """``result`` and ``aresult`` of the app, and the check that a store keeps results."""

    _backend: Backend
    clock: Clock

    def _check_results(self, what: str) -> None:
        if "results" not in self._backend.features:
            raise Unsupported(
                f"{self._backend.url} keeps no finished records, so it cannot keep {what} "
                f"(results need a store with the 'results' feature: memory://, sqlite://, "
                f"redis://, postgresql://)"
            )

    def _result_deadline(self, job_id: str, timeout: float | None) -> tuple[str, float | None]:
        job_id = check_job_id(job_id)
        self._check_results("results")
        if timeout is None:
            return job_id, None
        seconds = check_option_seconds(timeout, "timeout", allow_zero=True)
        return job_id, self.clock.monotonic() + seconds

    def result(self, job_id: str, *, timeout: float | None = 30.0) -> Any:
        """The return value of job ``job_id`` once it finished, waiting at most
        ``timeout`` seconds (None: no limit; 0: only look).

        Raises the job's final error (:class:`~delayq.errors.JobFailed`,
        :class:`~delayq.errors.JobCancelled`, :class:`~delayq.errors.JobSkipped`),
        :class:`~delayq.errors.ResultTimeout` when it is still not finished, and
        :class:`~delayq.errors.JobNotFound` when there is no such job (or its
        record expired). A succeeded job whose handler keeps no result gives None.
        """
        job_id, deadline = self._result_deadline(job_id, timeout)
        with self._finishes().watch(job_id) as finish:
            for pause in poll_pauses():
                done, value = job_result(job_id, self._backend.get(job_id))
                if done:
                    return value
                finish.wait(self.clock, self._pause(pause, deadline, job_id, timeout))
        raise AssertionError("unreachable")  # pragma: no cover

    async def aresult(self, job_id: str, *, timeout: float | None = 30.0) -> Any:
        """:meth:`result` for async code: the store is read in a thread, the waits
        are ``await``-ed on the app's clock."""
        job_id, deadline = self._result_deadline(job_id, timeout)
        with self._finishes().watch(job_id, asynchronous=True) as finish:
            for pause in poll_pauses():
                job = await asyncio.to_thread(self._backend.get, job_id)
                done, value = job_result(job_id, job)
                if done:
                    return value
                await finish.wait_async(self.clock, self._pause(pause, deadline, job_id, timeout))
        raise AssertionError("unreachable")  # pragma: no cover

    def _finishes(self) -> FinishedJobs:
        """This store's finishes in this process, and, where the store can tell them,
        those of other processes too (:class:`~delayq.backends.base.TellsFinishes`)."""
        finishes = finished_jobs(self._backend)
        if isinstance(self._backend, TellsFinishes):
            self._backend.listen_for_finishes(finishes.notify)
        return finishes

    def _pause(
        self, pause: float, deadline: float | None, job_id: str, timeout: float | None
    ) -> float:
        """The next pause, cut at the deadline; raises ResultTimeout once it is reached."""
        if deadline is None:
            return pause
        left = deadline - self.clock.monotonic()
        if left <= 0:
            raise ResultTimeout(f"job {job_id!r} did not finish within {timeout}s")
        return min(pause, left)
