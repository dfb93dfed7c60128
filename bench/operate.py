"""Operating delayq: what the dashboard's pages and the metrics cost.

::

    python -m bench.operate            # 1,000,000 pending jobs in SQLite (a few minutes)
    python -m bench.operate --quick    # 100,000

What is measured (the public calls a dashboard or a worker makes):

- a page of 50 jobs with ``DelayQ.list_jobs(limit=51, after=cursor)`` on SQLite,
  p50 / p99 over repeated reads, at the first page, in the middle and at the
  end of the due order: a keyset cursor walks the index from where the last page
  ended, so depth should not matter; the same with a ``name`` filter matching
  half of the jobs, and one matching one job in 1,000 (no index on names: the
  walk reads about 1,000 rows per match);
- a ``/metrics`` scrape of the store gauges (``stats()`` and the oldest due job);
- ``Metrics.on_result`` per finished attempt (counters + two histograms);
- ``DelayQ.schedule`` on the memory store with and without the metrics producer
  hook, jobs/s.

The machine may be shared and loaded: numbers are indicative.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import generate_latest

from delayq import DelayQ
from delayq.observe.metrics import Metrics, exposition_registry
from delayq.worker import JobResult


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def pages(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'pages.db'}?synchronous=normal"
        with DelayQ(url) as app:
            base = time.time() + 86400
            batch = 10_000
            for start in range(0, count, batch):
                app.schedule_many(
                    [
                        {
                            "name": "rare" if i % 1000 == 0 else ("mail" if i % 2 else "sms"),
                            "at": base + i * 0.001,
                            "job_id": f"j{i:08}",
                        }
                        for i in range(start, min(start + batch, count))
                    ]
                )
            print(f"SQLite, {count:,} pending jobs; a page = list_jobs(limit=51, after=cursor)")
            print(f"{'where':<28} {'p50 ms':>8} {'p99 ms':>8}")
            for label, depth in (("first page", None), ("middle", count // 2), ("end", count - 60)):
                cursor = None if depth is None else (base + depth * 0.001, f"j{depth:08}")
                p50, p99 = _timed(lambda c=cursor: app.list_jobs(limit=51, after=c), 50)
                print(f"{label:<28} {p50 * 1000:>8.2f} {p99 * 1000:>8.2f}")
            registry = exposition_registry(None, app.backend)
            p50, p99 = _timed(lambda: generate_latest(registry), 10)
            print(f"{'/metrics scrape (store)':<28} {p50 * 1000:>8.2f} {p99 * 1000:>8.2f}")
            middle = (base + count // 2 * 0.001, f"j{count // 2:08}")
            for name, label in (("mail", "name= half the jobs"), ("rare", "name= 1 job in 1,000")):
                p50, p99 = _timed(lambda n=name: app.list_jobs(limit=51, after=middle, name=n), 20)
                print(f"{label + ', middle':<28} {p50 * 1000:>8.2f} {p99 * 1000:>8.2f}")


def metrics_cost(calls: int) -> None:
    m = Metrics()
    results = [
        JobResult(str(i), f"h{i % 8}", 1, "succeeded", 0.001 * (i % 50), 0.01) for i in range(1000)
    ]
    start = time.perf_counter()
    for i in range(calls):
        m.on_result(results[i % 1000])
    elapsed = time.perf_counter() - start
    print(f"\nMetrics.on_result: {elapsed / calls * 1e6:.1f} µs per result ({calls:,} calls)")


def hook_cost(calls: int) -> None:
    rates = {}
    for label, hooked in (("without hook", False), ("with Metrics hook", True)):
        with DelayQ("memory://") as app:
            if hooked:
                Metrics().instrument(app)
            start = time.perf_counter()
            for i in range(calls):
                app.schedule("mail", {"n": i}, delay=60)
            rates[label] = calls / (time.perf_counter() - start)
    for label, rate in rates.items():
        print(f"schedule on memory://, {label}: {rate:,.0f} jobs/s ({calls:,} calls)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operate")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    pages(100_000 if args.quick else 1_000_000)
    metrics_cost(100_000 if args.quick else 500_000)
    hook_cost(20_000 if args.quick else 100_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
