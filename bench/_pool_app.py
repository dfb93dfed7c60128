"""The handlers of ``bench.pools``, importable by name (a process pool's children load
``bench._pool_app:app``)."""

from __future__ import annotations

import os
import time
from typing import Any

from delayq import DelayQ

TARGET = "bench._pool_app:app"

app = DelayQ("memory://")


def burn(loops: int) -> int:
    """Pure-Python CPU work: holds the GIL the whole time."""
    total = 0
    for i in range(loops):
        total += i * i % 7
    return total


@app.handler("cpu")
def cpu(payload: dict[str, Any]) -> None:
    burn(payload["loops"])


@app.handler("noop")
def noop(payload: Any) -> None:
    return None


@app.handler("spin", timeout=0.5)
def spin(payload: dict[str, Any]) -> None:
    """Says when it started (wall clock) and in which process, then never returns."""
    with open(payload["report"], "a") as out:
        out.write(f"{os.getpid()} {time.time()!r}\n")
    while True:
        pass
