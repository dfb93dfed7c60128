"""Drain rate of worker processes: how fast ``delayq worker`` empties a backlog of due jobs.

::

    python -m bench.drain                  # 20,000 due jobs per store
    python -m bench.drain --quick          # 2,000 due jobs per store (smoke run)
    python -m bench.drain --stores sqlite-normal,redis --jobs 50000 --concurrency 8
    python -m bench.drain --stores redis --processes 2   # two worker processes

Per store (memory, SQLite ``synchronous=normal`` and ``full``, Redis when it
answers at ``--redis``): this process fills the store with ``DelayQ.schedule_many``
(batches of 1,000, all due already), then ONE child process runs
``Worker(app)`` with a no-op handler (defaults: 8 handler threads and the
default prefetch) and reports how long it took from ``Worker.start()`` until
the last job was recorded as succeeded, plus the CPU seconds it used. The
memory store cannot be shared between processes, so its child fills its own
store before the clock starts. ``--repeat N`` runs each store N times and
shows the best run (the machine is shared: the best is the least disturbed).
Targets (on the development machine): Redis >= 10,000 jobs/s, SQLite normal
>= 8,000/s, full >= 5,000/s.

``--processes K`` drains with K worker processes started together (not the
memory store); the store's succeeded count says when they are done.

``--profile DIR`` runs each child under ``py-spy record`` (when installed) and
writes a flame graph per store into DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STORES = ("memory", "sqlite-normal", "sqlite-full", "redis")
REPO_ROOT = Path(__file__).resolve().parent.parent
FILL_BATCH = 1000


def _url(store: str, tmp: Path, redis_url: str) -> str:
    if store == "memory":
        return "memory://"
    if store.startswith("sqlite-"):
        mode = store.removeprefix("sqlite-")
        return f"sqlite:///{tmp / f'drain-{mode}-{uuid.uuid4().hex[:8]}.db'}?synchronous={mode}"
    return redis_url


def _fill(app: Any, n: int) -> None:
    due = time.time() - 1.0
    for start in range(0, n, FILL_BATCH):
        app.schedule_many(
            [
                {"name": "noop", "payload": {"i": i}, "at": due}
                for i in range(start, min(n, start + FILL_BATCH))
            ]
        )


def child(url: str, n: int, concurrency: int, prefetch: int | None, prefix: str | None) -> None:
    """The worker process: drain ``n`` due jobs, print one JSON line with the timing."""
    from delayq import DelayQ, Worker  # noqa: PLC0415 - the child imports what it measures
    from delayq.worker import JobResult  # noqa: PLC0415

    options: dict[str, Any] = {} if prefix is None else {"prefix": prefix}
    app = DelayQ(url, **options)
    app.register("noop", lambda payload: None)
    if url == "memory://":
        _fill(app, n)
    done = threading.Event()
    counted = 0
    lock = threading.Lock()

    def on_result(result: JobResult) -> None:
        nonlocal counted
        with lock:
            counted += 1
            if counted >= n:
                done.set()

    options = {} if prefetch is None else {"prefetch": prefetch}
    worker = Worker(app, concurrency=concurrency, on_result=on_result, **options)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    worker.start()
    finished = done.wait(600)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    stats = worker.stats()
    worker.stop(grace=5)
    app.close()
    print(
        json.dumps(
            {
                "finished": finished,
                "jobs": counted,
                "elapsed": elapsed,
                "cpu": cpu,
                "succeeded": stats.succeeded,
                "claimed": stats.claimed,
            }
        ),
        flush=True,
    )


def shared_child(
    url: str, concurrency: int, prefetch: int | None, prefix: str | None, go: Path
) -> None:
    """One of several worker processes on one store: start when ``go`` exists, run
    until SIGTERM, then print one JSON line with its CPU time and counts."""
    from delayq import DelayQ, Worker  # noqa: PLC0415 - the child imports what it measures

    app = DelayQ(url, **({} if prefix is None else {"prefix": prefix}))
    app.register("noop", lambda payload: None)
    options = {} if prefetch is None else {"prefetch": prefetch}
    worker = Worker(app, concurrency=concurrency, **options)
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.001)
    cpu0 = time.process_time()
    worker.run()  # SIGTERM stops it
    stats = worker.stats()
    app.close()
    print(
        json.dumps(
            {
                "cpu": time.process_time() - cpu0,
                "succeeded": stats.succeeded,
                "claimed": stats.claimed,
            }
        ),
        flush=True,
    )


def _measure_processes(
    url: str, n: int, processes: int, cmd: list[str], env: dict[str, str], tmp: Path
) -> dict[str, Any]:
    """Drain with ``processes`` worker processes; the store's count says when all are done."""
    from delayq import DelayQ  # noqa: PLC0415

    go = tmp / f"go-{uuid.uuid4().hex[:8]}"
    procs = [
        subprocess.Popen(
            [*cmd, "--go", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a drain child did not start:\n{proc.stderr.read()[-3000:]}")
        prefix = cmd[cmd.index("--prefix") + 1] if "--prefix" in cmd else None
        app = DelayQ(url, **({} if prefix is None else {"prefix": prefix}))
        try:
            go.touch()
            t0 = time.perf_counter()
            finished = False
            while time.perf_counter() - t0 < 600:
                if app.stats().succeeded >= n:
                    finished = True
                    break
                time.sleep(0.01)
            elapsed = time.perf_counter() - t0
        finally:
            app.close()
        reports = []
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if not lines:
                raise RuntimeError(f"a drain child failed:\n{err[-3000:]}")
            reports.append(json.loads(lines[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return {
        "finished": finished,
        "jobs": n,
        "elapsed": elapsed,
        "cpu": sum(r["cpu"] for r in reports),
        "succeeded": sum(r["succeeded"] for r in reports),
        "claimed": sum(r["claimed"] for r in reports),
    }


def _delete_prefix(url: str, prefix: str) -> None:
    import redis  # noqa: PLC0415 - only when Redis is measured

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=5000))
        for i in range(0, len(keys), 5000):
            client.unlink(*keys[i : i + 5000])
    finally:
        client.close()


def _redis_answers(url: str) -> bool:
    try:
        import redis  # noqa: PLC0415
    except ImportError:
        return False
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def measure(
    store: str,
    n: int,
    *,
    concurrency: int,
    prefetch: int | None,
    redis_url: str,
    tmp: Path,
    profile: Path | None,
    processes: int = 1,
) -> dict[str, Any]:
    """Fill ``store`` with ``n`` due jobs, drain them in a child process; the child's report."""
    from delayq import DelayQ  # noqa: PLC0415

    url = _url(store, tmp, redis_url)
    prefix = f"delayq-drain-{uuid.uuid4().hex[:10]}" if store == "redis" else None
    if store != "memory":
        app = DelayQ(url, **({} if prefix is None else {"prefix": prefix}))
        try:
            _fill(app, n)
        finally:
            app.close()
    cmd = [sys.executable, "-m", "bench.drain", "--child", url, str(n), str(concurrency)]
    cmd += ["--prefetch", str(prefetch)] if prefetch is not None else []
    cmd += ["--prefix", prefix] if prefix is not None else []
    if profile is not None and shutil.which("py-spy"):
        profile.mkdir(parents=True, exist_ok=True)
        out = profile / f"drain-{store}.svg"
        cmd = ["py-spy", "record", "--threads", "-r", "500", "-o", str(out), "--", *cmd]
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{REPO_ROOT}"}
    if processes > 1:
        try:
            report = _measure_processes(url, n, processes, cmd, env, tmp)
        finally:
            if prefix is not None:
                _delete_prefix(url, prefix)
        report["store"] = store
        report["rate"] = n / report["elapsed"] if report["elapsed"] > 0 else float("nan")
        return report
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=900, check=False
        )
    finally:
        if prefix is not None:
            _delete_prefix(url, prefix)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the drain child for {store} failed:\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    report["store"] = store
    report["rate"] = report["jobs"] / report["elapsed"] if report["elapsed"] > 0 else float("nan")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.drain", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="2,000 jobs per store")
    parser.add_argument("--jobs", type=int, default=None, help="due jobs per store (20,000)")
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated subset")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="runs per store; the best is shown")
    parser.add_argument("--prefetch", type=int, default=None, help="the worker's default if unset")
    parser.add_argument(
        "--redis", default=os.environ.get("DELAYQ_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy flame graphs here")
    parser.add_argument(
        "--child", nargs=3, metavar=("URL", "N", "CONCURRENCY"), help=argparse.SUPPRESS
    )
    parser.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--go", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--processes", type=int, default=1, help="worker processes (not for memory)"
    )
    args, _ = parser.parse_known_args(argv)
    if args.child and args.go is not None:
        url, _, concurrency = args.child
        shared_child(url, int(concurrency), args.prefetch, args.prefix, args.go)
        return 0
    if args.child:
        url, n, concurrency = args.child
        child(url, int(n), int(concurrency), args.prefetch, args.prefix)
        return 0
    n = args.jobs or (2_000 if args.quick else 20_000)
    stores = [s for s in args.stores.split(",") if s]
    if args.processes > 1:
        stores = [s for s in stores if s != "memory"]  # one process's memory
    unknown = set(stores) - set(STORES)
    if unknown:
        parser.error(f"unknown store(s) {sorted(unknown)}; choose from {', '.join(STORES)}")
    print(
        f"drain: {n:,} due jobs, {args.processes} worker process(es) "
        f"(concurrency {args.concurrency}, "
        f"prefetch {'default' if args.prefetch is None else args.prefetch}), no-op handler; "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} (a shared machine: compare within one run)\n"
    )
    print("| store | jobs/s | seconds | CPU s per 1,000 jobs |")
    print("| --- | ---: | ---: | ---: |")
    code = 0
    with tempfile.TemporaryDirectory(prefix="delayq-drain-") as tmp:
        for store in stores:
            if store == "redis" and not _redis_answers(args.redis):
                print(f"| {store} | skipped: no Redis at {args.redis} | | |")
                continue
            runs: list[dict[str, Any]] = []
            try:
                for _ in range(max(1, args.repeat)):
                    runs.append(
                        measure(
                            store,
                            n,
                            concurrency=args.concurrency,
                            prefetch=args.prefetch,
                            redis_url=args.redis,
                            tmp=Path(tmp),
                            profile=args.profile,
                            processes=args.processes,
                        )
                    )
            except Exception as exc:
                print(f"| {store} | failed: {exc} | | |")
                code = 1
                continue
            r = max(runs, key=lambda run: float(run["rate"]))
            if not r["finished"]:
                code = 1
            print(
                f"| {store} | {r['rate']:,.0f} | {r['elapsed']:.2f} | "
                f"{r['cpu'] / max(1, r['jobs']) * 1000:.3f} |",
                flush=True,
            )
    return code


if __name__ == "__main__":
    sys.exit(main())
