"""delayq on PostgreSQL for minutes at a steady rate: does the hot table stay small?

::

    python -m bench.postgres_soak                    # 1,000 jobs/s for 10 minutes
    python -m bench.postgres_soak --rate 500 --minutes 3
    python -m bench.postgres_soak --options result_ttl=0   # finished jobs deleted at once

ONE worker process with default settings (``bench._load_delayq``) and ONE
producer process calling ``schedule`` at ``--rate`` jobs/s, each job due 0-2 s
after it is scheduled, with the server's autovacuum as configured (the report
says whether it is on). Every 10 s the main process samples the size of the
jobs table with its indexes and TOAST (``pg_total_relation_size``) and times
``stats()``. Reported: the size after the first minute and at the end, the p99
lateness of the jobs scheduled in the first and in the last minute, the slowest
``stats()``; then ``stats()`` once more with ``--finished`` finished records
(default 1,000,000) written straight into the table.

Runs in the benchmark database of :mod:`bench.postgres` (``delayq_bench``), in a
schema of its own that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench._peer_common import OUT_ENV
from bench.load import (
    Workload,
    _count_lines,
    _produce,
    delayq_system,
    read_runs,
    running_worker,
)
from bench.postgres import DEFAULT_URL, bench_database

SCHEMA = "delayq_soak"
HORIZON_S = 2.0
SAMPLE_EVERY_S = 10.0


def _size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(f"SELECT pg_total_relation_size('{SCHEMA}.jobs')").fetchone()
    return int(row[0]) if row else 0


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def _stats_ms(url: str) -> float:
    from delayq.backends.postgres import PostgresBackend  # noqa: PLC0415

    store = PostgresBackend(url, schema=SCHEMA, migrate=False)
    try:
        store.stats()  # a warm connection
        t0 = time.perf_counter()
        store.stats()
        return (time.perf_counter() - t0) * 1000
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres_soak")
    parser.add_argument("--url", default=os.environ.get("DELAYQ_POSTGRES_URL", DEFAULT_URL))
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument(
        "--options", default="", help="more store options for the URL, e.g. result_ttl=0"
    )
    args = parser.parse_args(argv)
    server = bench_database(args.url)
    url = f"{server}?schema={SCHEMA}" + (f"&{args.options}" if args.options else "")
    system = delayq_system("delayq-postgres", lambda _dir: _FixedUrl(url))
    seconds = args.minutes * 60
    workload = Workload(args.rate, seconds, HORIZON_S, 10.0, 1)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        autovacuum = admin.execute("SHOW autovacuum").fetchone()
        from delayq.backends.postgres import PostgresBackend  # noqa: PLC0415

        PostgresBackend(url, schema=SCHEMA).close()  # creates the schema
        try:
            with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
                out = Path(tmp) / "runs"
                os.environ[OUT_ENV] = str(out)
                os.environ[system.env] = url
                samples: list[tuple[float, int, float]] = []
                with running_worker(system.worker_argv(url), Path(tmp) / "worker.log"):
                    ctx = multiprocessing.get_context("fork")
                    reports: Any = ctx.Queue()
                    start = time.time() + 0.5
                    producer = ctx.Process(
                        target=_produce, args=(system, url, workload, 0, start, reports)
                    )
                    producer.start()
                    while producer.is_alive():
                        producer.join(SAMPLE_EVERY_S)
                        samples.append((time.time() - start, _size(admin), _stats_ms(url)))
                    scheduled = reports.get(timeout=60)[1]
                    deadline = time.time() + HORIZON_S + 30
                    while _count_lines(out) < scheduled and time.time() < deadline:
                        time.sleep(0.2)
                runs, _claims = read_runs(out)
            per_minute = args.rate * 60
            first = [min(r) for i, r in runs.items() if 0 <= i < per_minute]
            last_from = round(seconds * args.rate) - per_minute
            last = [min(r) for i, r in runs.items() if i >= last_from]
            at_minute = next((size for t, size, _ in samples if t >= 60), samples[0][1])
            print(f"load average at the end: {os.getloadavg()}")
            print(f"autovacuum: {autovacuum[0] if autovacuum else '?'}")
            print(
                f"{scheduled:,} jobs scheduled at {args.rate:,}/s for {args.minutes:g} min; "
                f"{len(runs):,} ran"
            )
            print(
                f"jobs table + indexes: {at_minute / 1e6:.1f} MB after 1 min, "
                f"{samples[-1][1] / 1e6:.1f} MB at the end "
                f"({samples[-1][1] / max(at_minute, 1):.2f}x)"
            )
            print(
                f"p99 lateness: first minute {_p99(first) * 1000:.1f} ms, "
                f"last minute {_p99(last) * 1000:.1f} ms"
            )
            print(f"stats(): slowest sample {max(s[2] for s in samples):.1f} ms")
            admin.execute(
                f"INSERT INTO {SCHEMA}.jobs (queue, id, name, payload, run_at, state, "
                f"max_attempts, backoff, misfire, created_at, updated_at) "
                f"SELECT 'default', 'f' || i, 't', '{{}}', 1, 'succeeded', 1, '{{}}', 'none', "
                f"1, extract(epoch FROM now()) FROM generate_series(1, %s) AS i",
                (args.finished,),
            )
            admin.execute(f"ANALYZE {SCHEMA}.jobs")
            print(
                f"stats() with {args.finished:,} more finished records kept: "
                f"{_stats_ms(url):.1f} ms"
            )
        finally:
            admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    return 0


class _FixedUrl:
    """``prepare`` of a system whose URL is fixed (the schema is made by ``main``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
