"""The child side of the process pool: a spawned process running one handler at a time.

The child loads the app by its name (``package.module:app``, with the one
loader), says it is ready, then runs the tasks its parent sends over its pipe,
one at a time, in order: a message is a JSON list of tasks (handler name,
payload, the context's fields, a sequence number), an answer is JSON (``ok``, or
the error text with its traceback). A task marked ``queued`` was sent while
another ran: the child starts it only if it can take its token from the gate
semaphore (else the parent revoked it: it is dropped and reported as
``revoked``), and says ``start`` first, in the frame that answers the task
before. An async handler
runs to its end in ``asyncio.run``. The child ignores SIGINT (a Ctrl-C on the
terminal reaches the whole process group; the parent stops gracefully), ends
when its pipe closes, after ``max_tasks`` tasks, or when its parent is gone
(a watchdog thread: an orphan must not run a job whose lease its dead parent
can no longer keep; it sleeps between looks because no event tells a child
that its parent died). Its log records go to the parent over the same pipe
(``_childlog``). A timed-out handler is ended from outside: SIGTERM, then
SIGKILL.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Awaitable
from multiprocessing.connection import Connection
from typing import Any

from delayq._loader import load_app
from delayq.codec import encode_result
from delayq.errors import InvalidResult
from delayq.job import JobContext
from delayq.worker._childlog import PipeLogHandler
from delayq.worker._decide import format_error
from delayq.worker._pipe import FrameReader, write_frame

__all__ = ["ORPHAN_CHECK", "child_main"]

ORPHAN_CHECK = 0.5
"""Seconds between the child's looks at whether its parent still lives."""


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(ORPHAN_CHECK)
        if os.getppid() != parent:
            os._exit(70)  # the parent died: its claims' leases run out, the jobs run elsewhere


async def _wait(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _run(app: Any, task: dict[str, Any], lease_lost: Any) -> dict[str, Any]:
    handler = app.get_handler(task["name"])
    if handler is None:
        return {"error": f"UnknownHandler: the child process has no handler {task['name']!r}"}
    ctx = JobContext(**task["ctx"], lease_lost=lease_lost)
    try:
        result = handler.call(task["payload"], ctx)
        if result is not None and inspect.isawaitable(result):
            result = asyncio.run(_wait(result))
        if handler.store_result:
            return {"ok": True, "result": encode_result(result)}
    except BaseException as exc:  # SystemExit from a handler is its failure too
        answer: dict[str, Any] = {
            "error": format_error(exc),
            "summary": f"{type(exc).__name__}: {exc}",
        }
        if isinstance(exc, InvalidResult):
            answer["final"] = True  # the body ran: dead-lettered at once (see Runner._finish)
        return answer
    return {"ok": True}


def _forward_logs(conn: Connection, lock: threading.Lock, level: int) -> None:
    """Every record of this process goes to the parent (``_childlog``)."""
    root = logging.getLogger()
    root.handlers[:] = [PipeLogHandler(conn, lock)]
    root.setLevel(level)


def child_main(
    target: str,
    conn: Connection,
    lease_lost: tuple[Any, ...],
    max_tasks: int,
    parent: int,
    *,
    gate: Any,
    log_level: int,
) -> None:
    """The child's whole life (the target of the spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lock = threading.Lock()  # the answers and the log frames share the pipe
    _forward_logs(conn, lock, log_level)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()

    fd = conn.fileno()

    def send(answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        with lock:
            write_frame(fd, data)

    try:
        app = load_app(target)
    except BaseException as exc:
        send({"ready": False, "error": format_error(exc)})
        return
    send({"ready": True})
    reader = FrameReader(fd)
    inbox: deque[dict[str, Any]] = deque()  # tasks read from the pipe, not started yet
    out: dict[str, Any] = {}  # the next frame: the last answer, the tasks dropped, the next start
    done = 0
    while True:
        try:
            _read(reader, inbox, block=False)
            while not inbox:  # nothing to start: say what there is to say, then wait
                if out:
                    send(out)
                    out = {}
                _read(reader, inbox, block=True)
        except (EOFError, OSError):
            if out:
                send(out)
            return  # the parent closed the pipe: stop
        task = inbox.popleft()
        if task.get("queued"):
            if not gate.acquire(False):  # the parent took its token back: revoked
                out.setdefault("revoked", []).append(task["seq"])
                continue
            out["start"] = task["seq"]  # before the handler runs: the parent arms its timeout
        if out:
            send(out)
        out = _run(app, task, lease_lost[task.get("lane", 0)])
        out["seq"] = task.get("seq")
        done += 1
        if max_tasks and done >= max_tasks:
            send(out)
            return


def _read(reader: FrameReader, inbox: deque[dict[str, Any]], *, block: bool) -> None:
    """Move the tasks the parent sent (lists of them) into ``inbox``. ``block``:
    wait for a message first; else only look."""
    frames = reader.frames
    reader.fill(None if block and not frames else 0)
    while frames:
        inbox.extend(json.loads(frames.popleft()))
