"""What the RabbitMQ store's log costs a worker, and a cancel racing a start, many times.

::

    python -m bench.rabbitmq_cancel                 # 2,000 claims timed, 2,000 races
    python -m bench.rabbitmq_cancel --quick         # 300 and 200
    python -m bench.rabbitmq_cancel --claims 5000 --races 10000

Every run gets a virtual host of its own (deleted afterwards).

- start cost: ``claim(limit=1)`` of a job already delivered and due, timed on this host
  (p50 / p99 / max, ms). Before the log a claim read only the worker's memory (a few us),
  so its time is what the start record (a publish with confirm, then the record read back
  from the stream) adds before a handler starts. Also per batch of 8.
- races: a claimer in another process (``--claimer``) claims and acks every job; this
  process enqueues a job due now, waits 0-4 ms, cancels it; a job must be either cancelled
  (never started) or started exactly once with the answer ``running`` / ``finished``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.rabbitmq import DEFAULT_URL, _load_average, _vhost
from delayq.backends.base import Completion
from delayq.backends.rabbitmq import RabbitMQBackend
from delayq.job import CancelOutcome, JobSpec, JobState


def _due_now(job_id: str) -> JobSpec:
    return JobSpec(id=job_id, name="bench", payload="{}", run_at=0.0, delay=0.0)


def _percentiles(samples: list[float]) -> str:
    samples = sorted(samples)
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] * 1000  # noqa: E731
    return f"p50 {pick(0.5):.2f} / p99 {pick(0.99):.2f} / max {samples[-1] * 1000:.2f} ms"


def measure_start_cost(url: str, n: int, batch: int) -> str:
    store = RabbitMQBackend(url, queue="bench-start")
    try:
        store.enqueue([_due_now(f"w{i}") for i in range(10)])  # connect, fold the log
        deadline = time.monotonic() + 30
        got = 0
        while got < 10 and time.monotonic() < deadline:
            claims = store.claim(limit=10, lease=30)
            store.complete([Completion.ack(c) for c in claims])
            got += len(claims)
            store.wait_for_due(0.05)
        samples: list[float] = []
        for start in range(0, n, batch * 16):
            size = min(batch * 16, n - start)
            store.enqueue([_due_now(f"j{start + i}") for i in range(size)])
            taken = 0
            while taken < size:
                store.wait_for_due(0.5)
                if store._consumer.buffered() < min(batch, size - taken):
                    continue  # time only claims of deliveries already held
                began = time.perf_counter()
                claims = store.claim(limit=batch, lease=30)
                if claims:
                    samples.append(time.perf_counter() - began)
                store.complete([Completion.ack(c) for c in claims])
                taken += len(claims)
        confirms: list[float] = []
        for i in range(min(n, 500)):
            began = time.perf_counter()
            store.enqueue([JobSpec(id=f"c{i}", name="x", payload="{}", run_at=0, delay=3600)])
            confirms.append(time.perf_counter() - began)
        return (
            f"{len(samples)} claims of {batch}: {_percentiles(samples)} (for scale, one "
            f"enqueue, a publish with confirm: {_percentiles(confirms)})"
        )
    finally:
        store.close()


def claimer(url: str, queue: str, record: str) -> None:
    store = RabbitMQBackend(url, queue=queue)
    with open(record, "a", buffering=1) as out:
        while True:
            claims = store.claim(limit=8, lease=30.0)
            for claim in claims:
                out.write(f"{claim.job.id}\n")
            if claims:
                store.complete([Completion.ack(c) for c in claims])
            if any(c.job.id == "stop" for c in claims):
                break
            if not claims:
                store.wait_for_due(0.5)
    store.close()


def race(url: str, n: int) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-race-") as tmp:
        record = Path(tmp) / "started.txt"
        record.touch()
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.rabbitmq_cancel",
                "--claimer",
                url,
                "bench-race",
                *[str(record)],
            ]
        )
        store = RabbitMQBackend(url, queue="bench-race")
        try:
            rng, pause = random.Random(1), threading.Event()
            answers: dict[str, CancelOutcome] = {}
            took: list[float] = []
            for i in range(n):
                store.enqueue([_due_now(f"r{i}")])
                pause.wait(rng.uniform(0.0, 0.004))
                began = time.perf_counter()
                answers[f"r{i}"] = store.cancel(f"r{i}")
                took.append(time.perf_counter() - began)
            store.enqueue([JobSpec(id="stop", name="bench", payload="{}", run_at=0, delay=2.0)])
            worker.wait(timeout=600)
            runs = Counter(record.read_text().split())
            wrong = 0
            for job_id, answer in answers.items():
                job = store.get(job_id)
                state = job.state if job is not None else None
                if answer.cancelled:
                    wrong += job_id in runs or state is not JobState.CANCELLED
                else:
                    wrong += runs[job_id] != 1 or state is not JobState.SUCCEEDED
            kinds = Counter(a.value for a in answers.values())
            return (
                f"{n} races: {dict(kinds)}; wrong answers or double starts: {wrong}; "
                f"cancel {_percentiles(took)}"
            )
        finally:
            with contextlib.suppress(Exception):
                worker.kill()
            store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rabbitmq_cancel")
    parser.add_argument("--url", default=os.environ.get("DELAYQ_AMQP_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--claims", type=int, default=None)
    parser.add_argument("--races", type=int, default=None)
    parser.add_argument("--claimer", nargs=3, metavar=("URL", "QUEUE", "RECORD"))
    args, _ = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.claimer:
        claimer(*args.claimer)
        return 0
    claims = args.claims or (300 if args.quick else 2000)
    races = args.races or (200 if args.quick else 2000)
    print(f"## RabbitMQ log: start cost and races (load average at start: {_load_average()})\n")
    with _vhost(args.url) as url:
        for batch in (1, 8):
            print(f"- start cost, {measure_start_cost(url, claims, batch)}", flush=True)
        print(f"- {race(url, races)}")
    print(f"\n(load average at the end: {_load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
