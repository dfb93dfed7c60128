"""delayq worker entry for the live-load benchmark (``bench.load``), on any store.

``python -m bench._load_delayq`` runs one worker process with delayq's default settings
(``Worker(app).run()``), the same thing ``delayq worker bench._load_delayq:app`` runs, on the
store named by ``BENCH_LOAD_URL``. The no-op handler records, first thing, its start
lateness (``time.time()`` minus the due time) and the claim's lateness (claim time minus due
time, on the store's clock), so the table can say whether lateness comes from claiming or
from handing the job to a handler thread.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench._peer_common import OUT_ENV
from delayq.app import DelayQ
from delayq.job import JobContext

URL_ENV = "BENCH_LOAD_URL"

_fd: int | None = None


def _app() -> DelayQ:
    return DelayQ(os.environ.get(URL_ENV, "sqlite:///bench-load.db"))


app = _app()


@app.handler("noop")
def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record ``index start_lateness claim_lateness`` (seconds) with one atomic write."""
    started = time.time()
    global _fd  # noqa: PLW0603 - one descriptor per process
    if _fd is None:
        _fd = os.open(os.environ[OUT_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    due = payload["due"]
    os.write(_fd, f"{payload['index']} {started - due:.6f} {ctx.claimed_at - due:.6f}\n".encode())


def main() -> None:
    """Run one worker until SIGINT/SIGTERM (graceful stop)."""
    from delayq.worker import Worker  # noqa: PLC0415 - only the worker process needs it

    Worker(app).run()


if __name__ == "__main__":
    main()
