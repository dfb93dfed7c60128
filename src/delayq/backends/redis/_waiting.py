"""Waiting for due jobs without polling, and waking the waiters (see the package docstring).

:class:`Wakeups` is the part of a store that blocks in ``BLPOP`` on the
queue's wake list, keeps the exact deadline on the client (``CLIENT
UNBLOCK``), and wakes the waiters of this process. With an injected test
clock it waits on that clock instead, woken only by handles in this process.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import redis

from delayq.backends.redis._connection import Connection, mapped_errors
from delayq.backends.redis._expiry import (
    ChannelSubscriber,
    expiry_subscriber,
    results_subscriber,
)
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import BackendError, BackendUnavailable

__all__ = ["Wakeups"]

_WAKE_KEY_TTL_MS = 60_000  # private wake lists vanish if their waiter is gone
_UNBLOCK_GRACE = 0.25  # seconds to wait for the reply after CLIENT UNBLOCK
_LOCAL_WAIT = 0.010  # waits up to this long sleep locally instead of BLPOP
# A wait toward a due time longer than _WARM_AFTER returns _WARM_LEAD early, so
# the caller's next claim and wait warm up before the job is due (see wait).
_WARM_AFTER = 0.100
_WARM_LEAD = 0.050
_HINT_MAX_AGE = 1.0  # seconds a claim's "next due" hint is trusted by wait
_OUTAGE_PAUSE = 0.5  # seconds wait pauses at most when Redis is unreachable
_OUTAGE_POLL = 0.05  # while it pauses, it checks this often whether Redis is back
_TICK = 0.15  # Redis ends BLPOP timeouts on its ~100 ms cron tick: a bound on the delay
_BOUNDED_BLPOP = 2.0  # seconds one BLPOP of a bounded wait lasts at most
_EARLIER_MS = 1.0  # a due time learnt from a wake token this much earlier is news
_SHARED, _PRIVATE = "shared", "private"  # which wake list ended a BLPOP

log = logging.getLogger("delayq.redis")


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


def _source(key: str, reply: Any) -> str | None:
    """Which list a BLPOP reply came from: ``_PRIVATE`` (``key``), ``_SHARED``, or None."""
    if reply is None:
        return None
    return _PRIVATE if reply[0] == key else _SHARED


class Wakeups:
    """Blocked waits of one store and the wake-ups of its waiters in this process.

    ``next_wake`` runs the ``next_wake`` script (``"<ms until> <epoch ms>"`` of
    the next due job or lease expiry, ``""`` for none).

    Lock rule: ``_lock`` guards ``_waiters``, ``_in_redis``, ``closed``,
    ``_subscriber`` and ``_results``. The hint is per thread (``threading.local``).
    """

    def __init__(
        self,
        conn: Connection,
        keys: dict[str, str],
        *,
        queue: str,
        clock: Clock | None,
        expiry_events: bool,
        next_wake: Callable[[], Any],
    ) -> None:
        self._conn = conn
        self._keys = keys
        self.queue = queue
        self._clock = clock
        self._expiry_events = expiry_events
        self._next_wake = next_wake
        self._lock = threading.Lock()
        self._waiters: dict[str, threading.Event] = {}  # private wake list -> local event
        # private wake list -> client id of its BLPOP connection (None until known)
        self._in_redis: dict[str, int | None] = {}
        # per thread: (monotonic, seconds to next, its epoch ms) of the last claim
        self._hint = threading.local()
        self.closed = False
        self.unblock = True  # CLIENT ID / UNBLOCK allowed (else bounded waits; set once)
        self._subscriber: ChannelSubscriber | None = None
        self._results: ChannelSubscriber | None = None  # results told by other processes
        self._local = _local_wake(f"{conn.address}/{keys['due']}")

    def set_hint(self, ms: float | None, at_ms: float | None) -> None:
        """Remember (for this thread) the next due time a claim just reported:
        ``ms`` from now, at ``at_ms`` (epoch ms on the store's clock)."""
        until = None if ms is None else ms / 1000
        self._hint.value = (SYSTEM_CLOCK.monotonic(), until, at_ms)

    def wait(self, max_wait: float) -> None:
        """Block until a job may be due, at most ``max_wait`` seconds.

        Never raises for an unreachable Redis: it pauses up to half a second and
        returns, so the caller's next ``claim`` reports the outage.

        The shared wake token passes on: a waiter it wakes that learns of an
        earlier due time (not due yet) than it knew pushes the token again, so
        every blocked waiter learns of it in turn (one wake-up each) and none
        depends on the first one staying alive until then. A waiter that is
        being stopped when it takes the token puts it back.
        """
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
            until, known = self._until_next()
            timeout = max_wait if until is None else min(max_wait, until)
            if timeout <= 0:
                return
            if timeout <= _LOCAL_WAIT:
                # Too short for a BLPOP round trip to pay off: an earlier job
                # arriving meanwhile waits at most this long.
                event.wait(timeout)
                return
            with self._lock:
                self._in_redis.setdefault(key, None)  # now interrupt() pushes to its list
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
            if event.is_set():
                return
            if self._block(key, timeout) == _SHARED:
                self._took_shared(event, known)
        except BackendUnavailable as exc:
            # Waiting is not an operation the caller can fail on: pause briefly
            # and let its next claim report the outage (and back off).
            log.debug("wait_for_due: %s; pausing", exc)
            self._outage_pause(event, min(max_wait, _OUTAGE_PAUSE))
        finally:
            with self._lock:
                del self._waiters[key]
                self._in_redis.pop(key, None)

    def _took_shared(self, event: threading.Event, known: float | None) -> None:
        """This waiter took the queue's wake token: pass it on when others need it.

        ``known`` is the epoch ms (store clock) of the next due job or lease
        expiry this waiter knew of before (None: none). When the token announces
        an earlier one that is not due yet, the next waiter gets the token too;
        when this waiter is being stopped, the token goes back untouched.
        """
        if event.is_set():
            self._push_shared()
            return
        until, head = self._until_next()
        if until is None or head is None or until <= _LOCAL_WAIT:
            return  # nothing to wait for, or due now: this caller claims it
        if known is None or head < known - _EARLIER_MS:
            self._push_shared()

    def _outage_pause(self, event: threading.Event, pause: float) -> None:
        """Pause up to ``pause`` seconds while Redis is unreachable, returning as soon
        as it answers again (or a local wake-up comes): the caller resumes at once."""
        deadline = SYSTEM_CLOCK.monotonic() + pause
        while not event.wait(min(_OUTAGE_POLL, max(0.0, deadline - SYSTEM_CLOCK.monotonic()))):
            if SYSTEM_CLOCK.monotonic() >= deadline:
                return
            try:
                self._conn.call(self._conn.node().ping)
            except BackendError:
                continue
            return

    def _push_shared(self) -> None:
        """Put the shared wake token back for the next waiter (at most one in the list)."""
        pipe = self._conn.node().pipeline(transaction=False)
        pipe.lpush(self._keys["wake"], "1")
        pipe.ltrim(self._keys["wake"], 0, 0)
        try:
            self._conn.call(pipe.execute)
        except BackendError as exc:
            log.warning(
                "delayq: could not pass the wake-up token on (%s); other "
                "workers learn of the due job by their own deadline",
                exc,
            )

    def _until_next(self) -> tuple[float | None, float | None]:
        """Seconds until the next due job or lease expiry, and its epoch ms on the
        store's clock; (None, None): nothing to wait for.

        Uses the hint the last ``claim`` of this thread returned when it is
        fresh (saving a round trip in a busy worker's claim/wait loop), else
        asks the server.
        """
        hint: tuple[float, float | None, float | None] | None = getattr(self._hint, "value", None)
        self._hint.value = None
        if hint is not None:
            age = SYSTEM_CLOCK.monotonic() - hint[0]
            if age < _HINT_MAX_AGE:
                return (None, None) if hint[1] is None else (hint[1] - age, hint[2])
        reply = self._next_wake()
        if reply == "":
            return None, None
        ms, at = reply.split()
        return float(ms) / 1000, float(at)

    def _wait_on_clock(self, clock: Clock, max_wait: float) -> None:
        local = self._local
        deadline = clock.monotonic() + max_wait
        with local.cond:
            gen = local.gen
        while True:
            reply = self._next_wake()
            with local.cond:
                if local.gen != gen or self.closed:
                    return
                left = deadline - clock.monotonic()
                if reply != "":
                    left = min(left, float(reply.split()[0]) / 1000)
                if left <= 0:
                    return
                clock.wait(local.cond, left)
                if local.gen != gen or self.closed:
                    return

    def _block(self, key: str, timeout: float) -> str | None:
        """BLPOP the wake lists for ``timeout`` seconds, ending it on time ourselves.

        The server only notices BLPOP timeouts on its cron tick (~100 ms), so the
        client waits on the socket with its own deadline and ends the BLPOP with
        ``CLIENT UNBLOCK`` (from another connection) when that passes first.
        Returns ``_SHARED`` when the queue's wake token ended it, ``_PRIVATE``
        when an interrupt did, None when the time ran out. The private list comes
        first in the BLPOP: when both hold a token, the shared one stays for
        another waiter.
        """
        if not self.unblock:
            return self._block_bounded(key, timeout)
        pool = self._conn.blocking_node().connection_pool
        with mapped_errors(self._conn.url):
            conn = pool.get_connection()
        healthy = False
        reply: Any = None
        try:
            with mapped_errors(self._conn.url):
                conn.send_packed_command(
                    conn.pack_commands(
                        [("CLIENT", "ID"), ("BLPOP", key, self._keys["wake"], f"{timeout:.3f}")]
                    )
                )
                try:
                    client_id = conn.read_response()
                except redis.exceptions.NoPermissionError:
                    self._no_unblock("CLIENT ID is refused")
                    healthy = conn.can_read(timeout=timeout + _TICK)  # the BLPOP's reply
                    if healthy:
                        reply = conn.read_response()
                    return _source(key, reply)
                with self._lock:
                    if key in self._in_redis:
                        self._in_redis[key] = int(client_id)
                if not conn.can_read(timeout=timeout):
                    try:
                        self._conn.node().client_unblock(client_id)
                    except redis.exceptions.NoPermissionError:
                        self._no_unblock("CLIENT UNBLOCK is refused")
                        if not conn.can_read(timeout=_TICK):
                            return None
                    if not conn.can_read(timeout=_UNBLOCK_GRACE):
                        return None  # the connection is stuck: dropped in ``finally``
                reply = conn.read_response()  # nil: timed out or unblocked
                healthy = True
        finally:
            if not healthy:
                conn.disconnect()
            pool.release(conn)
        return _source(key, reply)

    def _block_bounded(self, key: str, timeout: float) -> str | None:
        """``_block`` without CLIENT ID / CLIENT UNBLOCK (a restricted ACL): BLPOP
        for the time less one server timeout tick, then wait out the rest here,
        so the wait still never ends late; an interrupt still pushes a token."""
        deadline = SYSTEM_CLOCK.monotonic() + timeout
        while (blocking := deadline - SYSTEM_CLOCK.monotonic() - _TICK) > _LOCAL_WAIT:
            # Each BLPOP stays well within the socket timeout.
            seconds = round(min(blocking, _BOUNDED_BLPOP), 3)
            reply = self._conn.call(
                functools.partial(
                    self._conn.blocking_node().blpop, [key, self._keys["wake"]], seconds
                )
            )
            if reply is not None:
                return _source(key, reply)
        with self._lock:
            event = self._waiters.get(key)
        left = deadline - SYSTEM_CLOCK.monotonic()
        if event is not None and left > 0:
            event.wait(left)
        return None

    def _no_unblock(self, why: str) -> None:
        if self.unblock:
            self.unblock = False
            log.warning(
                "delayq: %s on %s (a restricted ACL?): waits end by BLPOP timeouts, "
                "each within one 100 ms server tick of its deadline, then a local wait",
                why,
                self._conn.url,
            )

    def check_unblock(self) -> None:
        """At start-up: fall back to bounded waits when CLIENT ID / UNBLOCK are refused."""
        try:
            client_id = self._conn.call(self._conn.node().client_id)
            self._conn.call(functools.partial(self._conn.node().client_unblock, client_id))
        except BackendError as exc:
            if isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
                self._no_unblock(f"CLIENT ID / UNBLOCK are refused ({exc.__cause__})")
            else:
                raise

    def woke(self, woke: Any) -> None:
        """The head of the due set changed: wake this process's waiters at once."""
        if int(woke):
            self.wake_local()

    def wake_local(self) -> None:
        """Wake every waiter of this store in this process.

        A waiter blocked in Redis gets a token on its private list; when Redis
        refuses that push (out of memory, a lost connection), its BLPOP is ended
        with ``CLIENT UNBLOCK`` instead, and when that fails too it says so: the
        waiter then wakes by its own deadline.
        """
        self._local.notify()
        with self._lock:
            blocked = dict(self._in_redis)
            for event in self._waiters.values():
                event.set()
        if not blocked:
            return
        pipe = self._conn.node().pipeline(transaction=False)
        for key in blocked:
            pipe.lpush(key, "1")
            pipe.pexpire(key, _WAKE_KEY_TTL_MS)
        try:
            self._conn.call(pipe.execute)
            return
        except BackendError as exc:
            pushed_error: BackendError = exc
        for client_id in blocked.values():
            if client_id is None:
                continue
            try:
                self._conn.call(functools.partial(self._conn.node().client_unblock, client_id))
            except BackendError as exc:
                log.warning(
                    "delayq: could not wake a waiter blocked in Redis (%s; then %s); "
                    "it wakes by its own deadline",
                    pushed_error,
                    exc,
                )

    def _ensure_subscriber(self) -> None:
        with self._lock:
            if self._subscriber is None and not self.closed:
                self._subscriber = expiry_subscriber(
                    subscriber=lambda: self._conn.blocking_node().pubsub(
                        ignore_subscribe_messages=True
                    ),
                    db=self._conn.db,
                    shadow=self._keys["shadow:"],
                    queue=self.queue,
                    wake=self.wake_local,
                )

    def listen_for_results(self, on_finished: Callable[[list[str]], None]) -> bool:
        """Hear the ids of the jobs other processes finish with a result (once)."""
        with self._lock:
            if self.closed:
                return False
            if self._results is None:
                self._results = results_subscriber(
                    subscriber=lambda: self._conn.blocking_node().pubsub(
                        ignore_subscribe_messages=True
                    ),
                    channel=self._keys["done"],
                    queue=self.queue,
                    on_finished=on_finished,
                )
            return True

    def close(self) -> None:
        """Wake every waiter and stop the subscribers. Idempotent."""
        with self._lock:
            if self.closed:
                return
            keys = list(self._waiters)
            subscriber, self._subscriber = self._subscriber, None
            results, self._results = self._results, None
        if keys:
            self.wake_local()
        with self._lock:
            self.closed = True
        self._local.notify()
        for sub in (subscriber, results):
            if sub is not None:
                sub.stop()
