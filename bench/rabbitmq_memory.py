"""Worker memory on the RabbitMQ store with a large due backlog, default settings.

::

    python -m bench.rabbitmq_memory                # 100,000 due jobs of 1 KiB
    python -m bench.rabbitmq_memory --jobs 20000 --payload 65536
    python -m bench.rabbitmq_memory --log false    # without the queue's log

Schedules ``--jobs`` jobs due now (batches of 1,000, confirms pipelined), then
runs a :class:`~delayq.worker.Worker` (default settings, a 5 ms handler) for
``--seconds`` while the backlog lasts, and prints the process's resident memory
before and at its peak, the deliveries the worker held at most, and the jobs the
queue's log view held at most. A worker holds at most ``prefetch`` (32) deliveries
beyond its claims, whatever the backlog; with the log on (the default) every process
that reads the log also keeps each job not finished (its message) in its view.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from delayq import DelayQ, Worker
from delayq.job import JobContext, JobSpec


def _ctl(*args: str) -> None:
    # -t: the broker's own bound; timeout: the CLI's (a hung CLI holds a distribution port)
    subprocess.run(
        ["rabbitmqctl", "-q", "-t", "30", *args], check=False, capture_output=True, timeout=35
    )


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rabbitmq_memory")
    parser.add_argument(
        "--url", default=os.environ.get("DELAYQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=1024, help="payload bytes")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--log", choices=("true", "false"), default="true")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if shutil.which("rabbitmqctl") is None:
        print("skipped: rabbitmqctl is not on PATH")
        return 0
    vhost = f"delayq-memory-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", vhost)
    _ctl("set_permissions", "-p", vhost, urlsplit(args.url).username or "guest", ".*", ".*", ".*")
    parts = urlsplit(args.url)
    url = f"{parts.scheme}://{parts.netloc}/{quote(vhost, safe='')}?queue=memory&log={args.log}"
    try:
        load = os.getloadavg()
        app = DelayQ(url)
        backend: Any = app.backend
        text = '"' + "x" * max(0, args.payload - 2) + '"'
        opened = _rss_mib()
        started = time.perf_counter()
        for first in range(0, args.jobs, 1000):
            backend.enqueue(
                [
                    JobSpec(id=f"m{i}", name="work", payload=text, run_at=0.0, delay=0)
                    for i in range(first, min(args.jobs, first + 1000))
                ]
            )
        scheduled_in = time.perf_counter() - started
        ran = 0
        lock = threading.Lock()

        @app.handler("work")
        def work(payload: Any, ctx: JobContext) -> None:
            nonlocal ran
            time.sleep(0.005)
            with lock:
                ran += 1

        before = _rss_mib()
        peak, held, viewed = before, 0, 0
        worker = Worker(app).start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(0.2)
            peak = max(peak, _rss_mib())
            held = max(held, backend._consumer.buffered())
            viewed = max(viewed, len(backend._arbiter._view.entries))
        worker.stop()
        app.close()
        print(
            f"RabbitMQ worker memory, log={args.log} (load average at start {load[0]:.1f}, "
            f"{load[1]:.1f}, {load[2]:.1f}): {args.jobs:,} due jobs of {args.payload:,} B "
            f"scheduled in "
            f"{scheduled_in:.1f} s ({args.jobs / scheduled_in:,.0f} jobs/s, batches of 1,000); "
            f"worker default settings ran {ran:,} in {args.seconds:g} s; resident memory "
            f"{opened:.0f} MiB before scheduling, {before:.0f} MiB before the worker (a "
            f"producer reads the log too), {peak:.0f} MiB at most; deliveries held "
            f"unclaimed at most {held}; jobs in the log's view at most {viewed:,}"
        )
        return 0
    finally:
        _ctl("delete_vhost", vhost)


if __name__ == "__main__":
    raise SystemExit(main())
