"""The process pool: handlers run in spawned child processes, one task at a time each.

``Worker(app, pool="process")`` runs every handler (sync or async) in a child
process instead of on a handler thread: CPU-bound handlers use every core, and
a handler past its timeout is *killed*, not left to run. The runner keeps its
threads (one per slot, as with the thread pool: claims, leases, timeouts, the
group commit, ``ctx``, retries, metrics and logs are the same code); a thread
whose attempt starts hands it to an idle child and waits for the answer.

* Children come from the ``spawn`` start method (a fresh interpreter, never a
  fork of this threaded process) and load the app by its name with the one
  loader (``delayq._loader``), so handlers are the module's own functions. The
  pool starts ``size`` children and waits until each has loaded the app: an app
  that does not load fails ``Worker.start``, not every job.
* A task goes to the child as JSON (the payload is JSON data already); the
  child answers ``ok`` or the error text with the child's traceback. Under a
  backlog a few more wait in the child's pipe behind the running one (see
  :meth:`ProcessPool.run`), so the child never idles between tasks while this
  process records the last; the frames are read with ``_pipe.FrameReader``.
* A timeout (the runner's watcher) kills the child: SIGTERM, then SIGKILL after
  ``KILL_GRACE`` seconds. Until it is gone the attempt counts as abandoned work,
  so its retry starts only after the child is gone.
* A child that dies mid-handler (a signal, ``os._exit``, the OOM killer) makes
  the attempt fail with its exit status (``killed by SIGKILL``): retried by the
  job's backoff, never lost. A new child takes its place.
* ``max_tasks_per_child`` recycles a child after that many tasks (a handler
  leaking memory); the replacement is started in the background.
* A child's log records come back over its pipe as JSON and go through this
  process's loggers (``_childlog``): ``--log-format json`` covers handlers in
  children too.
* ``ctx.lease_lost`` in the child is an event shared with the parent, set when
  the lease keeper loses the attempt's lease.
* At shutdown idle children are told to stop (their pipe closes); a child still
  running a handler then has had its grace period and is killed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, Protocol

from delayq.errors import ConfigurationError
from delayq.job import JobContext
from delayq.worker._child import child_main
from delayq.worker._childlog import forward_level, replay
from delayq.worker._pipe import FrameReader, write_frame

__all__ = [
    "CHILD_START_TIMEOUT",
    "KILL_GRACE",
    "ChildFailed",
    "Driver",
    "ProcessPool",
    "Ran",
    "Task",
    "describe_exit",
]

log = logging.getLogger("delayq.worker")

KILL_GRACE = 0.1
"""Seconds between the SIGTERM and the SIGKILL that end a child past its timeout."""

CHILD_START_TIMEOUT = 60.0
"""Seconds a new child may take to start and load the app."""

QUEUE_DEPTH = 4
"""Tasks that may wait in a child's pipe behind the one it runs (see ``ProcessPool.run``)."""

QUEUE_TASK_BYTES = 16_384
"""A task bigger than this (as JSON) is never queued: it waits for an idle child."""

_LANES = QUEUE_DEPTH + 1

_CONTEXT_FIELDS = tuple(f.name for f in dataclasses.fields(JobContext) if f.name != "lease_lost")


class Ran(NamedTuple):
    """How a task in a child ended: ``failed`` is None when it succeeded (or did not
    run), else (summary, error text with the child's traceback); ``result`` the
    return value as JSON text (a handler storing results); ``final`` a failure no
    retry can mend (a return value that cannot be stored)."""

    failed: tuple[str, str] | None = None
    result: str | None = None
    final: bool = False


class Task(NamedTuple):
    """One handler call for a child: the claim's key, the handler's name, the payload
    (JSON data) and the context."""

    key: int
    name: str
    payload: Any
    ctx: JobContext


class Driver(Protocol):
    """What :meth:`ProcessPool.run` asks of the runner while a child works for it."""

    def ahead(self) -> tuple[Task, float] | None:
        """A started attempt to queue behind the running one now, with the monotonic
        time by which it must have started (else it is revoked); None for none."""

    def started(self, key: int) -> None:
        """A queued task's handler starts now (the child said so before calling it)."""

    def unstarted(self, key: int) -> None:
        """A queued task never started: revoked, or its child ended first."""

    def ended(self, key: int, ran: Ran) -> None:
        """A task's handler ended (answered, or its child died: see :class:`Ran`)."""


class ChildFailed(Exception):
    """A handler failed in its child process (its text is the child's summary)."""


def describe_exit(code: int | None) -> str:
    """How a child process ended, in words: ``was killed by SIGKILL (signal 9)``."""
    if code is None:
        return "ended (status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with status {code}"


class _Child:
    """One child process and its end of the pipe (used by one thread at a time).

    ``lease_lost`` holds one event per *lane*: each task queued behind the running
    one takes a lane no other task in the child holds, so a late signal for the
    task that just ended never reaches the next one. ``gate`` is a semaphore
    holding one token per queued task: the child takes one before it starts a
    queued task, the parent takes them back to revoke; whoever takes a token
    decides that task (one atomic step, whatever the other process is doing)."""

    __slots__ = (
        "_reader",
        "conn",
        "doomed",
        "gate",
        "lease_lost",
        "proc",
        "running",
        "seq",
        "tasks",
    )

    def __init__(self, proc: Any, conn: Connection, lease_lost: tuple[Any, ...], gate: Any) -> None:
        self.proc = proc
        self.conn = conn
        self.lease_lost = lease_lost
        self.gate = gate
        self._reader: FrameReader | None = None  # made on the first read
        self.tasks = 0  # tasks answered
        self.seq = 0  # tasks sent
        self.running: int | None = None  # the claim key whose handler runs now
        self.doomed = False  # being killed (a timeout, or the shutdown)

    def next_frame(self, timeout: float | None) -> dict[str, Any] | None:
        """The next frame the child sent that is not a log record (those are replayed
        here); None when ``timeout`` seconds (None: no limit) passed first; EOFError
        once the child is gone. One read takes every frame the pipe holds, so
        answers that piled up while this process was busy cost one system call."""
        if self._reader is None:
            self._reader = FrameReader(self.conn.fileno(), self.proc.sentinel)
        reader = self._reader
        frames = reader.frames
        deadline = None
        while True:
            while frames:
                frame: dict[str, Any] = json.loads(frames.popleft())
                if "log" not in frame:
                    return frame
                replay(frame["log"])
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            left = None if deadline is None else deadline - time.monotonic()
            reader.fill(left)
            if not frames and deadline is not None and time.monotonic() >= deadline:
                return None

    def send(self, message: object) -> None:
        self.send_text(json.dumps(message))

    def send_text(self, text: str) -> None:
        write_frame(self.conn.fileno(), text.encode())

    def kill(self, grace: float) -> None:
        """SIGTERM now, SIGKILL after ``grace`` seconds if it still lives."""
        if self.proc.exitcode is not None:
            return
        self.proc.terminate()
        timer = threading.Timer(grace, self._force)
        timer.daemon = True
        timer.start()

    def _force(self) -> None:
        if self.proc.exitcode is None:
            self.proc.kill()

    def close(self) -> None:
        self.conn.close()


def _answer(frame: dict[str, Any]) -> Ran:
    """How a task ended, from the child's answer."""
    if frame.get("ok"):
        result = frame.get("result")
        return Ran(result=result if isinstance(result, str) else None)
    error = str(frame.get("error", "ChildFailed: no error text"))
    summary = str(frame.get("summary", error.splitlines()[-1] if error else ""))
    return Ran((summary, error), final=bool(frame.get("final")))


class _Closed(Exception):
    """The pool is shutting down: no child for a new task."""


class ProcessPool:
    """Child processes running handlers (see the module docstring).

    ``_lock`` guards ``_idle``, ``_busy`` (claim key -> its child), ``_children``
    (every child started and not yet reaped: a child's pipe and event live as
    long as it does), ``_starting`` (threads starting a replacement) and
    ``_closed``. No child is waited on under it.
    """

    def __init__(self, target: str, *, size: int, max_tasks_per_child: int | None) -> None:
        self.target = target
        self.size = size
        self.max_tasks = max_tasks_per_child or 0
        self._mp = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._available = threading.Condition(self._lock)  # a child joined _idle
        self._idle: list[_Child] = []
        self._busy: dict[int, tuple[_Child, int]] = {}  # claim key -> its child, lane
        self._children: set[_Child] = set()
        self._starting: set[threading.Thread] = set()
        self._closed = False

    # -- children -------------------------------------------------------------------------
    def start(self) -> None:
        """Start ``size`` children and wait until each loaded the app.

        Raises :class:`ConfigurationError` (after ending them all) when one cannot.
        """
        starting = [self._spawn() for _ in range(self.size)]
        try:
            for child in starting:
                self._ready(child)
        except (ConfigurationError, _Closed):
            for child in starting:
                self._end(child)
            raise
        with self._lock:
            self._idle.extend(starting)

    def _spawn(self) -> _Child:
        parent_end, child_end = self._mp.Pipe()
        lease_lost = tuple(self._mp.Event() for _ in range(_LANES))
        gate = self._mp.Semaphore(0)
        proc = self._mp.Process(
            target=child_main,
            args=(self.target, child_end, lease_lost, self.max_tasks, os.getpid()),
            kwargs={"gate": gate, "log_level": forward_level()},
            name="delayq-child",
        )
        child = _Child(proc, parent_end, lease_lost, gate)
        with self._lock:
            if self._closed:
                raise _Closed
            self._children.add(child)
            proc.start()  # under the lock: a shutdown sees every child it must end
        child_end.close()  # the child holds the only other end: its death is an EOF here
        return child

    def _ready(self, child: _Child) -> None:
        """Wait until ``child`` loaded the app; else end it and raise ConfigurationError
        (or ``_Closed`` when the pool shut down meanwhile)."""
        reason = None
        try:
            hello = child.next_frame(CHILD_START_TIMEOUT)
            if hello is None:
                reason = f"it was not ready after {CHILD_START_TIMEOUT:g}s"
            elif not hello.get("ready"):
                reason = hello.get("error", "it did not say why")
        except (EOFError, OSError):
            child.proc.join(CHILD_START_TIMEOUT)
            reason = f"it {describe_exit(child.proc.exitcode)}"
        with self._lock:
            closed = self._closed
        if reason is None and not closed:
            return
        self._end(child)
        if closed:
            raise _Closed
        raise ConfigurationError(
            f"a process-pool child cannot load the app {self.target!r}: {reason}"
        )

    def _end(self, child: _Child, *, kill: bool = True) -> None:
        """End ``child`` (killed, or told to stop by closing its pipe) and reap it."""
        if kill:
            child.kill(KILL_GRACE)
        child.close()
        child.proc.join(CHILD_START_TIMEOUT)
        if child.proc.exitcode is None:
            child.proc.kill()
            child.proc.join()
        with self._lock:
            self._children.discard(child)
            self._available.notify_all()

    def _take(self) -> _Child:
        """An idle child; or the replacement being started (it is this task's);
        or a new one. Raises ``_Closed`` once the pool shut down."""
        with self._lock:
            # Every child busy: one is about to come back (a slot can free while its
            # child still holds a queued task that has not started).
            while (
                not self._idle
                and (self._starting or len(self._children) >= self.size)
                and not self._closed
            ):
                self._available.wait()
            if self._closed:
                raise _Closed
            if self._idle:
                return self._idle.pop()
        child = self._spawn()
        self._ready(child)
        return child

    def _put_back(self, child: _Child) -> None:
        with self._lock:
            keep = not self._closed and len(self._children) <= self.size
            if keep:
                self._idle.append(child)
                self._available.notify()
        if not keep:
            self._end(child, kill=False)  # it stops when its pipe closes

    def _gone(self, child: _Child) -> None:
        """``child`` ended (killed, crashed, or retired): reap it; start a replacement."""
        self._end(child, kill=False)
        thread = None
        with self._lock:
            if not self._closed and len(self._children) + len(self._starting) < self.size:
                thread = threading.Thread(
                    target=self._replace, name="delayq-child-start", daemon=True
                )
                self._starting.add(thread)
        if thread is not None:
            thread.start()

    def _replace(self) -> None:
        """Start a child in the background (one ended)."""
        try:
            child = self._spawn()
            self._ready(child)
        except _Closed:
            child = None
        except Exception:
            log.exception("delayq worker: cannot start a process-pool child; retrying on demand")
            child = None
        with self._lock:
            self._starting.discard(threading.current_thread())
            if child is not None:
                self._idle.append(child)
            self._available.notify_all()

    # -- tasks ----------------------------------------------------------------------------
    def run(self, first: Task, driver: Driver, *, begin: Callable[[], bool]) -> None:
        """Run ``first`` in a child, and the tasks the driver queues behind it; blocks
        until the child has none left. Each task ends in ``driver.ended`` (or, for a
        queued one that never started, ``driver.unstarted``).

        ``begin()`` is called once a child is ready, just before ``first`` is sent
        (its timeout starts there); when it returns False (the attempt was decided
        while it waited for a child) nothing runs (``ended`` with an empty
        :class:`Ran`). A child that died is a failure too (see :class:`Ran`).

        While ``first`` (or a task after it) runs, up to ``QUEUE_DEPTH`` tasks from
        ``driver.ahead()`` wait in the child's pipe, sent in one message, each with
        a token in the child's gate; the child takes the token and says it starts
        the task (in the frame that answers the one before). When the first of them
        has not started by its time, every token still there is taken back: those
        tasks never run (``driver.unstarted``) and the child drops them.
        """
        try:
            child = self._take()
        except _Closed:  # the worker stops (its claim is handed back, so this is not recorded)
            text = f"ChildFailed: the worker stopped before handler {first.name!r} could start"
            driver.ended(first.key, Ran((text, text)))
            return
        except ConfigurationError as exc:
            driver.ended(first.key, Ran((f"ChildFailed: {exc}", f"ChildFailed: {exc}")))
            return
        with self._lock:
            self._busy[first.key] = (child, 0)
            child.running = first.key
        if not begin():
            with self._lock:
                self._busy.pop(first.key, None)
                child.running = None
            self._put_back(child)
            driver.ended(first.key, Ran())
            return
        names = {first.key: first.name}
        lanes = {first.key: 0}
        running: int | None = first.key
        queued: deque[tuple[int, int, float]] = deque()  # (key, seq, start by), in order
        dropping: set[int] = set()  # revoked; the child has not said it dropped them yet
        released = False
        try:
            child.send([self._message(child, first, lane=0)])
            while running is not None or queued:
                if running is not None and not dropping:
                    batch = []
                    while len(queued) < QUEUE_DEPTH and self._may_queue(child, len(queued)):
                        got = driver.ahead()
                        if got is None:
                            break
                        task, start_by = got
                        used = {lanes[running], *(lanes[k] for k, _, _ in queued)}
                        lane = min(set(range(_LANES)) - used)
                        text = json.dumps(self._message(child, task, lane=lane, queued=True))
                        if len(text) > QUEUE_TASK_BYTES:
                            # Unread bytes stay well under the pipe's buffer: a write
                            # here never waits for a child busy in its handler.
                            driver.unstarted(task.key)
                            break
                        lanes[task.key] = lane
                        with self._lock:
                            self._busy[task.key] = (child, lane)
                        batch.append(text)
                        queued.append((task.key, child.seq, start_by))
                        names[task.key] = task.name
                        child.gate.release()  # its token
                    if batch:
                        child.send_text(f"[{','.join(batch)}]")
                timeout = None
                if queued and queued[0][2] < math.inf:
                    timeout = queued[0][2] - time.monotonic()
                frame = child.next_frame(timeout)
                if frame is None:  # the next task waited too long behind the running one
                    for key, seq in self._revoke(child, queued):
                        dropping.add(seq)
                        driver.unstarted(key)
                    continue
                ended = running if "seq" in frame else None
                if ended is not None:
                    child.tasks += 1
                    running = None
                if queued and frame.get("start") == queued[0][1]:
                    running = queued.popleft()[0]
                    with self._lock:
                        child.running = running
                    driver.started(running)
                dropping.difference_update(frame.get("revoked", ()))
                if ended is None:
                    continue
                with self._lock:
                    self._busy.pop(ended, None)
                    if child.running == ended:
                        child.running = None
                if running is None and not queued:
                    # Idle: back in the pool before the slot frees (a thread that takes
                    # the slot finds this child, never starts another one).
                    released = True
                    self._release(child)
                driver.ended(ended, _answer(frame))
        except BaseException as exc:
            if released:
                raise
            if not isinstance(exc, (EOFError, OSError)):  # a bug here: end the child
                child.doomed = True
                child.kill(KILL_GRACE)
                self._gone(child)
                raise
            child.proc.join()
            code = child.proc.exitcode
            with self._lock:
                for left in (running, *(key for key, _, _ in queued)):
                    if left is not None:
                        self._busy.pop(left, None)
                child.running = None
            # Those whose token is still there never started; the child took the
            # others' tokens and died before it said it started them: they may have.
            unstarted = [key for key, _ in self._revoke(child, queued)]
            self._gone(child)
            for key in unstarted:  # last first: each goes to the front of the line
                driver.unstarted(key)
            for key, _, _ in queued:
                driver.started(key)  # it may have: it counts as an attempt that failed
            for died in [running, *(key for key, _, _ in queued)]:
                if died is not None:
                    text = (
                        f"ChildFailed: the process running handler {names[died]!r} "
                        f"{describe_exit(code)} before the handler returned"
                    )
                    driver.ended(died, Ran((text, text)))

    @staticmethod
    def _revoke(child: _Child, queued: deque[tuple[int, int, float]]) -> list[tuple[int, int]]:
        """Take back the tokens of ``queued`` the child has not taken: those tasks
        (the last ones: the child takes tokens in order) are revoked and leave
        ``queued``, returned as (key, seq), last first; the rest start (the child
        holds their tokens), so no deadline is kept for them."""
        revoked: list[tuple[int, int]] = []
        while queued and child.gate.acquire(False):
            key, seq, _ = queued.pop()
            revoked.append((key, seq))
        for i, (key, seq, _) in enumerate(queued):
            queued[i] = (key, seq, math.inf)
        return revoked

    def _may_queue(self, child: _Child, queued: int) -> bool:
        """Whether one more task may wait in ``child``'s pipe (``queued`` wait there
        now): not while it is being killed, nor past the task it retires after."""
        if child.doomed:
            return False
        return not (self.max_tasks and child.tasks + 1 + queued + 1 > self.max_tasks)

    @staticmethod
    def _message(child: _Child, task: Task, *, lane: int, queued: bool = False) -> dict[str, Any]:
        """``task`` as the child reads it, on ``lane`` (its ``ctx.lease_lost``,
        cleared here), with the child's next sequence number."""
        child.lease_lost[lane].clear()
        child.seq += 1
        message = {
            "seq": child.seq,
            "lane": lane,
            "name": task.name,
            "payload": task.payload,  # JSON data already
            "ctx": {field: getattr(task.ctx, field) for field in _CONTEXT_FIELDS},
        }
        if queued:
            message["queued"] = True
        return message

    def _release(self, child: _Child) -> None:
        """``child`` has no task left: back to the idle ones, or ended (killed or retired)."""
        if child.doomed or (self.max_tasks and child.tasks >= self.max_tasks):
            child.proc.join(CHILD_START_TIMEOUT)
            self._gone(child)
        else:
            self._put_back(child)

    def kill(self, key: int) -> bool:
        """End the child running claim ``key`` (its handler ran past its timeout);
        False when none runs it (it just finished)."""
        with self._lock:
            child = self._busy.get(key, (None, 0))[0]
            if child is None or child.running != key:
                return False
            child.doomed = True
        child.kill(KILL_GRACE)
        return True

    def lease_lost(self, key: int) -> None:
        """Set ``ctx.lease_lost`` in the child running claim ``key``."""
        with self._lock:
            child, lane = self._busy.get(key, (None, 0))
        if child is not None:
            child.lease_lost[lane].set()

    def shutdown(self) -> None:
        """End every child: idle ones are told to stop (their pipe closes); the
        ones running a handler (past the grace period) or still starting are killed."""
        with self._lock:
            self._closed = True
            self._available.notify_all()
            idle = list(self._idle)
            self._idle.clear()
            others = [c for c in self._children if c not in idle]
            for child in others:
                child.doomed = True
            starting = list(self._starting)
        for child in others:
            child.kill(KILL_GRACE)
        for child in idle:
            child.close()
        for thread in starting:
            thread.join(CHILD_START_TIMEOUT)
        for child in [*idle, *others]:
            self._end(child, kill=child in others)
