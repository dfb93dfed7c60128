"""Recurring schedules under live load: how late each occurrence starts, and that each runs once.

::

    python -m bench.recurring            # full run (20 schedules every 1 s for 20 s)
    python -m bench.recurring --quick    # smoke run (5 schedules for 5 s)

Per store (SQLite in a temporary directory; Redis at ``$DELAYQ_BENCH_REDIS`` or
``redis://127.0.0.1:6379/0`` under a private prefix; PostgreSQL at
``$DELAYQ_BENCH_POSTGRES`` or ``postgresql://postgres@127.0.0.1:5432/test`` in a
private schema; a server that is unreachable is skipped):
``schedules`` schedules declared with ``DelayQ.recurring(every=1)`` and run by ONE
``Worker`` (defaults: 8 threads) in this process, while a producer thread calls
``DelayQ.schedule`` for one-off jobs due 50 ms later at ``load`` jobs/s (the
worker runs those too). Lateness is the handler's first ``time.time()`` minus
the occurrence's due time (its tick, then the occurrence job, both go through
the store); the one-off jobs' lateness is shown beside it. Also counted:
occurrences that ran, and any occurrence id that ran twice (must be 0).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from delayq import DelayQ, JobContext, Worker
from delayq.errors import DelayqError
from delayq.worker import percentile


def run_one(url: str, *, schedules: int, seconds: float, load: float, **options: Any) -> str:
    app = DelayQ(url, **options)
    lock = threading.Lock()
    late: list[float] = []
    noise_late: list[float] = []
    ran: Counter[str] = Counter()

    @app.handler("beat")
    def beat(payload: Any, ctx: JobContext) -> None:
        started = time.time()
        with lock:
            late.append(started - ctx.run_at)
            ran[ctx.id] += 1

    @app.handler("noise")
    def noise(payload: Any, ctx: JobContext) -> None:
        started = time.time()
        with lock:
            noise_late.append(started - ctx.run_at)

    stop = threading.Event()

    def produce() -> None:
        interval = 1.0 / load
        while not stop.wait(interval):
            app.schedule("noise", {"n": 1}, delay=0.05)

    worker = Worker(app)
    worker.start()
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    for i in range(schedules):
        app.recurring(f"beat.{i}", handler="beat", every=1)
    stop.wait(seconds)
    for i in range(schedules):
        app.remove_recurring(f"beat.{i}")
    stop.set()
    producer.join()
    worker.stop()
    app.close()
    twice = sum(1 for n in ran.values() if n > 1)
    ms = sorted(x * 1000 for x in late)
    base = sorted(x * 1000 for x in noise_late)
    return (
        f"{len(ran)} occurrences of {schedules} x every=1s over {seconds:.0f}s "
        f"(+{load:.0f} one-off jobs/s), ran twice: {twice}; occurrence lateness p50 "
        f"{percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms, max {ms[-1]:.1f} ms; "
        f"one-off jobs' lateness p50 {percentile(base, 50):.1f} ms, "
        f"p99 {percentile(base, 99):.1f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recurring")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    schedules, seconds, load = (5, 5.0, 100.0) if args.quick else (20, 20.0, 500.0)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        print(
            "sqlite (synchronous=full):",
            run_one(url, schedules=schedules, seconds=seconds, load=load),
        )
    redis_url = os.environ.get("DELAYQ_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    prefix = f"delayqbench:{uuid.uuid4().hex[:8]}"
    try:
        print(
            "redis:",
            run_one(redis_url, schedules=schedules, seconds=seconds, load=load, prefix=prefix),
        )
    except DelayqError as exc:
        print(f"redis: skipped ({exc})")
    finally:
        try:
            import redis  # noqa: PLC0415

            client = redis.Redis.from_url(redis_url)
            keys = list(client.scan_iter(f"{prefix}:*"))
            if keys:
                client.delete(*keys)
        except Exception as exc:
            print(f"redis cleanup failed: {exc}")
    pg_url = os.environ.get("DELAYQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"dq_bench_{uuid.uuid4().hex[:8]}"
    try:
        print(
            "postgres:",
            run_one(f"{pg_url}?schema={schema}", schedules=schedules, seconds=seconds, load=load),
        )
    except DelayqError as exc:
        print(f"postgres: skipped ({exc})")
    finally:
        try:
            import psycopg  # noqa: PLC0415

            with psycopg.connect(pg_url, autocommit=True, connect_timeout=3) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        except Exception as exc:
            print(f"postgres cleanup failed: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
