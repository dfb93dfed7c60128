"""Connection blips under load on the RabbitMQ store: nothing lost, nothing buried unrun.

::

    python -m bench.rabbitmq_chaos                 # 200 jobs/s for 60 s, a blip every 2 s
    python -m bench.rabbitmq_chaos --seconds 20 --rate 100

A producer thread schedules ``--rate`` jobs/s (due 0-2 s ahead, ``max_attempts=1``)
while a :class:`~delayq.worker.Worker` (8 handler threads) runs them, and every
``--every`` seconds ``rabbitmqctl close_all_connections`` closes every connection
of the run's own virtual host (producer, worker consumer and publisher). Then it
waits until every scheduled job ran or is a dead letter, and prints: jobs
scheduled (a ``schedule`` refused during a blip is counted apart: the caller was
told), run, run twice, dead letters whose handler never started, and lost.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from delayq import DelayQ, Worker
from delayq.errors import DelayqError
from delayq.job import JobContext


def _ctl(*args: str) -> None:
    # -t: the broker's own bound; timeout: the CLI's (a hung CLI holds a distribution port)
    subprocess.run(
        ["rabbitmqctl", "-q", "-t", "30", *args], check=False, capture_output=True, timeout=35
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rabbitmq_chaos")
    parser.add_argument(
        "--url", default=os.environ.get("DELAYQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=2.0)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if shutil.which("rabbitmqctl") is None:
        print("skipped: rabbitmqctl is not on PATH")
        return 0
    vhost = f"delayq-chaos-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", vhost)
    _ctl("set_permissions", "-p", vhost, urlsplit(args.url).username or "guest", ".*", ".*", ".*")
    parts = urlsplit(args.url)
    url = f"{parts.scheme}://{parts.netloc}/{quote(vhost, safe='')}?queue=chaos"
    try:
        return _run(url, vhost, args)
    finally:
        _ctl("delete_vhost", vhost)


def _run(url: str, vhost: str, args: argparse.Namespace) -> int:
    load = os.getloadavg()
    app = DelayQ(url)
    started: Counter[str] = Counter()
    lock = threading.Lock()

    @app.handler("chaos")
    def chaos(payload: Any, ctx: JobContext) -> None:
        with lock:
            started[ctx.id] += 1

    scheduled: list[str] = []
    refused = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal refused
        rng = random.Random(7)
        begin = time.monotonic()
        n = 0
        while time.monotonic() - begin < args.seconds:
            job_id = f"c{n:06}"
            try:
                app.schedule("chaos", None, delay=rng.uniform(0, 2), job_id=job_id, max_attempts=1)
                scheduled.append(job_id)
            except DelayqError:
                refused += 1
            n += 1
            pause = begin + n / args.rate - time.monotonic()
            if pause > 0:
                stop.wait(pause)

    def blips() -> None:
        while not stop.wait(args.every):
            _ctl("close_all_connections", "-p", vhost, "delayq chaos bench")

    worker = Worker(app, concurrency=8).start()
    producer = threading.Thread(target=produce)
    blipper = threading.Thread(target=blips, daemon=True)
    producer.start()
    blipper.start()
    producer.join()
    stop.set()
    deadline = time.monotonic() + 120
    dead: list[Any] = []
    while time.monotonic() < deadline:
        with lock:
            ran = set(started)
        try:
            dead = app.dead_letters(limit=100_000)
        except DelayqError:
            continue
        if set(scheduled) <= ran | {d.id for d in dead}:
            break
        time.sleep(1)
    worker.stop()
    with lock:
        ran = set(started)
        twice = sum(1 for count in started.values() if count > 1)
    dead_ids = {d.id for d in dead}
    unrun = len(dead_ids - ran)
    lost = len(set(scheduled) - ran - dead_ids)
    app.close()
    print(
        f"RabbitMQ chaos: {args.rate:g} jobs/s for {args.seconds:g} s, max_attempts=1, "
        f"close_all_connections every {args.every:g} s (load average at start "
        f"{load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f})"
    )
    print(
        f"scheduled {len(scheduled)} (refused during a blip: {refused}); ran {len(ran)}; "
        f"ran twice {twice}; dead letters {len(dead_ids)}, of which never started {unrun}; "
        f"lost {lost}"
    )
    return 0 if unrun == 0 and lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
