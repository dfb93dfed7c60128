"""The in-memory reference backend: the contract, with nothing but a lock and three heaps.

:class:`MemoryBackend` is what the contract suite checks every other store
against, what users run their handler tests on (``delayq.testing`` exports it),
and what ``memory://`` opens. It is not durable: the jobs live as long as the
object.
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from delayq._validate import check_handler_names
from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    MAX_UNSTARTED,
    PURGE_BATCH,
    RELEASED_NOTE,
    TTL_STATES,
    CompletesInBatches,
    check_claim_now,
    check_lease,
    check_limit,
    check_list_cursor,
    check_max_wait,
    check_payload_at,
    check_payload_contains,
    check_preview,
    check_result_ttl,
    check_run_at,
    check_spec,
    check_when,
    clip_error,
    lease_expired_error,
    lease_expired_note,
    listed_payload,
    payload_matches,
    readable_json,
    resolve_conflicts,
    stale_claim,
    undecodable_error,
    unstarted_expired_error,
    unstarted_expired_note,
)
from delayq.backends._urls import merge_options, split_url
from delayq.backends.base import Completion
from delayq.backends.memory._flow import Entry, FlowState, MemoryLimits, ReadyJobs
from delayq.backends.memory._keyed import MemoryKeyed, release_key, sweep_released
from delayq.backends.memory._schedules import MemorySchedules
from delayq.backends.memory._workers import MemoryWorkers
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.codec import decode_payload
from delayq.errors import ConfigurationError, QueueClosed, StaleClaim
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
from delayq.keyed import KeyState

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _Record:
    """One stored job (mutable; only touched under ``MemoryBackend._lock``)."""

    id: str
    name: str
    payload: str  # JSON text, as stored by every backend
    run_at: float
    max_attempts: int
    backoff: dict[str, Any]
    misfire: str
    created_at: float
    updated_at: float
    seq: int  # enqueue order, breaks run_at ties (FIFO)
    state: JobState = JobState.SCHEDULED
    attempts: int = 0
    started: bool = False  # the current claim's handler is known to have started
    unstarted: int = 0  # leases that ran out with no recorded start
    last_error: str | None = None
    outcome: str | None = None
    lease_until: float | None = None
    token: int = 0
    version: int = 0  # bumped on every change that invalidates heap entries
    key: str | None = None  # flow control (delayq.flow)
    priority: int = 0
    group: str | None = None
    throttled_until: float | None = None
    result: str | None = None  # a succeeded job's return value (JSON text)

    def to_job(self, *, strict: bool = False) -> Job:
        """The job; ``strict`` (claim) raises on a payload that does not decode,
        otherwise (inspection) it is returned as its raw text."""
        return Job(
            id=self.id,
            name=self.name,
            payload=decode_payload(self.payload) if strict else readable_json(self.payload),
            run_at=self.run_at,
            state=self.state,
            attempts=self.attempts,
            max_attempts=self.max_attempts,
            backoff=json.loads(json.dumps(self.backoff)),  # a copy the caller may mutate
            misfire=self.misfire,
            created_at=self.created_at,
            updated_at=self.updated_at,
            last_error=self.last_error,
            outcome=self.outcome,
            lease_until=self.lease_until,
            key=self.key,
            priority=self.priority,
            group=self.group,
            throttled_until=self.throttled_until,
            result=self.result,
        )


@dataclass(slots=True)
class _NamedView:
    """The scheduled jobs of some handler names (a filtered claim's index): a time
    heap and a ready stage, like the store's own, fed by ``_schedule`` and
    ``_retry_parked`` beside them. Entries are the store's, with its lazy
    deletion, so a job claimed or changed through any view is dead in the others."""

    due: list[Entry] = field(default_factory=list)
    ready: ReadyJobs = field(default_factory=ReadyJobs)


class MemoryBackend(MemorySchedules, MemoryLimits, MemoryWorkers, MemoryKeyed, CompletesInBatches):
    """The reference :class:`~delayq.backends.base.Backend`, held in memory.

    Options (keyword-only): ``clock`` decides "now" whenever a method is not
    given ``now=`` (use :class:`~delayq.testing.FakeClock` in tests), and
    ``result_ttl`` is how long finished records (succeeded, cancelled, skipped)
    are kept, 7 days by default; they are purged lazily by later calls. Dead
    letters stay until purged or requeued.

    Ordering: jobs are claimed by ``(run_at, seq)`` where ``seq`` is the order in
    which the job was enqueued (or replaced); retries and reschedules keep it.
    With flow control, ``claim`` moves the due jobs into ``_ready``
    (:class:`~delayq.backends.memory._flow.ReadyJobs`: by priority, groups in
    turn) and takes them from there; a job whose key is at its concurrency
    limit is parked in ``_flow`` until a slot frees. A claim with ``names=``
    (feature ``handler_filter``) takes the same steps on the view of those names
    (``_views``: made on its first use from the scheduled records, then fed with
    the store's own structures), so it never passes over other names' jobs.

    Lock rule: ``_lock`` guards every field below except ``_clock``, ``url`` and
    ``_result_ttl`` (immutable). ``_cond`` shares ``_lock``; it is notified when
    a job becomes the earliest due, a lease is returned, or :meth:`interrupt` is
    called (``_wake_gen`` counts those wake-ups). No user code runs under it.

    The three heaps use lazy deletion: an entry is live only while its
    ``version`` (or token) still matches the record.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {
            "attempt_at_start",
            "clock",
            "definite_cancel",
            "inspect",
            "payload_search",
            "recurring",
            "flow_control",
            "keyed",
            "results",
            "handler_filter",
        }
    )

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        result_ttl: float = DEFAULT_RESULT_TTL,
        url: str = "memory://",
    ) -> None:
        self.url = url
        self._clock = clock
        self._result_ttl = check_result_ttl(result_ttl)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._jobs: dict[str, _Record] = {}
        self._due: list[tuple[float, int, int, str]] = []  # (run_at, seq, version, id)
        self._leases: list[tuple[float, int, str]] = []  # (lease_until, token, id)
        self._finished: list[tuple[float, int, str]] = []  # (updated_at, version, id)
        self._ready = ReadyJobs()  # due jobs moved out of _due by claim
        self._ready_due: list[Entry] = []  # the same (and the parked ones) by run_at
        self._flow = FlowState()
        self._views: dict[frozenset[str], _NamedView] = {}  # handler filter -> its view
        self._keys: dict[str, KeyState] = {}  # keyed calls: key -> its record
        self._key_of: dict[str, str] = {}  # a key's job ids -> the key
        self._released: list[tuple[float, str, str]] = []  # keys whose run was purged
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self._wake_gen = 0
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MemoryBackend:
        """Open ``memory://`` (``memory://?result_ttl=60`` sets an option): a new,
        empty in-memory store each time."""
        if not url.startswith("memory://"):
            raise ConfigurationError(f"MemoryBackend needs a memory:// URL, got {url!r}")
        _, from_query = split_url(url, {"result_ttl": float}, store="memory", strict=True)
        return cls(url=url, **merge_options(url, from_query, options))

    def __repr__(self) -> str:
        return f"MemoryBackend(url={self.url!r})"

    # -- internals (call with _lock held) -------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")

    def _now(self, now: float | None) -> float:
        return self._clock.time() if now is None else check_run_at(now, "now")

    def _schedule(self, rec: _Record) -> None:
        rec.version += 1
        at = rec.run_at if rec.throttled_until is None else rec.throttled_until
        entry = (at, rec.seq, rec.version, rec.id)
        heapq.heappush(self._due, entry)
        for names, view in self._views.items():
            if rec.name in names:
                heapq.heappush(view.due, entry)

    def _view(self, names: frozenset[str]) -> _NamedView:
        """The view of ``names``, made from the scheduled records on first use."""
        view = self._views.get(names)
        if view is None:
            view = self._views[names] = _NamedView()
            for rec in self._jobs.values():
                if rec.state is JobState.SCHEDULED and rec.name in names:
                    at = rec.run_at if rec.throttled_until is None else rec.throttled_until
                    view.due.append((at, rec.seq, rec.version, rec.id))
            heapq.heapify(view.due)
        return view

    def _live(self, entry: Entry) -> bool:
        rec = self._jobs.get(entry[3])
        return rec is not None and rec.version == entry[2] and rec.state is JobState.SCHEDULED

    def _promote(self, now: float, view: _NamedView | None = None) -> None:
        """Move the jobs due at ``now`` from the time heap into ``_ready`` (or from
        a view's heap into its ready stage)."""
        due, ready = (self._due, self._ready) if view is None else (view.due, view.ready)
        while (head := self._head(due)) is not None and head[0] <= now:
            heapq.heappop(due)
            rec = self._jobs[head[3]]
            entry = (rec.run_at, rec.seq, rec.version, rec.id)
            ready.add(rec.priority, rec.group or "", entry)
            heapq.heappush(self._ready_due, entry)

    def _retry_parked(self, parked: list[tuple[int, str, Entry]]) -> None:
        """Give parked jobs (a slot freed, a limit changed) another turn; wake waiters."""
        if parked:
            for priority, group, entry in parked:
                self._ready.add(priority, group, entry)
                rec = self._jobs.get(entry[3])
                for names, view in self._views.items():
                    if rec is not None and rec.name in names:
                        view.ready.add(priority, group, entry)
            self._wake_gen += 1
            self._cond.notify_all()

    def _free_slot(self, rec: _Record) -> None:
        """``rec`` leaves RUNNING: its key's slot frees (idempotent)."""
        if rec.key is not None:
            self._retry_parked(self._flow.stop(rec.id))

    def _limits_changed(self) -> None:
        self._retry_parked(self._flow.changed())

    def _finish(self, rec: _Record, state: JobState, now: float) -> None:
        rec.state = state
        rec.lease_until = None
        rec.updated_at = now
        rec.version += 1
        if state in TTL_STATES:
            heapq.heappush(self._finished, (now, rec.version, rec.id))

    def _head(self, due: list[Entry] | None = None) -> Entry | None:
        """The live entry of the earliest scheduled job of the time heap ``due``
        (the store's by default); drops dead entries."""
        if due is None:
            due = self._due
        while due:
            _run_at, _seq, version, job_id = due[0]
            rec = self._jobs.get(job_id)
            if rec is not None and rec.version == version and rec.state is JobState.SCHEDULED:
                return due[0]
            heapq.heappop(due)
        return None

    def _next_due(self, view: _NamedView | None = None) -> float | None:
        """When a claim (of ``view``'s names) may next find work: the earliest time
        in the time heap, or a due job's time while the ready stage holds one
        (parked jobs wait for a slot, so they do not count)."""
        head = self._head(None if view is None else view.due)
        ready = (self._ready if view is None else view.ready).peek(self._live)
        if ready is None:
            return None if head is None else head[0]
        return ready[0] if head is None else min(head[0], ready[0])

    def _next_scheduled(self) -> float | None:
        """The earliest due time of a scheduled job, parked ones included."""
        ready = self._ready_due
        while ready and not self._live(ready[0]):
            heapq.heappop(ready)
        head = self._next_due()
        if not ready:
            return head
        return ready[0][0] if head is None else min(head, ready[0][0])

    def _next_lease_expiry(self) -> float | None:
        leases = self._leases
        while leases:
            lease_until, token, job_id = leases[0]
            rec = self._jobs.get(job_id)
            if (
                rec is not None
                and rec.state is JobState.RUNNING
                and rec.token == token
                and rec.lease_until == lease_until
            ):
                return lease_until
            heapq.heappop(leases)
        return None

    def _wake_if_earlier(self, run_at: float, head: float | None) -> None:
        # A filtered waiter sleeps toward its own names' head, which may be later
        # than ``head``: while views exist, every change wakes (it looks again).
        if head is None or run_at < head or self._views:
            self._wake_gen += 1
            self._cond.notify_all()

    def _purge_finished(self, now: float) -> None:
        """Forget at most ``PURGE_BATCH`` records past ``result_ttl`` per call, so
        no call pauses for a big purge; reads skip the rest (:meth:`_gone`)."""
        cutoff = now - self._result_ttl
        fin = self._finished
        for _ in range(PURGE_BATCH):
            if not fin or fin[0][0] > cutoff:
                break
            _at, version, job_id = heapq.heappop(fin)
            rec = self._jobs.get(job_id)
            if rec is not None and rec.version == version and rec.state in TTL_STATES:
                del self._jobs[job_id]
                if self._key_of:
                    release_key(self, job_id, now)
        if self._released:
            sweep_released(self, now)

    def _gone(self, rec: _Record, now: float) -> bool:
        """A finished record past ``result_ttl`` that is not purged yet."""
        return rec.state in TTL_STATES and rec.updated_at <= now - self._result_ttl

    def _lookup(self, job_id: str, now: float) -> _Record | None:
        self._purge_finished(now)
        rec = self._jobs.get(job_id)
        return None if rec is None or self._gone(rec, now) else rec

    def _expire_leases(self, now: float) -> None:
        while (expiry := self._next_lease_expiry()) is not None and expiry <= now:
            _lease_until, _token, job_id = heapq.heappop(self._leases)
            self._expire_lease(self._jobs[job_id], expiry, now)

    def _expire_lease(self, rec: _Record, expiry: float, now: float) -> None:
        """End a lease that ran out: buried after the last attempt, else due again;
        with no recorded start it was no attempt (see ``attempt_at_start``).
        (A stale heap entry left behind is skipped by ``_next_lease_expiry``.)"""
        self._free_slot(rec)
        if not rec.started:
            rec.attempts = max(0, rec.attempts - 1)
            rec.unstarted += 1
            if rec.unstarted >= MAX_UNSTARTED:
                rec.last_error = unstarted_expired_error(expiry, rec.unstarted)
                self._finish(rec, JobState.DEAD, now)
                return
            # Its place kept (its own due time), like a release.
            rec.last_error = unstarted_expired_note(expiry)
            rec.state = JobState.SCHEDULED
            rec.lease_until = None
            rec.updated_at = now
            self._schedule(rec)
            return
        if rec.attempts >= rec.max_attempts:
            rec.last_error = lease_expired_error(expiry, rec.attempts, rec.max_attempts)
            self._finish(rec, JobState.DEAD, now)
        else:
            # Due again from the moment the lease ran out: lateness (and the
            # misfire policy) is measured from there, not from the first due time.
            rec.last_error = lease_expired_note(expiry, rec.attempts)
            rec.state = JobState.SCHEDULED
            rec.run_at = expiry
            rec.lease_until = None
            rec.updated_at = now
            self._schedule(rec)

    def _changeable(self, job_id: str, now: float) -> tuple[_Record | None, str]:
        """The record a cancel or reschedule may change, or None and why not
        (``running``, ``finished``, ``not_found``). A RUNNING job whose lease
        has expired is not running: its lease ends here first."""
        rec = self._lookup(job_id, now)
        if rec is None:
            return None, "not_found"
        if rec.state is JobState.RUNNING:
            if rec.lease_until is None or rec.lease_until > now:
                return None, "running"
            self._expire_lease(rec, rec.lease_until, now)
        if rec.state is not JobState.SCHEDULED:
            return None, "finished"
        return rec, "scheduled"

    def _current(self, claim: Claim) -> _Record:
        rec = self._jobs.get(claim.job.id)
        if rec is None or rec.state is not JobState.RUNNING or rec.token != claim.token:
            raise stale_claim(
                claim, None if rec is None else rec.state, None if rec is None else rec.token
            )
        return rec

    # -- producers --------------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        on_conflict = check_on_conflict(on_conflict)
        specs = [check_spec(spec) for spec in jobs]
        with self._lock:
            self._check_open()
            now = self._clock.time()
            self._purge_finished(now)
            # Decide every outcome first so a conflict leaves nothing stored.
            existing: dict[str, JobState] = {}
            for job_id in dict.fromkeys(spec.id for spec in specs):
                old = self._jobs.get(job_id)
                if old is not None and not self._gone(old, now):
                    existing[job_id] = old.state
            outcomes, final = resolve_conflicts(specs, existing, on_conflict)
            head = self._next_due()
            earliest: float | None = None
            for spec in final.values():
                rec = self._insert(spec, now)
                earliest = rec.run_at if earliest is None else min(earliest, rec.run_at)
            if earliest is not None:
                self._wake_if_earlier(earliest, head)
            return outcomes

    def _insert(self, spec: JobSpec, now: float) -> _Record:
        """Store ``spec`` as a new scheduled record (over any old one of its id)."""
        rec = _Record(
            id=spec.id,
            name=spec.name,
            payload=spec.payload,
            run_at=float(spec.run_at) if spec.delay is None else now + max(0.0, spec.delay),
            max_attempts=spec.max_attempts,
            backoff=dict(spec.backoff),
            misfire=spec.misfire,
            created_at=spec.created_at or now,
            updated_at=now,
            seq=next(self._seq),
            key=spec.key,
            priority=spec.priority,
            group=spec.group,
        )
        old = self._jobs.get(spec.id)
        if old is not None:
            rec.version = old.version + 1
        self._jobs[spec.id] = rec
        self._schedule(rec)
        return rec

    def cancel(self, job_id: str) -> CancelOutcome:
        with self._lock:
            self._check_open()
            now = self._clock.time()
            rec, verdict = self._changeable(job_id, now)
            if rec is None:
                return CancelOutcome(verdict)
            rec.outcome = "cancelled"
            self._finish(rec, JobState.CANCELLED, now)
            return CancelOutcome.done(rec.attempts)

    def reschedule(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> RescheduleOutcome:
        at, after = check_when(run_at, delay)
        with self._lock:
            self._check_open()
            now = self._clock.time()
            run_at = now + after if after is not None else at
            assert run_at is not None
            rec, verdict = self._changeable(job_id, now)
            if rec is None:
                return RescheduleOutcome(verdict)
            head = self._next_due()
            rec.run_at = run_at
            rec.throttled_until = None
            rec.updated_at = now
            self._schedule(rec)
            self._wake_if_earlier(run_at, head)
            return RescheduleOutcome.done(rec.attempts)

    # -- workers ----------------------------------------------------------------
    def claim(
        self,
        *,
        limit: int,
        lease: float,
        now: float | None = None,
        names: Collection[str] | None = None,
    ) -> list[Claim]:
        limit = check_limit(limit)
        lease = check_lease(lease)
        chosen = check_handler_names(names)
        with self._lock:
            self._check_open()
            at = self._now(check_claim_now(now, self._clock))
            self._purge_finished(at)
            self._expire_leases(at)
            view = None if chosen is None else self._view(chosen)
            self._promote(at, view)
            ready = self._ready if view is None else view.ready
            claims: list[Claim] = []
            flow = self._flow
            while len(claims) < limit and (entry := ready.pop(self._live)) is not None:
                rec = self._jobs[entry[3]]
                verdict = flow.decide(rec.key, at)
                if not verdict.ok:
                    assert rec.key is not None
                    if verdict.throttled_until is None:  # at its concurrency limit
                        # A new version: its copies in the other views' ready
                        # stages die, so only the parked entry brings it back.
                        rec.version += 1
                        entry = (rec.run_at, rec.seq, rec.version, rec.id)
                        heapq.heappush(self._ready_due, entry)
                        flow.park(rec.key, rec.priority, rec.group or "", entry)
                    else:  # over its rate: scheduled until its next allowed time
                        rec.throttled_until = verdict.throttled_until
                        rec.updated_at = at
                        self._schedule(rec)
                    continue
                rec.throttled_until = None
                rec.attempts += 1
                try:
                    job = replace(
                        rec.to_job(strict=True),
                        state=JobState.RUNNING,
                        lease_until=at + lease,
                        updated_at=at,
                    )
                except (ValueError, TypeError) as exc:
                    # Unreadable: buried with the reason, never breaking the other claims.
                    rec.last_error = undecodable_error(exc)
                    self._finish(rec, JobState.DEAD, at)
                    continue
                rec.state = JobState.RUNNING
                rec.started = False
                rec.token = next(self._tokens)
                rec.lease_until = at + lease
                rec.updated_at = at
                rec.version += 1
                heapq.heappush(self._leases, (rec.lease_until, rec.token, rec.id))
                flow.start(rec.key, rec.id, at)
                claims.append(Claim(job, rec.token, rec.lease_until, at))
            return claims

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        items = Completion.batch(batch)
        if not items:
            return []
        with self._lock:
            self._check_open()
            now = self._clock.time()
            retrying = any(item.state is JobState.SCHEDULED for item in items)
            head = self._next_due() if retrying else None
            earliest: float | None = None
            results: list[StaleClaim | None] = []
            for item in items:
                try:
                    rec = self._current(item.claim)
                except StaleClaim as exc:
                    results.append(exc)
                    continue
                results.append(None)
                self._free_slot(rec)
                if item.released:
                    # Back to its place in the due order (or to run_at), the attempt given back.
                    rec.state = JobState.SCHEDULED
                    rec.attempts = max(0, rec.attempts - 1)
                    if item.run_at is not None:
                        rec.run_at = item.run_at
                    if item.error is not None:
                        rec.last_error = clip_error(item.error)
                    elif rec.last_error is None:  # an earlier attempt's error is kept
                        rec.last_error = RELEASED_NOTE
                    rec.lease_until = None
                    rec.updated_at = now
                    self._schedule(rec)
                    earliest = rec.run_at if earliest is None else min(earliest, rec.run_at)
                elif item.state is JobState.SCHEDULED:
                    assert item.run_at is not None
                    rec.state = JobState.SCHEDULED
                    rec.run_at = item.run_at
                    rec.last_error = clip_error(item.error)
                    rec.lease_until = None
                    rec.updated_at = now
                    self._schedule(rec)
                    earliest = rec.run_at if earliest is None else min(earliest, rec.run_at)
                elif item.state is JobState.DEAD:
                    rec.last_error = clip_error(item.error)
                    self._finish(rec, JobState.DEAD, now)
                else:
                    rec.outcome = item.outcome
                    rec.result = item.result
                    self._finish(rec, item.state, now)
            if earliest is not None:
                self._wake_if_earlier(earliest, head)
            return results

    def extend(self, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        with self._lock:
            self._check_open()
            rec = self._current(claim)
            now = self._clock.time()
            rec.lease_until = now + lease
            rec.updated_at = now
            heapq.heappush(self._leases, (rec.lease_until, rec.token, rec.id))
            return replace(claim, job=rec.to_job(), lease_until=rec.lease_until)

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        lease = check_lease(lease)
        with self._lock:
            self._check_open()
            now = self._clock.time()
            answers: list[Claim | StaleClaim] = []
            for claim in claims:
                try:
                    rec = self._current(claim)
                except StaleClaim as exc:
                    answers.append(exc)
                    continue
                if claim.token in started:
                    rec.started = True
                rec.lease_until = now + lease
                rec.updated_at = now
                heapq.heappush(self._leases, (rec.lease_until, rec.token, rec.id))
                answers.append(replace(claim, job=rec.to_job(), lease_until=rec.lease_until))
            return answers

    def wait_for_due(self, max_wait: float, *, names: Collection[str] | None = None) -> None:
        max_wait = check_max_wait(max_wait)
        chosen = check_handler_names(names)
        clock = self._clock
        with self._cond:
            view = None if chosen is None else self._view(chosen)
            gen = self._wake_gen
            deadline = clock.monotonic() + max_wait
            while not self._closed and self._wake_gen == gen:
                left = deadline - clock.monotonic()
                if left <= 0:
                    return
                now = clock.time()
                times = [
                    t for t in (self._next_due(view), self._next_lease_expiry()) if t is not None
                ]
                if times:
                    until = min(times) - now
                    if until <= 0:
                        return
                    left = min(left, until)
                clock.wait(self._cond, left)

    def interrupt(self) -> None:
        with self._cond:
            self._wake_gen += 1
            self._cond.notify_all()

    # -- inspection and dead letters -------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with self._lock:
            self._check_open()
            rec = self._lookup(job_id, self._clock.time())
            if rec is None:
                return None
            job = rec.to_job()
            state = self._keys.get(self._key_of.get(job_id, ""))
            if state is not None and state.job_id == job_id:
                job = replace(job, keyed=state.info())
            return job

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
        preview: int | None = None,
        payload_contains: str | None = None,
        payload_at: tuple[str, object] | None = None,
    ) -> list[Job]:
        """Jobs in ``run_at`` order (FIFO ties), due in ``due_after <= run_at < due_before``."""
        limit = check_limit(limit)
        state = None if state is None else JobState(state)
        cursor = check_list_cursor(after)
        preview = check_preview(preview)
        contains = check_payload_contains(payload_contains)
        at = check_payload_at(payload_at)
        searched = contains is not None or at is not None
        with self._lock:
            self._check_open()
            now = self._clock.time()
            self._purge_finished(now)
            start: tuple[float, int] | None = None
            if cursor is not None:
                last = self._jobs.get(cursor[1])
                start = (cursor[0], last.seq if last is not None else 0)
            recs = [
                r
                for r in self._jobs.values()
                if (state is None or r.state is state)
                and not self._gone(r, now)
                and (name is None or r.name == name)
                and (due_after is None or r.run_at >= due_after)
                and (due_before is None or r.run_at < due_before)
                and (start is None or (r.run_at, r.seq) > start)
                and (not searched or payload_matches(r.payload, contains, at))
            ]
            chosen = heapq.nsmallest(limit, recs, key=lambda r: (r.run_at, r.seq))
            jobs = [r.to_job() for r in chosen]
        if preview is None:
            return jobs
        return [
            replace(j, payload=listed_payload(r.payload, preview))
            for j, r in zip(jobs, chosen, strict=True)
        ]

    def next_due(self) -> float | None:
        with self._lock:
            self._check_open()
            return self._next_scheduled()

    def stats(self) -> Stats:
        with self._lock:
            self._check_open()
            now = self._clock.time()
            self._purge_finished(now)
            counts: dict[str, int] = dict.fromkeys(JobState, 0)
            due = 0
            for rec in self._jobs.values():
                if self._gone(rec, now):
                    continue
                counts[rec.state] += 1
                if rec.state is JobState.SCHEDULED and rec.run_at <= now:
                    due += 1
            return Stats.from_counts(counts, due=due, next_due=self._next_scheduled())

    def dead_letters(self, *, limit: int = 100, preview: int | None = None) -> list[Job]:
        limit = check_limit(limit)
        preview = check_preview(preview)
        with self._lock:
            self._check_open()
            dead = [r for r in self._jobs.values() if r.state is JobState.DEAD]
            chosen = heapq.nlargest(limit, dead, key=lambda r: (r.updated_at, r.seq))
            jobs = [r.to_job() for r in chosen]
        if preview is None:
            return jobs
        return [
            replace(j, payload=listed_payload(r.payload, preview))
            for j, r in zip(jobs, chosen, strict=True)
        ]

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        at, after = check_when(run_at, delay)
        with self._lock:
            self._check_open()
            rec = self._jobs.get(job_id)
            if rec is None or rec.state is not JobState.DEAD:
                return False
            run_at = self._clock.time() + after if after is not None else at
            assert run_at is not None
            head = self._next_due()
            rec.state = JobState.SCHEDULED
            rec.attempts = 0
            rec.unstarted = 0
            rec.run_at = run_at
            rec.outcome = None
            rec.updated_at = self._clock.time()
            self._schedule(rec)
            self._wake_if_earlier(run_at, head)
            return True

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``."""
        ids = None if job_ids is None else set(job_ids)
        with self._lock:
            self._check_open()
            doomed = [
                r.id
                for r in self._jobs.values()
                if r.state is JobState.DEAD
                and (ids is None or r.id in ids)
                and (older_than is None or r.updated_at < older_than)
            ]
            now = self._clock.time()
            for job_id in doomed:
                del self._jobs[job_id]
                release_key(self, job_id, now)
            return len(doomed)

    def close(self) -> None:
        """Mark the store closed (idempotent) and wake every waiter."""
        with self._cond:
            self._closed = True
            self._wake_gen += 1
            self._cond.notify_all()
