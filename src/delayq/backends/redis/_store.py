"""The Redis store: the contract methods of :class:`RedisBackend`, each one script call."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import urlsplit

from delayq._validate import check_int, check_seconds
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    PURGE_BATCH,
    check_ack_state,
    check_claim_now,
    check_lease,
    check_limit,
    check_max_wait,
    check_queue_name,
    check_result_ttl,
    check_run_at,
    check_spec,
    check_when,
    clip_error,
    conflict_error,
    stale_claim,
    undecodable_error,
)
from delayq.backends._urls import UrlOptions, keyword_defaults
from delayq.backends.base import Completion
from delayq.backends.redis._connection import Connection, mask, split_url
from delayq.backends.redis._fields import (
    completion_args,
    enqueue_args,
    job_of,
    optional_float,
    pairs,
    when_arg,
)
from delayq.backends.redis._flow import RedisLimits
from delayq.backends.redis._inspect import RedisInspection
from delayq.backends.redis._keyed import RedisKeyed
from delayq.backends.redis._keys import (
    DEFAULT_PREFIX,
    DEFAULT_QUEUE,
    KEY_NAMES,
    queue_keys,
)
from delayq.backends.redis._schedules import RedisSchedules
from delayq.backends.redis._server import ServerChecks
from delayq.backends.redis._waiting import Wakeups
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import (
    BackendError,
    ConfigurationError,
    InvalidOption,
    JobConflict,
    QueueClosed,
    StaleClaim,
)
from delayq.job import (
    CancelOutcome,
    Claim,
    EnqueueOutcome,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    check_on_conflict,
)

__all__ = ["RedisBackend"]

_RECOVER_PER_CLAIM = 1000  # expired leases returned per claim call (bounds script time)
SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)
"""The URL schemes the Redis store opens."""
ENQUEUE_CHUNK = 2000
"""Jobs stored per script call; a larger batch is checked, then written, in chunks."""
DEFAULT_MAX_FINISHED = 10_000
"""Finished records kept per final state at most (the oldest go first)."""
DEFAULT_MAX_DEAD = 100_000
"""Dead letters kept at most (the oldest go first)."""

log = logging.getLogger("delayq.redis")


class RedisBackend(RedisInspection, RedisSchedules, RedisLimits, RedisKeyed):
    """A :class:`~delayq.backends.base.Backend` on Redis (see the package docstring).

    Options (keyword-only):

    * ``queue``: the queue name (default ``"default"``); it is the hash tag.
    * ``prefix``: the first part of every key (default ``"delayq"``).
    * ``result_ttl``: seconds finished records (succeeded, cancelled, skipped)
      are kept, 7 days by default (an ``EXPIRE`` on the job hash).
    * ``max_finished``: at most this many full finished records per final state
      (10,000 by default; 0: no cap); past it the oldest are kept compact (no
      payload or error text) until their ``result_ttl``, at most ten times as
      many, so ``get``, ``cancel`` and ``on_conflict`` answer for an id the whole
      window; past that the oldest go, so memory stays bounded whatever the rate.
      ``max_dead``: at most this many dead letters (100,000 by default), which
      otherwise stay until purged or requeued; past it the oldest go.
    * ``clock``: for tests only. When given (and not the system clock) it
      replaces the server's ``TIME`` everywhere a call is not given ``now=``, and
      ``wait_for_due`` waits on it, woken only by handles in this process.
    * ``expiry_events``: also wake workers from key-expiry notifications (off by
      default). ``configure_server=True`` lets delayq turn on
      ``notify-keyspace-events Ex`` itself; otherwise it must already be on.
    * ``socket_timeout`` / ``socket_connect_timeout``: seconds (10 / 5).
    * ``client_options``: more keyword arguments for ``redis.Redis``.
    * ``wait_replicas`` / ``wait_aof``: an ``enqueue`` (``schedule``) returns
      only once that many replicas have its writes (``WAIT``) and, with
      ``wait_aof``, once the AOF of the master holds them on disk (``WAITAOF``,
      Redis 7.2 and later), within ``wait_timeout`` seconds; when that does not
      happen it raises :class:`~delayq.errors.BackendError` saying the jobs were
      stored on the master but are not yet as durable as asked. Not with Redis
      Cluster.
    * ``client``: your own ``redis.Redis`` or ``redis.cluster.RedisCluster``
      (created with ``decode_responses=True``) instead of one made from ``url``.

    URLs: ``redis://`` / ``rediss://`` / ``unix://`` for one server,
    ``redis+cluster://host:port[,host:port]`` for a Redis Cluster, and
    ``redis+sentinel://[:password@]host:port[,host:port]/service[/db]`` for the
    master that Sentinel names (followed across failovers).

    At startup it refuses (:class:`~delayq.errors.ConfigurationError`) a server
    whose ``maxmemory-policy`` may evict keys that are not volatile
    (``allkeys-*``): an evicted job hash or due set is a lost job. ``noeviction``
    is the right setting; ``volatile-*`` is accepted, because only keys with a
    TTL can go (finished records, wake lists, shadow keys), never a pending job.
    Claims re-check it every minute and log an error; a server without an
    append-only file gets a warning (see ``_server.py``).

    Connection failures raise :class:`~delayq.errors.BackendUnavailable`.
    Reads and claims are retried once on a fresh connection; other state
    changes are not (a lost reply leaves their outcome unknown, and a retried
    enqueue would report a conflict with itself). A claim is safe to retry
    because each call carries a request id: when its first reply was lost, the
    retry returns the jobs that call claimed, never leaves them leased to nobody.

    Its parts: ``_conn`` (clients, scripts, error mapping; ``_connection.py``)
    and ``_wakes`` (blocked waits and wake-ups; ``_waiting.py``, which holds
    the only lock). Everything here is set in ``__init__`` and not reassigned.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {
            "attempt_at_start",
            "clock",
            "shared",
            "durable",
            "server_clock",
            "definite_cancel",
            "inspect",
            "recurring",
            "flow_control",
            "keyed",
            "results",
        }
    )

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        queue: str = DEFAULT_QUEUE,
        prefix: str = DEFAULT_PREFIX,
        result_ttl: float = DEFAULT_RESULT_TTL,
        max_finished: int = DEFAULT_MAX_FINISHED,
        max_dead: int = DEFAULT_MAX_DEAD,
        clock: Clock | None = None,
        expiry_events: bool = False,
        configure_server: bool = False,
        socket_timeout: float = 10.0,
        socket_connect_timeout: float = 5.0,
        client_options: dict[str, Any] | None = None,
        client: Any = None,
        wait_replicas: int = 0,
        wait_aof: bool = False,
        wait_timeout: float = 1.0,
    ) -> None:
        redis_url, url_options = split_url(url)
        given = UrlOptions(url, url_options, _KEYWORD_DEFAULTS)
        queue = check_queue_name(given.pick("queue", queue))
        prefix = given.pick("prefix", prefix)
        result_ttl = given.pick("result_ttl", result_ttl)
        max_finished = given.pick("max_finished", max_finished)
        max_dead = given.pick("max_dead", max_dead)
        wait_replicas = given.pick("wait_replicas", wait_replicas)
        wait_aof = given.pick("wait_aof", wait_aof)
        wait_timeout = given.pick("wait_timeout", wait_timeout)
        expiry_events = given.pick("expiry_events", expiry_events)
        if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{}"):
            raise InvalidOption(f"prefix must be a non-empty str without braces, got {prefix!r}")
        self.url = mask(url)
        self.queue = queue
        self.prefix = prefix
        self._result_ttl = check_result_ttl(result_ttl)
        for option, cap in (("max_finished", max_finished), ("max_dead", max_dead)):
            check_int(cap, option, minimum=0, note=" (0: no cap)")
        self._wait: tuple[Any, ...] = ()
        for option, count in (("wait_replicas", wait_replicas), ("wait_aof", int(wait_aof))):
            check_int(count, option, minimum=0)
        if wait_replicas or wait_aof:
            ms = int(check_seconds(wait_timeout, "wait_timeout") * 1000)
            if wait_aof:
                self._wait = ("WAITAOF", 1, wait_replicas, ms)
            else:
                self._wait = ("WAIT", wait_replicas, ms)
        self._wait_replicas = wait_replicas
        # ARGV[3] of every script (see _lib.lua): how long and how many records stay.
        self._retention = f"{self._result_ttl * 1000!r} {max_finished} {max_dead}"
        self._clock = None if clock is None or clock is SYSTEM_CLOCK else clock
        self._keys = queue_keys(prefix, queue)
        self._key_list = [self._keys[name] for name in KEY_NAMES]
        self._expiry_events = bool(expiry_events)
        socket_timeout = check_seconds(socket_timeout, "socket_timeout")
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": check_seconds(
                socket_connect_timeout, "socket_connect_timeout"
            ),
            **({} if urlsplit(redis_url).scheme == "unix" else {"socket_keepalive": True}),
            **(client_options or {}),
        }
        # A claim's record serves its one retry, which follows a lost reply
        # within about one socket timeout: keep it for two, and 5 s more.
        self._replay_ms = int((2 * socket_timeout + 5) * 1000)
        self._conn = Connection(
            redis_url, self.url, options, anchor=self._keys["due"], client=client
        )
        self._redis = self._conn.client
        self._db = self._conn.db
        self._server = ServerChecks(self._conn)
        self._wakes = Wakeups(
            self._conn,
            self._keys,
            queue=queue,
            clock=self._clock,
            expiry_events=self._expiry_events,
            next_wake=lambda: self._run("next_wake", retry=True),
        )
        try:
            if self._wait and self._conn.cluster:
                raise ConfigurationError("wait_replicas / wait_aof do not work with Redis Cluster")
            self._server.at_start(
                expiry_events=self._expiry_events,
                configure=configure_server,
                waitaof=bool(wait_aof),
            )
            if self._clock is None:
                self._wakes.check_unblock()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """Open ``redis://[:password@]host:port/db[?queue=...&prefix=...]``."""
        if urlsplit(url).scheme not in SCHEMES:
            raise ConfigurationError(f"RedisBackend needs a redis:// URL, got {mask(url)!r}")
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"RedisBackend(url={self.url!r}, queue={self.queue!r}, prefix={self.prefix!r})"

    # -- internals ------------------------------------------------------------
    def _check_open(self) -> None:
        if self._wakes.closed:
            raise QueueClosed(f"{self!r} is closed")

    def _call(self, fn: Callable[[], Any], *, retry: bool = False) -> Any:
        return self._conn.call(fn, retry=retry)

    def _now_arg(self, now: float | None) -> str:
        if now is not None:
            return repr(check_run_at(now, "now"))
        if self._clock is not None:
            return repr(self._clock.time())
        return ""

    def _run(
        self,
        name: str,
        args: Sequence[Any] = (),
        *,
        now: float | None = None,
        retry: bool = False,
        keys: Sequence[str] = (),
        then: Sequence[Any] = (),
    ) -> Any:
        """Run script ``name`` with the queue's fixed keys plus ``keys``, the four
        common arguments (see ``_lib.lua``) plus ``args`` (``then``: see
        ``Connection.script``)."""
        self._check_open()
        full = [
            self._keys["job:"],
            self._now_arg(now),
            self._retention,
            self._keys["shadow:"] if self._expiry_events else "",
            *args,
        ]
        return self._conn.script(name, [*self._key_list, *keys], full, retry=retry, then=then)

    def _write(self, name: str, args: Sequence[Any], *, keys: Sequence[str] = ()) -> Any:
        """``_run`` for a producer's write, then the ``WAIT`` / ``WAITAOF`` asked for."""
        if not self._wait:
            return self._run(name, args, keys=keys)
        reply, acked = self._run(name, args, keys=keys, then=self._wait)
        if reply[0] == "conflict":
            return reply  # nothing was written
        local, replicas = (1, acked) if self._wait[0] == "WAIT" else (acked[0], acked[1])
        if local < 1 or replicas < self._wait_replicas:
            raise BackendError(
                f"the jobs were stored on the Redis master at {self.url}, but within the "
                f"wait_timeout only {replicas} of {self._wait_replicas} replicas"
                + (f" and {local} of 1 local AOF" if self._wait[0] == "WAITAOF" else "")
                + " acknowledged them: they may be lost if the master fails now"
            )
        return reply

    def _stale(self, claim: Claim, reply: Sequence[Any]) -> StaleClaim:
        state = JobState(reply[1]) if reply[1] else None
        token = int(reply[2]) if reply[2] else None
        return stale_claim(claim, state, token)

    # -- producers ----------------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """Store ``jobs`` all or none (see the contract).

        Up to ``ENQUEUE_CHUNK`` jobs go in one script call. A larger batch is
        sent in chunks, so no single script holds the server for long: every
        chunk is checked first (a conflict stores nothing), then written; only
        a concurrent writer of the same ids between the two passes can make a
        later chunk conflict, and the error then says how many were stored.
        """
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        if not specs:
            return []
        if len(specs) <= ENQUEUE_CHUNK:
            reply = self._write("enqueue", enqueue_args(specs, on_conflict, check_only=False))
            self._check_enqueued(reply, on_conflict, stored=0)
            self._wakes.woke(reply[1])
            return [EnqueueOutcome(o) for o in reply[2:]]
        if on_conflict == "reject":
            ids = [spec.id for spec in specs]
            if len(set(ids)) != len(ids):
                twice = next(i for i in ids if ids.count(i) > 1)
                raise JobConflict(f"job {twice!r} appears more than once in the batch")
        chunks = [specs[i : i + ENQUEUE_CHUNK] for i in range(0, len(specs), ENQUEUE_CHUNK)]
        for chunk in chunks:
            reply = self._run("enqueue", enqueue_args(chunk, on_conflict, check_only=True))
            self._check_enqueued(reply, on_conflict, stored=0)
        outcomes: list[EnqueueOutcome] = []
        for chunk in chunks:
            reply = self._write("enqueue", enqueue_args(chunk, on_conflict, check_only=False))
            self._check_enqueued(reply, on_conflict, stored=len(outcomes))
            self._wakes.woke(reply[1])
            outcomes += (EnqueueOutcome(o) for o in reply[2:])
        return outcomes

    @staticmethod
    def _check_enqueued(reply: Sequence[Any], on_conflict: str, *, stored: int) -> None:
        """Raise JobConflict for an enqueue reply that reports one."""
        if reply[0] != "conflict":
            return

        note = f" ({stored} jobs of this batch were stored before it)" if stored else ""
        raise conflict_error(reply[1], reply[2], on_conflict, note=note)

    def cancel(self, job_id: str) -> CancelOutcome:
        return CancelOutcome(self._run("cancel", [job_id]))

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        reply = self._run("reschedule", [job_id, when_arg(*check_when(run_at, delay))])
        self._wakes.woke(reply[1])
        return RescheduleOutcome(reply[0])

    # -- workers --------------------------------------------------------------------
    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        limit = check_limit(limit)
        lease = check_lease(lease)
        now = check_claim_now(now, self._clock or SYSTEM_CLOCK)
        # The request key makes the one retry safe: if the first call ran but its
        # reply was lost, the retry finds the key and returns that call's claims.
        self._server.maybe_recheck()
        request = f"{self._keys['claim:']}{uuid.uuid4().hex[:16]}"
        reply = self._run(
            "claim",
            [limit, repr(lease), _RECOVER_PER_CLAIM, self._replay_ms, PURGE_BATCH],
            now=now,
            retry=True,
            keys=[request],
        )
        return self._claims(reply, hint=now is None)

    def _claims(self, reply: Sequence[Any], *, hint: bool) -> list[Claim]:
        """The claims of a claim script's reply (see ``claim.lua``); jobs that do not
        decode are buried. ``hint``: remember the reply's next due time for waits."""
        claimed_at = float(reply[0])
        lease_until = float(reply[1])
        self._wakes.woke(reply[3])  # the new lease ends before anything waiters here wait for
        if hint and self._clock is None:  # the hint is on the server's clock
            ms = optional_float(reply[2])
            at = None if ms is None else claimed_at * 1000 + ms
            self._wakes.set_hint(ms, at)
        claims: list[Claim] = []
        for i in range(4, len(reply), 2):
            fields = pairs(reply[i + 1])
            token = int(fields["token"])
            try:
                job = job_of(reply[i], fields, strict=True)
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
        reply = self._run(
            "ack", [claim.job.id, claim.token, state.value, clip_error(outcome) or ""]
        )
        if not int(reply[0]):
            raise self._stale(claim, reply)
        self._wakes.woke(reply[1])  # a freed slot brought a parked job back

    def retry(self, claim: Claim, run_at: float, error: str) -> None:
        reply = self._run(
            "retry", [claim.job.id, claim.token, repr(check_run_at(run_at)), clip_error(error)]
        )
        if not int(reply[0]):
            raise self._stale(claim, reply)
        self._wakes.woke(reply[1])

    def bury(self, claim: Claim, error: str) -> None:
        reply = self._run("bury", [claim.job.id, claim.token, clip_error(error)])
        if not int(reply[0]):
            raise self._stale(claim, reply)
        self._wakes.woke(reply[1])

    def release(self, claim: Claim) -> None:
        [stale] = self.complete([Completion.release(claim)])
        if stale is not None:
            raise stale

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Finish every claim of ``batch`` with one script call (see ``complete.lua``)."""
        items = Completion.batch(batch)
        if not items:
            return []
        reply = self._run("complete", completion_args(items))
        return self._answers(items, reply)

    def complete_and_claim(
        self, batch: Sequence[Completion], *, limit: int, lease: float
    ) -> tuple[list[StaleClaim | None], list[Claim]]:
        """``complete(batch)`` then ``claim(limit=limit, lease=lease)`` as ONE script
        call (see ``complete_and_claim.lua``); ``limit=0`` claims nothing.

        It is not retried after a lost reply (its completions would then be
        answered as stale); the jobs it claimed come back when their lease ends.
        """
        check_int(limit, "limit", minimum=0)
        lease = check_lease(lease)
        items = Completion.batch(batch)
        if not items and limit == 0:
            return [], []
        self._server.maybe_recheck()
        request = f"{self._keys['claim:']}{uuid.uuid4().hex[:16]}"
        head = [limit, repr(lease), _RECOVER_PER_CLAIM, 0, PURGE_BATCH]
        reply = self._run("complete_and_claim", head + completion_args(items), keys=[request])
        answers = self._answers(items, reply[0])
        return answers, (self._claims(reply[1], hint=True) if limit else [])

    def _answers(
        self, items: Sequence[Completion], reply: Sequence[Any]
    ) -> list[StaleClaim | None]:
        """Each completion's answer in a ``complete`` reply (see ``complete.lua``)."""
        self._wakes.woke(reply[0])
        return [
            None if int(answer[0]) else self._stale(item.claim, answer)
            for item, answer in zip(items, reply[1:], strict=True)
        ]

    def extend(self, claim: Claim, lease: float) -> Claim:
        [answer] = self.extend_many([claim], lease)
        if isinstance(answer, StaleClaim):
            raise answer
        return answer

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        lease = check_lease(lease)
        if not claims:
            return []
        args: list[Any] = [repr(lease)]
        for claim in claims:
            args += [claim.job.id, claim.token, 1 if claim.token in started else 0]
        answers: list[Claim | StaleClaim] = []
        for claim, reply in zip(claims, self._run("extend", args), strict=True):
            if not int(reply[0]):
                answers.append(self._stale(claim, reply))
                continue
            job = job_of(claim.job.id, pairs(reply[1]))
            assert job.lease_until is not None
            answers.append(replace(claim, job=job, lease_until=job.lease_until))
        return answers

    def wait_for_due(self, max_wait: float) -> None:
        """Block until a job may be due (see the package docstring for how).

        Never raises for an unreachable Redis: it pauses up to half a second and
        returns, so the caller's next ``claim`` reports the outage.
        """
        max_wait = check_max_wait(max_wait)
        self._check_open()
        self._wakes.wait(max_wait)

    def interrupt(self) -> None:
        self._wakes.wake_local()

    # -- lifecycle --------------------------------------------------------------------
    def listen_for_finishes(self, on_finished: Callable[[list[str]], None]) -> bool:
        """Hear the results other processes record (``TellsFinishes``): ``ack_job``
        publishes each id on the queue's ``done`` channel."""
        return self._wakes.listen_for_results(on_finished)

    def close(self) -> None:
        """Close the connections and wake every waiter. Idempotent."""
        if self._wakes.closed:
            return
        self._wakes.close()
        self._conn.close()


_KEYWORD_DEFAULTS = keyword_defaults(RedisBackend.__init__)
"""A keyword at its default counts as not given next to a URL option (backends._urls)."""
