"""Talking to Redis: URL parsing, the clients, the Lua scripts, driver errors.

Driver errors become delayq errors in ONE place, :func:`mapped_errors`:
connection and timeout errors are :class:`~delayq.errors.BackendUnavailable`,
every other Redis error a :class:`~delayq.errors.BackendError`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from delayq.errors import BackendError, BackendUnavailable, ConfigurationError, MissingDependency

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.commands.core import Script
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency(
        "the redis:// backend needs the 'redis' package: pip install 'delayq[redis]'"
    ) from exc

__all__ = [
    "SCRIPT_NAMES",
    "Connection",
    "mapped_errors",
    "mask",
    "split_url",
]

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "ack",
    "retry",
    "bury",
    "complete",
    "extend",
    "cancel",
    "reschedule",
    "requeue_dead",
    "purge_dead",
    "next_wake",
    "stats",
    "get",
)
"""The Lua scripts, one file each (``<name>.lua``), each prefixed with ``_lib.lua``."""

SCRIPT_FLAGS = {
    # Calls that add work are refused as a whole when Redis is out of memory
    # (maxmemory reached under noeviction): the caller gets a BackendError and
    # nothing is written, never half a batch.
    "enqueue": "",
    "reschedule": "",
    "requeue_dead": "",
    # Calls that finish, renew, hand out or free work go on: refusing them would
    # stop the draining that frees memory, let leases lapse (handlers run twice)
    # and strand claimed jobs. Each writes a few bytes per job at most.
    "claim": "allow-oom",
    "ack": "allow-oom",
    "retry": "allow-oom",
    "bury": "allow-oom",
    "complete": "allow-oom",
    "extend": "allow-oom",
    "cancel": "allow-oom",
    "purge_dead": "allow-oom",
    "get": "allow-oom",  # deletes expired finished records it meets
    # Reads.
    "next_wake": "no-writes",
    "stats": "no-writes",
}
"""What each script does when Redis is out of memory, as its ``#!lua flags=``
line (Redis 7 and later check it before the script runs; older servers get the
scripts without it and refuse the first memory-growing command inside one)."""

# URL query parameters that are delayq options, not redis-py connection options.
_URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "queue": str,
    "prefix": str,
    "result_ttl": float,
    "expiry_events": lambda v: v.lower() in ("1", "true", "yes", "on"),
}

T = TypeVar("T")


def _load_scripts() -> dict[str, str]:
    folder = resources.files(__package__)
    lib = folder.joinpath("_lib.lua").read_text(encoding="utf-8")
    return {
        name: lib + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        for name in SCRIPT_NAMES
    }


SCRIPTS = _load_scripts()
"""Each script's text without its flags line (for servers before Redis 7)."""


def _flagged(name: str) -> str:
    flags = SCRIPT_FLAGS[name]
    shebang = f"#!lua flags={flags}" if flags else "#!lua"
    return f"{shebang}\n{SCRIPTS[name]}"


FLAGGED_SCRIPTS = {name: _flagged(name) for name in SCRIPT_NAMES}
"""Each script's text as loaded on Redis 7 and later: its flags line first."""


def mask(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Take delayq's own options (``?queue=...``) out of a Redis URL."""
    parts = urlsplit(url)
    ours: dict[str, Any] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _URL_OPTIONS:
            try:
                ours[name] = _URL_OPTIONS[name](value)
            except ValueError as exc:
                raise ConfigurationError(f"bad {name}={value!r} in Redis URL: {exc}") from exc
        else:
            theirs.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(theirs))), ours


@contextlib.contextmanager
def mapped_errors(url: str) -> Iterator[None]:
    """Turn redis-py errors raised in the block into delayq errors naming ``url``."""
    try:
        yield
    except redis.exceptions.OutOfMemoryError as exc:
        raise BackendError(
            f"Redis at {url} is out of memory (maxmemory reached) and refused the call; "
            f"nothing was written. Raise maxmemory, purge finished or dead jobs, or "
            f"lower result_ttl: {exc}"
        ) from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BackendUnavailable(f"Redis at {url} is unreachable: {exc}") from exc
    except redis.RedisError as exc:
        raise BackendError(f"Redis at {url} failed: {exc}") from exc


class Connection:
    """The two clients of one store and its registered scripts.

    ``client`` serves every ordinary call; ``blocking`` only blocked waits
    (BLPOP) and the expiry subscriber, so a waiting worker never starves normal
    calls of connections. Both are thread-safe redis-py clients; nothing here
    is reassigned after ``__init__``.
    """

    def __init__(self, redis_url: str, masked_url: str, options: dict[str, Any]) -> None:
        self.url = masked_url
        options = {"retry": Retry(NoBackoff(), 0), **options, "decode_responses": True}
        try:
            self.client = redis.Redis.from_url(redis_url, **options)
            self.blocking = redis.Redis.from_url(redis_url, **options)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad Redis URL or option for {masked_url!r}: {exc}") from exc
        kwargs = self.client.connection_pool.connection_kwargs
        self.db = int(kwargs.get("db", 0) or 0)
        self.address = f"{kwargs.get('host')}:{kwargs.get('port')}/{self.db}"
        self._texts = FLAGGED_SCRIPTS
        self._scripts: dict[str, Script] = {
            name: self.client.register_script(text) for name, text in self._texts.items()
        }

    def use_unflagged_scripts(self) -> None:
        """Load the scripts without their flags line (a server before Redis 7).

        Called once at start-up, before the store is shared between threads.
        """
        self._texts = SCRIPTS
        self._scripts = {name: self.client.register_script(t) for name, t in SCRIPTS.items()}

    def call(self, fn: Callable[[], T], *, retry: bool = False) -> T:
        """Run a Redis call, mapping driver errors; ``retry`` once if it is safe."""
        for attempt in itertools.count():
            try:
                with mapped_errors(self.url):
                    return fn()
            except BackendUnavailable:
                if retry and attempt == 0:
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def script(
        self, name: str, keys: Sequence[str], args: Sequence[Any], *, retry: bool = False
    ) -> Any:
        """Run script ``name`` with EVALSHA (reloaded by redis-py on NOSCRIPT)."""
        script = self._scripts[name]

        def run() -> Any:
            try:
                return script(keys=keys, args=args)
            except redis.exceptions.NoScriptError:
                # Flushed again between the reload and the retry: send the body.
                return self.client.eval(self._texts[name], len(keys), *keys, *args)

        return self.call(run, retry=retry)

    def sha(self, name: str) -> str:
        """The SHA1 of script ``name`` (what EVALSHA sends)."""
        return str(self._scripts[name].sha)

    def close(self) -> None:
        self.client.close()
        self.blocking.close()
