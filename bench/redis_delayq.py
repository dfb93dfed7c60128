"""delayq on Redis: enqueue rate, claim cost vs backlog, memory per job, idle load, lateness.

::

    python -m bench.redis_delayq            # full run (1,000,000 pending jobs; ~1-2 minutes)
    python -m bench.redis_delayq --quick    # smoke run (100,000 pending; a few seconds)
    python -m bench.redis_delayq --url redis://127.0.0.1:6379/0

Every measurement uses its own key prefix on the given Redis and deletes its keys
afterwards (SCAN + DEL; it never flushes). What is measured:

- enqueue jobs/s: ``DelayQ.schedule`` one call per job, and ``schedule_many`` in batches
  of 1,000 (validation, JSON, one Lua script per call), from one thread; and the same
  through ``RedisBackend.enqueue`` with ready-made ``JobSpec`` objects (the store's share).
- claim cost: mean and p99 time of ``claim(limit=1)`` round trips (one Lua script) while
  10,000 vs 1,000,000 jobs are pending in the future; flat means O(log n).
- memory per pending job: ``INFO memory`` used_memory after minus before enqueueing the
  pending jobs, divided by their number (a small JSON payload each).
- idle load: Redis commands per second (``INFO commandstats``, commands run inside scripts
  included) while a ``Worker`` with default settings waits for a job due in an hour. It
  uses a private ``redis-server`` when one is on PATH, so nothing else is counted.
- lateness: one worker process (``Worker(app)`` defaults, no-op handler), ``n`` jobs
  enqueued one at a time and due uniformly over ``span`` seconds; lateness is the
  handler's first ``time.time()`` minus the due time.

``bench.redis_peers`` imports :func:`measure_enqueue` and :func:`measure_lateness` for
its delayq row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from delayq.app import DelayQ
from delayq.backends.redis import RedisBackend
from delayq.job import JobContext, JobSpec

DEFAULT_URL = "redis://127.0.0.1:6379/0"
REPO_ROOT = Path(__file__).resolve().parent.parent


# -- helpers -------------------------------------------------------------------


def _prefix() -> str:
    return f"delayq-bench-{uuid.uuid4().hex[:10]}"


def _delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=5000):
            batch.append(key)
            if len(batch) >= 5000:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


@contextlib.contextmanager
def _scratch(url: str) -> Iterator[str]:
    """A fresh key prefix whose keys are deleted afterwards."""
    prefix = _prefix()
    try:
        yield prefix
    finally:
        _delete_prefix(url, prefix)


def _server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1_000_000


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _specs(prefix: str, n: int, run_at: float, start: int = 0) -> list[JobSpec]:
    return [
        JobSpec(id=f"{prefix}-{i}", name="noop", payload='{"n":1}', run_at=run_at)
        for i in range(start, start + n)
    ]


# -- measurements ----------------------------------------------------------------


def measure_enqueue(
    url: str = DEFAULT_URL, *, n_single: int = 20_000, n_batched: int = 200_000, batch: int = 1000
) -> dict[str, float]:
    """Jobs/s for ``schedule`` one at a time and ``schedule_many`` in batches."""
    with _scratch(url) as prefix:
        app = DelayQ(url, prefix=prefix)
        try:
            started = time.perf_counter()
            for i in range(n_single):
                app.schedule("noop", {"i": i}, delay=3600)
            single = n_single / (time.perf_counter() - started)
            started = time.perf_counter()
            for first in range(0, n_batched, batch):
                app.schedule_many(
                    {"name": "noop", "payload": {"i": i}, "delay": 3600}
                    for i in range(first, min(first + batch, n_batched))
                )
            batched = n_batched / (time.perf_counter() - started)
        finally:
            app.close()
        # The backend alone (JobSpecs built beforehand): what the store costs.
        backend = RedisBackend.from_url(url, prefix=prefix)
        try:
            run_at = time.time() + 3600
            specs = _specs("s", n_single, run_at)
            started = time.perf_counter()
            for spec in specs:
                backend.enqueue([spec])
            backend_single = n_single / (time.perf_counter() - started)
            specs = _specs("b", n_batched, run_at)
            started = time.perf_counter()
            for first in range(0, n_batched, batch):
                backend.enqueue(specs[first : first + batch])
            backend_batched = n_batched / (time.perf_counter() - started)
        finally:
            backend.close()
    return {
        "single_per_s": single,
        "batched_per_s": batched,
        "backend_single_per_s": backend_single,
        "backend_batched_per_s": backend_batched,
    }


def measure_backlog(url: str, pending: int, *, claims: int = 2000) -> dict[str, float]:
    """Memory per pending job and ``claim(limit=1)`` cost with ``pending`` future jobs."""
    with _scratch(url) as prefix:
        backend = RedisBackend.from_url(url, prefix=prefix)
        admin = redis.Redis.from_url(url)
        try:
            before = int(admin.info("memory")["used_memory"])
            future = _server_time(admin) + 86_400
            for first in range(0, pending, 1000):
                backend.enqueue(_specs("p", min(1000, pending - first), future, first))
            after = int(admin.info("memory")["used_memory"])
            backend.enqueue(_specs("due", claims, _server_time(admin) - 1))
            backend.claim(limit=1, lease=60)  # loads the script
            before_stats = admin.info("commandstats").get("cmdstat_evalsha", {})
            times: list[float] = []
            for _ in range(claims - 1):
                started = time.perf_counter()
                got = backend.claim(limit=1, lease=60)
                times.append(time.perf_counter() - started)
                assert len(got) == 1
            after_stats = admin.info("commandstats").get("cmdstat_evalsha", {})
            server_us = (after_stats.get("usec", 0) - before_stats.get("usec", 0)) / len(times)
        finally:
            backend.close()
            admin.close()
    return {
        "pending": pending,
        "bytes_per_job": (after - before) / pending,
        "claim_mean_us": sum(times) / len(times) * 1e6,
        "claim_p99_us": _percentile(times, 99) * 1e6,
        "claim_server_us": server_us,  # EVALSHA time inside Redis (others' calls too if shared)
    }


@contextlib.contextmanager
def _private_server() -> Iterator[str | None]:
    """A private redis-server URL (None when the binary is missing)."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            client.close()
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


def measure_idle(url: str = DEFAULT_URL, *, seconds: float = 30.0) -> dict[str, Any]:
    """Redis commands/s while a default ``Worker`` waits for a job due in an hour."""
    from delayq.worker import Worker  # noqa: PLC0415

    with _private_server() as private:
        target = private or url
        with _scratch(target) as prefix:
            app = DelayQ(target, prefix=prefix)
            app.schedule("noop", {}, delay=3600)
            admin = redis.Redis.from_url(target)
            worker = Worker(app).start()
            try:
                time.sleep(1.0)  # let it settle into its wait
                before = admin.info("commandstats")
                time.sleep(seconds)
                after = admin.info("commandstats")
            finally:
                worker.stop(grace=1.0)
                app.close()
                admin.close()
    delta = {
        k.removeprefix("cmdstat_"): int(v["calls"]) - int(before.get(k, {"calls": 0})["calls"])
        for k, v in after.items()
    }
    delta.pop("info", None)
    delta = {k: n for k, n in delta.items() if n}
    return {
        "commands_per_s": sum(delta.values()) / seconds,
        "commands": delta,
        "private_server": private is not None,
        "seconds": seconds,
    }


def measure_lateness(n_jobs: int, span_s: float, url: str = DEFAULT_URL) -> dict[str, float]:
    """Lateness p50/p99/max (seconds) of ``n_jobs`` due uniformly over ``span_s`` seconds.

    One worker process with ``Worker(app)`` defaults and a no-op handler; jobs are
    enqueued one ``schedule`` call at a time. Returns also the enqueue rate of that loop.
    """
    with _scratch(url) as prefix, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lateness.txt"
        out.touch()
        worker = subprocess.Popen(
            [sys.executable, "-m", "bench.redis_delayq", "--worker", url, prefix, str(out)],
            cwd=REPO_ROOT,
        )
        app = DelayQ(url, prefix=prefix)
        try:
            # Wait until the worker runs a probe job: it is up and waiting.
            app.schedule("noop", {"due": time.time(), "probe": True}, delay=0)
            deadline = time.monotonic() + 30
            while not out.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
            # Enqueue must end before the first job is due, or enqueue speed leaks
            # into lateness; ``enqueue_overlap_s`` reports it if it did not.
            lead = 2.0 + n_jobs / 1000
            first = time.time() + lead
            started = time.perf_counter()
            for i in range(n_jobs):
                due = first + span_s * i / n_jobs
                app.schedule("noop", {"due": due}, at=due)
            enqueue_s = time.perf_counter() - started
            overlap = max(0.0, time.time() - first)
            deadline = time.monotonic() + lead + span_s + 30
            while time.monotonic() < deadline:
                if _count_lines(out) >= n_jobs + 1:
                    break
                time.sleep(0.05)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            app.close()
        lines = [line.split() for line in out.read_text().splitlines()[1:]]
        samples = [float(cols[1]) for cols in lines]
        at_claim = [float(cols[2]) for cols in lines]
    return {
        "n": len(samples),
        "p50": _percentile(samples, 50),
        "p99": _percentile(samples, 99),
        "max": max(samples) if samples else float("nan"),
        "enqueue_per_s": n_jobs / enqueue_s,
        "enqueue_overlap_s": overlap,
        # claimed_at - run_at on the server's clock: the store's share of the lateness
        "claim_p50": _percentile(at_claim, 50),
        "claim_p99": _percentile(at_claim, 99),
    }


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))


def _worker_main(url: str, prefix: str, out: str) -> None:
    """The lateness worker process: a no-op handler that appends its lateness."""
    from delayq.worker import Worker  # noqa: PLC0415

    app = DelayQ(url, prefix=prefix)
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)

    @app.handler("noop")
    def noop(payload: dict[str, Any], ctx: JobContext) -> None:
        lateness = time.time() - payload["due"]
        probe = int(bool(payload.get("probe")))
        os.write(fd, f"{probe} {lateness:.6f} {ctx.lateness:.6f}\n".encode())

    Worker(app).run()
    app.close()


# -- report ----------------------------------------------------------------------


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"| {'-' * width} | ----- |"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_delayq", description=__doc__)
    parser.add_argument("--url", default=os.environ.get("DELAYQ_REDIS_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--worker", nargs=3, metavar=("URL", "PREFIX", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(*args.worker)
        return 0
    quick = args.quick
    url = args.url
    big = 100_000 if quick else 1_000_000
    rows: list[tuple[str, str]] = []
    enq = measure_enqueue(
        url, n_single=2_000 if quick else 20_000, n_batched=20_000 if quick else 200_000
    )
    rows.append(("enqueue, one schedule() per job", f"{enq['single_per_s']:,.0f} jobs/s"))
    rows.append(("enqueue, schedule_many() x1000", f"{enq['batched_per_s']:,.0f} jobs/s"))
    rows.append(("enqueue, backend.enqueue() x1", f"{enq['backend_single_per_s']:,.0f} jobs/s"))
    rows.append(("enqueue, backend.enqueue() x1000", f"{enq['backend_batched_per_s']:,.0f} jobs/s"))
    # A private server (when redis-server is on PATH) keeps other clients out of the
    # claim timings and the memory delta.
    with _private_server() as private:
        where = "private server" if private else "shared server"
        for pending in (10_000, big):
            b = measure_backlog(private or url, pending, claims=500 if quick else 2000)
            rows.append(
                (
                    f"claim(limit=1), {pending:,} pending ({where})",
                    f"{b['claim_mean_us']:.0f} µs mean, {b['claim_p99_us']:.0f} µs p99 round "
                    f"trip; {b['claim_server_us']:.0f} µs in Redis",
                )
            )
            if pending == big:
                rows.append(
                    (f"memory per pending job at {pending:,}", f"{b['bytes_per_job']:.0f} B")
                )
    idle = measure_idle(url, seconds=3.0 if quick else 30.0)
    detail = ", ".join(f"{k} {n}" for k, n in sorted(idle["commands"].items()))
    where = "private server" if idle["private_server"] else "shared server, others included"
    rows.append(
        (
            f"idle worker, commands/s ({where})",
            f"{idle['commands_per_s']:.2f} ({detail} in {idle['seconds']:.0f} s)",
        )
    )
    n, span = (2_000, 3.0) if quick else (20_000, 10.0)
    late = measure_lateness(n, span, url)
    rows.append(
        (
            f"lateness, {n:,} jobs over {span:.0f} s, 1 worker",
            f"p50 {late['p50'] * 1000:.1f} ms, p99 {late['p99'] * 1000:.1f} ms, "
            f"max {late['max'] * 1000:.1f} ms ({late['n']:,} ran)",
        )
    )
    rows.append(
        (
            "  of which claim (claimed_at - run_at, server clock)",
            f"p50 {late['claim_p50'] * 1000:.1f} ms, p99 {late['claim_p99'] * 1000:.1f} ms",
        )
    )
    rows.append(("enqueue during the lateness run", f"{late['enqueue_per_s']:,.0f} jobs/s"))
    print(f"delayq Redis backend ({'quick' if quick else 'full'} run, {url})\n")
    print(_table(rows))
    print()
    print(json.dumps({"enqueue": enq, "idle": idle, "lateness": late}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
