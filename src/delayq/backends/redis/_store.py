"""The Redis store: the contract methods of :class:`RedisBackend`, each one script call."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import urlsplit

from delayq._validate import check_seconds
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    PURGE_BATCH,
    RELEASED_NOTE,
    CompletesAndClaims,
    check_ack_state,
    check_lease,
    check_limit,
    check_max_wait,
    check_result_ttl,
    check_run_at,
    check_spec,
    check_when,
    stale_claim,
    undecodable_error,
)
from delayq.backends.base import Completion
from delayq.backends.redis._connection import Connection, mask, split_url
from delayq.backends.redis._fields import job_of, optional_float, pairs, when_arg
from delayq.backends.redis._keys import (
    DEFAULT_PREFIX,
    DEFAULT_QUEUE,
    FINISHED_INDEX,
    KEY_NAMES,
    queue_keys,
)
from delayq.backends.redis._schedules import RedisSchedules
from delayq.backends.redis._waiting import Waiting
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
    Job,
    JobSpec,
    JobState,
    OnConflict,
    RescheduleOutcome,
    Stats,
    check_on_conflict,
)

__all__ = ["RedisBackend"]

_RECOVER_PER_CLAIM = 1000  # expired leases returned per claim call (bounds script time)

log = logging.getLogger("delayq.redis")


class RedisBackend(RedisSchedules, CompletesAndClaims):
    """A :class:`~delayq.backends.base.Backend` on Redis (see the package docstring).

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

    Its parts: ``_conn`` (clients, scripts, error mapping; ``_connection.py``)
    and ``_wakes`` (blocked waits and wake-ups; ``_waiting.py``, which holds
    the only lock). Everything here is set in ``__init__`` and not reassigned.
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
        redis_url, url_options = split_url(url)
        queue = url_options.get("queue", queue)
        prefix = url_options.get("prefix", prefix)
        result_ttl = url_options.get("result_ttl", result_ttl)
        expiry_events = url_options.get("expiry_events", expiry_events)
        for name, value in (("queue", queue), ("prefix", prefix)):
            if not isinstance(value, str) or not value or any(c in value for c in "{}"):
                raise InvalidOption(f"{name} must be a non-empty str without braces, got {value!r}")
        self.url = mask(url)
        self.queue = queue
        self.prefix = prefix
        self._result_ttl = check_result_ttl(result_ttl)
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
            "socket_keepalive": True,
            **(client_options or {}),
        }
        # A claim's record serves its one retry, which follows a lost reply
        # within about one socket timeout: keep it for two, and 5 s more.
        self._replay_ms = int((2 * socket_timeout + 5) * 1000)
        self._conn = Connection(redis_url, self.url, options)
        self._redis = self._conn.client
        self._db = self._conn.db
        self._wakes = Waiting(
            self._conn,
            self._keys,
            queue=queue,
            clock=self._clock,
            expiry_events=self._expiry_events,
            next_wake=lambda: self._run("next_wake", retry=True),
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
            raise ConfigurationError(f"RedisBackend needs a redis:// URL, got {mask(url)!r}")
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"RedisBackend(url={self.url!r}, queue={self.queue!r}, prefix={self.prefix!r})"

    # -- internals ------------------------------------------------------------
    def _check_server(self, configure: bool) -> None:
        """Refuse a server that may evict pending jobs; set up expiry events if asked."""
        info = self._call(self._redis.info, retry=True)
        major = int(str(info.get("redis_version", "7")).split(".")[0] or 7)
        if major < 7:
            self._conn.use_unflagged_scripts()
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
    ) -> Any:
        """Run script ``name`` with the queue's fixed keys plus ``keys``, the four
        common arguments (see ``_lib.lua``) plus ``args``."""
        self._check_open()
        full = [
            self._keys["job:"],
            self._now_arg(now),
            repr(self._result_ttl * 1000),
            self._keys["shadow:"] if self._expiry_events else "",
            *args,
        ]
        return self._conn.script(name, [*self._key_list, *keys], full, retry=retry)

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
                job_of(job_id, pairs(flat))
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
        self._wakes.woke(reply[1])
        return [EnqueueOutcome(o) for o in reply[2:]]

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
        # The request key makes the one retry safe: if the first call ran but its
        # reply was lost, the retry finds the key and returns that call's claims.
        request = f"{self._keys['claim:']}{uuid.uuid4().hex[:16]}"
        reply = self._run(
            "claim",
            [limit, repr(lease), _RECOVER_PER_CLAIM, self._replay_ms, PURGE_BATCH],
            now=now,
            retry=True,
            keys=[request],
        )
        claimed_at = float(reply[0])
        lease_until = float(reply[1])
        self._wakes.woke(reply[3])  # the new lease ends before anything waiters here wait for
        if now is None and self._clock is None:  # the hint is on the server's clock
            ms = optional_float(reply[2])
            self._wakes.set_hint(ms)
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
        reply = self._run("ack", [claim.job.id, claim.token, state.value, outcome or ""])
        if not int(reply[0]):
            raise self._stale(claim, reply)

    def retry(self, claim: Claim, run_at: float, error: str) -> None:
        reply = self._run("retry", [claim.job.id, claim.token, repr(check_run_at(run_at)), error])
        if not int(reply[0]):
            raise self._stale(claim, reply)
        self._wakes.woke(reply[1])

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
        self._wakes.woke(reply[0])
        return [
            None if int(answer[0]) else self._stale(item.claim, answer)
            for item, answer in zip(items, reply[1:], strict=True)
        ]

    def extend(self, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        reply = self._run("extend", [claim.job.id, claim.token, repr(lease)])
        if not int(reply[0]):
            raise self._stale(claim, reply)
        job = job_of(claim.job.id, pairs(reply[1]))
        assert job.lease_until is not None
        return replace(claim, job=job, lease_until=job.lease_until)

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
        others = [JobState.RUNNING, *FINISHED_INDEX] if state is None else [state]
        for other in others:
            if other is JobState.SCHEDULED:
                continue
            index = self._keys["running" if other is JobState.RUNNING else FINISHED_INDEX[other]]
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
            next_due=optional_float(r[7]),
        )

    def dead_letters(self, *, limit: int = 100) -> list[Job]:
        limit = check_limit(limit)
        self._check_open()
        ids = self._members(lambda: self._redis.zrevrange(self._keys["dead"], 0, limit - 1))
        return [j for j in self._fetch(ids) if j.state is JobState.DEAD]

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        reply = self._run("requeue_dead", [job_id, when_arg(*check_when(run_at, delay))])
        if not int(reply[0]):
            return False
        self._wakes.woke(reply[1])
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
    def close(self) -> None:
        """Close the connections and wake every waiter. Idempotent."""
        if self._wakes.closed:
            return
        self._wakes.close()
        self._conn.close()
