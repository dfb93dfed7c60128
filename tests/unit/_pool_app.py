"""Handlers a process pool's children import by name (``tests.unit._pool_app:app``).

Each handler reports to the file named in its payload, so a test in the parent
sees what happened in the child: its pid, its payload, its context.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from delayq import DelayQ, JobContext

TARGET = "tests.unit._pool_app:app"

GATE = "DELAYQ_TEST_CHILD_GATE"
"""A file path: a child started while that file exists waits at its import until it
is gone (a test holds a replacement child "starting" for as long as it needs)."""

if os.environ.get(GATE) and __import__("multiprocessing").parent_process() is not None:
    while Path(os.environ[GATE]).exists():
        time.sleep(0.01)

app = DelayQ("memory://")


def _report(to: dict[str, Any], **facts: Any) -> None:
    with Path(to["report"]).open("a") as out:
        out.write(json.dumps({"pid": os.getpid(), **facts}) + "\n")


@app.handler("echo")
def echo(payload: dict[str, Any], ctx: JobContext) -> None:
    _report(
        payload,
        payload=payload,
        id=ctx.id,
        attempt=ctx.attempt,
        token=ctx.token,
        max_attempts=ctx.max_attempts,
    )


@app.handler("fails")
def fails(payload: dict[str, Any]) -> None:
    _report(payload)
    raise ValueError(f"boom {payload['n']}")


@app.handler("waits", timeout=2.0)
def waits(payload: dict[str, Any]) -> None:
    """Runs until the file ``payload["release"]`` exists (a hung call)."""
    _report(payload)
    while not Path(payload["release"]).exists():
        time.sleep(0.01)


@app.handler("pauses", timeout=2.0)
def pauses(payload: dict[str, Any]) -> None:
    """Like ``waits``, but first waits for ``payload["nudge"]`` and logs once it is
    there (a log record wakes the parent's thread that waits for this child)."""
    import logging  # noqa: PLC0415

    _report(payload)
    while not Path(payload["nudge"]).exists():
        time.sleep(0.01)
    logging.getLogger("tests.pool_app").warning("nudged")
    while not Path(payload["release"]).exists():
        time.sleep(0.01)


@app.handler("spins", timeout=2.0)
def spins(payload: dict[str, Any]) -> None:
    _report(payload)
    while True:
        pass


@app.handler("dies")
def dies(payload: dict[str, Any]) -> None:
    _report(payload)
    os.kill(os.getpid(), signal.SIGKILL)


@app.handler("fenced")
def fenced(payload: dict[str, Any], ctx: JobContext) -> None:
    """Waits for the loss of its lease (as a handler fencing its side effect would)."""
    _report(payload, token=ctx.token, started=True)
    _report(payload, lost=ctx.lease_lost.wait(60))


@app.handler("sleeps_async")
async def sleeps_async(payload: dict[str, Any]) -> None:
    await asyncio.sleep(0)
    _report(payload, loop=True)


def register_on(target: DelayQ) -> None:
    """Register these handlers on ``target`` too (a test's app on a fake clock)."""
    for name, handler in app.handlers.items():
        target.register(
            name, handler.fn, timeout=handler.timeout, store_result=handler.store_result
        )


def reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@app.handler("logs")
def logs(payload: dict[str, Any], ctx: JobContext) -> None:
    """Logs at each level and one exception, then reports (the logs come first)."""
    import logging  # noqa: PLC0415

    log = logging.getLogger("tests.pool_app")
    log.debug("debug from %s", ctx.id)
    log.info("info from %s", ctx.id)
    log.warning("warning from %s", ctx.id, extra={"order": 7})
    try:
        raise KeyError("inside")
    except KeyError:
        log.exception("it failed")
    _report(payload)


@app.handler("totals", store_result=True)
def totals(payload: dict[str, Any]) -> dict[str, Any]:
    """Returns its sum and the pid that ran it (kept as the job's result)."""
    return {"total": sum(payload["items"]), "pid": os.getpid()}


@app.handler("returns_a_set", store_result=True)
def returns_a_set(payload: dict[str, Any]) -> set[int]:
    return {1, 2}
