"""Pub/sub hints: shadow-key expiry events as local wake-ups (the optional
key-expiry trigger), and the ids of results other processes recorded (for
``result()`` waiters).

Only hints (see the package docstring): pub/sub is fire-and-forget and Redis
publishes an expiry event when it actually deletes the key, possibly late; the
due set and the job records stay the source of truth.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["ChannelSubscriber", "expiry_subscriber", "results_subscriber"]


class ChannelSubscriber:
    """A daemon thread that hands each message of one pub/sub channel to ``on_message``.

    ``subscriber()`` opens a pub/sub on a node that may block. Messages missed
    while it reconnects only cost latency: they are hints.
    """

    def __init__(
        self,
        *,
        subscriber: Callable[[], Any],
        channel: str,
        name: str,
        on_message: Callable[[str], None],
    ) -> None:
        self._subscriber = subscriber
        self._on_message = on_message
        self._stop = threading.Event()
        self.channel = channel
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._subscriber()
                with contextlib.closing(pubsub):
                    pubsub.subscribe(self.channel)
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message:
                            self._on_message(str(message.get("data", "")))
            except redis.RedisError:
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def expiry_subscriber(
    *,
    subscriber: Callable[[], Any],
    db: int,
    shadow: str,
    queue: str,
    wake: Callable[[], None],
) -> ChannelSubscriber:
    """Key-expiry events of the queue's shadow keys (prefix ``shadow``) in database
    ``db`` as calls of ``wake``. Only a hint: events may come late or never."""

    def on_expired(key: str) -> None:
        if key.startswith(shadow):
            wake()

    return ChannelSubscriber(
        subscriber=subscriber,
        channel=f"__keyevent@{db}__:expired",
        name=f"delayq-expiry-{queue}",
        on_message=on_expired,
    )


def results_subscriber(
    *,
    subscriber: Callable[[], Any],
    channel: str,
    queue: str,
    on_finished: Callable[[list[str]], None],
) -> ChannelSubscriber:
    """The ids of the jobs other processes finished with a result (``ack_job`` in
    ``_lib.lua`` publishes each on ``channel``) as calls of ``on_finished``."""
    return ChannelSubscriber(
        subscriber=subscriber,
        channel=channel,
        name=f"delayq-results-{queue}",
        on_message=lambda job_id: on_finished([job_id]),
    )
