"""delayq on RabbitMQ vs Celery on RabbitMQ, under live load.

::

    python -m bench.rabbitmq            # 200 and 2,000 jobs/s, 10 s of producing each
    python -m bench.rabbitmq --quick    # 200 jobs/s for 3 s, delayq only
    python -m bench.rabbitmq --url amqp://guest:guest@127.0.0.1:5672/ --rates 200,2000

It creates a virtual host of its own with ``rabbitmqctl`` (deleted afterwards;
without ``rabbitmqctl`` it uses the URL's vhost with fresh queue names).

- enqueue: ``DelayQ.schedule`` calls/s from one thread, one call per job,
  each returning after the broker's publisher confirm (quorum queues).
- live load: one worker process (8 threads: delayq's ``Worker`` defaults
  otherwise, Celery ``--pool threads -c 8``) and one producer thread calling
  ``schedule`` (``apply_async(countdown=)``) once per job at a fixed rate for
  ``--seconds``, each job due a random 0..``--max-delay`` seconds ahead, so
  earlier jobs fall due while the producer goes on. Lateness is the handler's
  first ``time.time()`` minus the due time the producer computed (same host);
  "early" counts negative lateness, "missing" jobs that never ran by the
  deadline, "dup" extra runs. ``enq/s`` is the producer's achieved rate.

Systems: ``delayq`` (quorum queues, levels from 64 ms, the rest waited out by
the worker); ``celery-native`` (Celery on quorum queues: kombu's native delayed
delivery; countdowns must be >= 1 s there, so its delays are 1..1+max-delay);
``celery-classic`` (classic queue: the ETA message is delivered at once and
held in the worker's memory until due).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

import bench._peer_rabbitmq as _peer
from delayq import DelayQ

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
REPO_ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("delayq", "celery-native", "celery-classic")
COLUMNS = ("system", "jobs/s", "enq/s", "p50 ms", "p99 ms", "max ms", "early", "missing", "dup")
COLUMNS += ("errors", "note")


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


@contextmanager
def _vhost(url: str) -> Iterator[str]:
    """The URL on a fresh vhost (deleted afterwards), or ``url`` itself without rabbitmqctl."""
    if shutil.which("rabbitmqctl") is None:
        yield url
        return
    name = f"delayq-bench-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True)
    user = urlsplit(url).username or "guest"
    subprocess.run(
        ["rabbitmqctl", "-q", "set_permissions", "-p", name, user, ".*", ".*", ".*"],
        check=True,
        capture_output=True,
    )
    parts = urlsplit(url)
    try:
        yield f"{parts.scheme}://{parts.netloc}/{quote(name, safe='')}"
    finally:
        subprocess.run(
            ["rabbitmqctl", "-q", "delete_vhost", name], check=False, capture_output=True
        )


def _env(mode: str, url: str, queue: str, record: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BENCH_MODE=mode, BENCH_URL=url, BENCH_QUEUE=queue, BENCH_RECORD=str(record))
    return env


def _start_worker(mode: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    if mode == "delayq":
        command = [sys.executable, "-m", "bench._peer_rabbitmq"]
    else:
        command = [
            sys.executable, "-m", "celery", "-A", "bench._peer_rabbitmq", "worker",
            "--pool", "threads", "-c", "8", "-Q", env["BENCH_QUEUE"], "-l", "warning",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
    quiet = subprocess.DEVNULL if mode != "delayq" else None  # Celery warns about root
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=quiet
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _lines(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def _wait(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        stop.wait(0.05)
    return bool(predicate())  # type: ignore[operator]


def live_load(
    mode: str, url: str, *, rate: float, seconds: float, max_delay: float, seed: int = 1
) -> dict[str, float | str]:
    """One live-load run of ``mode`` (see the module docstring); returns its row."""
    queue = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "ran.txt"
        env = _env(mode, url, queue, record)
        os.environ.update({k: env[k] for k in ("BENCH_MODE", "BENCH_URL", "BENCH_QUEUE")})
        worker = _start_worker(mode, env)
        try:
            if not _wait(lambda: "READY" in _lines(record), 60):
                return {"system": mode, "note": "worker did not start"}
            peer = importlib.reload(_peer)  # read the environment of this run
            schedule, close = peer.producer(mode)
            rng = random.Random(seed)
            low = 1.0 if mode == "celery-native" else 0.0
            n = int(rate * seconds)
            due: dict[int, float] = {}
            errors = 0
            pause = threading.Event()
            start = time.monotonic()
            for i in range(n):
                left = start + i / rate - time.monotonic()
                if left > 0:
                    pause.wait(left)
                delay = rng.uniform(low, low + max_delay)
                due[i] = time.time() + delay
                try:
                    schedule(i, delay)
                except Exception:  # a failed call is reported, not fatal
                    errors += 1
                    del due[i]
            produced = time.monotonic() - start
            close()
            grace = max_delay + max(30.0, seconds * 3)
            _wait(lambda: len(_lines(record)) - 1 >= len(due), grace)
        finally:
            _stop(worker)
        runs: dict[int, int] = {}
        lateness: list[float] = []
        for line in _lines(record):
            if line == "READY":
                continue
            i_text, at_text = line.split()
            i = int(i_text)
            runs[i] = runs.get(i, 0) + 1
            if runs[i] == 1 and i in due:
                lateness.append(float(at_text) - due[i])
    return {
        "system": mode,
        "rate": rate,
        "enq/s": n / produced,
        "p50 ms": _percentile(lateness, 50) * 1000,
        "p99 ms": _percentile(lateness, 99) * 1000,
        "max ms": max(lateness, default=float("nan")) * 1000,
        "early": sum(1 for x in lateness if x < 0),
        "missing": len(set(due) - set(runs)),
        "dup": sum(c - 1 for c in runs.values()),
        "errors": errors,
        "note": "delays >= 1 s (countdown < 1 s is refused)" if mode == "celery-native" else "",
    }


def measure_enqueue(url: str, n: int) -> dict[str, float]:
    """``DelayQ.schedule`` calls/s from one thread (delays 0 s and 1 h), confirms on."""
    queue = f"bench-enqueue-{uuid.uuid4().hex[:6]}"
    app = DelayQ(url, queue=queue)
    try:
        rates: dict[str, float] = {}
        for label, delay in (("delay 1 h", 3600.0), ("delay 0", 0.0)):
            started = time.perf_counter()
            for i in range(n):
                app.schedule("noop", i, delay=delay)
            rates[label] = n / (time.perf_counter() - started)
        return rates
    finally:
        app.close()


def _row(row: dict[str, float | str]) -> str:
    cells = []
    for key in (
        "system",
        "rate",
        "enq/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "early",
        "missing",
        "dup",
        "errors",
        "note",
    ):
        value = row.get(key, "")
        cells.append(f"{value:,.1f}" if isinstance(value, float) else str(value))
    return "| " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rabbitmq")
    parser.add_argument("--url", default=os.environ.get("DELAYQ_AMQP_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rates", default=None, help="jobs/s, comma separated (200,2000)")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--max-delay", type=float, default=2.0)
    parser.add_argument("--systems", default=None, help=f"comma separated: {','.join(SYSTEMS)}")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    rates = [float(r) for r in (args.rates or ("200" if args.quick else "200,2000")).split(",")]
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    systems = (args.systems or ("delayq" if args.quick else ",".join(SYSTEMS))).split(",")
    if importlib.util.find_spec("pika") is None:
        print("skipped: pika is not installed (pip install 'delayq[rabbitmq]')")
        return 0
    with _vhost(args.url) as url:
        enqueue = measure_enqueue(url, 500 if args.quick else 3000)
        print("## enqueue: DelayQ.schedule, one thread, publisher confirms (quorum queues)\n")
        for label, value in enqueue.items():
            print(f"- {label}: {value:,.0f} calls/s")
        print(
            f"\n## live load: one producer, jobs due 0..{args.max_delay:g} s ahead, "
            f"{seconds:g} s per run\n"
        )
        print("| " + " | ".join(COLUMNS) + " |")
        print("| --- " * len(COLUMNS) + "|")
        for rate in rates:
            for mode in systems:
                if mode.startswith("celery") and importlib.util.find_spec("celery") is None:
                    print(f"| {mode} | {rate:g} | skipped: celery is not installed |")
                    continue
                row = live_load(mode, url, rate=rate, seconds=seconds, max_delay=args.max_delay)
                print(_row(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
