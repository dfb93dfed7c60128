"""Worker and producer side of ``bench.rabbitmq`` for delayq and Celery (run as a process).

The worker is configured from the environment so Celery's own command line can
load it (``celery -A bench._peer_rabbitmq worker``)::

    BENCH_MODE    delayq | celery-native | celery-classic
    BENCH_URL     the AMQP URL (its vhost is the benchmark's own)
    BENCH_QUEUE   the queue name
    BENCH_RECORD  a file: "READY" once the worker consumes, then "<i> <time.time()>"
                  for each job whose handler starts

``python -m bench._peer_rabbitmq`` runs the delayq worker. ``producer(mode)``
returns ``schedule(i, delay, due)`` for the benchmark's producer thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from delayq import DelayQ, Worker

MODE = os.environ.get("BENCH_MODE", "delayq")
URL = os.environ.get("BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/")
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
RECORD = os.environ.get("BENCH_RECORD", os.devnull)

_lock = threading.Lock()
_out = open(RECORD, "a", buffering=1)  # noqa: SIM115 - open for the process's life


def record(i: int) -> None:
    line = f"{i} {time.time()!r}\n"
    with _lock:
        _out.write(line)


def ready() -> None:
    with _lock:
        _out.write("READY\n")


# -- Celery ---------------------------------------------------------------------

celery_app: Any = None
if MODE.startswith("celery"):
    from celery import Celery
    from celery.signals import worker_ready

    celery_app = Celery("bench_rabbitmq", broker=URL)
    celery_app.conf.update(
        task_default_queue=QUEUE,
        task_default_exchange=QUEUE,
        task_default_exchange_type="topic",  # native delayed delivery needs a topic exchange
        task_default_routing_key=QUEUE,
        task_acks_late=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True},
        worker_hijack_root_logger=False,
    )
    if MODE == "celery-native":
        # Quorum queues: Celery (kombu) delays countdowns with its native delayed
        # delivery (TTL + dead-letter levels, whole seconds).
        celery_app.conf.update(task_default_queue_type="quorum", worker_detect_quorum_queues=True)
    else:
        # Classic queue: an ETA message delivered at once and held in worker memory.
        celery_app.conf.update(task_default_queue_type="classic", worker_prefetch_multiplier=0)

    @celery_app.task(name="bench.noop")
    def noop(i: int) -> None:
        record(i)

    @worker_ready.connect
    def _ready(**_: Any) -> None:
        ready()


def producer(mode: str) -> tuple[Callable[[int, float], None], Callable[[], None]]:
    """``(schedule(i, delay), close)`` for ``mode``, in the calling process."""
    if mode == "delayq":
        app = DelayQ(URL, queue=QUEUE)

        def schedule(i: int, delay: float) -> None:
            app.schedule("noop", i, delay=delay)

        return schedule, app.close
    task = celery_app.tasks["bench.noop"]

    def schedule_celery(i: int, delay: float) -> None:
        task.apply_async(args=(i,), countdown=delay)

    return schedule_celery, celery_app.close


def main() -> None:
    """The delayq worker: a default ``Worker`` with a no-op handler that records its start."""
    app = DelayQ(URL, queue=QUEUE)
    app.register("noop", record)
    backend: Any = app._backend

    def announce() -> None:
        if backend._consumer.connected.wait(60):  # the worker's first claim starts it
            ready()

    threading.Thread(target=announce, daemon=True).start()
    try:
        Worker(app, concurrency=8).run()  # until SIGTERM
    finally:
        app.close()


if __name__ == "__main__":
    main()
