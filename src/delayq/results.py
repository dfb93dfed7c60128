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

Waiting for a result reads the job, and while it is not finished waits for a
finish in this process (:class:`FinishedJobs`: the worker's committer and
``app.cancel`` tell it) or a pause that grows from 10 ms (x1.5, at most 1 s) on
the app's clock, whichever comes first, then reads again. A store with the
optional capability :class:`~delayq.backends.base.TellsFinishes` (SQLite, Redis) also
tells of results recorded by other processes; elsewhere such a result is seen at
the next read. A job that ends otherwise raises its final error:
:class:`~delayq.errors.JobFailed` (dead-lettered; ``.error`` is its stored
error text), :class:`~delayq.errors.JobCancelled`,
:class:`~delayq.errors.JobSkipped`; one still not finished at the deadline,
:class:`~delayq.errors.ResultTimeout` (a ``TimeoutError``); one whose record is
gone (or never was), :class:`~delayq.errors.JobNotFound`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from delayq._present import error_summary
from delayq.clock import Clock
from delayq.errors import (
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobSkipped,
)
from delayq.job import FINAL_STATES, Job, JobState

__all__ = [
    "FINISHED_OUTCOMES",
    "FinishedJobs",
    "FinishWatch",
    "JobHandle",
    "ResultSource",
    "finished_jobs",
    "job_result",
    "poll_pauses",
]

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


FINISHED_OUTCOMES = frozenset({"succeeded", "dead", "skipped"})
"""The worker's outcomes (``JobResult.outcome``) that leave a job in a final state."""


class FinishWatch:
    """One waiter's watch on one job id (see :class:`FinishedJobs`).

    ``_cond`` guards ``_fired``; the async side (``_loop``, ``_event``) is set once,
    before the watch is registered, and only read afterwards.
    """

    __slots__ = ("_cond", "_event", "_fired", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._cond = threading.Condition()
        self._fired = False
        self._loop = loop
        self._event = asyncio.Event() if loop is not None else None

    def fire(self) -> None:
        """The job finished (called by :meth:`FinishedJobs.notify`, from any thread)."""
        with self._cond:
            self._fired = True
            self._cond.notify_all()
        if self._loop is not None and self._event is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self._event.set)

    def wait(self, clock: Clock, timeout: float) -> bool:
        """Block until the job finished in this process (True) or ``timeout`` seconds
        of ``clock`` passed (False). A fire since the last wait counts."""
        with self._cond:
            if not self._fired:
                clock.wait(self._cond, timeout)
            fired, self._fired = self._fired, False
        return fired

    async def wait_async(self, clock: Clock, timeout: float) -> bool:
        """:meth:`wait` for a watch made with the running loop."""
        assert self._event is not None, "an async wait needs a watch made with its loop"
        fired = await clock.wait_async(self._event, timeout)
        self._event.clear()
        with self._cond:
            self._fired = False
        return fired


class FinishedJobs:
    """Wake-ups, in this process, for callers waiting for jobs of one store to finish.

    Whatever records a final state in this process says so with :meth:`notify`
    after the store committed it: the worker's committer (succeeded, dead,
    skipped) and ``DelayQ.cancel``. A waiter :meth:`watch`-es its job id *before*
    it reads the job, so a finish between its read and its wait still wakes it.
    Nothing crosses processes: a waiter there finds the finish at its next read.

    Lock rule: ``_lock`` guards ``_watches`` (job id -> its watches); a watch's own
    condition is taken under it (``_lock`` first, never the other way round).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, list[FinishWatch]] = {}

    @contextlib.contextmanager
    def watch(self, job_id: str, *, asynchronous: bool = False) -> Iterator[FinishWatch]:
        """Watch ``job_id`` for the ``with`` block (``asynchronous=True``: in the running loop)."""
        watch = FinishWatch(asyncio.get_running_loop() if asynchronous else None)
        with self._lock:
            self._watches.setdefault(job_id, []).append(watch)
        try:
            yield watch
        finally:
            with self._lock:
                watches = self._watches[job_id]
                watches.remove(watch)
                if not watches:
                    del self._watches[job_id]

    def notify(self, job_ids: Iterable[str]) -> None:
        """These jobs reached a final state (the store has committed it)."""
        if not self._watches:
            # Nobody waits: the committer's common case, without the lock. A watch
            # registered meanwhile reads the job after this commit, so it misses nothing.
            return
        with self._lock:
            for job_id in job_ids:
                for watch in self._watches.get(job_id, ()):
                    watch.fire()


_registry_lock = threading.Lock()  # guards _registry
# Weak: held by the committers and waiters that use it, so a process opening many
# stores keeps only those in use; while any holds it, every caller gets that one.
_registry: weakref.WeakValueDictionary[str, FinishedJobs] = weakref.WeakValueDictionary()


def finished_jobs(store: object) -> FinishedJobs:
    """The :class:`FinishedJobs` of a store in this process, one per store URL, so
    two handles opened on the same store (an app and a worker's own app) share it.
    Handles of different stores with one URL (two ``memory://``) share it too: a
    waiter woken for a finish elsewhere only reads its job once more."""
    key = str(getattr(store, "url", "")) or f"<store {id(store)}>"
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = FinishedJobs()
            _registry[key] = found
        return found


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
