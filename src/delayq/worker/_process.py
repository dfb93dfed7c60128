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
  child answers ``ok`` or the error text with the child's traceback.
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
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from delayq.errors import ConfigurationError
from delayq.job import JobContext
from delayq.worker._child import child_main
from delayq.worker._childlog import forward_level, replay

__all__ = [
    "CHILD_START_TIMEOUT",
    "KILL_GRACE",
    "ChildFailed",
    "ProcessPool",
    "Ran",
    "describe_exit",
]

log = logging.getLogger("delayq.worker")

KILL_GRACE = 0.1
"""Seconds between the SIGTERM and the SIGKILL that end a child past its timeout."""

CHILD_START_TIMEOUT = 60.0
"""Seconds a new child may take to start and load the app."""

_CONTEXT_FIELDS = tuple(f.name for f in dataclasses.fields(JobContext) if f.name != "lease_lost")


class Ran(NamedTuple):
    """How a task in a child ended: ``failed`` is None when it succeeded (or did not
    run), else (summary, error text with the child's traceback); ``result`` the
    return value as JSON text (a handler storing results); ``final`` a failure no
    retry can mend (a return value that cannot be stored)."""

    failed: tuple[str, str] | None = None
    result: str | None = None
    final: bool = False


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
    """One child process and its end of the pipe (used by one thread at a time)."""

    __slots__ = ("_poller", "conn", "doomed", "lease_lost", "proc", "tasks")

    def __init__(self, proc: Any, conn: Connection, lease_lost: Any) -> None:
        self.proc = proc
        self.conn = conn
        self.lease_lost = lease_lost
        self.tasks = 0
        self.doomed = False  # being killed (a timeout, or the shutdown)
        self._poller: Any = None

    def wait_answer(self) -> bool:
        """Block until the child answered or ended: one ``poll`` on its pipe and its
        sentinel (built once per child: a task's wait is one system call). True when
        the pipe has something to read (an answer, or the EOF of a child gone)."""
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self.conn.fileno(), select.POLLIN)
            self._poller.register(self.proc.sentinel, select.POLLIN)
        fd = self.conn.fileno()
        while not (ready := self._poller.poll()):
            pass
        return any(got == fd for got, _ in ready) or self.conn.poll()

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


def _receive(conn: Connection, deadline: float) -> dict[str, Any] | None:
    """The next frame from a child that is not a log record (those are replayed);
    None when none came by ``deadline`` (monotonic)."""
    while conn.poll(max(0.0, deadline - time.monotonic())):
        frame: dict[str, Any] = json.loads(conn.recv_bytes())
        if "log" not in frame:
            return frame
        replay(frame["log"])
    return None


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
        self._busy: dict[int, _Child] = {}
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
        lease_lost = self._mp.Event()
        proc = self._mp.Process(
            target=child_main,
            args=(self.target, child_end, lease_lost, self.max_tasks, os.getpid()),
            kwargs={"log_level": forward_level()},
            name="delayq-child",
        )
        child = _Child(proc, parent_end, lease_lost)
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
            hello = _receive(child.conn, time.monotonic() + CHILD_START_TIMEOUT)
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

    def _take(self) -> _Child:
        """An idle child; or the replacement being started (it is this task's);
        or a new one. Raises ``_Closed`` once the pool shut down."""
        with self._lock:
            while not self._idle and self._starting and not self._closed:
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
    def run(
        self, key: int, name: str, payload: Any, ctx: JobContext, *, begin: Callable[[], bool]
    ) -> Ran:
        """Run handler ``name`` in a child for the claim ``key``; blocks until it ends.

        ``begin()`` is called once a child is ready, just before the task is
        sent (the handler's timeout starts there); when it returns False (the
        attempt was decided while it waited for a child) nothing runs. A child
        that died is a failure too (see :class:`Ran`).
        """
        task = json.dumps(
            {
                "name": name,
                "payload": payload,  # JSON data already
                "ctx": {field: getattr(ctx, field) for field in _CONTEXT_FIELDS},
            }
        ).encode()
        try:
            child = self._take()
        except _Closed:  # the worker stops (its claim is handed back, so this is not recorded)
            text = f"ChildFailed: the worker stopped before handler {name!r} could start"
            return Ran((text, text))
        except ConfigurationError as exc:
            return Ran((f"ChildFailed: {exc}", f"ChildFailed: {exc}"))
        child.lease_lost.clear()
        with self._lock:
            self._busy[key] = child
        if not begin():
            with self._lock:
                self._busy.pop(key, None)
            self._put_back(child)
            return Ran()
        answer: dict[str, Any] | None = None
        try:
            child.conn.send_bytes(task)
            while child.wait_answer():
                frame = json.loads(child.conn.recv_bytes())
                if "log" not in frame:
                    answer = frame
                    break
                replay(frame["log"])
        except (EOFError, OSError):
            answer = None
        finally:
            with self._lock:
                self._busy.pop(key, None)
        child.tasks += 1
        retired = self.max_tasks and child.tasks >= self.max_tasks
        if answer is None or child.doomed or retired:
            child.proc.join(None if answer is None or retired else CHILD_START_TIMEOUT)
            code = child.proc.exitcode
            self._gone(child)
            if answer is None:
                text = (
                    f"ChildFailed: the process running handler {name!r} "
                    f"{describe_exit(code)} before the handler returned"
                )
                return Ran((text, text))
        else:
            self._put_back(child)
        if answer.get("ok"):
            result = answer.get("result")
            return Ran(result=result if isinstance(result, str) else None)
        error = str(answer.get("error", "ChildFailed: no error text"))
        summary = str(answer.get("summary", error.splitlines()[-1] if error else ""))
        return Ran((summary, error), final=bool(answer.get("final")))

    def kill(self, key: int) -> bool:
        """End the child running claim ``key`` (its handler ran past its timeout);
        False when none runs it (it just finished)."""
        with self._lock:
            child = self._busy.get(key)
            if child is None:
                return False
            child.doomed = True
        child.kill(KILL_GRACE)
        return True

    def lease_lost(self, key: int) -> None:
        """Set ``ctx.lease_lost`` in the child running claim ``key``."""
        with self._lock:
            child = self._busy.get(key)
        if child is not None:
            child.lease_lost.set()

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
