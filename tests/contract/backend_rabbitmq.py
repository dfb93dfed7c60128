"""The RabbitMQ store in the contract suite, in real-time mode (it has no ``clock`` feature).

Each test gets its own queue in this test process's virtual host; the store's
declared features decide which tests run (``tests/contract/_realtime.py``
skips the others, naming the missing feature).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from delayq.backends.base import Backend
from delayq.backends.rabbitmq import RabbitMQBackend
from delayq.testing import FakeClock
from tests.contract._realtime import realtime
from tests.contract._registry import BackendFactory
from tests.rabbitmq_support import delete_queues, unique_queue, vhost_url


@contextmanager
def _open(clock: FakeClock, store: str, /, **options: Any) -> Iterator[Backend]:
    queue = unique_queue(store)
    backend = RabbitMQBackend(vhost_url(), queue=queue, clock=clock, **options)
    try:
        yield backend
    finally:
        backend.close()
        delete_queues(queue)


@contextmanager
def _open_live(store: str, /) -> Iterator[Backend]:
    queue = unique_queue(store)
    backend = RabbitMQBackend(vhost_url(), queue=queue)
    try:
        yield backend
    finally:
        backend.close()
        delete_queues(queue)


FACTORY = BackendFactory(
    name="rabbitmq",
    open=realtime(_open),
    open_live=_open_live,
    features=RabbitMQBackend.features,
    marks=(pytest.mark.rabbitmq,),
)
