"""Live load: producers call ``schedule`` once per job while earlier jobs fall due.

This is how applications use a delayed-job system: web requests keep scheduling while the
worker runs what fell due. Every system gets the same workload, in the same run::

    python -m bench.load                       # 200, 1,000, 2,000, 5,000 jobs/s, every system
    python -m bench.load --quick               # smoke run: short, two rates
    python -m bench.load --rates 2000 --only delayq-redis,arq

For each rate and system, one after the other:

1. start ONE worker process of the system with its default settings (delayq: ``Worker(app)
   .run()``, concurrency 8), and wait until it has run a probe job;
2. start the producers (separate processes, ``ceil(rate / 1,000)`` of them): each calls the
   system's ordinary delayed-enqueue API once per job (``app.schedule(..., at=due)`` for
   delayq), paced so that together they offer ``rate`` jobs/s for ``--seconds``; each job is
   due uniformly 0 to ``--horizon`` seconds after the moment it is scheduled, so jobs fall due
   all the while the producers run;
3. wait until every job ran, or ``--drain`` seconds after the last due time; stop the worker.

Columns:

- enqueue calls/s: jobs scheduled divided by the producers' wall time. A producer that cannot
  keep up with its share falls behind the offered rate (visible here) instead of dropping jobs.
- lateness p50 / p99 / max: the handler's first ``time.time()`` minus the job's due time; a
  job that never ran counts as later than the cut-off (``>N``).
- missing: jobs scheduled that had not run by the cut-off; early: jobs that started before
  their due time (must be 0); dup: extra runs of a job.
- CPU s / 1k jobs: user + system CPU of the worker's process group while the jobs ran, per
  1,000 jobs (the probe and start-up excluded).
- claim p99: for delayq, the claim time minus the due time (on the store's clock): with
  lateness p99 it tells whether lateness comes from claiming or from the hand-off to a
  handler thread.

Stores and peers: delayq on SQLite (``synchronous=full``, the default, and ``normal``) and on
Redis, then the Redis job queues arq, saq, dramatiq, rq and huey, then delayq on PostgreSQL
with procrastinate and pgqueuer (``bench.postgres``), and delayq on RabbitMQ with Celery
(``bench.rabbitmq``); the peers are installed only in the benchmark's environment
(``bench/requirements-peers.txt``). More systems join by adding a :class:`System` to
:data:`SYSTEMS` (see :func:`delayq_system`) or to a store module's own list. The
pre-enqueued measurements (every job enqueued before the first falls due) stay in
``bench.durable`` and ``bench.redis_peers``.

With matplotlib installed (the benchmark's environment), the run also writes the lateness CDF
of every system at the rate closest to 2,000 jobs/s to ``--plot`` (a PNG, log time axis).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._peer_common import OUT_ENV, REDIS_URL_ENV
from bench.redis_peers import (
    CLAIM_KEY,
    PEERS,
    Peer,
    _tail,
    _version,
    claim_database,
    delete_keys,
    machine_summary,
    running_worker,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PLOT = REPO_ROOT / "docs" / "load-cdf.png"
PROBE_TIMEOUT_S = 60.0

Jobs = Any  # an iterable of (index, due epoch seconds); the peers' enqueue loops iterate it


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True, slots=True)
class Workload:
    """``rate`` jobs/s offered for ``seconds``, each due 0..``horizon`` s after scheduling."""

    rate: int
    seconds: float
    horizon: float
    drain: float
    producers: int

    @property
    def n_jobs(self) -> int:
        return round(self.rate * self.seconds)


class PacedJobs:
    """The jobs of one producer, paced in real time as they are iterated.

    Producer ``k`` of ``n`` schedules jobs ``k, k + n, k + 2n, ...`` at their planned send
    times (``start + index / rate``); the due time is drawn when the job is handed to the
    enqueue call, so it is relative to the real moment of scheduling. When the producer is
    behind its plan it does not sleep (it falls behind, it never skips a job).
    """

    def __init__(self, workload: Workload, k: int, start: float, seed: int) -> None:
        self._w = workload
        self._k = k
        self._start = start
        self._rng = random.Random(seed)
        self.sent = 0
        self.first: float | None = None
        self.last: float | None = None

    def __iter__(self) -> Iterator[tuple[int, float]]:
        w = self._w
        for index in range(self._k, w.n_jobs, w.producers):
            planned = self._start + index / w.rate
            now = time.time()
            if planned > now:
                time.sleep(planned - now)
                now = time.time()
            if self.first is None:
                self.first = now
            self.sent += 1
            self.last = now
            yield index, now + self._rng.uniform(0.0, w.horizon)


# --------------------------------------------------------------------------- systems


@dataclass(frozen=True)
class System:
    """One system under load: how to prepare its store, run its worker, and schedule.

    ``prepare(workdir)`` is a context manager yielding the URL the run uses (and cleaning
    the store up afterwards); ``worker_argv(url)`` starts one worker process;
    ``enqueue(url, jobs)`` schedules the jobs one call each, in the producer's process.
    ``env`` names the environment variable the worker and producers read the URL from.
    """

    name: str
    distribution: str
    modules: tuple[str, ...]
    notes: str
    prepare: Callable[[Path], contextlib.AbstractContextManager[str]]
    worker_argv: Callable[[str], list[str]]
    enqueue: Callable[[str, Jobs], None]
    env: str
    records_claim: bool = False

    def missing(self) -> str | None:
        """Why this system cannot run here, or None."""
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                return f"`{module}` cannot be imported ({exc})"
        return None


def _delayq_enqueue(url: str, jobs: Jobs) -> None:
    from delayq import DelayQ  # noqa: PLC0415 - in the producer process

    with DelayQ(url) as app:
        for index, due in jobs:
            app.schedule("noop", {"index": index, "due": due}, at=due)


def delayq_system(
    name: str,
    prepare: Callable[[Path], contextlib.AbstractContextManager[str]],
    *,
    modules: tuple[str, ...] = (),
    notes: str = "",
) -> System:
    """delayq on the store whose URL ``prepare`` yields (any URL ``DelayQ`` accepts)."""
    return System(
        name=name,
        distribution="delayq",
        modules=("delayq", *modules),
        notes=notes or "no polling: sleeps until the head's due time, woken on enqueue",
        prepare=prepare,
        worker_argv=lambda url: [sys.executable, "-m", "bench._load_delayq"],
        enqueue=_delayq_enqueue,
        env="BENCH_LOAD_URL",
        records_claim=True,
    )


def _sqlite(synchronous: str) -> Callable[[Path], contextlib.AbstractContextManager[str]]:
    @contextlib.contextmanager
    def prepare(workdir: Path) -> Iterator[str]:
        path = workdir / f"load-{synchronous}-{time.monotonic_ns()}.db"
        query = "" if synchronous == "full" else f"?synchronous={synchronous}"
        yield f"sqlite:///{path}{query}"

    return prepare


class _RedisDatabase:
    """The run's Redis database, claimed on first use (an empty one, marked as taken)."""

    base = "redis://127.0.0.1:6379"
    url: str | None = None

    @classmethod
    def get(cls) -> str:
        if cls.url is None:
            cls.url = claim_database(cls.base, None)
        return cls.url

    @classmethod
    def release(cls) -> None:
        if cls.url is not None:
            delete_keys(cls.url, [CLAIM_KEY])
            cls.url = None


def _redis_prepare(patterns: Sequence[str], query: str = "") -> Callable[[Path], Any]:
    @contextlib.contextmanager
    def prepare(workdir: Path) -> Iterator[str]:
        url = _RedisDatabase.get()
        delete_keys(url, patterns)
        try:
            yield f"{url}{query}"
        finally:
            delete_keys(url, patterns)

    return prepare


def _peer_system(peer: Peer) -> System:
    return System(
        name=peer.name,
        distribution=peer.distribution,
        modules=peer.modules,
        notes=peer.defaults,
        prepare=_redis_prepare(peer.key_patterns),
        worker_argv=lambda url: peer.worker_argv(),
        enqueue=peer.enqueue,
        env=REDIS_URL_ENV,
    )


SYSTEMS: list[System] = [
    delayq_system(
        "delayq-sqlite-full", _sqlite("full"), notes="SQLite synchronous=full (the default)"
    ),
    delayq_system("delayq-sqlite-normal", _sqlite("normal"), notes="SQLite synchronous=normal"),
    delayq_system(
        "delayq-redis",
        _redis_prepare(("delayq:{bench-load}:*",), "?queue=bench-load"),
        modules=("redis",),
        notes="Redis: sleeps until the head's due time on Redis's clock, woken on enqueue",
    ),
    *(_peer_system(peer) for peer in PEERS),
]
"""Every system, in the order they run. Stores and peers join by appending here."""


# --------------------------------------------------------------------------- one run


@dataclass
class Result:
    """What one (system, rate) run measured."""

    system: str
    workload: Workload
    scheduled: int = 0
    enqueue_rate: float = math.nan
    lateness: list[float] = field(default_factory=list)  # one per job that ran, sorted
    claim_lateness: list[float] = field(default_factory=list)
    duplicates: int = 0
    cpu_s: float = math.nan
    cutoff_s: float = 0.0
    notes: str = ""
    failed: str | None = None

    @property
    def missing(self) -> int:
        return max(0, self.scheduled - len(self.lateness))

    @property
    def early(self) -> int:
        return sum(1 for late in self.lateness if late < 0)

    def percentile(self, q: float) -> float:
        """Nearest rank over every job scheduled; a job that never ran counts as +inf."""
        n = self.scheduled
        if n == 0:
            return math.nan
        rank = max(1, math.ceil(q * n))
        return self.lateness[rank - 1] if rank <= len(self.lateness) else math.inf


def read_runs(path: Path) -> tuple[dict[int, list[float]], dict[int, float]]:
    """index -> start lateness of each run; index -> claim lateness of its first run."""
    runs: dict[int, list[float]] = {}
    claims: dict[int, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            parts = line.split()
            with contextlib.suppress(ValueError, IndexError):
                index = int(parts[0])
                runs.setdefault(index, []).append(float(parts[1]))
                if len(parts) > 2:
                    claims.setdefault(index, float(parts[2]))
    return runs, claims


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of every live process in the group (and their reaped children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:  # field 5 (pgrp) counted from the state field
                total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def _produce(system: System, url: str, workload: Workload, k: int, start: float, out: Any) -> None:
    """One producer process: schedule this producer's share, report (sent, first, last)."""
    jobs = PacedJobs(workload, k, start, seed=1000 + k)
    try:
        system.enqueue(url, jobs)
        out.put((k, jobs.sent, jobs.first, jobs.last, None))
    except BaseException as exc:  # reported as the row's failure, never silently
        out.put((k, jobs.sent, jobs.first, jobs.last, f"{type(exc).__name__}: {exc}"))


class RunFailed(Exception):
    """The system could not be measured; the message becomes the row's note."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(system: System, workload: Workload, workdir: Path) -> Result:
    """Run ``workload`` against ``system`` (see the module docstring)."""
    result = Result(system=system.name, workload=workload, notes=system.notes)
    out = workdir / f"{system.name}-{workload.rate}.results"
    log_path = workdir / f"{system.name}-{workload.rate}.log"
    with system.prepare(workdir) as url:
        os.environ[OUT_ENV] = str(out)
        os.environ[system.env] = url
        with running_worker(system.worker_argv(url), log_path) as proc:
            system.enqueue(url, [(-1, time.time())])
            deadline = time.monotonic() + PROBE_TIMEOUT_S
            while _count_lines(out) < 1:
                if proc.poll() is not None:
                    raise RunFailed(f"worker exited with {proc.returncode}:\n{_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RunFailed(f"worker did not run the probe job:\n{_tail(log_path)}")
                time.sleep(0.02)
            cpu_before = group_cpu_seconds(proc.pid)

            ctx = multiprocessing.get_context("fork")
            reports: Any = ctx.Queue()
            start = time.time() + 0.5
            producers = [
                ctx.Process(target=_produce, args=(system, url, workload, k, start, reports))
                for k in range(workload.producers)
            ]
            for p in producers:
                p.start()
            done = [reports.get(timeout=workload.seconds * 20 + 120) for _ in producers]
            for p in producers:
                p.join(30)
            errors = [d[4] for d in done if d[4]]
            result.scheduled = sum(d[1] for d in done)
            firsts = [d[2] for d in done if d[2] is not None]
            lasts = [d[3] for d in done if d[3] is not None]
            if firsts and lasts and max(lasts) > min(firsts):
                result.enqueue_rate = result.scheduled / (max(lasts) - min(firsts))
            if errors:
                result.notes += f"; producer failed: {errors[0]}"

            last_due = (max(lasts) if lasts else time.time()) + workload.horizon
            cutoff = last_due + workload.drain
            while _count_lines(out) < result.scheduled + 1 and time.time() < cutoff:
                if proc.poll() is not None:
                    result.notes += f"; worker exited early ({proc.returncode})"
                    break
                time.sleep(0.05)
            result.cpu_s = group_cpu_seconds(proc.pid) - cpu_before
            result.cutoff_s = max(0.0, min(time.time(), cutoff) - last_due)

    runs, claims = read_runs(out)
    runs = {i: r for i, r in runs.items() if i >= 0}
    result.lateness = sorted(min(r) for r in runs.values())
    result.claim_lateness = sorted(c for i, c in claims.items() if i >= 0)
    result.duplicates = sum(len(r) - 1 for r in runs.values())
    return result


# --------------------------------------------------------------------------- output


def _ms(seconds: float, cutoff_s: float = 0.0) -> str:
    if math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return f">{cutoff_s * 1000:,.0f}"
    return f"{seconds * 1000:,.1f}" if abs(seconds) < 0.1 else f"{seconds * 1000:,.0f}"


def format_table(results: Sequence[Result]) -> str:
    """One markdown table for one rate: a row per system."""
    lines = [
        "| system | enqueue calls/s | lateness p50 / p99 / max (ms) | missing | early | dup "
        "| CPU s / 1k jobs | claim p99 (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        if r.failed is not None:
            lines.append(f"| {r.system} | - | {r.failed} | | | | | |")
            continue
        late = " / ".join(_ms(r.percentile(q), r.cutoff_s) for q in (0.5, 0.99, 1.0))
        cpu = r.cpu_s / r.scheduled * 1000 if r.scheduled else math.nan
        claim = "-"
        if r.claim_lateness:
            rank = max(1, math.ceil(0.99 * len(r.claim_lateness)))
            claim = _ms(r.claim_lateness[rank - 1])
        lines.append(
            f"| {r.system} | {r.enqueue_rate:,.0f} | {late} | {r.missing:,} | {r.early:,} "
            f"| {r.duplicates:,} | {cpu:.2f} | {claim} |"
        )
    return "\n".join(lines)


def write_cdf(results: Sequence[Result], path: Path) -> str | None:
    """The lateness CDF of every system of one rate as a PNG (log time axis)."""
    try:
        import matplotlib  # noqa: PLC0415 - only in the benchmark's environment

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colors = plt.get_cmap("tab20").colors
    for n, r in enumerate(results):
        if r.failed is not None or not r.scheduled:
            continue
        xs = [max(late, 1e-5) * 1000 for late in r.lateness]
        ys = [(i + 1) / r.scheduled for i in range(len(xs))]
        ours = r.system.startswith("delayq")  # delayq solid and thick, peers dashed
        ax.step(
            xs,
            ys,
            where="post",
            label=r.system,
            color=colors[n % len(colors)],
            linewidth=2.2 if ours else 1.2,
            linestyle="-" if ours else "--",
        )
    rate = results[0].workload.rate
    ax.set_xscale("log")
    ax.set_xlabel("lateness: handler start minus due time (ms, log scale)")
    ax.set_ylabel("fraction of jobs started")
    ax.set_title(f"Live load: {rate:,} jobs/s scheduled while earlier jobs fall due")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_ylim(0, 1.0)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return None


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 and 1,000/s, 3 s")
    parser.add_argument("--rates", default=None, help="jobs/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=None, help="how long producers run")
    parser.add_argument("--horizon", type=float, default=None, help="jobs due 0..H s ahead")
    parser.add_argument("--drain", type=float, default=None, help="wait after the last due")
    parser.add_argument("--producers", type=int, default=None, help="producer processes")
    parser.add_argument("--only", default=None, help="comma-separated system names")
    parser.add_argument("--plot", type=Path, default=None, help=f"PNG path ({DEFAULT_PLOT})")
    return parser


def _workloads(args: argparse.Namespace) -> list[Workload]:
    rates = [200, 1000] if args.quick else [200, 1000, 2000, 5000]
    if args.rates:
        rates = [int(r) for r in args.rates.split(",")]
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    horizon = args.horizon or (3.0 if args.quick else 10.0)
    drain = args.drain or (10.0 if args.quick else 30.0)
    return [
        Workload(rate, seconds, horizon, drain, args.producers or max(1, math.ceil(rate / 1000)))
        for rate in rates
    ]


def all_systems() -> list[System]:
    """:data:`SYSTEMS` plus the PostgreSQL and RabbitMQ stores and their peers, which
    their own modules (``bench.postgres``, ``bench.rabbitmq``) define on this harness."""
    systems = list(SYSTEMS)
    for module in ("bench.postgres", "bench.rabbitmq"):
        try:
            systems += importlib.import_module(module).SYSTEMS
        except ImportError as exc:  # a store's client is missing: its rows say so
            _log(f"{module} not loaded: {exc}")
    return systems


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    wanted = {n.strip() for n in args.only.split(",")} if args.only else None
    systems = [s for s in all_systems() if wanted is None or s.name in wanted]
    workloads = _workloads(args)
    summary = machine_summary(_RedisDatabase.get())
    _log(summary)
    tables: list[tuple[Workload, list[Result]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
            for workload in workloads:
                results: list[Result] = []
                for system in systems:
                    version = _version(system.distribution)
                    label = f"{system.name} {version}"
                    missing = system.missing()
                    if missing is not None:
                        results.append(Result(label, workload, failed=f"skipped: {missing}"))
                        continue
                    _log(f"{workload.rate:,} jobs/s, {label}: ...")
                    try:
                        result = measure(system, workload, Path(tmp))
                        result.system = label
                    except Exception as exc:  # one system's failure is its row, not the run's
                        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                        result = Result(label, workload, failed=f"failed: {first}")
                    results.append(result)
                    _log(format_table([result]).splitlines()[-1])
                tables.append((workload, results))
    finally:
        _RedisDatabase.release()

    print(f"## Live load\n\n{summary}\n")
    for workload, results in tables:
        print(
            f"### {workload.rate:,} jobs/s offered for {workload.seconds:g} s by "
            f"{workload.producers} producer process(es), each job due 0-{workload.horizon:g} s "
            f"after it is scheduled; 1 worker process\n"
        )
        print(format_table(results) + "\n")
    if tables and (not args.quick or args.plot):
        workload, results = min(tables, key=lambda t: abs(t[0].rate - 2000))
        path = args.plot or DEFAULT_PLOT
        problem = write_cdf(results, path)
        print(problem or f"lateness CDF at {workload.rate:,} jobs/s written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
