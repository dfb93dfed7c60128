"""A micro-cache of the dashboard's GET answers, so polling never adds up.

Eight browsers refreshing every few seconds, or scripts polling ``/api`` every
100 ms, ask the same few questions; each answer costs store reads plus
rendering, and in a worker's process (``--web-port``) that work competes with
the worker's own threads for the interpreter. :class:`MicroCache` answers a
repeated GET (same path, query, Host and credentials) from the last answer for
``seconds`` (about a second: live enough for a page refreshing every 5 s),
and forgets everything on any other method, so an action's redirect shows its
outcome at once. Off (0 seconds) unless asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["MicroCache"]

_MAX_ENTRIES = 256
_MAX_BODY = 1 << 20  # an answer larger than this is not kept


class MicroCache:
    """ASGI middleware: GET answers with status 200 kept ``seconds``.

    ``_lock`` guards ``_entries`` (the event loop and a test's threads may both
    call in; holding it never awaits).
    """

    def __init__(self, app: Callable[..., Awaitable[None]], seconds: float) -> None:
        self.app = app
        self.seconds = seconds
        self._entries: dict[tuple[Any, ...], tuple[float, list[Any]]] = {}
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            with self._lock:
                self._entries.clear()
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        key = (
            scope["method"],
            scope.get("root_path", ""),
            scope["path"],
            scope.get("query_string", b""),
            headers.get(b"host"),
            headers.get(b"authorization"),
            headers.get(b"cookie"),
        )
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and now - hit[0] < self.seconds:
            for message in hit[1]:
                await send(message)
            return
        messages: list[Any] = []
        size = 0
        keep = True

        async def recording_send(message: Any) -> None:
            nonlocal size, keep
            if message["type"] == "http.response.start" and message.get("status") != 200:
                keep = False
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
                keep = keep and size <= _MAX_BODY
            if keep:
                messages.append(message)
            await send(message)

        await self.app(scope, receive, recording_send)
        if keep and messages:
            with self._lock:
                if len(self._entries) >= _MAX_ENTRIES:
                    self._entries.clear()
                self._entries[key] = (now, messages)
