"""delayq on PostgreSQL under live load, its drain rate, and its ``schedule`` rate.

::

    python -m bench.postgres            # 200 and 2,000 jobs/s for 10 s; drain 20,000 jobs
    python -m bench.postgres --quick    # 3 s runs; drain 4,000 jobs
    python -m bench.postgres --only delayq-postgres

Everything runs in a database of its own (``delayq_bench``, created when
missing) on the server at ``--url``; each system's tables are dropped after its
runs. Per system, one after the other:

- **schedule calls/s** (delayq): one thread calling ``DelayQ.schedule`` as fast as
  it can, one committed transaction per call; and one thread's event loop with
  16 tasks awaiting ``AsyncDelayQ.schedule`` (the native asyncio path).
- **live load**: the shared harness of :mod:`bench.load`: ONE worker process
  with default settings while ONE producer process calls the ordinary
  delayed-enqueue API once per job at a fixed rate, each job due 0 to
  ``--horizon`` seconds after it is scheduled (so earlier jobs fall due while
  later ones arrive). Lateness is the handler's first ``time.time()`` minus the
  due time; see :mod:`bench.load` for every column.
- **drain**: N jobs already due (stored in batches before the workers start),
  then 1 or 2 worker processes: jobs/s over the jobs after the first 10% (so
  process start-up is not counted), from the handlers' start times.

``delayq-postgres`` is the default store (every ``schedule`` waits for its
commit to reach the disk); ``delayq-postgres-async`` opens it with
``synchronous_commit=off`` (a server crash may forget the last fraction of a
second of schedules). The peers, procrastinate and pgqueuer, are installed only
in the benchmark's environment (``bench/requirements-peers.txt``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psycopg

from bench import _pg_peers
from bench._peer_common import OUT_ENV
from bench.load import (
    Result,
    RunFailed,
    System,
    Workload,
    _count_lines,
    _version,
    delayq_system,
    format_table,
    measure,
    read_runs,
    running_worker,
)

DATABASE = "delayq_bench"
SCHEMA = "delayq_bench"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DRAIN_LIMIT_S = 60.0  # a drain slower than this is measured over the jobs that ran


def bench_database(server: str) -> str:
    """Create the benchmark's database when missing; its URL."""
    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if found.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return f"{server.rsplit('/', 1)[0]}/{DATABASE}"


class _Server:
    """The benchmark database's URL: set by :func:`main`, else the default server's."""

    url = ""

    @classmethod
    def get(cls) -> str:
        if not cls.url:  # run from bench.load
            cls.url = bench_database(DEFAULT_URL)
        return cls.url


def _drop(url: str, schemas: Sequence[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _delayq_prepare(query: str) -> Callable[[Path], contextlib.AbstractContextManager[str]]:
    @contextlib.contextmanager
    def prepare(workdir: Path) -> Iterator[str]:
        _drop(_Server.get(), [SCHEMA])
        try:
            yield f"{_Server.get()}?schema={SCHEMA}&queue=bench{query}"
        finally:
            _drop(_Server.get(), [SCHEMA])

    return prepare


def _peer_prepare(
    schema: str, install: Callable[[str], None]
) -> Callable[[Path], contextlib.AbstractContextManager[str]]:
    @contextlib.contextmanager
    def prepare(workdir: Path) -> Iterator[str]:
        _drop(_Server.get(), [schema])
        os.environ["PGQUEUER_SCHEMA"] = _pg_peers.PGQUEUER_SCHEMA
        install(_Server.get())
        try:
            yield _Server.get()
        finally:
            _drop(_Server.get(), [schema])

    return prepare


def _peer(name: str, modules: tuple[str, ...], notes: str, schema: str) -> System:
    return System(
        name=name,
        distribution=name,
        modules=modules,
        notes=notes,
        prepare=_peer_prepare(schema, getattr(_pg_peers, f"{name}_install")),
        worker_argv=lambda url: [sys.executable, "-m", "bench._pg_peers", name],
        enqueue=getattr(_pg_peers, f"{name}_enqueue"),
        env=_pg_peers.URL_ENV,
    )


SYSTEMS: list[System] = [
    delayq_system(
        "delayq-postgres",
        _delayq_prepare(""),
        modules=("psycopg", "psycopg_pool"),
        notes="LISTEN/NOTIFY, sleeps until the head's due time; schedule waits for the disk",
    ),
    delayq_system(
        "delayq-postgres-async",
        _delayq_prepare("&synchronous_commit=off"),
        modules=("psycopg", "psycopg_pool"),
        notes="synchronous_commit=off: schedule does not wait for the disk",
    ),
    _peer(
        "procrastinate",
        ("procrastinate",),
        "defaults: LISTEN/NOTIFY for new jobs, polls every 5 s for scheduled ones",
        _pg_peers.PROCRASTINATE_SCHEMA,
    ),
    _peer(
        "pgqueuer",
        ("pgqueuer",),
        "defaults: LISTEN/NOTIFY, dequeue_timeout 30 s, batch_size 10",
        _pg_peers.PGQUEUER_SCHEMA,
    ),
]
"""Every system, in the order they run."""


def schedule_rate(system: System, calls: int) -> float:
    """``schedule`` calls/s from one thread (delayq systems; jobs due in an hour)."""
    from delayq import DelayQ  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp, system.prepare(Path(tmp)) as url, DelayQ(url) as app:
        for i in range(100):  # warm up: connections, prepared statements
            app.schedule("noop", {"index": -i, "due": 0}, delay=3600)
        start = time.perf_counter()
        for i in range(calls):
            app.schedule("noop", {"index": i, "due": 0}, delay=3600)
        return calls / (time.perf_counter() - start)


def async_schedule_rate(system: System, calls: int, tasks: int = 16) -> float:
    """``await AsyncDelayQ.schedule`` calls/s from one thread: ``tasks`` coroutines on
    one event loop (the native asyncio path; jobs due in an hour)."""
    from delayq import AsyncDelayQ  # noqa: PLC0415

    async def run(url: str) -> float:
        async with AsyncDelayQ(url) as aq:
            for i in range(100):  # warm up: the async pool's connections
                await aq.schedule("noop", {"index": -i, "due": 0}, delay=3600)

            async def producer(first: int) -> None:
                for i in range(first, calls, tasks):
                    await aq.schedule("noop", {"index": i, "due": 0}, delay=3600)

            start = time.perf_counter()
            await asyncio.gather(*(producer(k) for k in range(tasks)))
            return calls / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp, system.prepare(Path(tmp)) as url:
        return asyncio.run(run(url))


def drain_rate(system: System, n: int, workers: int, workdir: Path) -> float:
    """Jobs/s of ``workers`` worker processes on a backlog of ``n`` jobs due already.

    The backlog is stored before the workers start; the rate is taken over the
    jobs after the first 10% (so start-up is not counted), from the handlers'
    start times: (jobs after the first 10%) / (last start - the 10% mark).
    """
    out = workdir / f"{system.name}-drain-{workers}.results"
    log_path = workdir / f"{system.name}-drain-{workers}.log"
    fill = getattr(_pg_peers, f"{system.distribution}_fill")
    with system.prepare(workdir) as url:
        os.environ[OUT_ENV] = str(out)
        os.environ[system.env] = url
        due = time.time()
        fill(url, n, due)
        with contextlib.ExitStack() as stack:
            for _ in range(workers):
                stack.enter_context(running_worker(system.worker_argv(url), log_path))
            deadline = time.monotonic() + DRAIN_LIMIT_S
            while _count_lines(out) < n and time.monotonic() < deadline:
                time.sleep(0.05)
    runs, _claims = read_runs(out)
    starts = sorted(due + min(late) for i, late in runs.items() if i >= 0)
    if len(starts) < n // 5:
        raise RunFailed(f"only {len(starts)} of {n} jobs ran in {DRAIN_LIMIT_S:.0f} s")
    mark = len(starts) // 10
    rate = (len(starts) - mark) / (starts[-1] - starts[mark])
    return rate if len(starts) == n else -rate  # negative: not every job ran in time


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--url", default=os.environ.get("DELAYQ_POSTGRES_URL", DEFAULT_URL))
    parser.add_argument("--only", default=None, help="comma-separated system names")
    parser.add_argument("--horizon", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        _Server.url = bench_database(args.url)
    except psycopg.Error as exc:
        print(f"PostgreSQL is not reachable at {args.url}: {exc}; skipped")
        return 0
    wanted = {n.strip() for n in args.only.split(",")} if args.only else None
    systems = [s for s in SYSTEMS if wanted is None or s.name in wanted]
    seconds = 3.0 if args.quick else 10.0
    horizon = args.horizon or (3.0 if args.quick else 5.0)
    workloads = [Workload(rate, seconds, horizon, 10.0, 1) for rate in (200, 2000)]
    n_drain = 4_000 if args.quick else 20_000
    print("machine: a shared 2-core VM, loaded by other work while this ran; PostgreSQL 15")
    print(
        f"live load: one producer process, {seconds:.0f} s per rate, due 0-{horizon:.0f} s ahead\n"
    )
    tables: dict[int, list[Result]] = {w.rate: [] for w in workloads}
    drains: list[str] = []
    calls: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-postgres-") as tmp:
        for system in systems:
            label = f"{system.name} {_version(system.distribution)}"
            missing = system.missing()
            if missing is not None:
                for w in workloads:
                    tables[w.rate].append(Result(label, w, failed=f"skipped: {missing}"))
                continue
            if system.distribution == "delayq":
                rate = schedule_rate(system, 1000 if args.quick else 5000)
                native = async_schedule_rate(system, 2000 if args.quick else 10000)
                calls.append(f"| {label} | {rate:,.0f} | {native:,.0f} |")
            for workload in workloads:
                try:
                    result = measure(system, workload, Path(tmp))
                    result.system = label
                except (RunFailed, OSError) as exc:
                    result = Result(label, workload, failed=f"failed: {exc}")
                tables[workload.rate].append(result)
            row = [label]
            for workers in (1, 2):
                try:
                    rate = drain_rate(system, n_drain, workers, Path(tmp))
                    row.append(
                        f"{rate:,.0f}" if rate > 0 else f"{-rate:,.0f} (not all ran in 60 s)"
                    )
                except (RunFailed, OSError) as exc:
                    row.append(f"failed: {exc}")
            drains.append("| " + " | ".join(row) + " |")
    if calls:
        print(
            "| system | schedule calls/s, one thread | asyncio, one thread, 16 tasks |\n"
            "| --- | ---: | ---: |"
        )
        print("\n".join(calls) + "\n")
    for rate, results in tables.items():
        print(f"live load, {rate:,} jobs/s offered\n")
        print(format_table(results) + "\n")
    print(f"drain: {n_drain:,} due jobs, jobs/s\n")
    print("| system | 1 worker process | 2 worker processes |\n| --- | ---: | ---: |")
    print("\n".join(drains))
    return 0


if __name__ == "__main__":
    sys.exit(main())
