"""Prometheus metrics: worker counters, the lateness histogram, store gauges, the
lateness series, and several processes aggregated through the multiprocess directory."""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prom_multiprocess

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.observe.metrics import (
    LATENESS_BUCKETS,
    LatenessSeries,
    Metrics,
    StoreCollector,
    bucket_quantile,
    exposition_registry,
    lateness_bucket_totals,
)
from delayq.testing import FakeClock
from delayq.worker import JobResult, Worker

T0 = 1_700_000_000.0


def result(outcome: str, *, name: str = "mail", lateness: float = 0.01, duration: float = 0.2):
    return JobResult(
        job_id="j", name=name, attempt=1, outcome=outcome, lateness=lateness, duration=duration
    )  # type: ignore[arg-type]


def value(m: Metrics, metric: str, **labels: str) -> float:
    got = m.registry.get_sample_value(metric, labels)
    return 0.0 if got is None else got


def test_results_count_by_outcome_and_handler_name() -> None:
    m = Metrics()
    for outcome in ("succeeded", "succeeded", "retried", "dead", "skipped", "returned"):
        m.on_result(result(outcome))
    m.on_result(result("succeeded", name="sms"))
    assert value(m, "delayq_jobs_succeeded_total", name="mail") == 2
    assert value(m, "delayq_jobs_succeeded_total", name="sms") == 1
    assert value(m, "delayq_jobs_retried_total", name="mail") == 1
    assert value(m, "delayq_jobs_failed_total", name="mail") == 2  # the retry and the bury
    assert value(m, "delayq_jobs_dead_total", name="mail") == 1
    assert value(m, "delayq_jobs_skipped_total", name="mail") == 1
    assert value(m, "delayq_jobs_started_total", name="mail") == 4  # not skipped, not returned
    # a returned (unstarted) claim is measured when it is claimed again
    assert value(m, "delayq_job_lateness_seconds_count", name="mail") == 5


def test_a_job_buried_without_running_is_dead_but_not_failed() -> None:
    m = Metrics()
    m.on_result(result("dead", duration=0.0))  # no handler registered under its name
    assert value(m, "delayq_jobs_dead_total", name="mail") == 1
    assert value(m, "delayq_jobs_failed_total", name="mail") == 0
    assert value(m, "delayq_jobs_started_total", name="mail") == 0


def test_an_unknown_handler_handed_back_for_a_retry_is_not_counted_as_started() -> None:
    m = Metrics()
    m.on_result(result("retried", name="legacy.unknown", duration=0.0))
    m.on_result(result("retried", name="mail", duration=0.004))
    assert value(m, "delayq_jobs_started_total", name="legacy.unknown") == 0
    assert value(m, "delayq_jobs_retried_total", name="legacy.unknown") == 1
    assert value(m, "delayq_jobs_started_total", name="mail") == 1


def test_lateness_buckets_go_from_a_tenth_of_a_millisecond_to_hours() -> None:
    # delayq's own p50 is well under a millisecond: sub-ms buckets tell 0.3 ms from 0.9 ms
    assert LATENESS_BUCKETS[0] == 0.0001 and LATENESS_BUCKETS[-1] >= 4 * 3600
    assert list(LATENESS_BUCKETS) == sorted(LATENESS_BUCKETS)
    m = Metrics()
    for lateness in (0.0004, 0.003, 0.003, 2.0, 5000.0, 10 * 86400.0, -0.5):
        m.on_result(result("succeeded", lateness=lateness))

    def le(bound: str) -> float:
        return value(m, "delayq_job_lateness_seconds_bucket", name="mail", le=bound)

    assert le("0.0001") == 1  # the (clock-skew) negative one, counted as 0
    assert le("0.0005") == 2  # and 0.4 ms
    assert le("0.001") == 2
    assert le("0.005") == 4
    assert le("2.5") == 5
    assert le("3600.0") == 5
    assert le("7200.0") == 6
    assert le("+Inf") == 7


def test_instrumented_app_counts_scheduled_and_cancelled_jobs_by_name() -> None:
    clock = FakeClock(T0)
    with DelayQ("memory://", clock=clock) as app:
        m = Metrics().instrument(app)
        app.schedule("mail", delay=5, job_id="a")
        app.schedule("mail", delay=5, job_id="a", on_conflict="keep")  # kept: not counted
        app.schedule_many([{"name": "sms", "delay": 1}, {"name": "sms"}])
        app.cancel("a")
        app.cancel("a")  # finished already: not counted again
    assert value(m, "delayq_jobs_scheduled_total", name="mail") == 1
    assert value(m, "delayq_jobs_scheduled_total", name="sms") == 2
    assert value(m, "delayq_jobs_cancelled_total", name="mail") == 1


def test_a_running_worker_feeds_the_counters_and_the_series() -> None:
    clock = FakeClock(T0)
    series = LatenessSeries(clock=clock)
    m = Metrics(series=series)
    done: queue.Queue[JobResult] = queue.Queue()

    def on_result(r: JobResult) -> None:
        m.on_result(r)
        done.put(r)

    with DelayQ(backend=MemoryBackend(clock=clock), clock=clock) as app:
        app.register("mail", lambda p: None)
        app.register("boom", lambda p: 1 / 0)
        app.schedule("mail")
        app.schedule("boom", max_attempts=1)
        worker = Worker(app, idle_wait=3600.0, on_result=on_result).start()
        try:
            outcomes = sorted(done.get(timeout=10).outcome for _ in range(2))
        finally:
            worker.stop(grace=0)
    assert outcomes == ["dead", "succeeded"]
    assert value(m, "delayq_jobs_succeeded_total", name="mail") == 1
    assert value(m, "delayq_jobs_dead_total", name="boom") == 1
    assert sum(p.count for p in series.points()) == 2


def test_store_gauges_read_states_backlog_oldest_due_and_next_due() -> None:
    clock = FakeClock(T0)
    backend = MemoryBackend(clock=clock)
    app = DelayQ(backend=backend, clock=clock)
    app.schedule("a", delay=0)
    app.schedule("b", delay=30)
    clock.advance(12)
    registry = CollectorRegistry()
    registry.register(StoreCollector(backend, clock=clock))

    def gauge(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert gauge("delayq_store_up") == 1
    assert gauge("delayq_jobs", state="scheduled") == 2
    assert gauge("delayq_jobs", state="dead") == 0
    assert gauge("delayq_jobs_due") == 1
    assert gauge("delayq_oldest_due_age_seconds") == pytest.approx(12)
    assert gauge("delayq_next_due_seconds") == pytest.approx(-12)
    backend.close()
    assert gauge("delayq_store_up") == 0  # a failed read is a value, not a gap
    assert gauge("delayq_jobs", state="scheduled") is None


def test_the_exposition_has_the_process_metrics_and_the_store_gauges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    m = Metrics()
    m.on_result(result("succeeded"))
    text = generate_latest(exposition_registry(m, MemoryBackend())).decode()
    assert 'delayq_jobs_succeeded_total{name="mail"} 1.0' in text
    assert "delayq_store_up 1.0" in text


def test_bucket_quantiles_are_upper_bounds() -> None:
    bounds = (0.01, 0.1, 1.0)
    assert math.isnan(bucket_quantile([0, 0, 0, 0], 0.5, bounds))
    assert bucket_quantile([98, 1, 1, 0], 0.5, bounds) == 0.01
    assert bucket_quantile([98, 1, 1, 0], 0.99, bounds) == 0.1
    assert bucket_quantile([0, 0, 1, 1], 0.99, bounds) == math.inf


def test_the_series_keeps_one_point_per_slot_in_fixed_memory() -> None:
    clock = FakeClock(T0)
    series = LatenessSeries(slot_seconds=10, slots=3, clock=clock)
    for i in range(5):
        for _ in range(99):
            series.add(0.002)
        series.add(30.0 * (i + 1))
        clock.advance(10)
    points = series.points()
    assert len(points) == 3  # the two oldest slots fell off
    assert [p.count for p in points] == [100, 100, 100]
    assert all(p.p50 == 0.0025 for p in points)
    assert [p.p99 for p in points] == [0.0025] * 3
    series.add_counts([0] * (len(LATENESS_BUCKETS)) + [3], at=clock.time())
    assert series.points()[-1].p99 == math.inf


def test_bucket_totals_sum_the_handlers_of_a_cumulative_histogram() -> None:
    m = Metrics()
    assert lateness_bucket_totals(m.registry) is None
    m.on_result(result("succeeded", name="a", lateness=0.003))
    m.on_result(result("succeeded", name="b", lateness=0.003))
    m.on_result(result("succeeded", name="b", lateness=50.0))
    totals = lateness_bucket_totals(m.registry)
    assert totals is not None and sum(totals) == 3
    assert totals[LATENESS_BUCKETS.index(0.005)] == 2
    assert totals[LATENESS_BUCKETS.index(60.0)] == 1


_CHILD = textwrap.dedent(
    """
    import sys
    from delayq.observe.metrics import Metrics
    from delayq.worker import JobResult
    m = Metrics()
    for i in range(int(sys.argv[1])):
        m.on_result(JobResult(job_id=str(i), name="mail", attempt=1, outcome="succeeded",
                              lateness=0.003, duration=0.01))
    """
)


@pytest.mark.slow
def test_several_worker_processes_aggregate_through_the_multiprocess_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "prom"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    for count in (3, 4):
        subprocess.run([sys.executable, "-c", _CHILD, str(count)], env=env, check=True, timeout=60)
    registry = CollectorRegistry()
    prom_multiprocess.MultiProcessCollector(registry, path=str(directory))
    assert registry.get_sample_value("delayq_jobs_succeeded_total", {"name": "mail"}) == 7
    bucket = {"name": "mail", "le": "0.005"}
    assert registry.get_sample_value("delayq_job_lateness_seconds_bucket", bucket) == 7
    # the exposition a dashboard or worker serves reads the same directory
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    text = generate_latest(exposition_registry(None, MemoryBackend())).decode()
    assert 'delayq_jobs_succeeded_total{name="mail"} 7.0' in text


def test_a_store_that_keeps_no_index_of_jobs_has_no_store_gauges() -> None:
    class Broker(MemoryBackend):
        features = frozenset({"definite_cancel"})

    registry = CollectorRegistry()
    registry.register(StoreCollector(Broker()))
    assert registry.get_sample_value("delayq_store_up") is None
    assert generate_latest(registry) == b""
