"""A worker process for the Redis integration tests (run with ``python -m``).

``python -m tests.integration.redis_worker_proc URL PREFIX [--skew S] [--lease S]``
runs a real :class:`~delayq.worker.Worker` on the Redis queue under ``PREFIX``
with one handler, ``record``, which appends one line per run to the list
``<PREFIX>:ran``::

    <job id> <attempt> <pid> <claimed_at> <run_at> <server time when the handler ran>

and then blocks for ``payload["sleep_first"]`` seconds on the first attempt
(to be killed mid-handler). ``--skew`` moves this process's wall clock (its
``time.time``) by that many seconds before delayq is imported, as on a host
whose clock is wrong.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--skew", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    if args.skew:
        real_time = time.time
        time.time = lambda: real_time() + args.skew

    import redis  # noqa: PLC0415 - imported after the clock is skewed, like delayq

    from delayq.app import DelayQ  # noqa: PLC0415
    from delayq.job import JobContext  # noqa: PLC0415
    from delayq.worker import Worker  # noqa: PLC0415

    app = DelayQ(args.url, prefix=args.prefix)
    client = redis.Redis.from_url(args.url, decode_responses=True)
    ran = f"{args.prefix}:ran"
    pid = os.getpid()
    forever = threading.Event()

    @app.handler("record")
    def record(payload: dict[str, Any], ctx: JobContext) -> None:
        seconds, micros = client.time()
        client.rpush(
            ran,
            f"{ctx.id} {ctx.attempt} {pid} {ctx.claimed_at!r} {ctx.run_at!r} "
            f"{seconds + micros / 1_000_000!r}",
        )
        if ctx.attempt == 1 and payload.get("sleep_first"):
            forever.wait(payload["sleep_first"])

    Worker(app, concurrency=args.concurrency, lease=args.lease, grace=5.0).run()
    app.close()


if __name__ == "__main__":
    main()
