"""Talking to Redis: URL parsing, the clients, the Lua scripts, driver errors.

Driver errors become delayq errors in ONE place, :func:`mapped_errors`:
connection and timeout errors are :class:`~delayq.errors.BackendUnavailable`,
every other Redis error a :class:`~delayq.errors.BackendError`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from delayq.backends import _urls as urls
from delayq.backends._urls import mask
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError

__all__ = [
    "CALL_TIMEOUT",
    "SCRIPT_NAMES",
    "Connection",
    "mapped_error",
    "open_clients",
    "mapped_errors",
    "mask",
    "split_url",
]

SCRIPT_NAMES = (
    "enqueue",
    "keyed",
    "claim",
    "ack",
    "retry",
    "bury",
    "complete",
    "complete_and_claim",
    "extend",
    "cancel",
    "reschedule",
    "requeue_dead",
    "purge_dead",
    "next_wake",
    "stats",
    "get",
    "put_limit",
    "delete_limit",
)
"""The Lua scripts, one file each (``<name>.lua``), each prefixed with the ``_lib.lua``
(and ``_flow.lua``) helpers it uses."""

SCRIPT_FLAGS = {
    # Calls that add work are refused as a whole when Redis is out of memory
    # (maxmemory reached under noeviction): the caller gets a BackendError and
    # nothing is written, never half a batch.
    "enqueue": "",
    "keyed": "",
    "reschedule": "",
    "requeue_dead": "",
    "put_limit": "",
    # Calls that finish, renew, hand out or free work go on: refusing them would
    # stop the draining that frees memory, let leases lapse (handlers run twice)
    # and strand claimed jobs. Each writes a few bytes per job at most.
    "claim": "allow-oom",
    "ack": "allow-oom",
    "retry": "allow-oom",
    "bury": "allow-oom",
    "complete": "allow-oom",
    "complete_and_claim": "allow-oom",
    "extend": "allow-oom",
    "cancel": "allow-oom",
    "purge_dead": "allow-oom",
    "get": "allow-oom",  # deletes expired finished records it meets
    "delete_limit": "allow-oom",
    # Reads.
    "next_wake": "no-writes",
    "stats": "no-writes",
}
"""What each script does when Redis is out of memory, as its ``#!lua flags=``
line (Redis 7 and later check it before the script runs; older servers get the
scripts without it and refuse the first memory-growing command inside one)."""

CALL_TIMEOUT = 5.0
"""Seconds one Redis call may take (``socket_timeout`` and ``socket_connect_timeout``
unless the URL or the options set them): a hung connection fails the call instead of
stalling a worker's thread past its leases (a third of the 30 s default lease is 10 s).
Blocked waits (BLPOP) keep their own deadlines."""

_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")

# URL query parameters that are delayq options, not redis-py connection options.
_URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "queue": str,
    "prefix": str,
    "result_ttl": float,
    "max_finished": int,
    "max_dead": int,
    "wait_replicas": int,
    "wait_aof": lambda v: v.lower() in ("1", "true", "yes", "on"),
    "wait_timeout": float,
    "expiry_events": lambda v: v.lower() in ("1", "true", "yes", "on"),
}

T = TypeVar("T")


_TOP_LEVEL = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def _split_lib(lib: str) -> tuple[str, list[tuple[str, str]]]:
    """``_lib.lua`` as its prelude (up to ``NOW_MS``) and its later top-level
    definitions, each ``(name, text with the comment above it)``, in order."""
    cut = lib.index("\n", lib.index("local NOW_MS")) + 1
    prelude, rest = lib[:cut], lib[cut:]
    starts = [m.start() for m in _TOP_LEVEL.finditer(rest)]
    blocks: list[tuple[str, str]] = []
    begin = 0
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(rest)
        # The comment lines just above a definition belong to it.
        end = rest.rfind("\n\n", start, end) + 1 or end
        match = _TOP_LEVEL.match(rest, start)
        assert match is not None
        blocks.append((match.group(1), rest[begin:end]))
        begin = end
    return prelude, blocks


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _with_lib(body: str, prelude: str, blocks: list[tuple[str, str]]) -> str:
    """``body`` after the prelude and only the definitions it uses (transitively):
    Redis runs a script's whole text on every call, so an unused helper costs
    time on every call."""
    names = {name for name, _ in blocks}
    uses = {name: set(_WORD.findall(block)) & names for name, block in blocks}
    needed: set[str] = set()
    todo = set(_WORD.findall(body)) & names
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo |= uses[name] - needed
    parts = [block for name, block in blocks if name in needed]
    return prelude + "".join(parts) + "\n" + body


_FLOW_SPLICE = "-- (the flow-control helpers of _flow.lua are spliced in here)\n"


def _lib_text(folder: Any) -> str:
    """``_lib.lua`` with the definitions of ``_flow.lua`` (its text from its first
    ``local``, without its header) at the line that names it: after the helpers
    they use, before those that use them."""
    lib: str = folder.joinpath("_lib.lua").read_text(encoding="utf-8")
    flow: str = folder.joinpath("_flow.lua").read_text(encoding="utf-8")
    first = re.search(r"^local ", flow, re.MULTILINE)
    assert first is not None and _FLOW_SPLICE in lib
    return lib.replace(_FLOW_SPLICE, flow[first.start() :] + "\n", 1)


def _load_scripts() -> dict[str, str]:
    folder = resources.files(__package__).joinpath("lua")
    prelude, blocks = _split_lib(_lib_text(folder))
    return {
        name: _with_lib(folder.joinpath(f"{name}.lua").read_text(encoding="utf-8"), prelude, blocks)
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


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Take delayq's own options (``?queue=...``) out of a Redis URL."""
    return urls.split_url(url, _URL_OPTIONS, store="Redis")


def mapped_error(exc: redis.RedisError, url: str) -> BackendError:
    """The delayq error for a redis-py error (raise it ``from exc``)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return BackendError(
            f"Redis at {url} is out of memory (maxmemory reached) and refused the call; "
            f"nothing was written. Raise maxmemory, purge finished or dead jobs, or "
            f"lower result_ttl: {exc}"
        )
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return BackendUnavailable(f"Redis at {url} is unreachable: {exc}")
    return BackendError(f"Redis at {url} failed: {exc}")


@contextlib.contextmanager
def mapped_errors(url: str) -> Iterator[None]:
    """Turn redis-py errors raised in the block into delayq errors naming ``url``."""
    try:
        yield
    except redis.RedisError as exc:
        raise mapped_error(exc, url) from exc


def _send(conn: Any, *command: Any) -> Any:
    """One command and its reply on a connection of our own."""
    conn.send_packed_command(conn.pack_command(*command), check_health=False)
    return conn.read_response()


_SPARE_MAX = 16  # connections of ended threads kept for new threads


class _Held:
    """A connection of its own for one thread, outside the client's pool.

    Script calls (every state change) go through it: no pool lock, no
    connection hand-over per call. When its thread ends (its ``threading.local``
    is cleared) the connection goes to ``spare`` for the next new thread (a
    thread-per-request server does not reconnect per request), or is closed
    when ``spare`` is full; the store's close closes them all. It is never used
    in a forked child (the child opens its own). Nothing here takes a lock
    (``deque`` appends are atomic), so running from a finalizer is safe.
    """

    __slots__ = ("__weakref__", "conn", "pid", "spare")
    conn: Any  # a redis-py Connection (its typed interface lacks what is used here)
    pid: int
    spare: collections.deque[Any]

    def __init__(self, conn: Any, spare: collections.deque[Any]) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.spare = spare

    def drop(self) -> None:
        """Close the socket (its state is unknown); the next call reconnects."""
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self.conn.disconnect()

    def __del__(self) -> None:
        if self.pid != os.getpid():
            return
        if len(self.spare) < _SPARE_MAX:
            self.spare.append(self.conn)
        else:
            self.drop()


def _hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    """``host1:port1,host2:port2`` (after any ``user:password@``) as pairs."""
    pairs: list[tuple[str, int]] = []
    for item in netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, ""
        try:
            pairs.append((host or "127.0.0.1", int(port) if port else default_port))
        except ValueError as exc:
            raise ConfigurationError(f"bad host:port {item!r} in a Redis URL") from exc
    return pairs


def open_clients(url: str, options: dict[str, Any]) -> tuple[Any, Any, bool]:
    """The ``(client, blocking client, is_cluster)`` of a Redis URL.

    ``redis://`` / ``rediss://`` / ``unix://``: one server. ``redis+cluster://h:p[,h:p]``
    (or ``rediss+cluster://``): a Redis Cluster, found from those start-up nodes.
    ``redis+sentinel://[:password@]h:p[,h:p]/service[/db]`` (or ``rediss+sentinel://``):
    the master of ``service`` as the sentinels at those addresses name it, followed
    across failovers (``?sentinel_password=`` for the sentinels themselves).
    """
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme.endswith("+cluster"):
        from redis.cluster import ClusterNode, RedisCluster  # noqa: PLC0415

        base = scheme.removesuffix("+cluster")
        nodes = [
            ClusterNode(h, p)  # type: ignore[no-untyped-call]
            for h, p in _hosts(parts.netloc, 6379)
        ]
        kwargs: dict[str, Any] = {**dict(parse_qsl(parts.query)), **options}
        if parts.username:
            kwargs["username"] = parts.username
        if parts.password:
            kwargs["password"] = parts.password
        if base == "rediss":
            kwargs["ssl"] = True

        def cluster() -> Any:
            return RedisCluster(startup_nodes=nodes, **kwargs)

        return cluster(), cluster(), True
    if scheme.endswith("+sentinel"):
        from redis.sentinel import Sentinel  # noqa: PLC0415

        query = dict(parse_qsl(parts.query))
        sentinel_kwargs: dict[str, Any] = {
            k: options[k] for k in ("socket_timeout", "socket_connect_timeout") if k in options
        }
        if "sentinel_password" in query:
            sentinel_kwargs["password"] = query.pop("sentinel_password")
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ConfigurationError(
                "a redis+sentinel:// URL names its service: .../<service>[/db]"
            )
        master: dict[str, Any] = {"db": int(path[1]) if len(path) > 1 else 0, **query}
        if parts.username:
            master["username"] = parts.username
        if parts.password:
            master["password"] = parts.password
        if scheme.startswith("rediss"):
            master["ssl"] = True
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            _hosts(parts.netloc, 26379), sentinel_kwargs=sentinel_kwargs, **options, **master
        )
        service = path[0]
        return (
            sentinel.master_for(service),  # type: ignore[no-untyped-call]
            sentinel.master_for(service),  # type: ignore[no-untyped-call]
            False,
        )
    return redis.Redis.from_url(url, **options), redis.Redis.from_url(url, **options), False


class Connection:
    """The two clients of one store and its registered scripts.

    ``client`` serves every ordinary call; ``blocking`` only blocked waits
    (BLPOP) and the expiry subscriber, so a waiting worker never starves normal
    calls of connections. Both are thread-safe redis-py clients (``RedisCluster``
    on a cluster); nothing here is reassigned after ``__init__`` but the
    script table (at start-up). ``anchor`` is a key of the queue: on a cluster,
    :meth:`node` and :meth:`blocking_node` are the clients of the node serving
    its slot (for BLPOP, CLIENT UNBLOCK, INFO and CONFIG); otherwise the clients
    themselves. ``client=`` is a user's own ``redis.Redis`` / ``RedisCluster``
    (used for both roles).
    """

    def __init__(
        self,
        redis_url: str,
        masked_url: str,
        options: dict[str, Any],
        *,
        anchor: str,
        client: Any = None,
    ) -> None:
        self.url = masked_url
        self.anchor = anchor
        query = dict(parse_qsl(urlsplit(redis_url).query))
        bounded = {k: CALL_TIMEOUT for k in _TIMEOUTS if k not in query}
        options = {"retry": Retry(NoBackoff(), 0), **bounded, **options, "decode_responses": True}
        try:
            if client is not None:
                self.client = self.blocking = client
                self.cluster = hasattr(client, "get_node_from_key")
            else:
                self.client, self.blocking, self.cluster = open_clients(redis_url, options)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad Redis URL or option for {masked_url!r}: {exc}") from exc
        if self.cluster:
            self.db = 0
            self.address = f"cluster:{masked_url}"
        else:
            kwargs = self.client.connection_pool.connection_kwargs
            self.db = int(kwargs.get("db", 0) or 0)
            self.address = f"{kwargs.get('host')}:{kwargs.get('port')}/{self.db}"
        self._texts = FLAGGED_SCRIPTS
        self._scripts: dict[str, Script] = {
            name: self.client.register_script(text) for name, text in self._texts.items()
        }
        self._shas = {name: str(script.sha) for name, script in self._scripts.items()}
        self._local = threading.local()  # .held: this thread's _Held
        self._all_held: weakref.WeakSet[_Held] = weakref.WeakSet()  # closed by close()
        self._spare: collections.deque[Any] = collections.deque()  # see _Held

    def node(self) -> Any:
        """The client for commands about the queue's server (its cluster node)."""
        if self.cluster:
            return self.client.get_redis_connection(self.client.get_node_from_key(self.anchor))
        return self.client

    def blocking_node(self) -> Any:
        """The blocking-wait client of the queue's server (its cluster node)."""
        if self.cluster:
            node = self.blocking.get_node_from_key(self.anchor)
            return self.blocking.get_redis_connection(node)
        return self.blocking

    def use_unflagged_scripts(self) -> None:
        """Load the scripts without their flags line (a server before Redis 7).

        Called once at start-up, before the store is shared between threads.
        """
        self._texts = SCRIPTS
        self._scripts = {name: self.client.register_script(t) for name, t in SCRIPTS.items()}
        self._shas = {name: str(script.sha) for name, script in self._scripts.items()}

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
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        retry: bool = False,
        then: Sequence[Any] = (),
    ) -> Any:
        """Run script ``name`` with EVALSHA on this thread's own connection.

        A server that lost the script (``NOSCRIPT`` after ``SCRIPT FLUSH`` or a
        restart) gets its text with EVAL, which also caches it again. A
        connection error is retried once on a new connection when ``retry``
        (the call is safe to repeat), else raised as BackendUnavailable.
        ``then``: a command sent next on the same connection (``WAIT``, which
        counts this connection's writes); the reply is then ``(script's, its)``.
        """
        if self.cluster:  # redis-py routes by slot and follows MOVED / ASK
            return self._script_via_client(name, keys, args, retry=retry)
        for attempt in (0, 1):
            held = self._held()
            conn = held.conn
            try:
                try:
                    reply = _send(conn, "EVALSHA", self._shas[name], len(keys), *keys, *args)
                except redis.exceptions.NoScriptError:
                    reply = _send(conn, "EVAL", self._texts[name], len(keys), *keys, *args)
                return (reply, _send(conn, *then)) if then else reply
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                held.drop()
                if retry and attempt == 0:
                    continue
                raise mapped_error(exc, self.url) from exc
            except redis.RedisError as exc:  # an error reply: the connection is fine
                raise mapped_error(exc, self.url) from exc
            except BaseException:
                held.drop()  # interrupted mid-call: a reply may still be on its way
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _script_via_client(
        self, name: str, keys: Sequence[str], args: Sequence[Any], *, retry: bool
    ) -> Any:
        script = self._scripts[name]

        def run() -> Any:
            try:
                return script(keys=keys, args=args)  # EVALSHA, reloaded on NOSCRIPT
            except redis.exceptions.NoScriptError:
                # Flushed again between the reload and the retry: send the body.
                return self.client.eval(self._texts[name], len(keys), *keys, *args)

        return self.call(run, retry=retry)

    def _held(self) -> _Held:
        """This thread's connection, checked for a server that closed it meanwhile."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.pid != os.getpid():
            try:
                conn = self._spare.pop()
            except IndexError:
                pool = self.client.connection_pool
                conn = pool.connection_class(**pool.connection_kwargs)
            held = self._local.held = _Held(conn, self._spare)
            self._all_held.add(held)
        conn = held.conn
        if conn._sock is not None:
            try:
                stale = conn.can_read(timeout=0)
            except (redis.ConnectionError, OSError):
                stale = True
            if stale:  # closed by the server (idle timeout, restart): reconnect below
                conn.disconnect()
        if conn._sock is None:
            # Connect here, as the pool does, through ``connect()``: a Sentinel
            # connection asks the sentinels for the master there (sending on an
            # unconnected socket would go to the default host instead).
            with mapped_errors(self.url):
                conn.connect()
        return held

    def sha(self, name: str) -> str:
        """The SHA1 of script ``name`` (what EVALSHA sends)."""
        return self._shas[name]

    def close(self) -> None:
        for held in list(self._all_held):
            held.drop()
        while self._spare:
            with contextlib.suppress(Exception):
                self._spare.pop().disconnect()
        self.client.close()
        if self.blocking is not self.client:
            self.blocking.close()
