"""Due jobs run in the calling thread: the worker's rules without its threads (tests).

:func:`run_due` claims what is due on the app's clock one job at a time, runs
its handler here and now, and records the attempt with the same
:func:`~delayq.worker._decide.decide` a :class:`~delayq.worker.Worker` uses
(retries by the job's backoff, dead letters, misfire, unknown handlers, results),
so a test sees what a worker would have done, in microseconds. Handler timeouts
are not enforced (nothing runs beside the handler to cut it short).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any

from delayq.app import DelayQ
from delayq.clock import SystemClock
from delayq.codec import encode_result
from delayq.errors import InvalidResult
from delayq.job import Claim
from delayq.results import FINISHED_OUTCOMES, finished_jobs
from delayq.worker._decide import JobResult, decide, format_error

__all__ = ["INLINE_LEASE", "run_due"]

INLINE_LEASE = 300.0
"""The lease of an inline claim (seconds): longer than any handler of a test."""


def run_due(app: DelayQ, *, limit: int = 10_000) -> list[JobResult]:
    """Run every job of ``app`` due now (on ``app.clock``, or the store's own clock
    when the app runs on the real one), oldest first, in this thread, including
    retries that fall due now; return what happened to each attempt. At most
    ``limit`` attempts (a guard against a chain that never stops being due)."""
    backend = app.backend
    keep_attempt = "attempt_at_start" in backend.features
    real = isinstance(app.clock, SystemClock)  # "due" is then the store's own now
    results: list[JobResult] = []
    while len(results) < limit:
        now = None if real else app.clock.time()
        claims = backend.claim(limit=1, lease=INLINE_LEASE, now=now)
        if not claims:
            break
        results.append(_run_one(app, claims[0], keep_attempt))
    return results


def _run_one(app: DelayQ, claim: Claim, keep_attempt: bool) -> JobResult:
    job = claim.job
    clock = app.clock
    handler = app.get_handler(job.name)
    decision = decide(
        claim,
        clock.time(),
        ran=False,
        handler_known=handler is not None,
        registered=tuple(app.handlers) if handler is None else (),
        keep_attempt=keep_attempt,
    )
    started = clock.monotonic()
    duration = 0.0
    if decision is None:
        assert handler is not None
        ctx = claim.context()
        error: str | None = None
        text: str | None = None
        failure: Exception | None = None
        try:
            value = handler.call(job.payload, ctx)
            if inspect.isawaitable(value):
                value = _awaited(value)
            if handler.store_result:
                text = encode_result(value)
        except Exception as exc:  # a handler's failure is its attempt's, as on a worker
            failure = exc
            error = format_error(exc)
        duration = clock.monotonic() - started
        decision = decide(
            claim,
            clock.time(),
            ran=True,
            error=error,
            result=text,
            final=isinstance(failure, InvalidResult),
        )
        assert decision is not None
    app.backend.complete([decision.completion(claim)])
    if decision.outcome in FINISHED_OUTCOMES:
        finished_jobs(app.backend).notify([job.id])
    return JobResult(
        job_id=job.id,
        name=job.name,
        attempt=claim.attempt,
        outcome=decision.outcome,
        lateness=claim.claimed_at - claim.due,
        duration=duration,
        error=decision.error,
        retry_at=decision.retry_at,
        start_lateness=claim.claimed_at - claim.due,
    )


def _awaited(awaitable: Any) -> Any:
    """Run an async handler to its end: on a new event loop, in a helper thread
    when this thread already runs one (``run_due`` called from async code)."""

    async def wait() -> Any:
        return await awaitable

    coro: Coroutine[Any, Any, Any] = wait()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    outcome: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(coro))
        except BaseException as exc:
            failed.append(exc)

    helper = threading.Thread(target=run, name="delayq-inline-async")
    helper.start()
    helper.join()
    if failed:
        raise failed[0]
    return outcome[0]
