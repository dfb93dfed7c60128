"""Flow control, measured: a noisy neighbour with and without fair shares, a
concurrency limit's utilisation, and the cost of limits that do not bind.

::

    nice python -m bench.flow                      # memory and SQLite
    nice python -m bench.flow --stores sqlite --backlog 50000 --seconds 10
    nice python -m bench.flow --stores postgres --only drain   # PostgreSQL at --postgres

Noisy neighbour: group A has ``--backlog`` due jobs, group B schedules 20 jobs/s
with 0-1 s delays for ``--seconds``; one in-process ``Worker(concurrency=8)``
runs 1 ms handlers. Reported: B's lateness (claim time - due time) p50 / p99 /
max, with groups (A and B take turns) and without (same run shape, no group):
without, B waits behind A's backlog.

Concurrency limit: 60 jobs of one key with ``concurrency=3``, 0.2 s handlers, one
worker of 8 threads (every thread could take one): the most running at once
(from handler start / end marks) and utilisation = busy time / (3 x wall time).

Cost: drain of ``--drain`` due jobs with no limit, and with a limit declared on
every job's key (``concurrency`` far above what runs), in jobs/s.

PostgreSQL runs in the benchmark database of :mod:`bench.postgres` (``delayq_bench``
on the server at ``--postgres``), one schema per scenario, dropped afterwards.

Numbers come with the load average (``os.getloadavg``): the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delayq.app import DelayQ
from delayq.job import JobContext
from delayq.worker import Worker

_POSTGRES = {"server": "postgresql://postgres@127.0.0.1:5432/postgres"}


def _url(store: str, tmp: Path, name: str) -> str:
    if store == "memory":
        return "memory://"
    if store == "postgres":
        from bench.postgres import bench_database  # noqa: PLC0415 - PostgreSQL runs only

        schema = "delayq_flow_" + "".join(c if c.isalnum() else "_" for c in name.lower())
        url = bench_database(_POSTGRES["server"])
        _drop_schema(url, schema)
        return f"{url}?schema={schema}&queue=bench"
    return f"sqlite:///{tmp / name}.db?synchronous=normal"


def _drop_schema(url: str, schema: str) -> None:
    import psycopg  # noqa: PLC0415 - only the PostgreSQL runs need the driver

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _cleanup(store: str, url: str) -> None:
    """Drop a PostgreSQL scenario's schema (the other stores' files go with the temp dir)."""
    if store == "postgres":
        base, _, query = url.partition("?")
        _drop_schema(base, dict(p.split("=") for p in query.split("&"))["schema"])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _until(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def noisy_neighbour(store: str, tmp: Path, *, backlog: int, seconds: float, fair: bool) -> str:
    url = _url(store, tmp, f"noisy-{fair}")
    app = DelayQ(url)
    late_b: list[float] = []
    lock = threading.Lock()

    @app.handler("a")
    def run_a(payload: Any) -> None:
        time.sleep(0.001)

    @app.handler("b")
    def run_b(payload: Any, ctx: JobContext) -> None:
        with lock:
            late_b.append(ctx.claimed_at - ctx.run_at)
        time.sleep(0.001)

    for start in range(0, backlog, 1000):
        app.schedule_many(
            [
                {"name": "a", "group": "A"} if fair else {"name": "a"}
                for _ in range(min(1000, backlog - start))
            ]
        )
    worker = Worker(app, concurrency=8).start()
    rng = random.Random(1)
    sent = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        app.schedule("b", delay=rng.random(), **({"group": "B"} if fair else {}))
        sent += 1
        time.sleep(0.05)
    _until(lambda: len(late_b) >= sent, 120)
    worker.stop()
    app.close()
    _cleanup(store, url)
    mode = "groups" if fair else "no groups"
    return (
        f"{store:7} noisy neighbour, {mode:9}: B lateness p50 {_pct(late_b, 0.5) * 1000:8.1f} ms"
        f"  p99 {_pct(late_b, 0.99) * 1000:8.1f} ms  max {max(late_b) * 1000:8.1f} ms"
        f"  ({len(late_b)}/{sent} B jobs run)"
    )


def concurrency_limit(store: str, tmp: Path) -> str:
    url = _url(store, tmp, "concurrency")
    app = DelayQ(url)
    app.limit("k", concurrency=3)
    marks: list[tuple[float, int]] = []
    lock = threading.Lock()

    @app.handler("slow")
    def slow(payload: Any) -> None:
        with lock:
            marks.append((time.monotonic(), +1))
        time.sleep(0.2)
        with lock:
            marks.append((time.monotonic(), -1))

    app.schedule_many([{"name": "slow", "key": "k"} for _ in range(60)])
    worker = Worker(app, concurrency=8).start()
    _until(lambda: len(marks) >= 120, 120)
    worker.stop()
    app.close()
    _cleanup(store, url)
    live = most = 0
    for _t, step in sorted(marks):
        live += step
        most = max(most, live)
    wall = max(t for t, _ in marks) - min(t for t, _ in marks)
    return (
        f"{store:7} concurrency 3, 60 x 0.2 s: at most {most} running; "
        f"utilisation {60 * 0.2 / (3 * wall) * 100:.0f}% of the limit ({wall:.2f} s)"
    )


def _releaser(done: threading.Semaphore) -> Callable[[Any], None]:
    def release(payload: Any) -> None:
        done.release()

    return release


def drain_cost(store: str, tmp: Path, jobs: int, *, limits: bool = True) -> str:
    rates = {}
    for limited in (False, True) if limits else (False,):
        url = _url(store, tmp, f"drain-{limited}")
        app = DelayQ(url)
        done = threading.Semaphore(0)

        app.register("n", _releaser(done))

        if limited:
            app.limit("tenant:*", concurrency=10_000)
        for start in range(0, jobs, 1000):
            app.schedule_many(
                [
                    {"name": "n", **({"key": f"tenant:{i % 100}"} if limited else {})}
                    for i in range(start, min(jobs, start + 1000))
                ]
            )
        t0 = time.monotonic()
        worker = Worker(app, concurrency=8).start()
        for _ in range(jobs):
            done.acquire(timeout=120)
        rates[limited] = jobs / (time.monotonic() - t0)
        worker.stop()
        app.close()
        _cleanup(store, url)
    if not limits:
        return f"{store:7} drain {jobs}: no limits {rates[False]:7.0f}/s"
    return (
        f"{store:7} drain {jobs}: no limits {rates[False]:7.0f}/s, limits declared, "
        f"not binding {rates[True]:7.0f}/s ({rates[True] / rates[False] * 100:.0f}%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="memory,sqlite")
    parser.add_argument("--backlog", type=int, default=50_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument(
        "--only", default=None, help="comma-separated scenarios: noisy, concurrency, drain, plain"
    )
    parser.add_argument("--postgres", default=_POSTGRES["server"], help="PostgreSQL server URL")
    args = parser.parse_args()
    _POSTGRES["server"] = args.postgres
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores.split(","):
            _run_store(store, Path(tmp), args)


def _run_store(store: str, tmp: Path, args: argparse.Namespace) -> None:
    scenarios: list[tuple[str, Callable[[], str]]] = [
        (
            "noisy",
            lambda: noisy_neighbour(
                store, tmp, backlog=args.backlog, seconds=args.seconds, fair=True
            ),
        ),
        (
            "noisy",
            lambda: noisy_neighbour(
                store, tmp, backlog=args.backlog, seconds=args.seconds, fair=False
            ),
        ),
        ("concurrency", lambda: concurrency_limit(store, tmp)),
        ("drain", lambda: drain_cost(store, tmp, args.drain)),
        # the no-limit drain alone (a store or version without flow control)
        ("plain", lambda: drain_cost(store, tmp, args.drain, limits=False)),
    ]
    wanted = None if args.only is None else set(args.only.split(","))
    for name, scenario in scenarios:
        skip = name == "plain" if wanted is None else name not in wanted
        if skip:
            continue
        line = scenario()
        print(f"{line}   [load {os.getloadavg()[0]:.1f}]", flush=True)


if __name__ == "__main__":
    main()
