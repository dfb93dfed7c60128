"""The in-flight table: every claim the worker holds, and the one lock over them.

A claim is in the table from the moment it is claimed until its outcome is
recorded in the store (or the worker gives up on it). It is *ready* (claimed,
waiting for a handler thread: a prefetched job), *running*, or *done* (its
outcome decided, waiting in or retrying the group commit). The table also
holds the few facts the worker's parts decide by: the handler slots in use,
whether a claim is in progress, whether the last claim found a backlog, the
stop request, and the statistics.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from delayq.job import Claim
from delayq.worker._stats import StatsBook

__all__ = ["InFlight", "InFlightTable"]


@dataclass(eq=False, slots=True)
class InFlight:
    """One claimed job.

    ``lock`` serialises the store calls made for this claim (a lease renewal by
    the lease keeper, the final ack/retry/bury/release by the group commit), so
    a renewal never races the final call. The other fields are guarded by the
    table's lock. ``lease_deadline`` is when the lease runs out on the local
    monotonic clock (counted from before the claim or renewal was sent, so it
    is never later than the store's).
    """

    key: int
    claim: Claim
    mono_claimed: float
    lease_deadline: float
    renew_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    lease_lost: threading.Event = field(default_factory=threading.Event)  # ctx.lease_lost
    started: bool = False  # the handler was called
    started_mono: float = 0.0  # when (monotonic)
    mark_at: float = math.inf  # when the lease keeper reports the start to the store
    marked: bool = False  # the store knows the handler started
    done: bool = False  # the outcome is decided (the first to decide wins; later ones are fenced)
    lost: bool = False  # a renewal said the lease is gone
    abandoned: bool = False  # still running after the grace period: never recorded
    timeout_at: float = math.inf  # monotonic deadline of the running handler
    is_async: bool = False  # runs on the event loop (a timeout cancels it)
    cancel: Callable[[], object] | None = None  # cancels it, once it is on the loop
    body_alive: bool = False  # decided (timed out) while its handler still runs: abandoned work
    held: object = None  # a timed-out attempt's result, recorded once its handler really ends


class InFlightTable:
    """The claims held by one worker, and the state its parts share.

    Lock rule (as in ``queue.Queue``): ``lock`` must be held whenever any field
    below is read or changed; it is shared by two conditions. ``changed`` is
    notified when a claim leaves, a claim attempt ends, a stop is requested or
    a commit ends (the dispatcher, the drain and ``stop`` wait on it); ``work``
    when a claim becomes ready, a slot frees or a task is queued (handler
    threads wait on it); ``leases`` when a claim arrives whose renewal is
    earlier than the lease keeper's next wake-up (``keeper_until``), or the
    table closes. Nothing slow runs under the lock: no handler, no store call,
    no user callback.

    Abandoned work: ``abandoned`` counts handlers whose attempt was decided
    (timed out) while their body still runs (a sync thread, a cancelled task
    that goes on); at ``abandoned_cap`` the worker claims nothing more
    (``room_locked`` is 0) and reports itself unhealthy.

    Health: ``beats`` holds the monotonic time of the last loop turn of the
    ``dispatcher`` and the ``leases`` keeper; ``stuck_call`` the start of the
    store call each part is in right now (``dispatcher``: claim, ``leases``:
    extend_many, ``committer``: complete), absent when none; ``loop_blocked_since``
    when the asyncio loop stopped answering (None while it runs callbacks).
    """

    def __init__(
        self, *, concurrency: int, prefetch: int, grace: float, abandoned_cap: int | None = None
    ) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.work = threading.Condition(self.lock)
        self.leases = threading.Condition(self.lock)
        self.keeper_until = math.inf
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.records: dict[int, InFlight] = {}
        self.ready: deque[InFlight] = deque()  # claimed, not started (oldest first)
        self.tasks: deque[Callable[[], None]] = deque()  # small jobs for handler threads
        self.running = 0  # handler slots in use (at most ``concurrency``)
        self.claiming = False  # a claim (alone or with a commit) is on its way to the store
        self.backlog = False  # the last claim was full: more jobs are due than we hold
        self.stopping = False
        self.stop_mono: float | None = None
        self.grace = grace
        self.closed = False  # handler threads exit
        self.prefetch_paused = (
            False  # a prefetched claim waited too long: claim for free slots only
        )
        self.prefetch_resume = 0.0  # monotonic time prefetching may resume
        self.abandoned = 0
        self.holding = 0  # records whose (timed-out) result waits for its handler to end
        self.abandoned_cap = concurrency if abandoned_cap is None else abandoned_cap
        self.beats: dict[str, float] = {}
        self.stuck_call: dict[str, float] = {}
        self.loop_blocked_since: float | None = None
        self.mark_after = 1.0  # seconds after a handler's start the keeper reports it
        self.stats = StatsBook()
        self._keys = itertools.count(1)

    # -- claims ---------------------------------------------------------------------------
    def room_locked(self) -> int:
        """How many more claims the worker may hold now: free slots, plus the
        prefetch while a backlog exists; none while abandoned work is at its cap."""
        if self.abandoned >= self.abandoned_cap:
            return 0
        prefetch = self.prefetch if self.backlog and not self.prefetch_paused else 0
        # A record held for its abandoned handler has given its slot up.
        return self.concurrency + prefetch - (len(self.records) - self.holding)

    def add_claims_locked(
        self, claims: Sequence[Claim], mono_sent: float, lease: float, *, full: bool
    ) -> None:
        """Hold ``claims`` (claimed at ``mono_sent`` for ``lease`` seconds) as ready.

        ``full`` says the claim returned as many jobs as it asked for (a backlog).
        """
        self.claiming = False
        self.backlog = full
        if claims:
            deadline = mono_sent + lease
            renew_at = mono_sent + lease / 3
            records, ready, stats = self.records, self.ready, self.stats
            keys = self._keys
            for claim in claims:
                key = next(keys)
                rec = InFlight(key, claim, mono_sent, deadline, renew_at)
                records[key] = rec
                ready.append(rec)
                stats.lateness.add(claim.claimed_at - claim.due)
            stats.counts["claimed"] += len(claims)
            self.work.notify(len(claims))
            if renew_at < self.keeper_until:
                self.leases.notify()
        self.changed.notify_all()

    def claim_failed_locked(self) -> None:
        self.claiming = False
        self.changed.notify_all()

    # -- handler threads ------------------------------------------------------------------
    def take_work(self) -> InFlight | Callable[[], None] | None:
        """For a handler thread: the next task, or a ready claim once a slot is
        free (taking the slot), or None when the threads must exit. Blocks."""
        with self.lock:
            while True:
                if self.tasks:
                    return self.tasks.popleft()
                if self.ready and (self.running < self.concurrency or self.stopping):
                    self.running += 1
                    return self.ready.popleft()
                if self.closed:
                    return None
                self.work.wait()

    def add_task(self, task: Callable[[], None]) -> None:
        with self.lock:
            self.tasks.append(task)
            self.work.notify()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.work.notify_all()
            self.leases.notify_all()

    # -- deadlines ------------------------------------------------------------------------
    def take_stale_ready_locked(self, now: float, bound: float) -> list[InFlight]:
        """Take out of ``ready`` the claims that waited ``bound`` seconds or more
        while every slot is busy (to hand them back)."""
        stale: list[InFlight] = []
        if self.running >= self.concurrency and not self.stopping:
            while self.ready and self.ready[0].mono_claimed + bound <= now:
                stale.append(self.ready.popleft())
        return stale

    def next_stale_ready_locked(self, now: float, bound: float) -> float:
        """When to look for ready claims that waited too long (monotonic): when the
        oldest will have waited ``bound`` seconds, or ``bound`` from ``now`` if it
        already has while a slot is free (a handler thread is about to take it)."""
        if not self.ready or self.stopping:
            return math.inf
        deadline = self.ready[0].mono_claimed + bound
        if deadline <= now and self.running < self.concurrency:
            return now + bound
        return deadline
