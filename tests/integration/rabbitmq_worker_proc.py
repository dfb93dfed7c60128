"""A worker process for the RabbitMQ integration tests (run with ``python -m``).

``python -m tests.integration.rabbitmq_worker_proc URL QUEUE RECORD [--concurrency N]``
runs a real :class:`~delayq.worker.Worker` on the RabbitMQ queue ``QUEUE`` with
two handlers that append one line per run to the file ``RECORD``::

    <job id> <attempt> <pid> <run_at> <time.time() when the handler started>

``record`` then blocks for ``payload["sleep_first"]`` seconds on the job's first
run in that file (to be killed mid-handler); ``kill`` kills its own process
(a job that kills every worker that runs it).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from typing import Any

from delayq.app import DelayQ
from delayq.job import JobContext
from delayq.worker import Worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("record")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    app = DelayQ(args.url, queue=args.queue)
    pid = os.getpid()
    forever = threading.Event()
    lock = threading.Lock()
    out = open(args.record, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def note(ctx: JobContext) -> bool:
        """Record this run; True when it is the job's first run in the file."""
        with lock, open(args.record) as before:
            first = not any(line.split()[0] == ctx.id for line in before if line.strip())
            out.write(f"{ctx.id} {ctx.attempt} {pid} {ctx.run_at!r} {time.time()!r}\n")
            out.flush()
            os.fsync(out.fileno())
        return first

    @app.handler("record")
    def record(payload: dict[str, Any], ctx: JobContext) -> None:
        if note(ctx) and payload.get("sleep_first"):
            forever.wait(payload["sleep_first"])

    @app.handler("kill")
    def kill(payload: dict[str, Any], ctx: JobContext) -> None:
        note(ctx)
        os.kill(pid, signal.SIGKILL)

    Worker(app, concurrency=args.concurrency, lease=30.0, grace=5.0).run()
    app.close()


if __name__ == "__main__":
    main()
