"""A worker process for the PostgreSQL integration tests (run with ``python -m``).

``python -m tests.integration.postgres_worker_proc URL SCHEMA APP_NAME [--lease S]``
runs a real :class:`~delayq.worker.Worker` on the queue in ``SCHEMA`` with one
handler, ``record``, which inserts one row per run into ``SCHEMA.ran``::

    (job id, attempt, pid, claimed_at, lease_until, server time when it ran)

and then blocks for ``payload["sleep_first"]`` seconds on the first attempt
(to be killed mid-handler). Every connection carries ``APP_NAME``, so a test
can terminate exactly this process's server backends.
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

import psycopg

from delayq.app import DelayQ
from delayq.job import JobContext
from delayq.worker import Worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("app_name")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    app = DelayQ(args.url, schema=args.schema, application_name=args.app_name)
    pid = os.getpid()
    forever = threading.Event()
    local = threading.local()

    def conn() -> psycopg.Connection[Any]:
        found: psycopg.Connection[Any] | None = getattr(local, "conn", None)
        if found is None or found.closed:
            found = psycopg.connect(args.url, autocommit=True, application_name=args.app_name)
            local.conn = found
        return found

    @app.handler("record")
    def record(payload: dict[str, Any], ctx: JobContext) -> None:
        try:
            conn().execute(
                f'INSERT INTO "{args.schema}".ran VALUES '
                f"(%s, %s, %s, %s, %s, extract(epoch FROM clock_timestamp()))",
                (ctx.id, ctx.attempt, pid, ctx.claimed_at, ctx.lease_until),
            )
        except psycopg.OperationalError:
            local.conn = None
            raise  # a failed attempt: retried, recorded by the next one
        if ctx.attempt == 1 and payload.get("sleep_first"):
            forever.wait(payload["sleep_first"])

    Worker(app, concurrency=args.concurrency, lease=args.lease, grace=5.0).run()
    app.close()


if __name__ == "__main__":
    main()
