"""A worker process for the recurring-schedule integration tests (run with ``python -m``).

``python -m tests.integration.recurring_worker_proc URL OUTDIR`` runs a real
:class:`~delayq.worker.Worker` on the store at ``URL`` with one handler,
``record``, which appends one line per run to ``OUTDIR/ran.<pid>``::

    <job id> <run_at> <pid> <payload as JSON>

and ``slow``, which sleeps ``payload["sleep"]`` seconds and then appends
``<job id> <start> <end> <scheduled_for>`` (wall-clock times) to
``OUTDIR/spans.<pid>``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("outdir")
    args = parser.parse_args(argv)

    from delayq.app import DelayQ  # noqa: PLC0415
    from delayq.job import JobContext  # noqa: PLC0415
    from delayq.worker import Worker  # noqa: PLC0415

    app = DelayQ(args.url)
    pid = os.getpid()
    out = (Path(args.outdir) / f"ran.{pid}").open("a", encoding="utf-8")
    spans = (Path(args.outdir) / f"spans.{pid}").open("a", encoding="utf-8")

    @app.handler("record")
    def record(payload: Any, ctx: JobContext) -> None:
        out.write(f"{ctx.id} {ctx.run_at!r} {pid} {json.dumps(payload)}\n")
        out.flush()

    @app.handler("slow")
    def slow(payload: Any, ctx: JobContext) -> None:
        start = time.time()
        time.sleep(float(payload["sleep"]))
        spans.write(f"{ctx.id} {start!r} {time.time()!r} {ctx.scheduled_for!r}\n")
        spans.flush()

    try:
        Worker(app, concurrency=2, lease=10.0, grace=5.0).run()
    finally:
        out.close()
        spans.close()
        app.close()


if __name__ == "__main__":
    main()
