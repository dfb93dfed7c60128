"""A worker process for the RabbitMQ integration tests (run with ``python -m``).

``python -m tests.integration.rabbitmq_worker_proc URL QUEUE RECORD [--concurrency N]``
runs a real :class:`~delayq.worker.Worker` on the RabbitMQ queue ``QUEUE`` with
one handler, ``record``, which appends one line per run to the file ``RECORD``::

    <job id> <attempt> <pid> <run_at> <time.time() when the handler started>

and then blocks for ``payload["sleep_first"]`` seconds on the first attempt
(to be killed mid-handler).
"""

from __future__ import annotations

import argparse
import os
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

    @app.handler("record")
    def record(payload: dict[str, Any], ctx: JobContext) -> None:
        with lock:
            out.write(f"{ctx.id} {ctx.attempt} {pid} {ctx.run_at!r} {time.time()!r}\n")
            out.flush()
            os.fsync(out.fileno())
        if ctx.attempt == 1 and payload.get("sleep_first"):
            forever.wait(payload["sleep_first"])

    Worker(app, concurrency=args.concurrency, lease=30.0, grace=5.0).run()
    app.close()


if __name__ == "__main__":
    main()
