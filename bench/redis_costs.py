"""delayq on Redis: what one ``schedule`` costs next to a bare EVALSHA, and memory per job.

::

    python -m bench.redis_costs            # 3,000 calls per round, 20,000 jobs for memory
    python -m bench.redis_costs --quick    # smoke run
    python -m bench.redis_costs --url redis://127.0.0.1:6379/0   # a server of your own

- round trips: ``DelayQ.schedule(name, payload, delay=3600)`` (validation, encoding, one
  script call) against a bare ``EVALSHA`` of ``return 1`` through redis-py, measured in
  alternating rounds on the same server; the table shows the median and the best round
  (the best is the least disturbed on a shared machine) and their ratio.
- memory: ``INFO memory`` used_memory before and after, divided by the jobs: a pending
  job (``{"n": <int>}`` payload), a finished record (succeeded, kept ``result_ttl``, at
  most ``max_finished`` per state), and one claim's replay record (``MEMORY USAGE``).
  From those, the steady memory of 1,000 jobs/s due 0-10 s after they are scheduled
  (mean 5 s pending), claimed in batches of 8, with the store's defaults.

It starts a private ``redis-server`` (ports 17000-17099, no persistence) unless
``--url`` is given, so other clients do not disturb the memory figures; with ``--url``
it works under its own key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence

import redis

from delayq.app import DelayQ
from delayq.backends.base import Completion
from delayq.backends.redis import RedisBackend
from delayq.backends.redis._store import DEFAULT_MAX_FINISHED

COMPACT_FACTOR = 10  # compact finished records per full one (lua/_lib.lua, trim_finished)

PORTS = range(17000, 17100)


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH; pass --url")
    port = next(p for p in PORTS if _free(p))
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(port=port)
            for _ in range(200):
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        break
                time.sleep(0.02)
            client.close()
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _delete(client: redis.Redis, prefix: str) -> None:
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


def round_trips(url: str, calls: int, rounds: int) -> dict[str, float]:
    """Microseconds per call: bare EVALSHA vs schedule (median and best round)."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    app = DelayQ(url, prefix=prefix)
    sha = client.script_load("return 1")
    try:

        def bare() -> None:
            client.evalsha(sha, 0)

        def schedule() -> None:
            app.schedule("noop", {"n": 1}, delay=3600)

        times: dict[str, list[float]] = {"bare": [], "schedule": []}
        for f in (bare, schedule):
            for _ in range(200):
                f()
        for _ in range(rounds):
            for name, f in (("bare", bare), ("schedule", schedule)):
                started = time.perf_counter()
                for _ in range(calls):
                    f()
                times[name].append((time.perf_counter() - started) / calls * 1e6)
    finally:
        app.close()
        _delete(client, prefix)
        client.close()
    return {
        "bare_median": statistics.median(times["bare"]),
        "bare_best": min(times["bare"]),
        "schedule_median": statistics.median(times["schedule"]),
        "schedule_best": min(times["schedule"]),
    }


def memory(url: str, jobs: int) -> dict[str, float]:
    """Bytes per pending job, per finished record, per claim replay record."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, decode_responses=True)
    backend = RedisBackend.from_url(url, prefix=prefix, max_finished=0)  # keep them all
    owner = DelayQ(url, prefix=prefix)
    try:

        def used() -> int:
            return int(client.info("memory")["used_memory"])

        before = used()
        seconds, micros = client.time()
        now = float(seconds) + micros / 1e6
        batch = [{"name": "noop", "payload": {"n": i}, "at": now - 1} for i in range(jobs)]
        for start in range(0, jobs, 1000):
            owner.schedule_many(batch[start : start + 1000])
        pending = (used() - before) / jobs
        before_claims = used()
        replay = 0
        claims = 0
        while True:
            got = backend.claim(limit=8, lease=60.0)
            if not got:
                break
            claims += 1
            backend.complete([Completion.ack(c) for c in got])
        replay_keys = list(client.scan_iter(match=f"{prefix}:*claim:*", count=1000))
        if replay_keys:
            replay = int(client.memory_usage(replay_keys[0]) or 0)
        finished = (used() - before_claims - replay * len(replay_keys)) / jobs + pending
    finally:
        owner.close()
        backend.close()
        _delete(client, prefix)
        client.close()
    return {
        "pending": pending,
        "finished": finished,
        "compact": compact_record(url, jobs),
        "replay": float(replay),
        "claims": claims,
    }


def compact_record(url: str, jobs: int) -> float:
    """Bytes per finished record kept compact past ``max_finished`` (its hash and its
    index entry): every record but one goes past a cap of 1."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, decode_responses=True)
    backend = RedisBackend.from_url(url, prefix=prefix, max_finished=1)
    owner = DelayQ(url, prefix=prefix)
    jobs = min(jobs, 10)  # the compact tier holds 10 x max_finished
    try:
        seconds, micros = client.time()
        now = float(seconds) + micros / 1e6
        owner.schedule_many(
            [{"name": "noop", "payload": {"n": i}, "at": now - 1} for i in range(jobs + 1)]
        )
        while got := backend.claim(limit=8, lease=60.0):
            backend.complete([Completion.ack(c) for c in got])
        keys = backend._keys
        compact = list(client.zrange(keys["succeeded"] + ":compact", 0, -1))
        hashes = sum(int(client.memory_usage(keys["job:"] + k) or 0) for k in compact)
        index = int(client.memory_usage(keys["succeeded"] + ":compact") or 0)
        return (hashes + index) / max(1, len(compact))
    finally:
        owner.close()
        backend.close()
        _delete(client, prefix)
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="a Redis of your own (default: private)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    calls, rounds, jobs = (300, 3, 2_000) if args.quick else (3_000, 7, 20_000)
    with _server(args.url) as url:
        rt = round_trips(url, calls, rounds)
        mem = memory(url, jobs)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"redis_costs: CPython {platform.python_version()}, load average {load} "
        f"(a shared machine: compare within one run)\n"
    )
    print("| call | median µs | best round µs |")
    print("| --- | ---: | ---: |")
    print(f"| bare EVALSHA (redis-py) | {rt['bare_median']:.0f} | {rt['bare_best']:.0f} |")
    print(f"| DelayQ.schedule | {rt['schedule_median']:.0f} | {rt['schedule_best']:.0f} |")
    print(
        f"| ratio | {rt['schedule_median'] / rt['bare_median']:.2f} | "
        f"{rt['schedule_best'] / rt['bare_best']:.2f} |\n"
    )
    rate, mean_pending_s, batch, replay_s = 1000, 5.0, 8, 25.0
    steady = (
        rate * mean_pending_s * mem["pending"]
        + DEFAULT_MAX_FINISHED * mem["finished"]
        + COMPACT_FACTOR * DEFAULT_MAX_FINISHED * mem["compact"]
        + rate / batch * replay_s * mem["replay"]
    )
    print("| memory | bytes |")
    print("| --- | ---: |")
    print(f"| per pending job | {mem['pending']:.0f} |")
    print(f"| per finished record | {mem['finished']:.0f} |")
    print(f"| per finished record kept compact (past max_finished) | {mem['compact']:.0f} |")
    print(f"| per claim replay record | {mem['replay']:.0f} |")
    print(
        f"| steady state at 1,000 jobs/s (5 s pending, {DEFAULT_MAX_FINISHED:,} finished "
        f"kept and {COMPACT_FACTOR * DEFAULT_MAX_FINISHED:,} compact, claims of {batch} "
        f"kept {replay_s:.0f} s) | {steady / 2**20:.1f} MiB |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
