"""Operating delayq: what the dashboard's pages and the metrics cost.

::

    python -m bench.operate            # 1,000,000 pending jobs in SQLite (a few minutes)
    python -m bench.operate --quick    # 100,000

What is measured (the public calls a dashboard or a worker makes):

- a page of 50 jobs with ``DelayQ.list_jobs(limit=51, after=cursor)`` on SQLite,
  p50 / p99 over repeated reads, at the first page, in the middle and at the
  end of the due order: a keyset cursor walks the index from where the last page
  ended, so depth should not matter; the same with a ``name`` filter matching
  half of the jobs, and one matching one job in 1,000 (an index range on
  ``(name, state, run_at)``);
- a ``/metrics`` scrape of the store gauges (``stats()`` and the oldest due job);
- ``Metrics.on_result`` per finished attempt (counters + two histograms);
- ``DelayQ.schedule`` on the memory store with and without the metrics producer
  hook, jobs/s;
- a worker's lateness while its own dashboard (``--web-port``, served by a child
  process of the worker) is polled: a worker on a SQLite store of
  ``--polled-jobs`` pending jobs runs a tick job due every 20 ms; alone, and
  while 8 clients (another process) each fetch the overview page,
  ``/api/overview``, ``/api/jobs?limit=100`` and a ``name=`` search every 100 ms,
  the two taking turns (four of each) so that the machine's changing load meets
  both. Lateness p50 / p99 / max of each. ``--in-process`` serves that dashboard
  from the worker's own process (as ``--web-port`` did before), to compare;
  ``--search`` adds a payload search that matches nothing (a walk of every
  pending job) to what the clients fetch.

The machine may be shared and loaded: numbers are indicative.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


_PATHS = ("/", "/api/overview", "/api/jobs?limit=100", "/api/jobs?name=nope&limit=50")

_SEARCH = "/api/jobs?payload_contains=nope&limit=50"
"""A payload search no job matches: a walk of every pending job (``--search``)."""


def _client(
    base: str, stop_at: float, interval: float, counts: Any, paths: Sequence[str] = _PATHS
) -> None:
    """One polling client: every ``interval`` s the next of ``paths``."""
    i = 0
    while time.time() < stop_at:
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(base + paths[i % len(paths)], timeout=30) as r:
                r.read()
            with counts.get_lock():
                counts[0] += 1
                counts[1] += time.perf_counter() - started
        except OSError:
            with counts.get_lock():
                counts[2] += 1
        i += 1
        time.sleep(max(0.0, interval - (time.perf_counter() - started)))


def _clients(
    base: str, seconds: float, n: int, interval: float, counts: Any, paths: Sequence[str]
) -> None:
    stop_at = time.time() + seconds
    threads = [
        threading.Thread(target=_client, args=(base, stop_at, interval, counts, paths))
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _pcts(values: list[float]) -> str:
    if not values:
        return "no samples"
    values = sorted(values)
    p50 = values[len(values) // 2]
    p99 = values[max(0, int(len(values) * 0.99) - 1)]
    top = values[-1]
    return (
        f"n={len(values):>4}  p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms  "
        f"max {top * 1e3:7.2f} ms"
    )


def _in_process_dashboard(app: DelayQ, ops: Any) -> tuple[Any, str]:
    """The dashboard served from the worker's own process (as ``--web-port`` did
    before it moved to a child process): uvicorn in a thread, for comparison."""
    import uvicorn  # noqa: PLC0415

    from delayq.web import create_app  # noqa: PLC0415

    site = create_app(app, metrics=ops.metrics, cache_seconds=1.0)
    server = uvicorn.Server(
        uvicorn.Config(site, host="127.0.0.1", port=0, log_config=None, access_log=False)
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/"


def polled_worker(
    pending: int,
    seconds: float,
    clients: int = 8,
    interval: float = 0.1,
    rounds: int = 4,
    *,
    in_process: bool = False,
    search: bool = False,
) -> None:
    from delayq.cli.worker import WorkerOps  # noqa: PLC0415
    from delayq.worker import Worker  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'polled.db'}?synchronous=normal"
        with DelayQ(url) as app:
            base = time.time() + 86400
            for start in range(0, pending, 10_000):
                app.schedule_many(
                    [
                        {"name": "mail" if i % 2 else "sms", "at": base + i, "job_id": f"p{i}"}
                        for i in range(start, min(start + 10_000, pending))
                    ]
                )
            lateness: list[tuple[float, float]] = []
            app.register("tick", lambda payload: None)
            ops = WorkerOps(app, web_port=None if in_process else 0, store_url=url)
            if in_process:
                ops.metrics = Metrics().instrument(app)

            def on_result(result: JobResult) -> None:
                ops.on_result(result)
                if result.name == "tick":
                    lateness.append((time.time(), result.lateness))

            worker = Worker(app, concurrency=4, on_result=on_result)
            ops.start(worker)
            server = None
            if in_process:
                server, ops.web_url = _in_process_dashboard(app, ops)
            worker.start()
            assert ops.web_url is not None
            stop = threading.Event()

            def produce() -> None:
                while not stop.wait(0.02):
                    app.schedule("tick", delay=0.05)

            producer = threading.Thread(target=produce)
            producer.start()
            # alone and polled phases take turns, so a change in the machine's load
            # meets both (the machine may be shared)
            phases: list[tuple[str, float, float]] = []
            counts = multiprocessing.Array("d", 3)
            try:
                time.sleep(2)  # warm up
                for _ in range(rounds):
                    start = time.time()
                    time.sleep(seconds / rounds)
                    phases.append(("alone", start, time.time()))
                    start = time.time()
                    proc = multiprocessing.Process(
                        target=_clients,
                        args=(
                            ops.web_url.rstrip("/"),
                            seconds / rounds,
                            clients,
                            interval,
                            counts,
                            (*_PATHS, _SEARCH) if search else _PATHS,
                        ),
                    )
                    proc.start()
                    proc.join()
                    phases.append(("polled", start, time.time()))
            finally:
                stop.set()
                producer.join()
                worker.stop(grace=5)
                if server is not None:
                    server.should_exit = True
                ops.close()

    def during(kind: str) -> list[float]:
        return [v for t, v in lateness for k, a, b in phases if k == kind and a <= t < b]

    alone, polled = during("alone"), during("polled")
    ok, total, failed = counts[0], counts[1], counts[2]
    print(
        f"\nworker lateness, SQLite with {pending:,} pending jobs, a tick due every 20 ms "
        f"({seconds:.0f} s each, in {rounds} turns of alone / polled); the dashboard in "
        + ("the worker's process" if in_process else "a child process")
        + (", a payload search among the polled paths" if search else "")
    )
    print(f"  alone:                       {_pcts(alone)}")
    print(f"  {clients} clients polling every {interval * 1000:.0f} ms: {_pcts(polled)}")
    mean = total / ok * 1000 if ok else float("nan")
    print(f"  requests answered: {ok:.0f} ({ok / seconds:.0f}/s, mean {mean:.1f} ms)", end="")
    print(f", failed: {failed:.0f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operate")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only-polled", action="store_true", help="Only the polled-worker measurement."
    )
    parser.add_argument("--polled-jobs", type=int, default=None)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="Serve the polled dashboard from the worker's process (the old way), to compare.",
    )
    parser.add_argument(
        "--search",
        action="store_true",
        help="The pollers also search the payloads (no match: a walk of every pending job).",
    )
    args = parser.parse_args(argv)
    if not args.only_polled:
        pages(100_000 if args.quick else 1_000_000)
        metrics_cost(100_000 if args.quick else 500_000)
        hook_cost(20_000 if args.quick else 100_000)
    pending = args.polled_jobs or (50_000 if args.quick else 200_000)
    polled_worker(
        pending, 8.0 if args.quick else 20.0, in_process=args.in_process, search=args.search
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
