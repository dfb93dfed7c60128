"""The RabbitMQ store's contract methods (the design is in the package docstring).

Longer than most modules: besides the contract it keeps the one table of claims
this process holds (leases, the owner of each token, the finishes kept for a
redelivery of the same message), and every method that reads or changes that
table lives next to it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from delayq.backends._common import (
    DEFAULT_RESULT_TTL,
    RELEASED_NOTE,
    CompletesInBatches,
    check_claim_now,
    check_lease,
    check_limit,
    check_max_wait,
    check_run_at,
    check_spec,
    check_when,
    extend_one_by_one,
    undecodable_error,
)
from delayq.backends.base import Completion
from delayq.backends.rabbitmq._arbiter import Arbiter
from delayq.backends.rabbitmq._claims import Held, due_on_worker, expired, judge
from delayq.backends.rabbitmq._connection import Settings
from delayq.backends.rabbitmq._consumer import Adopted, Consumer, Delivery
from delayq.backends.rabbitmq._dead import BURIED_AT, ERROR, DeadLetters
from delayq.backends.rabbitmq._inspect import RabbitMQInspection, Starting
from delayq.backends.rabbitmq._message import JobMessage, encode, new_instance
from delayq.backends.rabbitmq._policies import check_at_open
from delayq.backends.rabbitmq._publisher import Outgoing, Publisher
from delayq.backends.rabbitmq._topology import Topology, route
from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import (
    ConfigurationError,
    DelayqError,
    InvalidOption,
    QueueClosed,
    StaleClaim,
    Unsupported,
)
from delayq.job import (
    Claim,
    EnqueueOutcome,
    Job,
    JobSpec,
    JobState,
    OnConflict,
    Stats,
    check_on_conflict,
)

__all__ = ["RabbitMQBackend"]

log = logging.getLogger("delayq.rabbitmq")

_TOKENS = itertools.count(1)
"""Fencing tokens, unique in the process, so any handle can tell whose claim it is given."""

_OWNERS: weakref.WeakValueDictionary[int, RabbitMQBackend] = weakref.WeakValueDictionary()
"""token -> the handle holding that claim's delivery (an ack must go back on its channel)."""

_FINISHED_FOR = 60.0
"""Seconds a finish (or an ack) is kept for a redelivery of its message."""
_FINISHED_KEEP = 20_000
"""At most this many kept (the oldest go first): a few seconds of acks at full speed."""

_NO_INDEX = (
    "the RabbitMQ store answers get, cancel and reschedule by id from its log but keeps no "
    "index of jobs, so it cannot {what}; use the Redis, PostgreSQL or SQLite store when you "
    "need it"
)


class RabbitMQBackend(RabbitMQInspection, CompletesInBatches):
    """A :class:`~delayq.backends.base.Backend` on RabbitMQ (see the module docstring).

    Lock rule: ``_lock`` guards ``_held`` and ``_closed``; the publisher and
    the consumer have their own locks, and none is held while calling the other.
    """

    features: frozenset[str] = frozenset({"shared", "durable", "definite_cancel"})
    """The promises of a store with its log (the default); ``log=false`` keeps
    ``shared`` and ``durable`` only."""

    def __init__(
        self,
        url: str,
        *,
        queue: str | None = None,
        queue_type: str | None = None,
        prefetch: int | None = None,
        max_returns: int | None = None,
        confirm_timeout: float | None = None,
        declare: str | None = None,
        allow_at_most_once: bool | None = None,
        log: bool | None = None,
        policies: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = Settings.parse(
            url,
            queue=queue,
            queue_type=queue_type,
            prefetch=prefetch,
            max_returns=max_returns,
            confirm_timeout=confirm_timeout,
            declare=declare,
            allow_at_most_once=allow_at_most_once,
            log=log,
            policies=policies,
        )
        self.url = self._settings.url
        self.queue = self._settings.queue
        self._clock = clock
        self._topology = Topology(self._settings.queue, self._settings.queue_type)
        self._publisher = Publisher(self._settings, self._topology)
        self._consumer = Consumer(self._settings, self._topology, self._adopt)
        self._dead = DeadLetters(self._settings, self._topology)
        self._log_on = self._settings.log
        if not self._log_on:
            self.features = frozenset({"shared", "durable"})
        self._arbiter = Arbiter(
            self._settings, self._topology.log_queue, self._publisher.publish, DEFAULT_RESULT_TTL
        )
        self._lock = threading.Lock()
        self._held: dict[int, Held] = {}
        # instance -> (what its finish needs, monotonic expiry): claims finished after
        # their connection was lost, for the broker's redelivery of the same message.
        self._finished: dict[str, tuple[Adopted, float]] = {}
        self._closed = False
        self._publisher.open()  # a wrong URL, password or vhost fails here, not later
        try:
            check_at_open(
                self._settings.policies,
                self._settings.vhost,
                urlsplit(self._settings.pika_url).hostname,
                self._topology.names(),
            )
        except ConfigurationError:
            self._publisher.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RabbitMQBackend:
        """Open ``amqp[s]://user:pass@host:port/vhost[?queue=...&queue_type=...]``."""
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"RabbitMQBackend(url={self.url!r}, queue={self.queue!r})"

    # -- internals -------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"{self!r} is closed")

    def _outgoing(self, message: JobMessage, delay: float) -> Outgoing:
        r = route(self._topology, delay)
        body = encode(replace(message, local=r.local, more=r.more, instance=""))
        return Outgoing(r.exchange, r.routing_key, body, message.id)

    def _buried(self, message: JobMessage | None, body: bytes = b"", error: str = "") -> Outgoing:
        """A dead letter: ``message`` (its ``last_error`` set), or an unreadable ``body``."""
        headers: dict[str, Any] = {BURIED_AT: int(self._clock.time() * 1000)}
        if message is None:
            headers[ERROR] = error
            return Outgoing("", self._topology.dead_queue, body, "?", headers)
        body = encode(replace(message, instance=""))
        return Outgoing("", self._topology.dead_queue, body, message.id, headers)

    def _unsupported(self, what: str) -> Unsupported:
        return Unsupported(_NO_INDEX.format(what=what))

    def _stale(self, claim: Claim) -> StaleClaim:
        return StaleClaim(
            f"claim on job {claim.job.id!r} (token {claim.token}) is stale: it was finished, "
            f"its lease ran out, or the connection it came on closed (the broker then "
            f"returned the job to the queue)"
        )

    # -- producers ---------------------------------------------------------------
    def enqueue(
        self, jobs: Sequence[JobSpec], *, on_conflict: OnConflict = "reject"
    ) -> list[EnqueueOutcome]:
        """Publish each job into the levels; returns once the broker confirmed every one
        and the queue's log decided ``on_conflict`` (``View.enqueue``: the rule of
        every store, up to 1,000 jobs at a time).

        With ``log=false`` nothing can tell that an id is taken: ``reject`` stores
        the job unchecked (a reused id runs twice), ``keep`` and ``replace`` raise
        ``Unsupported``. A batch is checked whole before anything is published; a
        broker failure in the middle of a batch leaves the jobs published before it.
        """
        policy = check_on_conflict(on_conflict)
        if policy != "reject" and not self._log_on:
            raise Unsupported(
                f"the RabbitMQ store was opened with log=false, so it cannot tell that a job "
                f"id is taken (on_conflict={policy!r}): open it with its log (the default)"
            )
        specs = [check_spec(spec) for spec in jobs]
        self._check_open()
        now = self._clock.time()
        outgoing, messages = [], []
        for spec in specs:
            # A past run_at is kept (it orders the job among those due); delay= is
            # relative to this clock, a negative one meaning now.
            run_at = spec.run_at if spec.delay is None else now + max(0.0, spec.delay)
            message = JobMessage.from_spec(spec, run_at, now)
            messages.append(message)
            outgoing.append(self._outgoing(message, run_at - now))
        if not specs:
            return []
        if not self._log_on:
            self._publisher.publish(outgoing, "schedule a job")
            return [EnqueueOutcome.CREATED] * len(specs)
        # The log's records first (a start that comes before its enqueue record wins anyway).
        return self._enqueue_decided(messages, outgoing, policy, now)

    # -- workers -----------------------------------------------------------------
    def claim(self, *, limit: int, lease: float, now: float | None = None) -> list[Claim]:
        limit = check_limit(limit)
        lease = check_lease(lease)
        check_claim_now(now, self._clock)  # due is decided by the broker and the local wait
        self._check_open()
        self._consumer.start()
        self._consumer.resume()
        mono = SYSTEM_CLOCK.monotonic()
        generation = self._consumer.generation
        with self._lock:
            expired_tokens = [t for t, h in self._held.items() if h.lease_mono <= mono]
            lapsed = [self._held.pop(t) for t in expired_tokens]
        for token in expired_tokens:
            _OWNERS.pop(token, None)
        wall = self._clock.time()
        claims: list[Claim] = []
        # Messages to publish before their deliveries are acked: dead letters, the rest
        # of a long delay, returned deliveries with their return counted, expired leases.
        burials: list[tuple[Delivery | None, Outgoing]] = []
        ended: list[JobMessage] = []  # buried: the log's finish records
        for held in lapsed:
            if held.delivery.generation != generation:
                continue  # its connection is gone: the broker has returned it already
            kind, again = expired(held)
            if kind == "bury":
                ended.append(again)
            out = self._buried(again) if kind == "bury" else self._outgoing(again, 0.0)
            burials.append((held.delivery, out))
        starting: list[Starting] = []
        for delivery in self._consumer.take_due(limit, mono):
            verdict = judge(delivery, self._settings.max_returns, wall)
            message = verdict.message
            if verdict.error and verdict.kind == "pass_on":
                log.warning(
                    "RabbitMQ delivered job %r %s of its due time by this host's clock (a "
                    "message-ttl policy on delayq's queues, or clocks that disagree): "
                    "delayed again",
                    delivery.message.id if delivery.message else "?",
                    verdict.error.replace("early by", "ahead"),
                )
            if verdict.kind in ("pass_on", "again"):
                # pass_on: the levels held it at least one pass, the rest is relative to
                # now; again: a returned delivery, published with its return counted.
                assert message is not None
                burials.append((delivery, self._outgoing(message, message.more)))
                continue
            if verdict.kind == "bury":
                if message is not None:
                    ended.append(message)
                burials.append((delivery, self._buried(message, delivery.body, verdict.error)))
                continue
            assert message is not None
            try:
                job = message.job(
                    JobState.RUNNING,
                    verdict.attempts,
                    wall,
                    lease_until=wall + lease,
                    last_error=verdict.last_error,
                )
            except Exception as exc:
                dead = replace(message, last_error=undecodable_error(exc))
                ended.append(dead)
                burials.append((delivery, self._buried(dead)))
                continue
            starting.append((delivery, message, verdict.attempts, job))
        try:
            won = self._start(starting, wall + lease, wall)
        except BaseException:
            for held_back in [d for d, _ in burials if d is not None]:
                self._consumer.put_back(held_back)  # still held: the next claim tries again
            # Their start records may be in the log, winning for nobody: returned to the
            # broker, they come back as returns, whose start wins over such a record.
            self._consumer.settle([(s[0], True) for s in starting])
            raise
        lost: list[Delivery] = []
        for (delivery, message, attempts, job), sid in zip(starting, won, strict=True):
            if not sid:
                lost.append(delivery)  # cancelled, rescheduled, finished, or run elsewhere
                continue
            token = next(_TOKENS)
            with self._lock:
                self._held[token] = Held(delivery, message, attempts, mono + lease, sid)
            _OWNERS[token] = self
            due = due_on_worker(
                message.run_at, wall, mono - delivery.due, delivery.entered, message.local
            )
            claims.append(Claim(job, token, wall + lease, wall, due_at=due))
        if ended:
            finishes = [[m.id, m.ver, "", "dead", None, m.last_error] for m in ended]
            burials += [(None, r) for r in self._record("F", f=finishes, at=wall)]
        if burials:
            try:
                self._publisher.publish([o for _, o in burials], "bury or pass on a job")
            except BaseException:
                for delivery in [d for d, _ in burials if d is not None] + lost:
                    self._consumer.put_back(delivery)  # still held: the next claim tries again
                raise
        settled = [d for d, _ in burials if d is not None] + lost
        if settled:
            self._consumer.settle([(d, False) for d in settled])
            self._acked(settled)
        return claims

    def complete(self, batch: Sequence[Completion]) -> list[StaleClaim | None]:
        """Publish what each entry needs (a retry's new message, a dead letter), then ack.

        An entry whose delivery's connection is gone is stale (the broker has
        returned that message already). A connection lost between the publish
        and the ack leaves the job both republished and returned: it runs
        again (at least once, never lost).
        """
        items = Completion.batch(batch)
        if not items:
            return []
        self._check_open()
        groups: dict[RabbitMQBackend, list[int]] = {}
        for index, item in enumerate(items):
            owner = self._owner(item.claim)
            groups.setdefault(owner, []).append(index)
        if len(groups) == 1 and self in groups:
            return self._complete_own(items)
        results: list[StaleClaim | None] = [None] * len(items)
        for owner, indexes in groups.items():
            answers = owner._complete_own([items[i] for i in indexes])
            for i, answer in zip(indexes, answers, strict=True):
                results[i] = answer
        return results

    def _adopt(self, delivery: Delivery) -> Adopted:
        """A delivery the broker returned: is it a message this process runs (its claim
        came on a lost connection: the claim takes the new delivery over) or finished?"""
        instance = delivery.message.instance if delivery.message is not None else ""
        if not instance:
            return None
        with self._lock:
            for held in self._held.values():
                if held.message.instance == instance and (
                    held.delivery.generation != delivery.generation
                ):
                    held.delivery = delivery
                    return "held"
            finished = self._finished.pop(instance, None)
        return None if finished is None else finished[0]

    def _remember(self, instance: str, outcome: Adopted) -> None:
        """Keep what a redelivery of ``instance`` should become: the finish of a claim
        whose connection was lost, or "ack" for a message acked (an ack can be lost
        with its connection; then the broker delivers it again) (call locked)."""
        if not instance:
            return
        now = SYSTEM_CLOCK.monotonic()
        if len(self._finished) >= _FINISHED_KEEP:
            for key in [k for k, (_, until) in self._finished.items() if until <= now]:
                del self._finished[key]
            while len(self._finished) >= _FINISHED_KEEP:
                del self._finished[next(iter(self._finished))]
        self._finished[instance] = (outcome, now + _FINISHED_FOR)

    def _acked(self, deliveries: Sequence[Delivery]) -> None:
        with self._lock:
            for delivery in deliveries:
                if delivery.message is not None:
                    self._remember(delivery.message.instance, "ack")

    def _owner(self, claim: Claim) -> RabbitMQBackend:
        """The handle of this process holding ``claim`` (self when none does)."""
        with self._lock:
            if claim.token in self._held:
                return self
        owner = _OWNERS.get(claim.token)
        return self if owner is None or owner._closed else owner

    def _complete_own(self, items: list[Completion]) -> list[StaleClaim | None]:
        generation = self._consumer.generation
        results: list[StaleClaim | None] = []
        taken: list[tuple[int, Held]] = []
        lost: list[tuple[Completion, Held]] = []
        with self._lock:
            for item in items:
                held = self._held.pop(item.claim.token, None)
                _OWNERS.pop(item.claim.token, None)
                if held is None or held.delivery.generation != generation:
                    results.append(self._stale(item.claim))
                    if held is not None:
                        lost.append((item, held))
                    continue
                results.append(None)
                taken.append((len(results) - 1, held))
        now = self._clock.time()
        for item, held in lost:  # the broker returns it: its redelivery gets this finish
            finish = self._finish(item, held, now)
            outcome: Adopted = "release" if item.released else ("ack" if finish is None else finish)
            with self._lock:
                self._remember(held.message.instance, outcome)
        outgoing: list[Outgoing] = []
        for index, held in taken:
            item = items[index]
            if item.released:
                continue  # the delivery goes back to this worker's heap, below
            finish = self._finish(item, held, now)
            if finish is not None:
                outgoing.append(finish)
        ends = [self._ended(items[i], h) for i, h in taken] + [self._ended(i, h) for i, h in lost]
        outgoing += self._record("F", f=ends, at=now)
        try:
            self._publisher.publish(outgoing, "finish a job")
        except BaseException:
            with self._lock:  # nothing was acked: the claims stay as they were
                for index, held in taken:
                    self._held[items[index].claim.token] = held
                    _OWNERS[items[index].claim.token] = self
            raise
        acked = [(i, h) for i, h in taken if not items[i].released]
        done = self._consumer.settle([(held.delivery, False) for _, held in acked])
        self._acked([held.delivery for _, held in acked])
        for index, held in taken:
            if items[index].released:
                # Unstarted: back in the heap at its own deadline (its place in the due
                # order), still unacked, so its next claim is the same attempt again.
                held.delivery.note = RELEASED_NOTE
                done.insert(len(done), self._consumer.put_back(held.delivery))
                acked.append((index, held))
        for (index, _held), ok in zip(acked, done, strict=True):
            if not ok:
                results[index] = self._stale(items[index].claim)
        return results

    def _finish(self, item: Completion, held: Held, now: float) -> Outgoing | None:
        """The message a finish publishes before its ack (a retry, a dead letter), if any."""
        message = replace(held.message, attempts=held.attempts)
        if item.state is JobState.SCHEDULED and not item.released:
            assert item.run_at is not None
            again = replace(message, run_at=item.run_at, last_error=item.error)
            return self._outgoing(again, item.run_at - now)
        if item.state is JobState.DEAD:
            return self._buried(replace(message, last_error=item.error))
        return None

    def extend(self, claim: Claim, lease: float) -> Claim:
        lease = check_lease(lease)
        self._check_open()
        owner = self._owner(claim)
        if owner is not self:
            return owner.extend(claim, lease)
        [answer] = self._extend_own([claim], lease)
        if isinstance(answer, StaleClaim):
            raise answer
        return answer

    def extend_many(
        self, claims: Sequence[Claim], lease: float, *, started: Collection[int] = ()
    ) -> list[Claim | StaleClaim]:
        """Renew every claim of this handle with one lease record in the log."""
        lease = check_lease(lease)
        self._check_open()
        if any(self._owner(claim) is not self for claim in claims):
            return extend_one_by_one(self, claims, lease)
        return self._extend_own(claims, lease)

    def _extend_own(self, claims: Sequence[Claim], lease: float) -> list[Claim | StaleClaim]:
        """Renew locally and in the log: a claim whose job was cancelled or moved after
        its lease ran out (a lease record that loses) is stale."""
        generation = self._consumer.generation
        mono, wall = SYSTEM_CLOCK.monotonic(), self._clock.time()
        renew: list[tuple[int, Held]] = []
        with self._lock:
            for index, claim in enumerate(claims):
                held = self._held.get(claim.token)
                if held is not None and held.delivery.generation == generation:
                    renew.append((index, held))
        kept: list[bool] = [True] * len(renew)
        if renew and self._log_on:
            leases = [[held.message.id, held.sid, wall + lease] for _, held in renew]
            kept = self._arbiter.append("L", "renew a lease", l=leases, at=wall)
        answers: list[Claim | StaleClaim] = [self._stale(claim) for claim in claims]
        with self._lock:
            for (index, held), ok in zip(renew, kept, strict=True):
                if ok:
                    held.lease_mono = mono + lease
                    claim, until = claims[index], wall + lease
                    job = replace(claim.job, lease_until=until)
                    answers[index] = replace(claim, job=job, lease_until=until)
        return answers

    def _next_lease_end(self) -> float | None:
        with self._lock:
            return min((h.lease_mono for h in self._held.values()), default=None)

    def wait_for_due(self, max_wait: float) -> None:
        """Sleep until a held delivery is due, one arrives earlier, a lease ends,
        ``interrupt``, or ``max_wait``. Deliveries are pushed: no polling."""
        max_wait = check_max_wait(max_wait)
        self._check_open()
        self._consumer.start()
        self._consumer.resume()
        self._consumer.wait(SYSTEM_CLOCK.monotonic() + max_wait, self._next_lease_end)

    def interrupt(self) -> None:
        self._consumer.interrupt()

    def health(self) -> dict[str, object]:
        """The consumer thread's state (:class:`~delayq.backends.base.ReportsHealth`):
        ``alive`` (connected and consuming, or never started: a producer has none),
        and counts of ``reconnects``, ``cancels``, ``channel_closes``, ``resubscribes``."""
        return self._consumer.health()

    # -- inspection and dead letters -------------------------------------------------
    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        due_after: float | None = None,
        due_before: float | None = None,
        limit: int = 100,
        name: str | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Job]:
        raise self._unsupported("list jobs")

    def next_due(self) -> float | None:
        raise self._unsupported("tell the next due time")

    def stats(self) -> Stats:
        raise self._unsupported("count jobs by state")

    def dead_letters(self, *, limit: int = 100) -> list[Job]:
        """Dead jobs, most recently buried first (reads the whole dead-letter queue)."""
        limit = check_limit(limit)
        self._check_open()
        return self._dead.list(limit)

    def requeue_dead(
        self, job_id: str, run_at: float | None = None, *, delay: float | None = None
    ) -> bool:
        """Schedule a dead job again (attempts reset); False when no dead letter has that id."""
        at, after = check_when(run_at, delay)
        self._check_open()

        def again(message: JobMessage) -> list[Outgoing]:
            now = self._clock.time()
            wait = after if after is not None else (at or now) - now
            fresh = replace(message, attempts=0, run_at=now + max(0.0, wait), ver=new_instance())
            return [*self._enqueued([fresh], now), self._outgoing(fresh, wait)]

        return self._dead.requeue(job_id, again)

    def purge_dead(
        self, *, job_ids: Sequence[str] | None = None, older_than: float | None = None
    ) -> int:
        """Delete dead jobs: all, those in ``job_ids``, and/or buried before ``older_than``."""
        if isinstance(job_ids, str):
            raise InvalidOption("job_ids must be a list of ids, not a str")
        ids = None if job_ids is None else set(job_ids)
        cutoff = None if older_than is None else check_run_at(older_than, "older_than")
        self._check_open()
        purged = self._dead.purge(ids, cutoff)
        if purged:
            self._publisher.publish(self._record("P", ids=purged), "purge dead letters")
        return len(purged)

    def close(self) -> None:
        """Stop consuming and close the connections.

        Claims not finished may have started: each is published again with its
        attempt counted (as an expired lease would be), then acked; what the
        consumer held unclaimed is given back unchanged (``Consumer.close``). If
        that fails, the broker returns them when the connection closes (counted
        as returns, not attempts).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for token in self._held:
                _OWNERS.pop(token, None)
            unfinished = list(self._held.values())
            self._held.clear()
        generation = self._consumer.generation
        unfinished = [h for h in unfinished if h.delivery.generation == generation]
        if unfinished:
            copies = []
            for held in unfinished:
                kind, again = expired(held)
                copies.append(self._buried(again) if kind == "bury" else self._outgoing(again, 0))
            try:
                self._publisher.publish(copies, "give back unfinished claims")
            except DelayqError:
                log.warning("could not give back %d unfinished claims", len(copies), exc_info=True)
            else:
                self._consumer.settle([(h.delivery, False) for h in unfinished])
        self._consumer.close()
        self._arbiter.close()
        self._publisher.close()
        self._dead.close()
