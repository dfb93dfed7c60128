"""The optional key-expiry trigger: shadow-key expiry events as local wake-ups.

Only a hint (see the package docstring): Redis publishes an expiry event when it
actually deletes the key, possibly late, over fire-and-forget pub/sub; the due
set stays the source of truth.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["ExpirySubscriber"]


class ExpirySubscriber:
    """A daemon thread that turns key-expiry events of shadow keys into local wake-ups.

    Only a hint (see the package docstring): events may come late or never.
    ``subscriber()`` opens a pub/sub on a node that may block, ``db`` is the
    database whose events count, ``shadow`` the prefix of the queue's shadow
    keys and ``wake`` is called for each of their expiries.
    """

    def __init__(
        self,
        *,
        subscriber: Callable[[], Any],
        db: int,
        shadow: str,
        queue: str,
        wake: Callable[[], None],
    ) -> None:
        self._subscriber = subscriber
        self._wake = wake
        self._stop = threading.Event()
        self._channel = f"__keyevent@{db}__:expired"
        self._shadow = shadow
        self._thread = threading.Thread(
            target=self._run, name=f"delayq-expiry-{queue}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._subscriber()
                with contextlib.closing(pubsub):
                    pubsub.subscribe(self._channel)
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message and str(message.get("data", "")).startswith(self._shadow):
                            self._wake()
            except redis.RedisError:
                # Missed events only cost latency: the ZSET decides.
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
