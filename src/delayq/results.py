"""Job results: a handler's return value, kept with its finished record.

Opt in per handler (``@app.task(store_result=True)``, ``@app.handler(name,
store_result=True)``); a typed task's ``schedule`` returns a :class:`JobHandle`::

    @app.task(store_result=True)
    def total(order_id: int) -> dict[str, int]: ...

    handle = total.schedule(42)      # a str subclass: the job id, as before
    handle.result(timeout=30)        # blocks: the return value, or the job's final error
    await handle                     # the same in async code (or await handle.aresult())
    app.result(job_id)               # by id, from any process

The value is stored as JSON (at most :data:`~delayq.codec.DEFAULT_MAX_RESULT_BYTES`,
64 KiB) in the job's finished record, so it lives as long as the record does
(the store's ``result_ttl``; on Redis also at most ``max_finished`` records per
state) and is gone when the job is replaced. A return
value that is not JSON data, or too big, fails the job at once: it is
dead-lettered with :class:`~delayq.errors.InvalidResult` (or
:class:`~delayq.errors.ResultTooLarge`) as its error, without a retry (the
body ran; a retry would run its side effects again).

Waiting for a result polls the store with a growing pause (10 ms, x1.5, at most
1 s), on the app's clock. A job that ends otherwise raises its final error:
:class:`~delayq.errors.JobFailed` (dead-lettered; ``.error`` is its stored
error text), :class:`~delayq.errors.JobCancelled`,
:class:`~delayq.errors.JobSkipped`; one still not finished at the deadline,
:class:`~delayq.errors.ResultTimeout` (a ``TimeoutError``); one whose record is
gone (or never was), :class:`~delayq.errors.JobNotFound`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from delayq._present import error_summary
from delayq.errors import (
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobSkipped,
)
from delayq.job import FINAL_STATES, Job, JobState

__all__ = ["JobHandle", "ResultSource", "job_result", "poll_pauses"]

R = TypeVar("R")

FIRST_PAUSE = 0.01
PAUSE_GROWTH = 1.5
LONGEST_PAUSE = 1.0


class ResultSource(Protocol):
    """What a handle needs of its app (``DelayQ``)."""

    def result(self, job_id: str, *, timeout: float | None = ...) -> Any: ...

    async def aresult(self, job_id: str, *, timeout: float | None = ...) -> Any: ...


def poll_pauses() -> Generator[float, None, None]:
    """The pauses between two reads of a job not finished yet: 10 ms growing to 1 s."""
    pause = FIRST_PAUSE
    while True:
        yield pause
        pause = min(LONGEST_PAUSE, pause * PAUSE_GROWTH)


def job_result(job_id: str, job: Job | None) -> tuple[bool, Any]:
    """``(True, value)`` for a succeeded job (None when it kept no result),
    ``(False, None)`` while it is not finished; raises the final error of a job
    that ended otherwise, :class:`JobNotFound` for one that is not there."""
    if job is None:
        raise JobNotFound(
            f"no job {job_id!r}: it never existed, or its finished record (and result) "
            f"expired (the store's result_ttl)"
        )
    state = job.state
    if state not in FINAL_STATES:
        return False, None
    if state is JobState.SUCCEEDED:
        return True, None if job.result is None else json.loads(job.result)
    if state is JobState.DEAD:
        raise JobFailed(
            f"job {job_id!r} ({job.name}) failed after {job.attempts} attempt(s): "
            f"{error_summary(job.last_error) or 'no error recorded'}",
            job=job,
            error=job.last_error,
        )
    if state is JobState.CANCELLED:
        raise JobCancelled(f"job {job_id!r} ({job.name}) was cancelled", job=job)
    raise JobSkipped(f"job {job_id!r} ({job.name}) was not run: {job.outcome}", job=job)


class JobHandle(str, Generic[R]):
    """A scheduled job's id (a ``str``, usable wherever the id was) and a way to its result.

    ``decode`` turns the stored JSON value into the task's return type (a
    dataclass or pydantic model rebuilt from its fields).
    """

    _source: ResultSource
    _decode: Callable[[Any], R] | None

    def __new__(
        cls, job_id: str, source: ResultSource, decode: Callable[[Any], R] | None = None
    ) -> JobHandle[R]:
        handle = super().__new__(cls, job_id)
        handle._source = source
        handle._decode = decode
        return handle

    @property
    def id(self) -> str:
        """The job id as a plain ``str``."""
        return str.__str__(self)

    def result(self, timeout: float | None = 30.0) -> R:
        """Block until the job finishes (at most ``timeout`` seconds, None: no
        limit) and return its value, or raise its final error (see the module)."""
        return self._rebuilt(self._source.result(self.id, timeout=timeout))

    async def aresult(self, timeout: float | None = 30.0) -> R:
        """:meth:`result` for async code (the event loop is not blocked)."""
        return self._rebuilt(await self._source.aresult(self.id, timeout=timeout))

    def __await__(self) -> Generator[Any, None, R]:
        return self.aresult().__await__()

    def _rebuilt(self, value: Any) -> R:
        return value if self._decode is None else self._decode(value)

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return str, (self.id,)  # pickled (or copied) as the plain id
