"""delayq on Redis: drain rate of one and of two worker processes on one queue.

::

    python -m bench.redis_scale            # 20,000 jobs per run
    python -m bench.redis_scale --quick    # 4,000 jobs per run
    python -m bench.redis_scale --url redis://127.0.0.1:6379/0   # a server of your own

Each run fills a fresh key prefix with ``n`` jobs (``schedule_many``), all due at
the same moment ahead, starts the worker processes (``Worker(app)`` defaults, no-op
handler), checks they are all blocked waiting before that moment (else the run is
repeated with a longer lead), and measures on the Redis server's clock from that
moment until the store has nothing scheduled or running. So process start-up is
not counted, and one and two processes are measured the same way. It uses a
private ``redis-server`` (ports 17000-17099) unless ``--url`` is given.
``--repeat`` keeps the best run of each (a shared machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis

from bench.redis_costs import _server
from delayq.app import DelayQ

REPO_ROOT = Path(__file__).resolve().parent.parent
LEAD = 8.0  # seconds between filling and the due moment: the workers start meanwhile


def _worker(url: str, prefix: str) -> None:
    from delayq.worker import Worker  # noqa: PLC0415

    app = DelayQ(url, prefix=prefix)
    app.register("noop", lambda payload: None)
    Worker(app).run()
    app.close()


def _blocked(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c.get("cmd") == "blpop")


def run(url: str, n: int, processes: int) -> float:
    """Jobs per second of ``processes`` workers draining ``n`` jobs due at once."""
    prefix = f"bench-scale:{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(url)
    app = DelayQ(url, prefix=prefix)
    children: list[subprocess.Popen[bytes]] = []
    try:
        seconds, micros = client.time()
        due = seconds + micros / 1e6 + LEAD
        for start in range(0, n, 1000):
            app.schedule_many(
                [
                    {"name": "noop", "payload": {"i": i}, "at": due}
                    for i in range(start, min(n, start + 1000))
                ]
            )
        env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{REPO_ROOT}"}
        cmd = [sys.executable, "-m", "bench.redis_scale", "--worker", url, prefix]
        blocked_before = _blocked(client)
        children = [subprocess.Popen(cmd, env=env) for _ in range(processes)]
        while _blocked(client) < blocked_before + processes:
            time.sleep(0.05)
        seconds, micros = client.time()
        if seconds + micros / 1e6 >= due:
            return float("nan")  # the workers were not waiting before the jobs fell due
        backend = app.backend
        while True:
            stats = backend.stats()
            if stats.scheduled == 0 and stats.running == 0:
                break
            time.sleep(0.01)
        seconds, micros = client.time()
        return n / (seconds + micros / 1e6 - due)
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        app.close()
        for key in client.scan_iter(match=f"{prefix}:*", count=5000):
            client.unlink(key)
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="a Redis of your own (default: private)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("URL", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    n = 4_000 if args.quick else 20_000
    best: dict[int, float] = {}
    with _server(args.url) as url:
        for _ in range(args.repeat):
            for processes in (1, 2):
                rate = run(url, n, processes)
                if rate == rate:  # not NaN
                    best[processes] = max(best.get(processes, 0.0), rate)
    if len(best) < 2:
        print("redis_scale: the workers never started before the jobs fell due")
        return 1
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"redis_scale: {n:,} jobs due at once, best of {args.repeat}; load average {load}\n")
    print("| worker processes | jobs/s |")
    print("| ---: | ---: |")
    for processes, rate in best.items():
        print(f"| {processes} | {rate:,.0f} |")
    print(f"\ntwo processes / one: {best[2] / best[1]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
