"""delayq on RabbitMQ vs Celery on RabbitMQ: ``schedule`` rate, and live load (``bench.load``).

::

    python -m bench.rabbitmq            # 200 and 2,000 jobs/s, 10 s of producing each
    python -m bench.rabbitmq --quick    # 200 jobs/s for 3 s
    python -m bench.rabbitmq --url amqp://guest:guest@127.0.0.1:5672/ --rates 200,2000

Every run gets a virtual host of its own (``rabbitmqctl add_vhost``, deleted afterwards).

- schedule calls/s: ``DelayQ.schedule`` one call per job from one thread, each returning
  after the broker's publisher confirm (quorum queues), jobs due in 1 h and due now.
- live load: the shared workload of ``bench.load`` (producers calling ``schedule`` once per
  job at a fixed rate while earlier jobs fall due, each job due 0..``--horizon`` s after it
  is scheduled; one worker process; lateness = handler start minus due time) for:

  - ``delayq-rabbitmq``: quorum queues, levels of whole 32 ms units, the rest waited
    out by the worker (``Worker(app)`` defaults), the queue's log on (a start record
    before each claim runs); ``delayq-rabbitmq-nolog`` the same with ``log=false``;
    ``delayq-rabbitmq-classic`` on classic queues;
  - ``celery-native``: Celery on quorum queues, kombu's native delayed delivery. It
    refuses countdowns under 1 s, so those jobs are scheduled 1 s ahead instead;
  - ``celery-classic``: Celery on a classic queue: an ETA message is delivered at once
    and held in worker memory until due (``--pool threads -c 8``, prefetch unlimited).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit

from bench import load
from bench._load_celery import URL_ENV as CELERY_URL_ENV
from bench._load_celery import enqueue as celery_enqueue
from delayq import DelayQ

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
_BASE = {"url": DEFAULT_URL}  # the broker of this run (set by ``main``)


def _ctl(*args: str, check: bool = True) -> None:
    """``rabbitmqctl -q ARGS``, bounded (``-t`` on the broker, 35 s for the CLI)."""
    subprocess.run(
        ["rabbitmqctl", "-q", "-t", "30", *args], check=check, capture_output=True, timeout=35
    )


@contextlib.contextmanager
def _vhost(url: str) -> Iterator[str]:
    """``url`` on a fresh virtual host, deleted afterwards."""
    if shutil.which("rabbitmqctl") is None:
        raise load.RunFailed("rabbitmqctl is not on PATH (needed for a private vhost)")
    name = f"delayq-bench-{uuid.uuid4().hex[:8]}"
    user = urlsplit(url).username or "guest"
    _ctl("add_vhost", name)
    _ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    parts = urlsplit(url)
    try:
        yield f"{parts.scheme}://{parts.netloc}/{quote(name, safe='')}"
    finally:
        _ctl("delete_vhost", name, check=False)


def _prepare(query: str = "") -> Callable[[Path], contextlib.AbstractContextManager[str]]:
    @contextlib.contextmanager
    def prepare(workdir: Path) -> Iterator[str]:
        with _vhost(_BASE["url"]) as url:
            yield url + query

    return prepare


def _celery_system(mode: str, notes: str) -> load.System:
    return load.System(
        name=f"celery-{mode}",
        distribution="celery",
        modules=("celery", "kombu"),
        notes=notes,
        prepare=_prepare(),
        worker_argv=lambda url: [
            sys.executable,
            "-m",
            "celery",
            "-A",
            f"bench._load_celery:{mode}",
            "worker",
            "--pool",
            "threads",
            "-c",
            "8",
            "-Q",
            "bench-load",
            "-l",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        enqueue=celery_enqueue(mode),
        env=CELERY_URL_ENV,
    )


SYSTEMS: list[load.System] = [
    load.delayq_system(
        "delayq-rabbitmq",
        _prepare("?queue=bench-load"),
        modules=("pika",),
        notes="quorum levels of 32 ms units, the rest (< 32 ms) waited out by the worker",
    ),
    load.delayq_system(
        "delayq-rabbitmq-nolog",
        _prepare("?queue=bench-load&log=false"),
        modules=("pika",),
        notes="the same without the queue's log (log=false: no start record, nothing by id)",
    ),
    load.delayq_system(
        "delayq-rabbitmq-classic",
        _prepare("?queue=bench-load&queue_type=classic&allow_at_most_once=true"),
        modules=("pika",),
        notes="the same on classic queues (dead-lettering at most once between levels)",
    ),
    _celery_system("native", "quorum queues, native delayed delivery (countdown >= 1 s)"),
    _celery_system("classic", "classic queue, ETA held in worker memory"),
]


def measure_enqueue(n: int) -> dict[str, float]:
    """``DelayQ.schedule`` calls/s from one thread, confirms on (quorum queues); the same
    with ``log=false`` and with ``schedule_many`` batches of 100; and the broker's floor
    for one thread: pika publishing one message to a quorum queue and waiting for its
    confirm, call after call (what a ``schedule`` cannot beat)."""
    rates: dict[str, float] = {}
    with _vhost(_BASE["url"]) as url:
        for query, suffix in (("", ""), ("?log=false", ", log=false")):
            app = DelayQ(url + query, queue="bench-enqueue")
            try:
                for label, delay in (("due in 1 h", 3600.0), ("due now", 0.0)):
                    started = time.perf_counter()
                    for i in range(n):
                        app.schedule("noop", i, delay=delay)
                    rates[label + suffix] = n / (time.perf_counter() - started)
                batches = max(1, n // 100)
                started = time.perf_counter()
                for _ in range(batches):
                    app.schedule_many(
                        [{"name": "noop", "payload": i, "delay": 3600.0} for i in range(100)]
                    )
                rates[f"due in 1 h, schedule_many of 100{suffix}"] = (
                    batches * 100 / (time.perf_counter() - started)
                )
            finally:
                app.close()
        rates["pika floor: one confirmed publish to a quorum queue per call"] = _pika_floor(url, n)
    return rates


def _pika_floor(url: str, n: int) -> float:
    import pika  # noqa: PLC0415 (main() checks that the driver is installed first)

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare("bench-floor", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        body = b'{"payload": 0}'
        started = time.perf_counter()
        for _ in range(n):
            channel.basic_publish(
                "", "bench-floor", body, pika.BasicProperties(delivery_mode=2), mandatory=True
            )
        return n / (time.perf_counter() - started)
    finally:
        connection.close()


def _load_average() -> str:
    with contextlib.suppress(OSError):
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return "?"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rabbitmq")
    parser.add_argument("--url", default=os.environ.get("DELAYQ_AMQP_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rates", default=None, help="jobs/s, comma separated (200,2000)")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--horizon", type=float, default=None, help="jobs due 0..H s ahead")
    parser.add_argument("--only", default=None, help="comma separated system names")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if importlib.util.find_spec("pika") is None:
        print("skipped: pika is not installed (pip install 'delayq[rabbitmq]')")
        return 0
    if shutil.which("rabbitmqctl") is None:
        print("skipped: rabbitmqctl is not on PATH (the benchmark makes its own vhost)")
        return 0
    _BASE["url"] = args.url
    rates = [int(r) for r in (args.rates or ("200" if args.quick else "200,2000")).split(",")]
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    horizon = args.horizon or (3.0 if args.quick else 10.0)
    wanted = set(args.only.split(",")) if args.only else None
    systems = [s for s in SYSTEMS if wanted is None or s.name in wanted]

    print(f"## RabbitMQ (load average at start: {_load_average()})\n")
    for label, value in measure_enqueue(300 if args.quick else 3000).items():
        unit = "jobs/s" if "schedule_many" in label else "calls/s"
        print(f"- one thread, publisher confirms, {label}: {value:,.0f} {unit}")
    with tempfile.TemporaryDirectory(prefix="bench-rabbitmq-") as tmp:
        for rate in rates:
            workload = load.Workload(rate, seconds, horizon, 30.0, max(1, math.ceil(rate / 1000)))
            results = []
            for system in systems:
                label = f"{system.name} {load._version(system.distribution)}"
                missing = system.missing()
                if missing is not None:
                    results.append(load.Result(label, workload, failed=f"skipped: {missing}"))
                    continue
                try:
                    result = load.measure(system, workload, Path(tmp))
                    result.system = label
                except Exception as exc:  # a row that cannot be measured says why
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    result = load.Result(label, workload, failed=f"failed: {first}")
                results.append(result)
            print(
                f"\n### {rate:,} jobs/s offered for {seconds:g} s by {workload.producers} "
                f"producer process(es), each job due 0-{horizon:g} s ahead; 1 worker process "
                f"(load average now: {_load_average()})\n"
            )
            print(load.format_table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
