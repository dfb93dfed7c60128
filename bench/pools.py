"""Thread pool against process pool: CPU-bound handlers, hard time limits, no-op drains.

::

    python -m bench.pools            # 2,000 CPU jobs, 100 spinning jobs, 2,000 no-op jobs
    python -m bench.pools --quick    # 200 / 10 / 200 (smoke run)

Everything runs in this process on the memory store (the pool's children load
``bench._pool_app:app`` by name and run only the handlers); ``-c 2`` unless
``--concurrency``. Times run from ``Worker.start()`` returning (the process
pool's children are up) until the last result is recorded.

* **cpu**: a pure-Python loop calibrated to 20 ms on one core, ``--jobs`` jobs,
  thread pool then process pool; jobs/s and the speed-up (target: the process
  pool >= 1.8x the thread pool on 2 cores).
* **hard limit**: ``--spinners`` jobs whose handler is ``while True: pass`` with
  ``timeout=0.5``, on the process pool; per job, the seconds from the handler's
  start to its child being gone (target: <= 0.5 s + 200 ms), and the processes
  and threads left after the worker stopped (target: none more than before).
* **no-op drain**: ``--jobs`` jobs of a handler doing nothing, both pools
  (target: the process pool within 2x the thread pool's time).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._pool_app import TARGET, app, burn
from delayq.worker import JobResult, Worker

CPU_MS = 20.0


def _calibrate(ms: float) -> int:
    """Loops of :func:`burn` that take ``ms`` milliseconds here (the best of a few tries)."""
    loops = 10_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        burn(loops)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(loops * ms / 1000 / best))


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] != me:  # ppid
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in command:  # multiprocessing's helper stays for good
            found.add(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # a zombie no longer runs; the pool reaps it


def _drain(
    pool: str, name: str, payloads: list[Any], concurrency: int, **job: Any
) -> dict[str, Any]:
    """Run one job per payload on ``pool``; seconds from start to the last result."""
    done = threading.Event()
    results: list[JobResult] = []
    lock = threading.Lock()

    def on_result(result: JobResult) -> None:
        if result.outcome == "returned":
            return  # handed back unstarted (a prefetched claim behind busy slots): runs again
        with lock:
            results.append(result)
            if len(results) >= len(payloads):
                done.set()

    options: dict[str, Any] = {"app_target": TARGET} if pool == "process" else {}
    worker = Worker(app, pool=pool, concurrency=concurrency, on_result=on_result, **options)
    t0 = time.perf_counter()
    worker.start()
    started = time.perf_counter() - t0
    app.schedule_many([{"name": name, "payload": p, "delay": 0, **job} for p in payloads])
    t1 = time.perf_counter()
    finished = done.wait(1800)
    elapsed = time.perf_counter() - t1
    worker.stop(grace=5)
    return {
        "finished": finished,
        "elapsed": elapsed,
        "startup": started,
        "rate": len(payloads) / elapsed if elapsed > 0 else float("nan"),
        "outcomes": sorted({r.outcome for r in results}),
    }


def _hard_limit(spinners: int, concurrency: int, tmp: Path) -> dict[str, Any]:
    report = tmp / "spin.txt"
    threads_before = threading.active_count()
    children_before = _children()
    watched: dict[int, float] = {}  # pid -> wall time its handler started
    gone_at: dict[int, float] = {}
    stop = threading.Event()

    def watch() -> None:  # notes when each spinner's child is gone, every millisecond
        seen = 0
        while not stop.is_set():
            if report.exists():
                lines = report.read_text().splitlines()
                for line in lines[seen:]:
                    pid, at = line.split()
                    watched[int(pid)] = float(at)
                seen = len(lines)
            now = time.time()
            for pid in list(watched):
                if pid not in gone_at and _gone(pid):
                    gone_at[pid] = now
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = _drain(
        "process", "spin", [{"report": str(report)}] * spinners, concurrency, max_attempts=1
    )
    deadline = time.monotonic() + 10
    while len(gone_at) < len(watched) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    watcher.join()
    lives = sorted(gone_at[pid] - watched[pid] for pid in gone_at)
    time.sleep(0.5)  # the kill timers (SIGKILL after the grace) end
    return {
        **run,
        "spinners": len(watched),
        "life_p50": statistics.median(lives) if lives else float("nan"),
        "life_max": max(lives) if lives else float("nan"),
        "extra_processes": len(_children() - children_before),
        "extra_threads": threading.active_count() - threads_before,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pools", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="200 / 10 / 200 jobs")
    parser.add_argument("--jobs", type=int, default=None, help="CPU and no-op jobs (2,000)")
    parser.add_argument("--spinners", type=int, default=None, help="spinning jobs (100)")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--only", default="cpu,limit,noop", help="comma-separated subset")
    args, _ = parser.parse_known_args(argv)
    jobs = args.jobs or (200 if args.quick else 2_000)
    spinners = args.spinners or (10 if args.quick else 100)
    only = set(args.only.split(","))
    c = args.concurrency
    print(
        f"pools: -c {c}; {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start "
        f"(a shared machine: compare within one run)\n"
    )
    code = 0
    if "cpu" in only:
        loops = _calibrate(CPU_MS)
        payloads = [{"loops": loops}] * jobs
        thread = _drain("thread", "cpu", payloads, c)
        process = _drain("process", "cpu", payloads, c)
        print(f"cpu: {jobs:,} jobs of a {CPU_MS:g} ms pure-Python loop ({loops:,} loops)\n")
        print("| pool | jobs/s | seconds | children started in (s) |")
        print("| --- | ---: | ---: | ---: |")
        for name, r in (("thread", thread), ("process", process)):
            print(f"| {name} | {r['rate']:,.1f} | {r['elapsed']:.2f} | {r['startup']:.2f} |")
        print(
            f"\nprocess / thread: {process['rate'] / thread['rate']:.2f}x "
            f"(load average {os.getloadavg()[0]:.2f} now)\n",
            flush=True,
        )
        code = code or int(not (thread["finished"] and process["finished"]))
    if "limit" in only:
        with tempfile.TemporaryDirectory(prefix="delayq-pools-") as tmp:
            r = _hard_limit(spinners, c, Path(tmp))
        print(f"hard limit: {spinners} jobs in `while True: pass`, timeout=0.5 s, process pool\n")
        print(
            "| handler start to child gone p50 / max (s) | jobs/s "
            "| extra processes | extra threads |"
        )
        print("| ---: | ---: | ---: | ---: |")
        print(
            f"| {r['life_p50']:.3f} / {r['life_max']:.3f} | {r['rate']:.1f} | "
            f"{r['extra_processes']} | {r['extra_threads']} |"
        )
        print(
            f"\n(outcomes {r['outcomes']}; {r['spinners']} spinners seen; load average "
            f"{os.getloadavg()[0]:.2f} now)\n",
            flush=True,
        )
        code = code or int(not r["finished"])
    if "noop" in only:
        payloads = [None] * jobs
        thread = _drain("thread", "noop", payloads, c)
        process = _drain("process", "noop", payloads, c)
        print(f"no-op drain: {jobs:,} jobs\n")
        print("| pool | jobs/s | seconds |")
        print("| --- | ---: | ---: |")
        for name, r in (("thread", thread), ("process", process)):
            print(f"| {name} | {r['rate']:,.0f} | {r['elapsed']:.2f} |")
        print(
            f"\nprocess time / thread time: {process['elapsed'] / thread['elapsed']:.2f}x "
            f"(load average {os.getloadavg()[0]:.2f} now)\n",
            flush=True,
        )
        code = code or int(not (thread["finished"] and process["finished"]))
    return code


if __name__ == "__main__":
    sys.exit(main())
