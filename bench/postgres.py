"""delayq's PostgreSQL store under live load, and its drain rate.

::

    python -m bench.postgres            # 200 and 2,000 jobs/s for 10 s; drain 20,000
    python -m bench.postgres --quick    # 3 s runs; drain 4,000

Everything runs in a database of its own (``delayq_bench``, created if missing,
its tables dropped at the end) on the server at ``--url``.

- **schedule calls/s**: one thread calling ``DelayQ.schedule`` as fast as it can
  (one call, one committed transaction per job).
- **live load**: one worker process (default settings) runs while ONE producer
  thread calls ``schedule`` at a fixed rate, each job due ``--lead`` seconds
  after it is scheduled, so earlier jobs fall due while later ones arrive.
  Lateness is the handler's first ``time.time()`` minus the due time; "early"
  counts negative ones; "missing" the jobs not run by the drain deadline.
- **drain**: N jobs already due, 1 or 2 worker processes: jobs/s from the due
  time until the last one ran.

The numbers depend on the machine; the one this was written on is a shared,
loaded 2-core VM, so compare rows of one run rather than runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench._peer_common import OUT_ENV
from bench._pg_delayq import URL_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
DATABASE = "delayq_bench"
SCHEMA = "delayq_bench"


@dataclass(frozen=True, slots=True)
class Lateness:
    """Lateness of one run, in milliseconds."""

    jobs: int
    ran: int
    early: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, jobs: int, seconds: Sequence[float]) -> Lateness:
        ms = sorted(s * 1000 for s in seconds)
        if not ms:
            return cls(jobs, 0, 0, math_nan(), math_nan(), math_nan())
        return cls(
            jobs,
            len(ms),
            sum(1 for m in ms if m < 0),
            statistics.median(ms),
            ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            ms[-1],
        )


def math_nan() -> float:
    return float("nan")


def bench_url(server: str) -> str:
    """Create the benchmark's database if missing; its URL."""
    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if found.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    base = server.rsplit("/", 1)[0]
    return f"{base}/{DATABASE}"


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


@contextlib.contextmanager
def workers(url: str, out: Path, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` delayq worker processes on ``url``, stopped gracefully afterwards."""
    env = {**os.environ, URL_ENV: url, OUT_ENV: str(out)}
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench._pg_delayq"], cwd=REPO_ROOT, env=env)
        for _ in range(count)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def read(out: Path) -> dict[int, float]:
    found: dict[int, float] = {}
    if out.exists():
        for line in out.read_text().splitlines():
            index, late = line.split()
            if int(index) >= 0:  # -1: the probe
                found.setdefault(int(index), float(late))
    return found


def wait_probe(out: Path, timeout: float = 30.0) -> None:
    """Wait until the probe job (index -1) ran: the worker is up and warm."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and any(line.startswith("-1 ") for line in out.read_text().splitlines()):
            return
        time.sleep(0.02)
    raise RuntimeError("the worker did not run the probe job in time")


def wait_for(out: Path, n: int, deadline: float) -> dict[int, float]:
    while True:
        got = read(out)
        if len(got) >= n or time.monotonic() >= deadline:
            return got
        time.sleep(0.05)


def schedule_rate(url: str, n: int) -> float:
    """``schedule`` calls per second from one thread (jobs due in an hour, never run)."""
    from delayq import DelayQ  # noqa: PLC0415

    with DelayQ(url) as app:
        for i in range(50):  # warm up: connections, prepared statements
            app.schedule("noop", {"i": -i, "due": 0}, delay=3600)
        start = time.perf_counter()
        for i in range(n):
            app.schedule("noop", {"i": i, "due": 0}, delay=3600)
        return n / (time.perf_counter() - start)


def live(
    url: str, rate: float, seconds: float, lead: float, drain: float
) -> tuple[Lateness, float]:
    """One producer at ``rate`` jobs/s for ``seconds``; lateness and the achieved rate."""
    from delayq import DelayQ  # noqa: PLC0415

    n = int(rate * seconds)
    with tempfile.TemporaryDirectory() as tmp, DelayQ(url) as app:
        out = Path(tmp) / "ran.txt"
        with workers(url, out, 1):
            app.schedule("noop", {"i": -1, "due": time.time()}, delay=0)  # probe: the worker is up
            wait_probe(out)
            start_wall, start = time.time(), time.perf_counter()
            dues: dict[int, float] = {}
            for i in range(n):
                target = i / rate
                pause = target - (time.perf_counter() - start)
                if pause > 0:
                    time.sleep(pause)
                due = start_wall + target + lead
                dues[i] = due
                app.schedule("noop", {"i": i, "due": due}, at=due)
            achieved = n / (time.perf_counter() - start)
            last_due = max(dues.values())
            got = wait_for(out, n, time.monotonic() + max(0.0, last_due - time.time()) + drain)
    return Lateness.of(n, list(got.values())), achieved


def drain(url: str, n: int, procs: int) -> float:
    """Jobs/s with ``procs`` worker processes on ``n`` jobs due at one moment."""
    from delayq import DelayQ  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp, DelayQ(url) as app:
        out = Path(tmp) / "ran.txt"
        with workers(url, out, procs):
            app.schedule("noop", {"i": -1, "due": time.time()}, delay=0)
            wait_probe(out)
            due = time.time() + 3.0 + n / 20_000  # after the enqueue below
            for start in range(0, n, 1000):
                app.schedule_many(
                    [
                        {"name": "noop", "payload": {"i": i, "due": due}, "at": due}
                        for i in range(start, min(n, start + 1000))
                    ]
                )
            got = wait_for(out, n, time.monotonic() + 120)
            finished = time.time()
    if len(got) < n:
        return float("nan")
    return n / (finished - due) if finished > due else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--url",
        default=os.environ.get(
            "DELAYQ_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--lead", type=float, default=1.0)
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else 10.0
    n_drain = 4_000 if args.quick else 20_000
    try:
        db = bench_url(args.url)
    except psycopg.Error as exc:
        print(f"PostgreSQL not reachable at {args.url}: {exc}; skipped")
        return 0
    url = f"{db}?schema={SCHEMA}&queue=bench"
    print("delayq-postgres (one producer thread; worker processes with default settings)")
    print("machine: shared 2-core VM, loaded by other work while this ran\n")
    try:
        reset(db)
        calls = schedule_rate(url, 1000 if args.quick else 5000)
        print(f"schedule calls/s (one thread): {calls:,.0f}")
        print("\n| rate jobs/s | achieved | jobs | ran | early | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|---|---|---|")
        for rate in (200.0, 2000.0):
            reset(db)
            late, achieved = live(url, rate, seconds, args.lead, drain=10.0)
            print(
                f"| {rate:,.0f} | {achieved:,.0f} | {late.jobs} | {late.ran} | {late.early} "
                f"| {late.p50:.1f} | {late.p99:.1f} | {late.max:.1f} |",
                flush=True,
            )
        print("\n| drain | jobs | jobs/s |")
        print("|---|---|---|")
        for procs in (1, 2):
            reset(db)
            rate = drain(url, n_drain, procs)
            print(f"| {procs} worker process(es) | {n_drain} | {rate:,.0f} |", flush=True)
    finally:
        reset(db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
