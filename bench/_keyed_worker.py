"""delayq worker entry for the live keyed benchmark (``bench.keyed_live``), on any store.

``python -m bench._keyed_worker`` runs one worker process with delayq's default settings on
the store named by ``BENCH_LOAD_URL``. Each handler records, first thing, one line per run
with one atomic write: ``debounce`` writes ``job_id start run_at seq`` (the payload's call
number: the last call that reached the job), ``append`` writes ``job_id e1,e2,...`` (the
events the run received).
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench._load_delayq import URL_ENV
from bench._peer_common import OUT_ENV
from delayq.app import DelayQ
from delayq.job import JobContext

app = DelayQ(os.environ.get(URL_ENV, "sqlite:///bench-keyed.db"))

_fd: int | None = None


def _write(line: str) -> None:
    global _fd  # noqa: PLW0603 - one descriptor per process
    if _fd is None:
        _fd = os.open(os.environ[OUT_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line.encode())


@app.handler("debounce")
def debounce(payload: dict[str, Any], ctx: JobContext) -> None:
    started = time.time()
    _write(f"{ctx.id} {started:.6f} {ctx.run_at:.6f} {payload['seq']}\n")


@app.handler("append")
def append(payload: list[int], ctx: JobContext) -> None:
    _write(f"{ctx.id} {','.join(str(e) for e in payload)}\n")


def main() -> None:
    """Run one worker until SIGINT/SIGTERM (graceful stop)."""
    from delayq.worker import Worker  # noqa: PLC0415 - only the worker process needs it

    Worker(app).run()


if __name__ == "__main__":
    main()
