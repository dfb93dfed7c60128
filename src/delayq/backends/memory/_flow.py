"""The memory store's flow control: due jobs by priority and group, limits, slots.

:class:`ReadyJobs` holds the jobs that are due (moved here from the time heap by
``claim``) and hands them out in claim order: the highest priority first; within
one priority, the groups in turn (round-robin, so a group with a big backlog
gets its share and no more); within one group, due order (ties FIFO). A job
whose key is at its concurrency limit is parked under its key (no head-of-line
blocking: the next job is tried) and comes back when a slot of that key frees
or a limit changes. Only touched under ``MemoryBackend._lock``; entries use the
store's lazy deletion (live while the record's version matches).
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from delayq.backends._limits import check_limit_args, check_pattern, check_version
from delayq.flow import Limit, LimitRecord, admit_rate, pick_limit

__all__ = ["FlowState", "MemoryLimits", "ReadyJobs", "Verdict"]

Entry = tuple[float, int, int, str]  # (run_at, seq, version, id)


@dataclass(slots=True)
class _Level:
    """The due jobs of one priority: a heap per group and the groups' turn."""

    groups: dict[str, list[Entry]] = field(default_factory=dict)
    turn: deque[str] = field(default_factory=deque)


class ReadyJobs:
    """Due jobs in claim order (see the module docstring)."""

    def __init__(self) -> None:
        self._levels: dict[int, _Level] = {}

    def add(self, priority: int, group: str, entry: Entry) -> None:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
        heap = level.groups.get(group)
        if heap is None:
            heap = level.groups[group] = []
            level.turn.append(group)
        heapq.heappush(heap, entry)

    def _front(self, live: Callable[[Entry], bool]) -> tuple[_Level, str] | None:
        """The level and group whose turn it is, dead entries dropped on the way."""
        while self._levels:
            priority = max(self._levels)
            level = self._levels[priority]
            while level.turn:
                group = level.turn[0]
                heap = level.groups[group]
                while heap and not live(heap[0]):
                    heapq.heappop(heap)
                if heap:
                    return level, group
                level.turn.popleft()
                del level.groups[group]
            del self._levels[priority]
        return None

    def peek(self, live: Callable[[Entry], bool]) -> Entry | None:
        """The next entry in claim order, left in place, or None."""
        front = self._front(live)
        return None if front is None else front[0].groups[front[1]][0]

    def pop(self, live: Callable[[Entry], bool]) -> Entry | None:
        """Take the next entry in claim order (its group's turn passes), or None."""
        front = self._front(live)
        if front is None:
            return None
        level, group = front
        heap = level.groups[group]
        entry = heapq.heappop(heap)
        level.turn.popleft()
        if heap:
            level.turn.append(group)  # its next job waits for the other groups' turn
        else:
            del level.groups[group]
        return entry


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the limits say about starting a job now: ``ok``; else ``parked``
    (its key is at its concurrency limit) or ``throttled_until`` a time."""

    ok: bool
    throttled_until: float | None = None


_OK = Verdict(True)
_PARKED = Verdict(False)


class FlowState:
    """Limits, the live leases per key, each key's rate state and parked jobs."""

    def __init__(self) -> None:
        self.limits: dict[str, tuple[Limit, int]] = {}  # pattern -> (limit, version)
        self._by_key: dict[str, Limit | None] = {}  # resolved limit per key (cache)
        self._running: dict[str, set[str]] = {}  # key -> ids of jobs holding a slot
        self._holder: dict[str, str] = {}  # job id -> key whose slot it holds
        self._tat: dict[str, float] = {}  # key -> theoretical arrival time (rate)
        self._promised: dict[str, float] = {}  # key -> next moment to give a throttled job
        self.parked: dict[str, list[tuple[int, str, Entry]]] = {}  # key -> (priority, group, entry)

    def limit_of(self, key: str) -> Limit | None:
        try:
            return self._by_key[key]
        except KeyError:
            found = self._by_key[key] = pick_limit([lim for lim, _v in self.limits.values()], key)
            return found

    def changed(self) -> list[tuple[int, str, Entry]]:
        """Forget resolved limits (a limit was written or deleted) and return
        every parked job, to be tried again."""
        self._by_key.clear()
        back = [item for items in self.parked.values() for item in items]
        self.parked.clear()
        return back

    def decide(self, key: str | None, now: float) -> Verdict:
        """May a job of ``key`` start at ``now``? A job over the rate is given the
        next free moment after those already given to the key's other throttled
        jobs, so a backlog is spread over the coming slots, not woken at once."""
        if key is None:
            return _OK
        limit = self.limit_of(key)
        if limit is None:
            return _OK
        if limit.concurrency is not None and len(self._running.get(key, ())) >= limit.concurrency:
            return _PARKED
        if limit.rate is not None:
            allowed, at = admit_rate(self._tat.get(key), now, limit.rate, limit.burst)
            if not allowed:
                at = max(at, self._promised.get(key, at))
                self._promised[key] = at + limit.rate.interval
                return Verdict(False, at)
        return _OK

    def start(self, key: str | None, job_id: str, now: float) -> None:
        """Record a start that :meth:`decide` allowed: a slot (counted for every
        keyed job, so a limit declared later counts the jobs already running)
        and a rate step."""
        if key is None:
            return
        limit = self.limit_of(key)
        if limit is not None and limit.rate is not None:
            _ok, tat = admit_rate(self._tat.get(key), now, limit.rate, limit.burst)
            self._tat[key] = tat
        self._running.setdefault(key, set()).add(job_id)
        self._holder[job_id] = key

    def park(self, key: str, priority: int, group: str, entry: Entry) -> None:
        self.parked.setdefault(key, []).append((priority, group, entry))

    def stop(self, job_id: str) -> list[tuple[int, str, Entry]]:
        """The job left RUNNING: free its slot; return its key's parked jobs
        (to be tried again). Idempotent; a job without a slot frees nothing."""
        key = self._holder.pop(job_id, None)
        if key is None:
            return []
        running = self._running[key]
        running.discard(job_id)
        if not running:
            del self._running[key]
        return self.parked.pop(key, [])


class MemoryLimits:
    """Limit records in :class:`FlowState` (the reference ``LimitStore``).

    The host (``MemoryBackend``) provides ``_lock``, ``_flow`` and
    ``_limits_changed()`` (tries the parked jobs again and wakes the waiters).
    """

    _lock: threading.Lock
    _flow: FlowState

    def _limits_changed(self) -> None:
        raise NotImplementedError

    def put_limit(self, limit: Limit, *, version: int) -> int | None:
        limit, version = check_limit_args(limit, version)
        with self._lock:
            table = self._flow.limits
            current = table.get(limit.pattern)
            if (0 if current is None else current[1]) != version:
                return None
            table[limit.pattern] = (limit, version + 1)
            self._limits_changed()
            return version + 1

    def get_limit(self, pattern: str) -> LimitRecord | None:
        pattern = check_pattern(pattern)
        with self._lock:
            found = self._flow.limits.get(pattern)
            return None if found is None else LimitRecord(*found)

    def list_limits(self) -> list[LimitRecord]:
        with self._lock:
            table = self._flow.limits
            return [LimitRecord(*table[p]) for p in sorted(table)]

    def delete_limit(self, pattern: str, *, version: int | None = None) -> bool:
        pattern = check_pattern(pattern)
        if version is not None:
            version = check_version(version)
        with self._lock:
            table = self._flow.limits
            found = table.get(pattern)
            if found is None or (version is not None and found[1] != version):
                return False
            del table[pattern]
            self._limits_changed()
            return True
