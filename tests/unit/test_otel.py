"""OpenTelemetry: the trace context captured at schedule links the handler's span."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.job import JobContext
from delayq.observe.otel import ENVELOPE_KEY, instrument, unwrap
from delayq.testing import FakeClock
from delayq.worker import JobResult, Worker

T0 = 1_700_000_000.0


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def run_jobs(app: DelayQ, clock: FakeClock, count: int) -> list[JobResult]:
    results: queue.Queue[JobResult] = queue.Queue()
    worker = Worker(app, idle_wait=3600.0, on_result=results.put).start()
    try:
        return [results.get(timeout=10) for _ in range(count)]
    finally:
        worker.stop(grace=0)


def test_the_handler_span_links_to_the_span_current_at_schedule(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    clock = FakeClock(T0)
    seen: list[tuple[Any, str]] = []
    with DelayQ(backend=MemoryBackend(clock=clock), clock=clock) as app:

        @app.handler("mail")
        def mail(payload: Any, ctx: JobContext) -> None:
            span = trace.get_current_span()
            seen.append((payload, span.name if hasattr(span, "name") else ""))

        @app.handler("sms")
        async def sms(payload: Any) -> None:
            await asyncio.sleep(0)
            seen.append((payload, trace.get_current_span().name))  # type: ignore[attr-defined]

        instrument(app, tracer_provider=provider)
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("POST /orders") as request_span:
            job_id = app.schedule("mail", {"order": 42})
            app.schedule("sms", [1, 2])
        stored = app.get(job_id)
        assert stored is not None and ENVELOPE_KEY in stored.payload  # where it travels
        results = run_jobs(app, clock, 2)
    assert sorted(r.outcome for r in results) == ["succeeded", "succeeded"]
    assert sorted(seen, key=str) == sorted(
        [({"order": 42}, "delayq.job mail"), ([1, 2], "delayq.job sms")], key=str
    )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    job_span = spans["delayq.job mail"]
    assert job_span.kind is trace.SpanKind.CONSUMER
    (link,) = job_span.links
    parent = request_span.get_span_context()
    assert (link.context.trace_id, link.context.span_id) == (parent.trace_id, parent.span_id)
    assert job_span.attributes is not None and job_span.attributes["delayq.job.id"] == job_id
    assert job_span.attributes["delayq.job.attempt"] == 1
    assert spans["delayq.job sms"].links[0].context.trace_id == parent.trace_id


def test_without_a_current_span_the_payload_is_stored_as_is_and_the_span_has_no_link(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    clock = FakeClock(T0)
    with DelayQ(backend=MemoryBackend(clock=clock), clock=clock) as app:
        app.register("mail", lambda p: None)
        instrument(app, tracer_provider=provider)
        job_id = app.schedule("mail", {"order": 1})
        stored = app.get(job_id)
        assert stored is not None and stored.payload == {"order": 1}
        run_jobs(app, clock, 1)
    (span,) = exporter.get_finished_spans()
    assert span.name == "delayq.job mail" and list(span.links) == []


def test_a_failing_handler_records_the_error_on_its_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    clock = FakeClock(T0)
    with DelayQ(backend=MemoryBackend(clock=clock), clock=clock) as app:
        app.register("boom", lambda p: 1 / 0)
        instrument(app, tracer_provider=provider)
        app.schedule("boom", max_attempts=1)
        (result,) = run_jobs(app, clock, 1)
    assert result.outcome == "dead"
    (span,) = exporter.get_finished_spans()
    assert not span.status.is_ok
    assert any(e.name == "exception" for e in span.events)


def test_unwrap_leaves_ordinary_payloads_alone() -> None:
    assert unwrap({"payload": 1, "other": 2}) == ({"payload": 1, "other": 2}, None)
    assert unwrap({ENVELOPE_KEY: {"traceparent": "x"}, "payload": [1]}) == (
        [1],
        {"traceparent": "x"},
    )
