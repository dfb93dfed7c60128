"""What the store checks about its Redis server: eviction, persistence, expiry events.

At start-up a server whose ``maxmemory-policy`` may evict keys that are not
volatile (``allkeys-*``) is refused: an evicted job hash or due set is a lost
job. The policy can change while workers run (``CONFIG SET``, a failover to a
differently configured replica), so claims re-check it every
``RECHECK_INTERVAL`` seconds and log an error each time it is wrong. A server
without an append-only file (``appendonly no``) gets a warning: a crash then
loses every write since the last snapshot (see the README for what each
persistence setting guarantees).
"""

from __future__ import annotations

import functools
import logging
import threading

from delayq.backends.redis._connection import Connection
from delayq.clock import SYSTEM_CLOCK
from delayq.errors import BackendError, ConfigurationError

__all__ = ["RECHECK_INTERVAL", "ServerChecks"]

RECHECK_INTERVAL = 60.0
"""Seconds between two checks of the eviction policy while the store is used."""

log = logging.getLogger("delayq.redis")


def _policy_problem(policy: str, url: str) -> str | None:
    if not policy.startswith("allkeys-"):
        return None
    return (
        f"Redis at {url} has maxmemory-policy {policy}: it may evict pending "
        f"jobs when memory runs out. Set maxmemory-policy noeviction (or a volatile-* "
        f"policy) on that server, or give delayq its own Redis."
    )


class ServerChecks:
    """The start-up checks and the periodic eviction-policy check of one store.

    Lock rule: ``_lock`` guards ``_next_check`` (claims of many threads share it).
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._next_check = SYSTEM_CLOCK.monotonic() + RECHECK_INTERVAL

    def at_start(self, *, expiry_events: bool, configure: bool, waitaof: bool = False) -> None:
        """Refuse an evicting server, warn without an AOF, set up expiry events if asked."""
        info = self._conn.call(self._conn.node().info, retry=True)
        version = tuple(int(x) for x in str(info.get("redis_version", "7.0")).split(".")[:2])
        if version < (7, 0):
            self._conn.use_unflagged_scripts()
        if waitaof and version < (7, 2):
            raise ConfigurationError(
                f"wait_aof=True needs WAITAOF (Redis 7.2 or later); {self._conn.url} runs "
                f"Redis {info.get('redis_version')}"
            )
        problem = _policy_problem(str(info.get("maxmemory_policy", "noeviction")), self._conn.url)
        if problem is not None:
            raise ConfigurationError(problem)
        if str(info.get("aof_enabled", "1")) == "0":
            log.warning(
                "delayq: Redis at %s runs without an append-only file (appendonly no): "
                "a crash or restart loses every job scheduled since the last snapshot. "
                "Use appendonly yes (appendfsync always to lose nothing)",
                self._conn.url,
            )
        if expiry_events:
            self._expiry_events(configure)

    def maybe_recheck(self) -> None:
        """Every RECHECK_INTERVAL seconds, check the eviction policy again (one INFO);
        log an error when it may evict pending jobs. Never raises."""
        now = SYSTEM_CLOCK.monotonic()
        with self._lock:
            if now < self._next_check:
                return
            self._next_check = now + RECHECK_INTERVAL
        try:
            info = self._conn.call(functools.partial(self._conn.node().info, "memory"))
        except BackendError:
            return  # the caller's own calls report an outage
        problem = _policy_problem(str(info.get("maxmemory_policy", "noeviction")), self._conn.url)
        if problem is not None:
            log.error("delayq: %s", problem)

    def _expiry_events(self, configure: bool) -> None:
        flags = self._config_flags()
        if flags is not None and "E" in flags and ("x" in flags or "A" in flags):
            return
        if not configure:
            raise ConfigurationError(
                f"expiry_events=True needs notify-keyspace-events to include 'Ex' on "
                f"{self._conn.url} (now {flags!r}); run CONFIG SET notify-keyspace-events Ex, "
                f"or pass configure_server=True to let delayq set it"
            )
        new = "".join(sorted(set((flags or "") + "Ex")))
        self._conn.call(
            functools.partial(self._conn.node().config_set, "notify-keyspace-events", new),
            retry=True,
        )

    def _config_flags(self) -> str | None:
        try:
            reply = self._conn.call(
                functools.partial(self._conn.node().config_get, "notify-keyspace-events"),
                retry=True,
            )
        except BackendError:
            return None  # CONFIG is disabled on some managed services
        return str(reply.get("notify-keyspace-events", ""))
