"""Prometheus metrics: what the workers did, how late jobs ran, what the store holds.

Three sources feed them:

* the worker, through its public ``on_result`` callback (a
  :class:`~delayq.worker.JobResult` per finished attempt): counters of started,
  succeeded, failed, retried, dead-lettered and skipped attempts by handler
  name, the **lateness** histogram (claim time minus due time, buckets from
  0.1 ms to a day) and the handler-duration histogram;
* producers, through a :class:`~delayq.app.ProducerHook` (``metrics.instrument(app)``):
  jobs scheduled and cancelled by handler name;
* the store, read at scrape time (:class:`StoreCollector`): jobs by state, the
  due-now backlog, the age of the oldest overdue job, the time to the next due
  job, and ``delayq_store_up`` (0 when the store could not be read: a failed
  read is a value on the dashboard, never a silently missing series).

Several worker processes on one host aggregate with prometheus_client's
multiprocess mode: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory for
every process (before it starts); each writes its samples there and whichever
process serves ``/metrics`` reports the sum (:func:`exposition_registry`).

:class:`LatenessSeries` keeps lateness percentiles over time in fixed memory
for the dashboard's chart. Needs ``pip install 'delayq[web]'``.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.errors import DelayqError, MissingDependency
from delayq.job import CancelOutcome, EnqueueOutcome, JobSpec, JobState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from delayq.app import DelayQ
    from delayq.backends.base import Backend
    from delayq.worker import JobResult

__all__ = [
    "DURATION_BUCKETS",
    "LATENESS_BUCKETS",
    "MULTIPROC_ENV",
    "CounterSource",
    "LatenessSeries",
    "Metrics",
    "RelayedCounters",
    "SeriesPoint",
    "StoreCollector",
    "bucket_quantile",
    "exposition_registry",
    "lateness_bucket_totals",
    "multiprocess_dir",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

LATENESS_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
)  # fmt: skip
"""Upper bounds (seconds) of the lateness histogram: 0.1 ms (a claim on a warm
store) and 1 ms (a timer's jitter) to a
day (a backlog after downtime); a last ``+Inf`` bucket catches the rest."""

DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip

_STARTED = frozenset({"succeeded", "stale", "error"})
_MAYBE_STARTED = frozenset({"retried", "dead"})


def _prometheus() -> Any:
    try:
        import prometheus_client  # noqa: PLC0415 (an optional extra)
    except ImportError as exc:
        raise MissingDependency(
            "delayq metrics need the 'prometheus_client' package: pip install 'delayq[web]'"
        ) from exc
    return prometheus_client


def multiprocess_dir() -> str | None:
    """The multiprocess directory shared by the processes of this host, or None."""
    return os.environ.get(MULTIPROC_ENV) or None


class Metrics:
    """The counters and histograms of one process (see the module docstring).

    ``registry`` is where they are registered (a private one by default, so
    several instances, e.g. in tests, never clash). Feed it with
    ``Worker(app, on_result=metrics.on_result)`` and ``metrics.instrument(app)``.
    Thread-safe: prometheus_client's metrics are; ``series`` has its own lock.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        series: LatenessSeries | None = None,
    ) -> None:
        prom = _prometheus()
        self.registry: CollectorRegistry = (
            prom.CollectorRegistry() if registry is None else registry
        )
        self.series = series
        self._app: DelayQ | None = None

        def counter(name: str, doc: str) -> Any:
            return prom.Counter(f"delayq_jobs_{name}", doc, ["name"], registry=self.registry)

        self.scheduled = counter("scheduled", "Jobs stored by schedule (created or replaced).")
        self.cancelled = counter("cancelled", "Jobs cancelled by this process's cancel calls.")
        self.started = counter("started", "Attempts whose handler ran (counted when finished).")
        self.succeeded = counter("succeeded", "Attempts that succeeded.")
        self.failed = counter("failed", "Attempts that failed (retried or dead-lettered).")
        self.retried = counter("retried", "Failed attempts scheduled again with backoff.")
        self.dead = counter("dead", "Jobs moved to the dead letters.")
        self.skipped = counter("skipped", "Jobs skipped by their misfire policy.")
        self.lateness = prom.Histogram(
            "delayq_job_lateness_seconds",
            "Seconds between a job's due time and its claim (never negative).",
            ["name"],
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.start_lateness = prom.Histogram(
            "delayq_job_start_lateness_seconds",
            "Seconds between a job's due time and its handler's start (a wait for a slot "
            "included; never negative).",
            ["name"],
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            "delayq_handler_duration_seconds",
            "Seconds a handler ran.",
            ["name"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )

    # -- the worker's on_result ------------------------------------------------------
    def on_result(self, result: JobResult) -> None:
        """Count one finished attempt (pass as ``Worker(on_result=...)``)."""
        name, outcome = result.name, result.outcome
        if outcome == "returned":
            return  # handed back unstarted: it will be claimed (and measured) again
        self.lateness.labels(name).observe(max(0.0, result.lateness))
        if result.start_lateness is not None:
            self.start_lateness.labels(name).observe(max(0.0, result.start_lateness))
        if self.series is not None:
            self.series.add(result.lateness)
        # a retry or burial with no run time is a hand-back: an unknown handler
        # name, a misfire or backoff the worker could not read
        ran = outcome in _STARTED or (outcome in _MAYBE_STARTED and result.duration > 0)
        if ran:
            self.started.labels(name).inc()
            self.duration.labels(name).observe(result.duration)
        if outcome == "succeeded":
            self.succeeded.labels(name).inc()
        elif outcome == "retried":
            self.failed.labels(name).inc()
            self.retried.labels(name).inc()
        elif outcome == "dead":
            if ran:
                self.failed.labels(name).inc()
            self.dead.labels(name).inc()
        elif outcome == "skipped":
            self.skipped.labels(name).inc()

    def families(self) -> list[Metric]:
        """The current values of every counter and histogram (to relay them to
        another process: :class:`RelayedCounters`). Costs a few milliseconds per
        handler name: a worker sends them seldom."""
        return list(self.registry.collect())

    # -- producers (a ProducerHook) --------------------------------------------------
    def instrument(self, app: DelayQ) -> Metrics:
        """Count what ``app`` schedules and cancels; returns self."""
        self._app = app
        app.add_hook(self)
        return self

    def before_enqueue(self, specs: list[JobSpec]) -> list[JobSpec]:
        return specs

    def after_enqueue(self, specs: Sequence[JobSpec], outcomes: Sequence[EnqueueOutcome]) -> None:
        for spec, outcome in zip(specs, outcomes, strict=True):
            if outcome is not EnqueueOutcome.KEPT:
                self.scheduled.labels(spec.name).inc()

    def after_cancel(self, job_id: str, outcome: CancelOutcome) -> None:
        if not outcome.cancelled:
            return
        # cancel() knows only the id; the cancelled record still names the handler.
        job = None if self._app is None else self._app.backend.get(job_id)
        self.cancelled.labels(job.name if job is not None else "").inc()


class CounterSource(Protocol):
    """Where a dashboard reads a worker's counters and histograms: a :class:`Metrics`
    of its own process, or :class:`RelayedCounters` sent by another one."""

    @property
    def registry(self) -> CollectorRegistry: ...


class RelayedCounters:
    """Another process's counters and histograms as it last sent them.

    The dashboard a worker serves runs in a child process
    (``delayq worker --web-port``); the worker sends its metric families every
    few seconds (:meth:`Metrics.families`) and the child shows them through
    ``registry``, as if they were its own. ``_lock`` guards ``_families``.
    """

    def __init__(self) -> None:
        prom = _prometheus()
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        # no describe(): the families are not known before the first relay
        self.registry: CollectorRegistry = prom.CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def update(self, families: Sequence[Metric]) -> None:
        """Replace what is shown by ``families`` (the sender's latest)."""
        with self._lock:
            self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._families
        yield from families


class StoreCollector:
    """Gauges read from the store at each scrape (a prometheus_client collector)."""

    def __init__(self, backend: Backend, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.backend = backend
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        if "inspect" not in getattr(self.backend, "features", {"inspect"}):
            return  # a broker keeps no index of jobs: nothing to count (not "down")
        up = GaugeMetricFamily("delayq_store_up", "1 when the store answered this scrape.")
        try:
            stats = self.backend.stats()
            head = self.backend.list_jobs(state=JobState.SCHEDULED, limit=1)
        except DelayqError:
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        now = self.clock.time()
        jobs = GaugeMetricFamily("delayq_jobs", "Jobs in the store by state.", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], float(getattr(stats, state.value)))
        yield jobs
        yield GaugeMetricFamily(
            "delayq_jobs_due", "Scheduled jobs already due (the backlog).", value=stats.due
        )
        oldest = head[0].run_at if head else None
        yield GaugeMetricFamily(
            "delayq_oldest_due_age_seconds",
            "How long the oldest due job has waited past its due time (0 when none).",
            value=max(0.0, now - oldest) if oldest is not None else 0.0,
        )
        yield GaugeMetricFamily(
            "delayq_next_due_seconds",
            "Seconds until the next scheduled job is due (<= 0: one is due; NaN: none).",
            value=(stats.next_due - now) if stats.next_due is not None else math.nan,
        )


class _Joined:
    """Several collectors exposed as one (for an exposition registry)."""

    def __init__(self, parts: Iterable[Any]) -> None:
        self.parts = list(parts)

    def collect(self) -> Iterator[Metric]:
        for part in self.parts:
            yield from part.collect()


def exposition_registry(
    metrics: CounterSource | None = None, backend: Backend | None = None
) -> CollectorRegistry:
    """The registry to serve on ``/metrics``.

    In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) the counters and
    histograms are the sum over every process of this host that wrote to the
    directory, this one included; otherwise they are ``metrics``'s own. The
    store gauges come from ``backend`` (read once per scrape, by this process
    only, so they are never summed).
    """
    prom = _prometheus()
    registry: CollectorRegistry = prom.CollectorRegistry()
    parts: list[Any] = []
    directory = multiprocess_dir()
    if directory is not None:
        from prometheus_client import multiprocess  # noqa: PLC0415

        parts.append(multiprocess.MultiProcessCollector(None, path=directory))  # type: ignore[no-untyped-call]
    elif metrics is not None:
        parts.append(metrics.registry)
    if backend is not None:
        parts.append(StoreCollector(backend))
    registry.register(_Joined(parts))
    return registry


# -- lateness over time (the dashboard's chart) ----------------------------------------
def bucket_quantile(counts: Sequence[int], q: float, bounds: Sequence[float]) -> float:
    """The upper bound of the bucket holding the ``q`` quantile (0..1) of ``counts``.

    ``counts`` are per bucket (not cumulative), one per bound plus the ``+Inf``
    bucket. An upper estimate, as precise as the buckets; NaN when empty, and
    ``inf`` when the quantile lies beyond the last bound.
    """
    total = sum(counts)
    if total == 0:
        return math.nan
    rank = max(1, math.ceil(q * total))
    seen = 0
    for i, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return bounds[i] if i < len(bounds) else math.inf
    return math.inf


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """Lateness in one time slot: how many attempts, and p50 / p99 upper bounds."""

    start: float  # epoch seconds
    count: int
    p50: float
    p99: float


class LatenessSeries:
    """Lateness percentiles per time slot, in fixed memory.

    Keeps the last ``slots`` slots of ``slot_seconds`` each, every slot a bucket
    count over :data:`LATENESS_BUCKETS` (O(slots x buckets) memory, O(1) per
    sample). Fed sample by sample (``add``, from ``on_result`` in the worker's
    process) or by bucket deltas of a cumulative histogram (``add_counts``, a
    dashboard reading the multiprocess directory). ``_lock`` guards ``_slots``.
    """

    def __init__(
        self, *, slot_seconds: float = 10.0, slots: int = 180, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.slot_seconds = slot_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._slots: deque[tuple[int, list[int]]] = deque(maxlen=slots)

    def _slot(self, at: float) -> list[int]:
        index = int(at // self.slot_seconds)
        if not self._slots or self._slots[-1][0] < index:
            self._slots.append((index, [0] * (len(LATENESS_BUCKETS) + 1)))
            return self._slots[-1][1]
        for i, counts in reversed(self._slots):
            if i == index:
                return counts
        return self._slots[-1][1]  # a sample from before the newest slot: count it there

    def add(self, lateness: float, *, at: float | None = None) -> None:
        """Count one attempt claimed ``lateness`` seconds after its due time."""
        bucket = len(LATENESS_BUCKETS)
        for i, bound in enumerate(LATENESS_BUCKETS):
            if lateness <= bound:
                bucket = i
                break
        when = self.clock.time() if at is None else at
        with self._lock:
            self._slot(when)[bucket] += 1

    def add_counts(self, counts: Sequence[int], *, at: float | None = None) -> None:
        """Add per-bucket counts (one per bound plus ``+Inf``) to the slot of ``at``."""
        if len(counts) != len(LATENESS_BUCKETS) + 1:
            raise ValueError(f"need {len(LATENESS_BUCKETS) + 1} bucket counts, got {len(counts)}")
        when = self.clock.time() if at is None else at
        with self._lock:
            slot = self._slot(when)
            for i, count in enumerate(counts):
                slot[i] += count

    def recent(self, count: int = 2) -> list[tuple[int, list[int]]]:
        """Copies of the newest ``count`` slots, as ``(slot index, bucket counts)``:
        what changed lately, to relay to another process's series (:meth:`merge`)."""
        with self._lock:
            return [(i, list(c)) for i, c in list(self._slots)[-count:]]

    def merge(self, slots: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Take ``slots`` (from :meth:`recent` of another series with the same slot
        length) as they are: a slot already here is replaced, a newer one appended."""
        with self._lock:
            for index, counts in slots:
                if len(counts) != len(LATENESS_BUCKETS) + 1:
                    raise ValueError(f"a slot needs {len(LATENESS_BUCKETS) + 1} bucket counts")
                if not self._slots or self._slots[-1][0] < index:
                    self._slots.append((index, list(counts)))
                    continue
                for i, (known, _) in enumerate(self._slots):
                    if known == index:
                        self._slots[i] = (index, list(counts))
                        break

    def points(self) -> list[SeriesPoint]:
        """One point per slot that saw attempts, oldest first."""
        with self._lock:
            slots = [(i, list(c)) for i, c in self._slots]
        return [
            SeriesPoint(
                start=i * self.slot_seconds,
                count=sum(c),
                p50=bucket_quantile(c, 0.50, LATENESS_BUCKETS),
                p99=bucket_quantile(c, 0.99, LATENESS_BUCKETS),
            )
            for i, c in slots
            if sum(c)
        ]


def lateness_bucket_totals(registry: Any) -> list[int] | None:
    """Per-bucket lateness counts summed over handler names, from ``registry``'s
    cumulative histogram; None when it has no lateness samples yet."""
    cumulative = [0.0] * (len(LATENESS_BUCKETS) + 1)
    found = False
    for family in registry.collect():
        if family.name != "delayq_job_lateness_seconds":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            le = sample.labels.get("le")
            bound = math.inf if le in ("+Inf", "inf") else float(le)
            index = len(LATENESS_BUCKETS)
            for i, b in enumerate(LATENESS_BUCKETS):
                if math.isclose(b, bound):
                    index = i
                    break
            cumulative[index] += sample.value
            found = True
    if not found:
        return None
    counts = [int(cumulative[0])]
    counts.extend(int(cumulative[i] - cumulative[i - 1]) for i in range(1, len(cumulative)))
    return counts
