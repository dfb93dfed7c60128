"""Waiting for due jobs without polling: LISTEN/NOTIFY, filtered by due time.

Each store handle that waits owns one listener: a daemon thread holding one
connection that ``LISTEN``\\ s on the queue's channel. A notification's payload
is a due time (epoch seconds on the deciding clock). Waiters register the time
they sleep toward (the head of the due set or the next lease end); the
listener wakes them only when a notification is earlier than that, so jobs
scheduled behind the head cost a sleeping worker nothing: no wake-up, no query.

Who notifies:

* the store's own writes (enqueue, retry, release, reschedule, requeue), after
  their commit, when what they scheduled is now the earliest scheduled job
  (``Statements.head_check``): checked after the commit, so a worker that read
  the head before that commit is always told;
* an enqueue inside a caller's transaction, unconditionally: ``NOTIFY`` is
  delivered on commit and dropped on rollback, so a job exists for the workers
  exactly when the caller's transaction commits.

The LISTEN connection has TCP keepalives and sends ``SELECT 1`` after ten idle
seconds, so a half-open connection is noticed and replaced like a dropped one.

A wake-up is an optimisation, never the only path: while the listener's
connection is down (a server restart, ``pg_terminate_backend``) waits are cut
to :data:`FALLBACK_WAIT` and a warning is logged once per outage; after it
reconnects every waiter is woken to read the schedule again, since a
notification sent meanwhile was lost.

Lock rule: ``cond``'s lock guards ``gen``, ``waiters``, ``seq``, ``epoch``,
``log``, ``listening``, ``closed`` and ``thread``. No query runs under it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["FALLBACK_WAIT", "Listener", "channel_name"]

FALLBACK_WAIT = 0.5
"""Longest wait (seconds) while notifications cannot be received."""

_RECONNECT_PAUSES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
_LOG_SIZE = 256  # due times heard, kept for waiters that read the schedule earlier
_POLL_STOP = 1.0  # seconds between checks of the stop flag while idle (no query)
_HEARTBEAT_EVERY = 10  # idle polls between two ``SELECT 1`` on the LISTEN connection

log = logging.getLogger("delayq.postgres")


def channel_name(schema: str, queue: str) -> str:
    """The NOTIFY channel of a queue (hashed: channel names are short identifiers)."""
    digest = hashlib.sha1(f"{schema}\0{queue}".encode()).hexdigest()[:16]
    return f"delayq_{digest}"


class Listener:
    """One LISTEN connection per store handle, feeding local waiters (see the module doc).

    ``connect`` opens a fresh autocommit psycopg connection; it is called on
    the listener thread only.
    """

    def __init__(self, connect: Callable[[], Any], channel: str, *, enabled: bool = True) -> None:
        self._connect = connect
        self.enabled = enabled  # False: poll-only, no thread, no connection
        self.channel = channel
        self.cond = threading.Condition(threading.Lock())
        self.gen = 0  # bumped by every wake-up that concerns the waiters
        self.waiters: dict[int, float] = {}  # waiter id -> due time it sleeps toward
        # Every due time heard, numbered: a waiter that read the schedule before it
        # registered (a claim's hint) checks what arrived since. ``epoch`` counts the
        # events after which nothing earlier may be trusted (reconnects, wake()).
        self.seq = 0
        self.epoch = 0
        self.log: deque[tuple[int, float]] = deque(maxlen=_LOG_SIZE)
        self.listening = False
        self.closed = False
        self.thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._warned = False

    # -- waiters --------------------------------------------------------------
    def start(self, timeout: float = 5.0) -> bool:
        """Start the thread if needed; True once it listens (False: fall back)."""
        with self.cond:
            if self.closed or not self.enabled:
                return False
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name=f"delayq-listen-{self.channel}", daemon=True
                )
                self.thread.start()
        self._ready.wait(timeout)
        with self.cond:
            return self.listening

    def wake(self) -> None:
        """Wake every waiter (interrupt, close, or a change made by this handle)."""
        with self.cond:
            self.gen += 1
            self.epoch += 1
            self.cond.notify_all()

    def heard(self, due: float) -> None:
        """A job due at ``due`` committed: wake the waiters that sleep past it."""
        with self.cond:
            self.seq += 1
            self.log.append((self.seq, due))
            if any(due < until for until in self.waiters.values()):
                self.gen += 1
                self.cond.notify_all()

    def mark(self) -> tuple[int, int]:
        """Where the log is now: ``(epoch, seq)``, taken before reading the schedule."""
        with self.cond:
            return self.epoch, self.seq

    def heard_since(self, mark: tuple[int, int], until: float) -> bool:
        """Whether anything due before ``until`` was heard after ``mark`` (or the log
        cannot tell: a reconnect, a wake-up, or more arrivals than it keeps). Lock held.

        While the connection is down nothing is heard: the caller's wait is capped
        at :data:`FALLBACK_WAIT` instead (returning here would make a claim loop spin)."""
        epoch, seq = mark
        if epoch != self.epoch:
            return True
        if self.log and self.log[0][0] > seq + 1:
            return True  # entries after ``mark`` fell out of the log
        return any(n > seq and due < until for n, due in self.log)

    # -- the thread -------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while True:
            with self.cond:
                if self.closed:
                    return
            try:
                conn = self._connect()
            except Exception as exc:
                self._lost(exc)
                self._pause(failures)
                failures += 1
                continue
            try:
                with self.cond:
                    if self.closed:
                        return
                conn.execute(f'LISTEN "{self.channel}"')
                with self.cond:
                    self.listening = True
                    self.gen += 1  # notifications may have been missed: look again
                    self.epoch += 1
                    self.cond.notify_all()
                if self._warned:
                    log.warning("delayq: LISTEN on %s restored", self.channel)
                    self._warned = False
                self._ready.set()
                failures = 0
                idle = 0
                while True:
                    with self.cond:
                        if self.closed:
                            return
                    idle += 1
                    for note in conn.notifies(timeout=_POLL_STOP):
                        idle = 0
                        try:
                            due = float(note.payload)
                        except ValueError:
                            due = float("-inf")  # unknown: wake everyone
                        self.heard(due)
                    if idle >= _HEARTBEAT_EVERY:
                        # A half-open connection (a NAT or firewall dropped it) is
                        # noticed by the write and the keepalives, not hours later.
                        conn.execute("SELECT 1")
                        idle = 0
            except Exception as exc:
                with self.cond:
                    if self.closed:
                        return
                self._lost(exc)
                self._pause(failures)
                failures += 1
            finally:
                with contextlib.suppress(Exception):
                    conn.close()

    def _lost(self, exc: BaseException) -> None:
        with self.cond:
            if self.listening:  # a failed reconnect changes nothing for the waiters
                self.listening = False
                self.gen += 1
                self.epoch += 1
                self.cond.notify_all()
        self._ready.set()  # a first connect that fails must not block start()
        if not self._warned:
            log.warning(
                "delayq: LISTEN on %s lost (%s); waits are capped at %.1fs until it is back",
                self.channel,
                exc,
                FALLBACK_WAIT,
            )
            self._warned = True

    def _pause(self, failures: int) -> None:
        pause = _RECONNECT_PAUSES[min(failures, len(_RECONNECT_PAUSES) - 1)]
        with self.cond:
            if not self.closed:
                self.cond.wait(pause)

    def close(self) -> None:
        """Stop the thread and wake every waiter. Idempotent."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.listening = False
            self.gen += 1
            self.cond.notify_all()
        # The thread notices ``closed`` within _POLL_STOP and closes its connection
        # itself (a connection is not shared between threads, so not closed here).
