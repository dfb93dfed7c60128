"""Durable jobs side by side: the memory reference store and SQLite (synchronous NORMAL / FULL).

::

    python -m bench.durable            # full run (1,000,000 pending jobs; a few minutes)
    python -m bench.durable --quick    # smoke run (100,000 pending; well under a minute)

Everything runs in a fresh temporary directory. What is measured, per store:

- enqueue jobs/s: ``DelayQ.schedule`` one call per job (each its own transaction,
  so with FULL each is fsynced), and ``schedule_many`` in batches of 1,000 (one
  transaction per batch). Validation and JSON encoding included.
- claim+ack jobs/s: a ``Worker`` (defaults: 8 threads) drains already-due jobs
  with a no-op handler; from ``start()`` until the last ack.
- lateness: ONE worker process (a separate ``python`` running ``Worker(app)``
  with defaults) and jobs scheduled by this process with ``schedule_many``
  before they are due, due uniformly over the span; lateness is the handler's
  first ``time.time()`` minus the job's due time. The memory store cannot be
  shared between processes, so its row uses a worker thread in this process.
- claim cost: p50 / p99 of ``claim(limit=1)`` calls (a BEGIN IMMEDIATE
  transaction on SQLite) while 10,000 vs 1,000,000 jobs are pending in the
  future; flat means the due-time index does its job.

Targets (from the design): batched enqueue >= 20,000 jobs/s; lateness p99 <= 50 ms
across processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayq import DelayQ, JobContext, Worker
from delayq.backends import open_backend
from delayq.backends.memory import MemoryBackend
from delayq.job import JobSpec
from delayq.worker import percentile


@dataclass(frozen=True)
class Plan:
    single: int
    batched: int
    drain: int
    late_jobs: int
    late_span: float
    backlogs: tuple[int, ...]
    claims: int


FULL = Plan(
    single=10_000,
    batched=200_000,
    drain=20_000,
    late_jobs=20_000,
    late_span=10.0,
    backlogs=(10_000, 1_000_000),
    claims=2_000,
)
QUICK = Plan(
    single=1_000,
    batched=20_000,
    drain=2_000,
    late_jobs=2_000,
    late_span=2.0,
    backlogs=(10_000, 100_000),
    claims=500,
)

STORES = ("memory", "sqlite normal", "sqlite full")


@dataclass
class Column:
    """One store's results (None: not measured)."""

    name: str
    single: float | None = None
    batched: float | None = None
    drain: float | None = None
    lateness: tuple[float, float, float] | None = None
    lateness_note: str = ""
    claim: dict[int, tuple[float, float]] = field(default_factory=dict)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _url(store: str, path: Path) -> str:
    if store == "memory":
        return "memory://"
    mode = store.split()[1]
    return f"sqlite:///{path}?synchronous={mode}"


# -- enqueue ---------------------------------------------------------------------------
def measure_enqueue(
    url: str, n_single: int, n_batched: int, batch: int = 1000
) -> tuple[float, float]:
    with DelayQ(url) as app:
        started = time.perf_counter()
        for i in range(n_single):
            app.schedule("noop", {"i": i}, delay=3600)
        single = n_single / (time.perf_counter() - started)
        started = time.perf_counter()
        for first in range(0, n_batched, batch):
            app.schedule_many(
                [
                    {"name": "noop", "payload": {"i": i}, "delay": 3600}
                    for i in range(first, min(first + batch, n_batched))
                ]
            )
        batched = n_batched / (time.perf_counter() - started)
    return single, batched


# -- claim + ack -----------------------------------------------------------------------
def measure_drain(url: str, n: int) -> float:
    with DelayQ(url) as app:
        app.register("noop", lambda payload: None)
        for first in range(0, n, 1000):
            app.schedule_many(
                [
                    {"name": "noop", "payload": {"i": i}, "delay": 0}
                    for i in range(first, min(first + 1000, n))
                ]
            )
        done = threading.Event()
        count = [0]
        lock = threading.Lock()

        def on_result(_: object) -> None:
            with lock:
                count[0] += 1
                if count[0] == n:
                    done.set()

        worker = Worker(app, on_result=on_result)
        started = time.perf_counter()
        worker.start()
        finished = done.wait(600)
        elapsed = time.perf_counter() - started
        worker.stop()
        if not finished:
            raise RuntimeError(f"drain: only {count[0]} of {n} jobs ran")
    return n / elapsed


# -- lateness ----------------------------------------------------------------------------
def serve(url: str, out: str, ready: str) -> None:
    """The worker process of the lateness run: record lateness until SIGTERM."""
    app = DelayQ(url)
    samples: list[float] = []

    @app.handler("late")
    def late(payload: Any, ctx: JobContext) -> None:
        samples.append(time.time() - ctx.run_at)

    worker = Worker(app)
    Path(ready).write_text(str(os.getpid()))
    worker.run()
    Path(out).write_text(json.dumps(samples))
    app.close()


def _schedule_spread(app: DelayQ, n: int, start: float, span: float) -> float:
    """Schedule ``n`` jobs due uniformly over ``[start, start + span]``; returns when done."""
    for first in range(0, n, 1000):
        app.schedule_many(
            [
                {"name": "late", "payload": {"i": i}, "at": start + span * i / max(1, n - 1)}
                for i in range(first, min(first + 1000, n))
            ]
        )
    return time.time()


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def measure_lateness(url: str, n: int, span: float, tmp: Path) -> tuple[list[float], str]:
    lead = 1.0 + n / 20_000  # time to enqueue before the first job is due
    if url.startswith("memory://"):
        with DelayQ(url) as app:
            samples: list[float] = []
            app.register("late", lambda p, ctx: samples.append(time.time() - ctx.run_at))
            with Worker(app):
                start = time.time() + lead
                enqueued = _schedule_spread(app, n, start, span)
                _wait_for(lambda: len(samples) >= n, span + lead + 60)
            return samples, "worker thread in-process" + _late_note(enqueued, start)
    out, ready = tmp / "lateness.json", tmp / "ready"
    for p in (out, ready):
        p.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.durable", "--serve", url, str(out), str(ready)],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        if not _wait_for(ready.exists, 30):
            raise RuntimeError("the worker process did not start")
        with DelayQ(url) as app:
            start = time.time() + lead
            enqueued = _schedule_spread(app, n, start, span)
            _wait_for(lambda: app.stats().succeeded >= n, span + lead + 60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    samples = json.loads(out.read_text())
    return samples, "1 worker process" + _late_note(enqueued, start)


def _late_note(enqueued: float, start: float) -> str:
    if enqueued > start:
        return f"; enqueue ended {enqueued - start:.2f}s after the first due time"
    return ""


# -- claim cost vs backlog -------------------------------------------------------------------
def _fill(url: str, pending: int) -> None:
    backend = open_backend(url)
    try:
        far = time.time() + 86_400
        for first in range(0, pending, 10_000):
            backend.enqueue(
                [
                    JobSpec(id=f"p-{i}", name="noop", payload='{"n":1}', run_at=far + i * 0.001)
                    for i in range(first, min(first + 10_000, pending))
                ]
            )
    finally:
        backend.close()


def measure_claims(url: str, claims: int, tag: str) -> tuple[float, float]:
    """p50 and p99 seconds of ``claim(limit=1)`` over ``claims`` due jobs (acked untimed)."""
    backend = open_backend(url)
    try:
        now = time.time()
        backend.enqueue(
            [
                JobSpec(id=f"due-{tag}-{i}", name="noop", payload="{}", run_at=now - 1 + i * 1e-6)
                for i in range(claims)
            ]
        )
        timings: list[float] = []
        for _ in range(claims):
            started = time.perf_counter()
            (claim,) = backend.claim(limit=1, lease=30)
            timings.append(time.perf_counter() - started)
            backend.ack(claim)
    finally:
        backend.close()
    return percentile(timings, 50), percentile(timings, 99)


# -- the run -------------------------------------------------------------------------------------
def run(plan: Plan, stores: Sequence[str], tmp: Path) -> list[Column]:
    columns = []
    for store in stores:
        col = Column(store)
        columns.append(col)
        _log(f"{store}: enqueue")
        col.single, col.batched = measure_enqueue(
            _url(store, tmp / f"{store}-enqueue.db"), plan.single, plan.batched
        )
        _log(f"{store}: claim+ack")
        col.drain = measure_drain(_url(store, tmp / f"{store}-drain.db"), plan.drain)
        _log(f"{store}: lateness")
        samples, col.lateness_note = measure_lateness(
            _url(store, tmp / f"{store}-late.db"), plan.late_jobs, plan.late_span, tmp
        )
        if len(samples) < plan.late_jobs:
            col.lateness_note += f"; only {len(samples)} of {plan.late_jobs} ran"
        col.lateness = (percentile(samples, 50), percentile(samples, 99), max(samples))
    # Claim cost: one prefilled file per backlog size, claimed with each durability mode.
    for pending in plan.backlogs:
        sqlite_file = tmp / f"backlog-{pending}.db"
        needs_sqlite = any(s.startswith("sqlite") for s in stores)
        if needs_sqlite:
            _log(f"backlog {pending:,}: filling a SQLite file")
            _fill(f"sqlite:///{sqlite_file}?synchronous=normal", pending)
        for col in columns:
            _log(f"{col.name}: claim cost with {pending:,} pending")
            if col.name == "memory":
                mem = MemoryBackend()
                far = time.time() + 86_400
                for first in range(0, pending, 10_000):
                    mem.enqueue(
                        [
                            JobSpec(id=f"p-{i}", name="noop", payload="{}", run_at=far + i)
                            for i in range(first, min(first + 10_000, pending))
                        ]
                    )
                col.claim[pending] = _claims_on(mem, plan.claims)
            else:
                url = _url(col.name, sqlite_file)
                col.claim[pending] = measure_claims(url, plan.claims, col.name.split()[1])
    return columns


def _claims_on(backend: Any, claims: int) -> tuple[float, float]:
    now = time.time()
    backend.enqueue(
        [
            JobSpec(id=f"due-{i}", name="noop", payload="{}", run_at=now - 1 + i * 1e-6)
            for i in range(claims)
        ]
    )
    timings = []
    for _ in range(claims):
        started = time.perf_counter()
        (claim,) = backend.claim(limit=1, lease=30)
        timings.append(time.perf_counter() - started)
        backend.ack(claim)
    return percentile(timings, 50), percentile(timings, 99)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def render(columns: Sequence[Column], plan: Plan) -> str:
    header = "| measure | " + " | ".join(c.name for c in columns) + " | target |"
    rows = [header, "|" + " --- |" * (len(columns) + 2)]

    def row(label: str, cells: Sequence[str], target: str = "") -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")

    row("enqueue, one `schedule` per job (jobs/s)", [_rate(c.single) for c in columns])
    row(
        "enqueue, `schedule_many` x1000 (jobs/s)",
        [_rate(c.batched) for c in columns],
        ">= 20,000",
    )
    row("claim+ack, no-op handler, 1 worker (jobs/s)", [_rate(c.drain) for c in columns])
    span = f"{plan.late_jobs:,} jobs due over {plan.late_span:g} s"
    row(
        f"lateness p50 / p99 / max, {span} (ms)",
        [
            "-" if c.lateness is None else " / ".join(f"{v * 1000:.1f}" for v in c.lateness)
            for c in columns
        ],
        "p99 <= 50 ms",
    )
    for pending in plan.backlogs:
        row(
            f"claim(limit=1) p50 / p99, {pending:,} pending (µs)",
            [
                " / ".join(f"{v * 1e6:.0f}" for v in c.claim[pending])
                if pending in c.claim
                else "-"
                for c in columns
            ],
            "flat",
        )
    notes = [f"- {c.name} lateness: {c.lateness_note}" for c in columns if c.lateness_note]
    return "\n".join([*rows, "", *notes])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.durable", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated subset of: {', '.join(STORES)}"
    )
    parser.add_argument("--serve", nargs=3, metavar=("URL", "OUT", "READY"), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve:
        serve(*args.serve)
        return 0
    plan = QUICK if args.quick else FULL
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(stores) - set(STORES)
    if unknown:
        print(
            f"unknown store(s) {sorted(unknown)}; choose from {', '.join(STORES)}", file=sys.stderr
        )
        return 2
    _log(
        f"bench.durable ({'quick' if args.quick else 'full'}): Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    with tempfile.TemporaryDirectory(prefix="bench-durable-") as tmp:
        columns = run(plan, stores, Path(tmp))
    load = os.getloadavg()[0]
    print(f"\n## durable jobs ({'quick' if args.quick else 'full'} run, load average {load:.2f})\n")
    print(render(columns, plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
