"""Delayed-job lateness on one Redis: delayq next to arq, saq, dramatiq, rq and huey.

Run it from the benchmark's own environment, where the peers are installed (they are never
delayq dependencies)::

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -e '.[redis]' -r bench/requirements-peers.txt
    .venv-bench/bin/python -m bench.redis_peers            # 20,000 jobs due over 10 s
    .venv-bench/bin/python -m bench.redis_peers --quick    # 2,000 jobs due over 3 s

For each system, one after the other on the same Redis: start ONE worker process of that
system (a real subprocess, with the system's default settings), wait until it runs a probe
job, enqueue the jobs one call at a time with due times spread uniformly over the span,
wait for them to run, stop the worker (SIGINT, its graceful shutdown), and delete the keys.

- enqueue jobs/s: jobs divided by the wall time of the enqueue loop (one call per job, the
  library's ordinary delayed-enqueue API, no batching), with the worker already running.
- lateness: the handler's first ``time.time()`` minus the job's due time. Every system gets
  the same no-op handler, which only appends that number to a file. A job that never ran
  before the drain deadline counts as later than the deadline (shown as ``>N``).

The run uses a dedicated, empty Redis database (the first empty one of 15..9, or ``--db``),
marks it as taken while it runs, and deletes every key it created at the end. It never
flushes a database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._peer_common import OUT_ENV, REDIS_URL_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = "bench/requirements-peers.txt"
CLAIM_KEY = "delayq-bench:redis-peers:claim"

Job = tuple[int, float]  # (index, absolute due time, epoch seconds)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Plan:
    """How many jobs, due over how long, and the waits around them.

    ``lead_s`` is the least time from the start of the enqueue loop to the first due time;
    each system gets more when its probe batch shows that it needs more to finish enqueuing
    before its first job is due (see :meth:`lead_for`), so that enqueue speed does not leak
    into lateness. ``drain_s`` is how long after the last due time the run waits for
    stragglers before it gives up on the rest.
    """

    n_jobs: int
    span_s: float
    lead_s: float
    drain_s: float

    @property
    def probes(self) -> int:
        """How many probe jobs (due at once) go first: 1% of the jobs, 20 to 200."""
        return max(20, min(200, self.n_jobs // 100))

    def lead_for(self, probe_enqueue_s: float) -> float:
        """The lead for a system that took ``probe_enqueue_s`` to enqueue the probes.

        Twice the enqueue time that rate predicts, plus a second, and never less than
        ``lead_s``: a machine busy with other work slows some enqueue loops severalfold.
        """
        predicted = self.n_jobs * probe_enqueue_s / self.probes
        return max(self.lead_s, 2.0 * predicted + 1.0)

    def jobs(self, start: float, lead_s: float | None = None) -> list[Job]:
        """The jobs, in due order, for an enqueue loop that starts at ``start``."""
        first = start + (self.lead_s if lead_s is None else lead_s)
        return [(i, first + self.span_s * i / self.n_jobs) for i in range(self.n_jobs)]


FULL = Plan(n_jobs=20_000, span_s=10.0, lead_s=12.0, drain_s=240.0)
QUICK = Plan(n_jobs=2_000, span_s=3.0, lead_s=5.0, drain_s=30.0)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Row:
    """One measured line of the table."""

    system: str
    enqueue_rate: float | None
    lateness: tuple[float, ...]  # seconds, sorted, one per job that ran
    n_jobs: int
    cutoff_s: float  # a job that never ran is at least this late
    notes: str

    @property
    def completed(self) -> int:
        return len(self.lateness)

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile over ALL jobs; a job that never ran counts as +inf."""
        if self.n_jobs == 0:
            return math.nan
        rank = max(1, math.ceil(q * self.n_jobs))
        return self.lateness[rank - 1] if rank <= len(self.lateness) else math.inf


def _ms(seconds: float, cutoff_s: float) -> str:
    if math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return f">{cutoff_s * 1000:,.0f}"
    return f"{seconds * 1000:,.1f}" if abs(seconds) < 0.1 else f"{seconds * 1000:,.0f}"


def format_table(rows: Sequence[Row]) -> str:
    """The markdown table: one row per system, skipped peers included with their reason."""
    lines = [
        "| system | enqueue jobs/s | lateness p50 / p99 / max (ms) | jobs completed | notes |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        if row.enqueue_rate is None:
            lines.append(f"| {row.system} | - | - | - | {row.notes} |")
            continue
        late = " / ".join(_ms(row.percentile(q), row.cutoff_s) for q in (0.5, 0.99, 1.0))
        lines.append(
            f"| {row.system} | {row.enqueue_rate:,.0f} | {late} | "
            f"{row.completed:,} / {row.n_jobs:,} | {row.notes} |"
        )
    return "\n".join(lines)


def read_results(path: Path) -> dict[int, list[float]]:
    """index -> lateness of every run of it (more than one means it ran twice)."""
    runs: dict[int, list[float]] = {}
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        index, _, late = line.partition(" ")
        with contextlib.suppress(ValueError):
            runs.setdefault(int(index), []).append(float(late))
    return runs


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# --------------------------------------------------------------------------- peers


@dataclass(frozen=True, slots=True)
class Peer:
    """How to run one system: its worker command and its delayed-enqueue call."""

    name: str
    distribution: str  # whose version the table shows
    modules: tuple[str, ...]  # must all be importable, else the row is skipped
    defaults: str  # the shipped settings that bound its lateness (the notes column)
    key_patterns: tuple[str, ...]  # every Redis key it creates matches one of these
    worker_argv: Callable[[], list[str]]
    enqueue: Callable[[str, Sequence[Job]], None]  # (redis url, jobs), one call per job


def _arq_enqueue(url: str, jobs: Sequence[Job]) -> None:
    from arq import create_pool  # noqa: PLC0415 - peers are optional
    from arq.connections import RedisSettings  # noqa: PLC0415

    async def run() -> None:
        pool = await create_pool(RedisSettings.from_dsn(url))
        try:
            for index, due in jobs:
                await pool.enqueue_job(
                    "noop", index, due, _defer_until=datetime.fromtimestamp(due, tz=UTC)
                )
        finally:
            await pool.aclose()

    asyncio.run(run())


def _saq_enqueue(url: str, jobs: Sequence[Job]) -> None:
    from saq import Queue  # noqa: PLC0415

    async def run() -> None:
        queue = Queue.from_url(url)
        try:
            for index, due in jobs:
                # `scheduled` is epoch seconds; saq compares it with time.time() as a float
                await queue.enqueue("noop", index=index, due=due, scheduled=due)
        finally:
            await queue.disconnect()

    asyncio.run(run())


def _dramatiq_enqueue(url: str, jobs: Sequence[Job]) -> None:
    from bench._peer_dramatiq import noop  # noqa: PLC0415

    for index, due in jobs:
        delay_ms = max(0, round((due - time.time()) * 1000))
        noop.send_with_options(args=(index, due), delay=delay_ms)


def _rq_enqueue(url: str, jobs: Sequence[Job]) -> None:
    from redis import Redis  # noqa: PLC0415
    from rq import Queue  # noqa: PLC0415

    from bench._peer_rq import noop  # noqa: PLC0415

    queue = Queue("default", connection=Redis.from_url(url))
    for index, due in jobs:
        queue.enqueue_in(timedelta(seconds=max(0.0, due - time.time())), noop, index, due)


def _huey_enqueue(url: str, jobs: Sequence[Job]) -> None:
    from bench._peer_huey import noop  # noqa: PLC0415

    for index, due in jobs:
        noop.schedule(args=(index, due), delay=max(0.0, due - time.time()))


def _python_m(*args: str) -> Callable[[], list[str]]:
    return lambda: [sys.executable, "-m", *args]


PEERS: tuple[Peer, ...] = (
    Peer(
        name="arq",
        distribution="arq",
        modules=("arq",),
        key_patterns=("arq:*",),
        defaults=(
            "polls its ZSET every 0.5 s (poll_delay), reading up to 100 due ids per poll "
            "(queue_read_limit); max_jobs 10"
        ),
        worker_argv=_python_m("arq", "bench._peer_arq.WorkerSettings"),
        enqueue=_arq_enqueue,
    ),
    Peer(
        name="saq",
        distribution="saq",
        modules=("saq",),
        key_patterns=("saq:*",),
        defaults="scheduler moves due jobs every 1 s (timers.schedule); concurrency 10",
        worker_argv=_python_m("saq", "bench._peer_saq.settings"),
        enqueue=_saq_enqueue,
    ),
    Peer(
        name="dramatiq",
        distribution="dramatiq",
        modules=("dramatiq",),
        key_patterns=("dramatiq:*",),
        defaults=(
            "worker holds delayed messages in memory, re-enqueues them when due; "
            "Redis consumers back off up to worker_timeout 1 s; 8 threads"
        ),
        worker_argv=_python_m("dramatiq", "bench._peer_dramatiq", "--processes", "1"),
        enqueue=_dramatiq_enqueue,
    ),
    Peer(
        name="rq",
        distribution="rq",
        modules=("rq",),
        key_patterns=("rq:*",),
        defaults=(
            "scheduler every 1 s, whole-second scores, 1,000 jobs per pass; "
            "forks a work horse per job"
        ),
        worker_argv=lambda: [
            sys.executable,
            "-m",
            "rq.cli",
            "worker",
            "--with-scheduler",
            "--url",
            os.environ[REDIS_URL_ENV],
            "default",
        ],
        enqueue=_rq_enqueue,
    ),
    Peer(
        name="huey",
        distribution="huey",
        modules=("huey",),
        key_patterns=("huey.*",),
        defaults="scheduler every 1 s (-s 1); 1 worker thread",
        worker_argv=_python_m("huey.bin.huey_consumer", "bench._peer_huey.huey"),
        enqueue=_huey_enqueue,
    ),
)


def _missing(peer: Peer) -> str | None:
    """Why the peer cannot run here (not installed, or installed without a dependency)."""
    for module in peer.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"`{module}` cannot be imported ({exc})"
    return None


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# --------------------------------------------------------------------------- redis


def _redis(url: str) -> Any:
    from redis import Redis  # noqa: PLC0415 - only the benchmark environment has it for sure

    return Redis.from_url(url)


def claim_database(base_url: str, db: int | None) -> str:
    """Pick an empty database (or the given one) and mark it as this run's.

    An empty database is one with no keys at all; the claim key keeps a second run of this
    benchmark away from it while this one runs (it expires, should a run be killed).
    """
    candidates = [db] if db is not None else list(range(15, 8, -1))
    for number in candidates:
        url = f"{base_url.rstrip('/')}/{number}"
        client = _redis(url)
        try:
            if client.set(CLAIM_KEY, str(os.getpid()), nx=True, ex=6 * 3600):
                if client.dbsize() == 1:
                    return url
                client.delete(CLAIM_KEY)
        finally:
            client.close()
    raise SystemExit(
        f"no empty Redis database among {candidates} at {base_url}; pass --db with an empty one"
    )


def delete_keys(url: str, patterns: Sequence[str]) -> int:
    """Delete the keys matching ``patterns`` (the systems' own key families) in the run's db.

    Only the benchmarked systems' key families are deleted, never "everything", so that even
    a database someone else started using meanwhile keeps its other keys.
    """
    client = _redis(url)
    deleted = 0
    try:
        for pattern in patterns:
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += client.unlink(*batch)
                    batch.clear()
            if batch:
                deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted


# --------------------------------------------------------------------------- processes


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def running_worker(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a worker in its own session; stop it (and anything it forked) on exit.

    SIGINT asks every peer for its graceful shutdown; whatever is still alive in the
    process group after that gets SIGTERM, then SIGKILL.
    """
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop_process_group(proc)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """Graceful stop of one worker we started, escalating only if it does not exit."""
    pgid = proc.pid  # start_new_session: the worker leads its own group
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None and not _group_alive(pgid):
            return
        _log(f"  worker group {pgid} still running; sending {sig.name}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (proc.poll() is None or _group_alive(pgid)):
            time.sleep(0.05)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


# --------------------------------------------------------------------------- one system


class RunFailed(Exception):
    """A system could not be measured; the message goes into the notes column."""


def _enqueue(peer: Peer, url: str, jobs: Sequence[Job]) -> None:
    try:
        peer.enqueue(url, jobs)
    except Exception as exc:  # any peer failure becomes that row's note, not a crash
        raise RunFailed(f"enqueue failed: {type(exc).__name__}: {exc}") from exc


def measure_peer(peer: Peer, plan: Plan, url: str, workdir: Path) -> Row:
    """Start the peer's worker, enqueue the plan's jobs, wait for them, stop the worker."""
    system = f"{peer.name} {_version(peer.distribution)}"
    out = workdir / f"{peer.name}.results"
    log_path = workdir / f"{peer.name}.log"
    os.environ[OUT_ENV] = str(out)
    with running_worker(peer.worker_argv(), log_path) as proc:
        # Probe jobs (negative indices, due now): the worker is up and consuming, and
        # their enqueue time sizes this system's lead. One job first, untimed, so that
        # imports and connection setup do not count.
        _enqueue(peer, url, [(-1, time.time())])
        probe_started = time.time()
        _enqueue(peer, url, [(-2 - j, probe_started) for j in range(plan.probes)])
        lead_s = plan.lead_for(time.time() - probe_started)
        probe_deadline = time.monotonic() + 60.0
        while _count_lines(out) < plan.probes + 1:
            if proc.poll() is not None:
                raise RunFailed(f"worker exited with {proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > probe_deadline:
                raise RunFailed(f"worker did not run the probe jobs in 60 s:\n{_tail(log_path)}")
            time.sleep(0.05)
        _log(
            f"  {peer.name}: worker ready; enqueueing {plan.n_jobs:,} jobs, "
            f"first due in {lead_s:.1f} s"
        )

        start = time.time()
        jobs = plan.jobs(start, lead_s)
        _enqueue(peer, url, jobs)
        enqueue_s = time.time() - start
        first_due, last_due = jobs[0][1], jobs[-1][1]
        overran_s = start + enqueue_s - first_due
        _log(f"  {peer.name}: enqueued in {enqueue_s:.2f} s; waiting for the jobs to run")

        deadline = last_due + plan.drain_s
        while _count_lines(out) < plan.probes + 1 + plan.n_jobs and time.time() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        ended = min(time.time(), deadline)
        exited = proc.poll()

    runs = read_results(out)
    runs = {index: late for index, late in runs.items() if index >= 0}
    lateness = tuple(sorted(min(r) for r in runs.values()))
    notes = [peer.defaults]
    duplicates = sum(len(r) - 1 for r in runs.values())
    if duplicates:
        notes.append(f"{duplicates:,} duplicate runs")
    if lateness and lateness[0] < 0:
        notes.append(f"ran up to {-lateness[0] * 1000:,.0f} ms early")
    if overran_s > 0:
        notes.append(f"enqueue loop ended {overran_s:.1f} s after the first due time")
    behind = _fell_behind(plan, jobs, runs)
    if behind:
        notes.append(behind)
    if exited is not None:
        notes.append(f"worker exited early ({exited})")
    return Row(
        system=system,
        enqueue_rate=plan.n_jobs / enqueue_s,
        lateness=lateness,
        n_jobs=plan.n_jobs,
        cutoff_s=max(0.0, ended - last_due),
        notes="; ".join(notes),
    )


def _fell_behind(plan: Plan, jobs: Sequence[Job], runs: dict[int, list[float]]) -> str | None:
    """Say so when a system could not keep up with the due rate, and how fast it ran."""
    starts = sorted(jobs[i][1] + min(late) for i, late in runs.items() if 0 <= i < len(jobs))
    if len(starts) < 2 or starts[-1] - jobs[-1][1] < 1.0:
        return None
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    if rate >= 0.9 * plan.n_jobs / plan.span_s:
        return None  # finished late because of a poll interval, not for want of speed
    digits = 0 if rate >= 10 else 1
    due_rate = plan.n_jobs / plan.span_s
    return f"fell behind: ran {rate:,.{digits}f} jobs/s while {due_rate:,.0f}/s came due"


# --------------------------------------------------------------------------- delayq


def _delayq_enqueue(url: str, jobs: Sequence[Job]) -> None:
    from bench._peer_delayq import app  # noqa: PLC0415 - needs delayq[redis]

    for index, due in jobs:
        app.schedule("noop", {"index": index, "due": due}, at=due)


DELAYQ = Peer(
    name="delayq-redis",
    distribution="delayq",
    modules=("redis", "delayq.backends.redis", "delayq.worker"),
    defaults=(
        "no polling: sleeps until the head's due time (Redis clock), woken on enqueue; "
        "concurrency 8"
    ),
    key_patterns=("delayq:{bench-peers}:*",),
    worker_argv=_python_m("bench._peer_delayq"),
    enqueue=_delayq_enqueue,
)


def delayq_batched_note(url: str, plan: Plan) -> str | None:
    """delayq's batched enqueue rate, from bench.redis_delayq (what the loop above can't show)."""
    try:
        delayq_bench = importlib.import_module("bench.redis_delayq")
        rates = delayq_bench.measure_enqueue(
            url, n_single=plan.n_jobs // 10, n_batched=plan.n_jobs * 5, batch=1000
        )
        return f"schedule_many in batches of 1,000: {rates['batched_per_s']:,.0f} jobs/s"
    except Exception as exc:  # an extra; the row stands without it
        _log(f"  delayq batched enqueue not measured: {type(exc).__name__}: {exc}")
        return None


def _skipped(system: str, reason: str) -> Row:
    return Row(system, None, (), 0, 0.0, reason)


# --------------------------------------------------------------------------- main


def machine_summary(url: str) -> str:
    """nproc, CPU model, Python and Redis versions: the context every number needs."""
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    client = _redis(url)
    try:
        redis_version = client.info("server").get("redis_version", "?")
    finally:
        client.close()
    return (
        f"machine: {os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}; "
        f"Redis {redis_version}; load average at start {os.getloadavg()[0]:.2f}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_peers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="2,000 jobs over 3 s (smoke run)")
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379", help="Redis server (without database)"
    )
    parser.add_argument("--db", type=int, default=None, help="empty database to use")
    parser.add_argument(
        "--only", default=None, help="comma-separated systems to run (e.g. arq,delayq)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = QUICK if args.quick else FULL
    wanted = {name.strip() for name in args.only.split(",")} if args.only else None

    try:
        url = claim_database(args.redis, args.db)
    except Exception as exc:
        print(f"Redis at {args.redis} is not usable: {exc}", file=sys.stderr)
        return 2
    os.environ[REDIS_URL_ENV] = url
    rows: list[Row] = []
    summary = machine_summary(url)
    _log(summary)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-redis-peers-") as tmp:
            for peer in (*PEERS, DELAYQ):
                if wanted is not None and not {peer.name, peer.name.split("-")[0]} & wanted:
                    continue
                missing = _missing(peer)
                if missing is not None:
                    note = f"skipped: {missing}; pip install -r {REQUIREMENTS}"
                    _log(f"{peer.name}: {note}")
                    rows.append(_skipped(peer.name, note))
                    continue
                _log(f"{peer.name} {_version(peer.distribution)}:")
                delete_keys(url, peer.key_patterns)
                try:
                    row = measure_peer(peer, plan, url, Path(tmp))
                    if peer is DELAYQ:
                        batched = delayq_batched_note(url, plan)
                        if batched:
                            row = replace(row, notes=f"{row.notes}; {batched}")
                    rows.append(row)
                except RunFailed as exc:
                    _log(f"  {peer.name} failed: {exc}")
                    first_line = str(exc).splitlines()[0]
                    rows.append(_skipped(f"{peer.name} {_version(peer.distribution)}", first_line))
                finally:
                    delete_keys(url, peer.key_patterns)
    finally:
        delete_keys(url, [CLAIM_KEY])

    print(
        f"Delayed-job lateness on one Redis: {plan.n_jobs:,} jobs due uniformly over "
        f"{plan.span_s:g} s, 1 worker process, no-op handler (first due at least {plan.lead_s:g} s "
        f"after the enqueue loop starts).\n{summary}\n"
    )
    # delayq's own row first, then the peers in the order they ran
    rows.sort(key=lambda row: not row.system.startswith(DELAYQ.name))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
