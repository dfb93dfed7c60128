"""The optional key-expiry trigger: shadow-key expiry events as local wake-ups.

Only a hint (see the package docstring): Redis publishes an expiry event when it
actually deletes the key, possibly late, over fire-and-forget pub/sub; the due
set stays the source of truth.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from delayq.backends.redis._waiting import Waiting

__all__ = ["ExpirySubscriber"]


class ExpirySubscriber:
    """A daemon thread that turns key-expiry events of shadow keys into local wake-ups.

    Only a hint (see the package docstring): events may come late or never.
    """

    def __init__(self, waiting: Waiting) -> None:
        self._waiting = waiting
        self._stop = threading.Event()
        self._channel = f"__keyevent@{waiting._conn.db}__:expired"
        self._shadow = waiting._keys["shadow:"]
        self._thread = threading.Thread(
            target=self._run, name=f"delayq-expiry-{waiting.queue}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._waiting._conn.blocking_node().pubsub(ignore_subscribe_messages=True)
                with contextlib.closing(pubsub):
                    pubsub.subscribe(self._channel)
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message and str(message.get("data", "")).startswith(self._shadow):
                            self._waiting.wake_local()
            except redis.RedisError:
                # Missed events only cost latency: the ZSET decides.
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
