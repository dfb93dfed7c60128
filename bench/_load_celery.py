"""Celery on RabbitMQ for ``bench.rabbitmq``: the worker apps and the producers' enqueue.

``celery -A bench._load_celery:native worker`` (or ``:classic``) runs one Celery worker on
the broker named by ``BENCH_CELERY_URL``; its task ``bench.noop(index, due)`` appends
``"<index> <start lateness>"`` to ``BENCH_PEER_OUT`` first thing (``bench._peer_common``).

- ``native``: quorum queues, so ``apply_async(countdown=)`` uses kombu's native delayed
  delivery (TTL + dead-letter levels in whole seconds). It refuses a countdown under
  1 s, so :func:`enqueue` moves such a job's due time to 1 s ahead (and measures lateness
  from that).
- ``classic``: a classic queue, where a countdown is an ETA message delivered at once and
  held in the worker's memory until due.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench._peer_common import record

URL_ENV = "BENCH_CELERY_URL"
QUEUE = "bench-load"


def make_app(mode: str, url: str) -> Any:
    """A Celery app on ``url`` with the ``bench.noop`` task, set up for ``mode``."""
    from celery import Celery  # noqa: PLC0415 - only the Celery rows need it

    app = Celery(f"bench_{mode}", broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        task_default_exchange=QUEUE,
        task_default_exchange_type="topic",  # native delayed delivery needs a topic exchange
        task_default_routing_key=QUEUE,
        task_acks_late=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True},
        worker_hijack_root_logger=False,
    )
    if mode == "native":
        app.conf.update(task_default_queue_type="quorum", worker_detect_quorum_queues=True)
    else:
        app.conf.update(task_default_queue_type="classic", worker_prefetch_multiplier=0)
    app.task(name="bench.noop")(record)  # record(index, due)
    return app


def enqueue(mode: str) -> Any:
    """``enqueue(url, jobs)`` for ``bench.load``: one ``apply_async`` per job."""

    def run(url: str, jobs: Any) -> None:
        app = make_app(mode, url)
        task = app.tasks["bench.noop"]
        if mode == "native":
            _declare_delayed_delivery(app)
        try:
            for index, planned in jobs:
                now = time.time()
                # native: a countdown under 1 s raises ValueError there
                due = max(planned, now + 1.0) if mode == "native" else planned
                for attempt in range(150):
                    try:
                        task.apply_async(args=(index, due), countdown=max(0.0, due - now))
                        break
                    except Exception as exc:
                        # The worker declares the delayed-delivery exchanges as it starts:
                        # the probe job may come first.
                        if "NOT_FOUND" not in str(exc) or attempt == 149:
                            raise
                        time.sleep(0.2)
        finally:
            app.close()

    return run


def _declare_delayed_delivery(app: Any) -> None:
    """What the worker declares as it starts (levels, and the queue bound to them), so a
    job published before the worker is up is not dropped at the end of its delay."""
    from kombu.transport.native_delayed_delivery import (  # noqa: PLC0415
        bind_queue_to_native_delayed_delivery_exchange,
        declare_native_delayed_delivery_exchanges_and_queues,
    )

    with app.connection_for_write() as connection:
        declare_native_delayed_delivery_exchanges_and_queues(connection, "quorum")
        queue = app.amqp.queues[QUEUE]
        queue.bind(connection.default_channel).declare()
        bind_queue_to_native_delayed_delivery_exchange(connection, queue)


_url = os.environ.get(URL_ENV)
native: Any = make_app("native", _url) if _url else None
classic: Any = make_app("classic", _url) if _url else None
