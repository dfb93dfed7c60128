"""The Redis backend: delayed jobs on a ZSET, every state change one Lua script.

Many worker processes on many hosts share one Redis. ``redis://host:port/db``
(or ``rediss://``) selects it; it needs ``pip install 'delayq[redis]'``.

Key layout (``P`` = ``prefix``, ``Q`` = ``queue``; the hash tag ``{Q}`` puts
every key of a queue in one Redis Cluster slot, so multi-key scripts work
there)::

    P:{Q}:due          ZSET  member "<16-digit seq><job id>", score run_at in ms
    P:{Q}:running      ZSET  member job id, score lease deadline in ms
    P:{Q}:dead         ZSET  member job id, score buried time in ms
    P:{Q}:succeeded    ZSET  member job id, score record expiry in ms (also
    P:{Q}:cancelled          :cancelled and :skipped); the job hash itself has
    P:{Q}:skipped            a PEXPIRE of result_ttl
    P:{Q}:seq          STRING counter: FIFO order of jobs due at the same time
    P:{Q}:token        STRING counter: fencing tokens
    P:{Q}:wake         LIST  wake-up token for blocked workers (at most one)
    P:{Q}:job:<id>     HASH  the job (name, payload, run_at, state, attempts ...)
    P:{Q}:wake:<uuid>  LIST  a private wake-up list of one waiting thread
    P:{Q}:shadow:<id>  STRING expiring shadow key (only with ``expiry_events``)
    P:{Q}:claim:<uuid> LIST  what one claim call took (its time, lease end, ids and
                             tokens), kept 60 s so a retried call whose first reply
                             was lost returns the same claims instead of new ones

Every state change (enqueue, claim, ack, retry, bury, complete (a batch of
those three), extend, cancel, reschedule, requeue_dead, purge_dead) is one Lua
script in this folder, run with EVALSHA; redis-py's ``Script`` reloads a
script the server no longer knows (``NOSCRIPT`` after ``SCRIPT FLUSH`` or a
restart) by itself.

One clock decides "due": the scripts read Redis ``TIME``, so a worker whose
host clock is skewed never runs a job early. ``claim(now=...)`` and the
``clock=`` option inject a time for tests only.

Waiting without polling: :meth:`RedisBackend.wait_for_due` asks a script how
long until the head of the due set (or the earliest lease expiry) on the
server's clock, then blocks in ``BLPOP`` on the queue's wake list. The enqueue,
retry, reschedule and requeue scripts push a token there only when the head of
the due set changed; a claim that leaves due jobs behind passes one on to the
next worker; a claim whose lease ends before both the head of the due set and
every other lease pushes one too (so a worker asleep toward a far-off job
recovers that lease on time if the claimer dies). Redis fires ``BLPOP``
timeouts on its ~100 ms cron tick, so the precise deadline is kept by the
client: it waits on the socket itself and, when its deadline passes first,
ends the ``BLPOP`` with ``CLIENT UNBLOCK``. A long wait toward a due time
returns 50 ms early, so the slow first round trips after a quiet spell (a
halted idle CPU, cold caches) are over before the job is due.
An idle worker with nothing due for an hour sends a handful of commands an hour.

``expiry_events=True`` adds the classic key-expiry trigger: each scheduled job
gets a shadow key that expires at its due time, and a subscriber thread wakes
local waiters on ``__keyevent@<db>__:expired``. It is only a hint: Redis
publishes expiry events when it actually deletes the key (lazily, on access,
or by its sampling sweep, so possibly late) over fire-and-forget pub/sub (lost
while the subscriber is disconnected), so the due ZSET stays the source of
truth and a lost event costs latency, never a job.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from delayq._validate import check_seconds
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    PURGE_BATCH,
    RELEASED_NOTE,
    check_ack_state,
    check_lease,
    check_limit,
    check_max_wait,
    check_result_ttl,
    check_run_at,
    check_spec,
    check_when,
    readable_json,
    stale_claim,
    undecodable_error,
)
from delayq.backends.base import Completion
from delayq.backends.redis._schedules import RedisSchedules
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.codec import decode_payload
from delayq.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    InvalidOption,
    JobConflict,
    MissingDependency,
    QueueClosed,
    StaleClaim,
)
from delayq.job import (
    CancelOutcome,
    Claim,
    EnqueueOutcome,
    Job,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    Stats,
    check_on_conflict,
)

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.commands.core import Script
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependency(
        "the redis:// backend needs the 'redis' package: pip install 'delayq[redis]'"
    ) from exc

__all__ = ["DEFAULT_PREFIX", "DEFAULT_QUEUE", "SCRIPT_NAMES", "RedisBackend", "queue_keys"]

DEFAULT_PREFIX = "delayq"
DEFAULT_QUEUE = "default"

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

_KEY_NAMES = (
    "due",
    "running",
    "dead",
    "seq",
    "token",
    "wake",
    "succeeded",
    "cancelled",
    "skipped",
)
_FINISHED_INDEX = {
    JobState.SUCCEEDED: "succeeded",
    JobState.CANCELLED: "cancelled",
    JobState.SKIPPED: "skipped",
    JobState.DEAD: "dead",
}
# URL query parameters that are delayq options, not redis-py connection options.
_URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "queue": str,
    "prefix": str,
    "result_ttl": float,
    "expiry_events": lambda v: v.lower() in ("1", "true", "yes", "on"),
}
_RECOVER_PER_CLAIM = 1000  # expired leases returned per claim call (bounds script time)
_WAKE_KEY_TTL_MS = 60_000  # private wake lists vanish if their waiter is gone
_UNBLOCK_GRACE = 0.25  # seconds to wait for the reply after CLIENT UNBLOCK
_LOCAL_WAIT = 0.010  # waits up to this long sleep locally instead of BLPOP
# A wait toward a due time longer than _WARM_AFTER returns _WARM_LEAD early, so
# the caller's next claim and wait warm up before the job is due (see wait_for_due).
_WARM_AFTER = 0.100
_WARM_LEAD = 0.050
_HINT_MAX_AGE = 1.0  # seconds a claim's "next due" hint is trusted by wait_for_due
_OUTAGE_PAUSE = 0.5  # seconds wait_for_due pauses when Redis is unreachable

log = logging.getLogger("delayq.redis")

T = TypeVar("T")


def queue_keys(prefix: str, queue: str) -> dict[str, str]:
    """Every fixed key of a queue, by role, plus the job/wake/shadow key prefixes.

    All of them share the hash tag ``{queue}``.
    """
    ns = f"{prefix}:{{{queue}}}:"
    keys = {name: ns + name for name in _KEY_NAMES}
    keys["job:"] = ns + "job:"
    keys["wake:"] = ns + "wake:"
    keys["shadow:"] = ns + "shadow:"
    keys["claim:"] = ns + "claim:"
    return keys


def _load_scripts() -> dict[str, str]:
    folder = resources.files(__package__)
    lib = folder.joinpath("_lib.lua").read_text(encoding="utf-8")
    return {
        name: lib + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        for name in SCRIPT_NAMES
    }


_SCRIPTS = _load_scripts()


def _mask(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _split_url(url: str) -> tuple[str, dict[str, Any]]:
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


def _float(text: str | None) -> float | None:
    return None if text is None or text == "" else float(text)


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def _when(run_at: float | None, delay: float | None) -> str:
    """A due-time argument of the scripts: epoch seconds, or "+<delay>" after the server's now."""
    return repr(run_at) if delay is None else f"+{delay!r}"


def _job(job_id: str, f: dict[str, str], *, strict: bool = False) -> Job:
    """The job of a hash's fields. ``strict`` (claim) raises on a payload or backoff
    that does not decode; otherwise (inspection) such a field is its raw text."""
    return Job(
        id=job_id,
        name=f["name"],
        payload=decode_payload(f["payload"]) if strict else readable_json(f["payload"]),
        run_at=float(f["run_at"]),
        state=JobState(f["state"]),
        attempts=int(f["attempts"]),
        max_attempts=int(f["max_attempts"]),
        backoff=json.loads(f["backoff"]) if strict else readable_json(f["backoff"]),
        misfire=f["misfire"],
        created_at=float(f["created_at"]),
        updated_at=float(f["updated_at"]),
        last_error=f.get("last_error"),
        outcome=f.get("outcome"),
        lease_until=_float(f.get("lease_until")),
    )


class _LocalWake:
    """Wake-ups between handles of one store inside one process (injected-clock mode).

    Lock rule: ``cond``'s lock guards ``gen``.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.gen = 0

    def notify(self) -> None:
        with self.cond:
            self.gen += 1
            self.cond.notify_all()


_LOCAL_WAKES: weakref.WeakValueDictionary[str, _LocalWake] = weakref.WeakValueDictionary()
_LOCAL_WAKES_LOCK = threading.Lock()


def _local_wake(namespace: str) -> _LocalWake:
    with _LOCAL_WAKES_LOCK:
        wake = _LOCAL_WAKES.get(namespace)
        if wake is None:
            wake = _LocalWake()
            _LOCAL_WAKES[namespace] = wake
        return wake


class RedisBackend(RedisSchedules):
    """A :class:`~delayq.backends.base.Backend` on Redis (see the module docstring).

    Options (keyword-only):

    * ``queue``: the queue name (default ``"default"``); it is the hash tag.
    * ``prefix``: the first part of every key (default ``"delayq"``).
    * ``result_ttl``: seconds finished records (succeeded, cancelled, skipped)
      are kept, 7 days by default (an ``EXPIRE`` on the job hash). Dead letters
      stay until purged or requeued.
    * ``clock``: for tests only. When given (and not the system clock) it
      replaces the server's ``TIME`` everywhere a call is not given ``now=``, and
      ``wait_for_due`` waits on it, woken only by handles in this process.
    * ``expiry_events``: also wake workers from key-expiry notifications (off by
      default). ``configure_server=True`` lets delayq turn on
      ``notify-keyspace-events Ex`` itself; otherwise it must already be on.
    * ``socket_timeout`` / ``socket_connect_timeout``: seconds (10 / 5).
    * ``client_options``: more keyword arguments for ``redis.Redis``.

    At startup it refuses (:class:`~delayq.errors.ConfigurationError`) a server
    whose ``maxmemory-policy`` may evict keys that are not volatile
    (``allkeys-*``): an evicted job hash or due set is a lost job. ``noeviction``
    is the right setting; ``volatile-*`` is accepted, because only keys with a
    TTL can go (finished records, wake lists, shadow keys), never a pending job.

    Connection failures raise :class:`~delayq.errors.BackendUnavailable`.
    Reads and claims are retried once on a fresh connection; other state
    changes are not (a lost reply leaves their outcome unknown, and a retried
    enqueue would report a conflict with itself). A claim is safe to retry
    because each call carries a request id: when its first reply was lost, the
    retry returns the jobs that call claimed, never leaves them leased to nobody.

    Lock rule: ``_lock`` guards ``_waiters``, ``_in_redis``, ``_closed`` and
    ``_subscriber``.
    Everything else is set in ``__init__`` and not reassigned (redis-py clients
    and their pools are thread-safe). No user code runs under it.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {"clock", "shared", "durable", "server_clock", "definite_cancel", "inspect", "recurring"}
    )

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        queue: str = DEFAULT_QUEUE,
        prefix: str = DEFAULT_PREFIX,
        result_ttl: float = DEFAULT_RESULT_TTL,
        clock: Clock | None = None,
        expiry_events: bool = False,
        configure_server: bool = False,
        socket_timeout: float = 10.0,
        socket_connect_timeout: float = 5.0,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        redis_url, url_options = _split_url(url)
        queue = url_options.get("queue", queue)
        prefix = url_options.get("prefix", prefix)
        result_ttl = url_options.get("result_ttl", result_ttl)
        expiry_events = url_options.get("expiry_events", expiry_events)
        for name, value in (("queue", queue), ("prefix", prefix)):
            if not isinstance(value, str) or not value or any(c in value for c in "{}"):
                raise InvalidOption(f"{name} must be a non-empty str without braces, got {value!r}")
        self.url = _mask(url)
        self.queue = queue
        self.prefix = prefix
        self._result_ttl = check_result_ttl(result_ttl)
        self._clock = None if clock is None or clock is SYSTEM_CLOCK else clock
        self._keys = queue_keys(prefix, queue)
        self._key_list = [self._keys[name] for name in _KEY_NAMES]
        self._expiry_events = bool(expiry_events)
        socket_timeout = check_seconds(socket_timeout, "socket_timeout")
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": check_seconds(
                socket_connect_timeout, "socket_connect_timeout"
            ),
            "socket_keepalive": True,
            "retry": Retry(NoBackoff(), 0),
            **(client_options or {}),
            "decode_responses": True,
        }
        try:
            self._redis = redis.Redis.from_url(redis_url, **options)
            # Blocked waits get their own pool, so they never starve normal calls.
            self._blocking = redis.Redis.from_url(redis_url, **options)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad Redis URL or option for {self.url!r}: {exc}") from exc
        self._db = int(self._redis.connection_pool.connection_kwargs.get("db", 0) or 0)
        self._scripts: dict[str, Script] = {
            name: self._redis.register_script(text) for name, text in _SCRIPTS.items()
        }
        self._lock = threading.Lock()
        self._waiters: dict[str, threading.Event] = {}  # private wake list -> local event
        self._in_redis: set[str] = set()  # private wake lists of waiters blocked in BLPOP
        self._hint = threading.local()  # per thread: (monotonic, seconds to next) of last claim
        self._closed = False
        self._subscriber: _ExpirySubscriber | None = None
        self._local = _local_wake(
            f"{self._redis.connection_pool.connection_kwargs.get('host')}:"
            f"{self._redis.connection_pool.connection_kwargs.get('port')}/{self._db}/"
            f"{self._keys['due']}"
        )
        try:
            self._check_server(configure_server)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """Open ``redis://[:password@]host:port/db[?queue=...&prefix=...]``."""
        if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigurationError(f"RedisBackend needs a redis:// URL, got {_mask(url)!r}")
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"RedisBackend(url={self.url!r}, queue={self.queue!r}, prefix={self.prefix!r})"

    # -- internals ------------------------------------------------------------
    def _check_server(self, configure: bool) -> None:
        """Refuse a server that may evict pending jobs; set up expiry events if asked."""
        info = self._call(lambda: self._redis.info("memory"), retry=True)
        policy = str(info.get("maxmemory_policy", "noeviction"))
        if policy.startswith("allkeys-"):
            raise ConfigurationError(
                f"Redis at {self.url} has maxmemory-policy {policy}: it may evict pending "
                f"jobs when memory runs out. Set maxmemory-policy noeviction (or a volatile-* "
                f"policy) on that server, or give delayq its own Redis."
            )
        if not self._expiry_events:
            return
        flags = self._config_flags()
        if flags is not None and "E" in flags and ("x" in flags or "A" in flags):
            return
        if not configure:
            raise ConfigurationError(
                f"expiry_events=True needs notify-keyspace-events to include 'Ex' on "
                f"{self.url} (now {flags!r}); run CONFIG SET notify-keyspace-events Ex, or "
                f"pass configure_server=True to let delayq set it"
            )
        new = "".join(sorted(set((flags or "") + "Ex")))
        self._call(lambda: self._redis.config_set("notify-keyspace-events", new), retry=True)

    def _config_flags(self) -> str | None:
        try:
            reply = self._call(lambda: self._redis.config_get("notify-keyspace-events"), retry=True)
        except BackendError:
            return None  # CONFIG is disabled on some managed services
        return str(reply.get("notify-keyspace-events", ""))

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")

    def _call(self, fn: Callable[[], T], *, retry: bool = False) -> T:
        """Run a Redis call, wrapping driver errors; ``retry`` once if it is safe."""
        for attempt in itertools.count():
            try:
                return fn()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if retry and attempt == 0:
                    continue
                raise BackendUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
            except redis.RedisError as exc:
                raise BackendError(f"Redis at {self.url} failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _now_arg(self, now: float | None) -> str:
        if now is not None:
            return repr(check_run_at(now, "now"))
        if self._clock is not None:
            return repr(self._clock.time())
        return ""

    def _run(
        self, name: str, args: Sequence[Any] = (), *, now: float | None = None, retry: bool = False
    ) -> Any:
        self._check_open()
        full = [
            self._keys["job:"],
            self._now_arg(now),
            repr(self._result_ttl * 1000),
            self._keys["shadow:"] if self._expiry_events else "",
            *args,
        ]
        script = self._scripts[name]

        def run() -> Any:
            try:
                return script(keys=self._key_list, args=full)  # EVALSHA, reloads on NOSCRIPT
            except redis.exceptions.NoScriptError:
                # Flushed again between the reload and the retry: send the body.
                return self._redis.eval(_SCRIPTS[name], len(self._key_list), *self._key_list, *full)

        return self._call(run, retry=retry)

    def _woke(self, woke: Any) -> None:
        """The head of the due set changed: wake this process's waiters at once."""
        if int(woke):
            self._wake_local()

    def _wake_local(self) -> None:
        self._local.notify()
        with self._lock:
            keys = list(self._in_redis)
            for event in self._waiters.values():
                event.set()
        if not keys:
            return
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.lpush(key, "1")
            pipe.pexpire(key, _WAKE_KEY_TTL_MS)
        with contextlib.suppress(BackendError):
            self._call(pipe.execute)

    def _stale(self, claim: Claim, reply: Sequence[Any]) -> StaleClaim:
        state = JobState(reply[1]) if reply[1] else None
        token = int(reply[2]) if reply[2] else None
        return stale_claim(claim, state, token)

    def _members(self, fn: Callable[[], Any]) -> list[str]:
        """Run a read returning ZSET members (retried once), as a list of str."""
        self._check_open()
        return [str(m) for m in self._call(fn, retry=True)]

    def _fetch(self, ids: Sequence[str]) -> list[Job]:
        """The jobs with these ids that still exist, in the given order."""
        jobs: list[Job] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            replies = self._run("get", chunk, retry=True)
            jobs.extend(
                _job(job_id, _pairs(flat))
                for job_id, flat in zip(chunk, replies, strict=True)
                if flat
            )
        return jobs

    # -- producers ----------------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if not specs:
            return []
        # Jobs of one batch usually share name, max_attempts, backoff, misfire and
        # created_at: send each such "profile" once and 4 fields per job (see
        # enqueue.lua), half the arguments to pack, send and read.
        profiles: dict[tuple[Any, ...], int] = {}
        backoffs: dict[int, str] = {}  # JSON of each backoff dict (often one shared dict)
        head: list[Any] = [on_conflict, len(specs), 0]
        body: list[Any] = []
        for spec in specs:
            backoff = backoffs.get(id(spec.backoff))
            if backoff is None:
                backoff = backoffs[id(spec.backoff)] = json.dumps(
                    spec.backoff, separators=(",", ":")
                )
            key = (spec.name, spec.max_attempts, backoff, spec.misfire, spec.created_at)
            profile = profiles.get(key)
            if profile is None:
                profile = profiles[key] = len(profiles) + 1
                head += (
                    spec.name,
                    spec.max_attempts,
                    backoff,
                    spec.misfire,
                    repr(float(spec.created_at)),
                )
            # A relative delay is due on the server's clock ("+<seconds>").
            when = repr(float(spec.run_at)) if spec.delay is None else f"+{float(spec.delay)!r}"
            body += (spec.id, spec.payload, when, profile)
        head[2] = len(profiles)
        args = head + body
        reply = self._run("enqueue", args)
        if reply[0] == "conflict":
            job_id, state = reply[1], reply[2]
            if state == "running" and on_conflict == "replace":
                raise JobConflict(
                    f"job {job_id!r} is running and cannot be replaced; "
                    f"cancel is not possible either: wait for it to finish"
                )
            raise JobConflict(
                f"job {job_id!r} already exists ({state}); pass "
                f"on_conflict='keep' or 'replace' to accept an existing id"
            )
        self._woke(reply[1])
        return [EnqueueOutcome(o) for o in reply[2:]]

    def cancel(self, job_id: str) -> CancelOutcome:
        return CancelOutcome(self._run("cancel", [job_id]))

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        reply = self._run("reschedule", [job_id, _when(*check_when(run_at, delay))])
        self._woke(reply[1])
        return RescheduleOutcome(reply[0])

    # -- workers --------------------------------------------------------------------
    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        limit = check_limit(limit)
        lease = check_lease(lease)
        # The request key makes the one retry safe: if the first call ran but its
        # reply was lost, the retry finds the key and returns that call's claims.
        request = f"{self._keys['claim:']}{uuid.uuid4().hex}"
        reply = self._run(
            "claim",
            [limit, repr(lease), _RECOVER_PER_CLAIM, request, PURGE_BATCH],
            now=now,
            retry=True,
        )
        claimed_at = float(reply[0])
        lease_until = float(reply[1])
        self._woke(reply[3])  # the new lease ends before anything waiters here wait for
        if now is None and self._clock is None:  # the hint is on the server's clock
            ms = _float(reply[2])
            self._hint.value = (SYSTEM_CLOCK.monotonic(), None if ms is None else ms / 1000)
        claims: list[Claim] = []
        for i in range(4, len(reply), 2):
            fields = _pairs(reply[i + 1])
            token = int(fields["token"])
            try:
                job = _job(reply[i], fields, strict=True)
            except (ValueError, TypeError, KeyError) as exc:
                self._bury_unreadable(reply[i], token, exc)
                continue
            claims.append(Claim(job, token, lease_until, claimed_at))
        return claims

    def _bury_unreadable(self, job_id: str, token: int, exc: BaseException) -> None:
        """Bury a claimed job whose stored fields cannot be read (it never runs)."""
        log.error("delayq: burying job %r: %s", job_id, exc)
        with contextlib.suppress(BackendError):  # else its lease runs out and it comes back
            self._run("bury", [job_id, token, undecodable_error(exc)])

    def ack(
        self, claim: Claim, *, state: JobState = JobState.SUCCEEDED, outcome: str | None = None
    ) -> None:
        state = check_ack_state(state)
        reply = self._run("ack", [claim.job.id, claim.token, state.value, outcome or ""])
        if not int(reply[0]):
            raise self._stale(claim, reply)

    def retry(self, claim: Claim, run_at: float, error: str) -> None:
        reply = self._run("retry", [claim.job.id, claim.token, repr(check_run_at(run_at)), error])
        if not int(reply[0]):
            raise self._stale(claim, reply)
        self._woke(reply[1])

    def bury(self, claim: Claim, error: str) -> None:
        reply = self._run("bury", [claim.job.id, claim.token, error])
        if not int(reply[0]):
            raise self._stale(claim, reply)

    def release(self, claim: Claim) -> None:
        [stale] = self.complete([Completion.release(claim)])
        if stale is not None:
            raise stale

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Finish every claim of ``batch`` with one script call (see ``complete.lua``)."""
        items = Completion.batch(batch)
        if not items:
            return []
        args: list[Any] = [len(items)]
        for item in items:
            retrying = item.state is JobState.SCHEDULED
            text = item.error if retrying or item.state is JobState.DEAD else item.outcome
            if item.released:
                text = RELEASED_NOTE
            args += (
                item.claim.job.id,
                item.claim.token,
                "release" if item.released else item.state.value,
                repr(item.run_at) if item.run_at is not None else "",
                text or "",
            )
        reply = self._run("complete", args)
        self._woke(reply[0])
        return [
            None if int(answer[0]) else self._stale(item.claim, answer)
            for item, answer in zip(items, reply[1:], strict=True)
        ]

    def extend(self, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        reply = self._run("extend", [claim.job.id, claim.token, repr(lease)])
        if not int(reply[0]):
            raise self._stale(claim, reply)
        job = _job(claim.job.id, _pairs(reply[1]))
        assert job.lease_until is not None
        return replace(claim, job=job, lease_until=job.lease_until)

    def wait_for_due(self, max_wait: float) -> None:
        """Block until a job may be due (see the module docstring for how).

        Never raises for an unreachable Redis: it pauses up to half a second and
        returns, so the caller's next ``claim`` reports the outage.
        """
        max_wait = check_max_wait(max_wait)
        self._check_open()
        if self._clock is not None:
            self._wait_on_clock(self._clock, max_wait)
            return
        if self._expiry_events:
            self._ensure_subscriber()
        key = f"{self._keys['wake:']}{uuid.uuid4().hex}"
        event = threading.Event()
        with self._lock:
            self._waiters[key] = event
        try:
            until = self._until_next()
            timeout = max_wait if until is None else min(max_wait, until)
            if timeout <= 0:
                return
            if timeout <= _LOCAL_WAIT:
                # Too short for a BLPOP round trip to pay off: an earlier job
                # arriving meanwhile waits at most this long.
                event.wait(timeout)
                return
            with self._lock:
                self._in_redis.add(key)  # from now on, interrupt() pushes to its list
            # Warm-up: after a quiet spell of a second or more, everything is
            # slow for the first tens of milliseconds (measured on 2-vCPU VMs
            # whose idle CPUs halt: the client's timer fires 2-20 ms late, CLIENT
            # UNBLOCK and the first claim take 2-15 ms each, against 0.1-0.3 ms
            # warm). So a wait that ends at a due time (not one cut by max_wait)
            # returns _WARM_LEAD early: the caller's claim finds nothing yet and
            # its next wait, short and warm, ends at the due time. One claim
            # more per long wait; a wake-up token still ends the wait at once.
            if until is not None and until <= max_wait and timeout > _WARM_AFTER:
                timeout -= _WARM_LEAD
            if not event.is_set():
                self._block(key, timeout)
        except BackendUnavailable as exc:
            # Waiting is not an operation the caller can fail on: pause briefly
            # and let its next claim report the outage (and back off).
            log.debug("wait_for_due: %s; pausing", exc)
            event.wait(min(max_wait, _OUTAGE_PAUSE))
        finally:
            with self._lock:
                del self._waiters[key]
                self._in_redis.discard(key)

    def _until_next(self) -> float | None:
        """Seconds until the next due job or lease expiry (server clock); None: nothing.

        Uses the hint the last ``claim`` of this thread returned when it is
        fresh (saving a round trip in a busy worker's claim/wait loop), else
        asks the server.
        """
        hint: tuple[float, float | None] | None = getattr(self._hint, "value", None)
        self._hint.value = None
        if hint is not None:
            age = SYSTEM_CLOCK.monotonic() - hint[0]
            if age < _HINT_MAX_AGE:
                return None if hint[1] is None else hint[1] - age
        reply = self._run("next_wake", retry=True)
        return None if reply == "" else float(reply) / 1000

    def _wait_on_clock(self, clock: Clock, max_wait: float) -> None:
        local = self._local
        deadline = clock.monotonic() + max_wait
        with local.cond:
            gen = local.gen
        while True:
            reply = self._run("next_wake", retry=True)
            with local.cond:
                if local.gen != gen or self._closed:
                    return
                left = deadline - clock.monotonic()
                if reply != "":
                    left = min(left, float(reply) / 1000)
                if left <= 0:
                    return
                clock.wait(local.cond, left)
                if local.gen != gen or self._closed:
                    return

    def _block(self, key: str, timeout: float) -> bool:
        """BLPOP the wake lists for ``timeout`` seconds, ending it on time ourselves.

        The server only notices BLPOP timeouts on its cron tick (~100 ms), so the
        client waits on the socket with its own deadline and ends the BLPOP with
        ``CLIENT UNBLOCK`` (from another connection) when that passes first.
        Returns True when a wake-up token ended it, False when the time ran out.
        """
        pool = self._blocking.connection_pool
        try:
            conn = pool.get_connection()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise BackendUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
        healthy = False
        woken = False
        try:
            conn.send_packed_command(  # type: ignore[no-untyped-call]
                conn.pack_commands(  # type: ignore[no-untyped-call]
                    [("CLIENT", "ID"), ("BLPOP", self._keys["wake"], key, f"{timeout:.3f}")]
                )
            )
            client_id = conn.read_response()
            if not conn.can_read(timeout=timeout):
                self._redis.client_unblock(client_id)
                if not conn.can_read(timeout=_UNBLOCK_GRACE):
                    return False  # the connection is stuck: dropped in ``finally``
            woken = conn.read_response() is not None  # nil: timed out or unblocked
            healthy = True
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise BackendUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
        except redis.RedisError as exc:
            raise BackendError(f"Redis at {self.url} failed: {exc}") from exc
        finally:
            if not healthy:
                conn.disconnect()  # type: ignore[no-untyped-call]
            pool.release(conn)
        return woken

    def interrupt(self) -> None:
        self._wake_local()

    # -- inspection and dead letters ------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        jobs = self._fetch([job_id])
        return jobs[0] if jobs else None

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """Jobs in ``run_at`` order (FIFO ties); the window is ``due_after <= run_at < due_before``.

        Scheduled jobs are read from the due index (cost grows with ``limit``);
        the other states are read whole and sorted here, which is fine for an
        inspection call but grows with the number of running/finished records.
        """
        limit = check_limit(limit)
        state = None if state is None else JobState(state)
        low = "-inf" if due_after is None else repr(check_run_at(due_after, "due_after") * 1000)
        high = (
            "+inf"
            if due_before is None
            else "(" + repr(check_run_at(due_before, "due_before") * 1000)
        )
        jobs: list[Job] = []
        if state in (None, JobState.SCHEDULED):
            members = self._members(
                lambda: self._redis.zrangebyscore(self._keys["due"], low, high, 0, limit)
            )
            jobs += self._fetch([m[16:] for m in members])
        others = [JobState.RUNNING, *_FINISHED_INDEX] if state is None else [state]
        for other in others:
            if other is JobState.SCHEDULED:
                continue
            index = self._keys["running" if other is JobState.RUNNING else _FINISHED_INDEX[other]]
            ids = self._members(functools.partial(self._redis.zrange, index, 0, -1))
            jobs += [j for j in self._fetch(ids) if j.state is other]
        seq = {j.id: i for i, j in enumerate(jobs)}
        jobs = [
            j
            for j in jobs
            if (due_after is None or j.run_at >= due_after)
            and (due_before is None or j.run_at < due_before)
        ]
        jobs.sort(key=lambda j: (j.run_at, seq[j.id]))
        return jobs[:limit]

    def next_due(self) -> float | None:
        return self.stats().next_due

    def stats(self) -> Stats:
        r = self._run("stats", retry=True)
        return Stats(
            scheduled=int(r[0]),
            due=int(r[1]),
            running=int(r[2]),
            succeeded=int(r[3]),
            dead=int(r[4]),
            cancelled=int(r[5]),
            skipped=int(r[6]),
            next_due=_float(r[7]),
        )

    def dead_letters(self, *, limit: int = 100) -> list[Job]:
        limit = check_limit(limit)
        self._check_open()
        ids = self._members(lambda: self._redis.zrevrange(self._keys["dead"], 0, limit - 1))
        return [j for j in self._fetch(ids) if j.state is JobState.DEAD]

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        reply = self._run("requeue_dead", [job_id, _when(*check_when(run_at, delay))])
        if not int(reply[0]):
            return False
        self._woke(reply[1])
        return True

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``."""
        if job_ids is not None:
            job_ids = list(job_ids)
            if not job_ids:
                return 0
        bound = "" if older_than is None else repr(check_run_at(older_than, "older_than"))
        return int(self._run("purge_dead", [bound, *(job_ids or [])]))

    # -- lifecycle --------------------------------------------------------------------
    def _ensure_subscriber(self) -> None:
        with self._lock:
            if self._subscriber is None and not self._closed:
                self._subscriber = _ExpirySubscriber(self)

    def close(self) -> None:
        """Close the connections and wake every waiter. Idempotent."""
        with self._lock:
            if self._closed:
                return
            keys = list(self._waiters)
            subscriber, self._subscriber = self._subscriber, None
        if keys:
            self._wake_local()
        with self._lock:
            self._closed = True
        self._local.notify()
        if subscriber is not None:
            subscriber.stop()
        self._redis.close()
        self._blocking.close()


class _ExpirySubscriber:
    """A daemon thread that turns key-expiry events of shadow keys into local wake-ups.

    Only a hint (see the module docstring): events may come late or never.
    """

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._stop = threading.Event()
        self._channel = f"__keyevent@{backend._db}__:expired"
        self._shadow = backend._keys["shadow:"]
        self._thread = threading.Thread(
            target=self._run, name=f"delayq-expiry-{backend.queue}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._backend._blocking.pubsub(  # type: ignore[no-untyped-call]
                    ignore_subscribe_messages=True
                )
                with contextlib.closing(pubsub):
                    pubsub.subscribe(self._channel)
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message and str(message.get("data", "")).startswith(self._shadow):
                            self._backend._wake_local()
            except redis.RedisError:
                # Missed events only cost latency: the ZSET decides.
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
