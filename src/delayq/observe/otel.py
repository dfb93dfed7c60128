"""Optional OpenTelemetry tracing: a job carries the trace it was scheduled in.

``instrument(app)`` (``pip install 'delayq[otel]'``) does two things:

* **at schedule**: when a span is current, its context (W3C ``traceparent`` /
  ``tracestate``, through the configured propagator) is stored with the job;
* **in the worker**: each handler registered so far runs inside a CONSUMER span
  ``delayq.job <name>`` whose *link* points to that stored context (a link, not a
  parent: the job may run hours later, retried, in another process), with the
  job id, attempt and lateness as attributes; a failure is recorded on the span.

Where the context travels: the stores' schemas have no header field, so the
context rides in the stored payload as an envelope
``{"$delayq": {"traceparent": ...}, "payload": <the payload>}``, built only
when a span is current. Instrumented handlers unwrap it and receive the
original payload. The gap this leaves: a worker that is not instrumented hands
its handlers the envelope, the dashboard and ``delayq get`` show it, and it
adds about 100 bytes after the payload size check. Instrument the producers and
the workers of a queue together (usually the same module: call
``instrument(app)`` after registering the handlers).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from delayq.errors import MissingDependency
from delayq.job import CancelOutcome, EnqueueOutcome, JobSpec

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from delayq.app import DelayQ
    from delayq.job import Handler, JobContext

__all__ = ["ENVELOPE_KEY", "Tracing", "instrument", "unwrap"]

ENVELOPE_KEY = "$delayq"


def _otel() -> Any:
    try:
        from opentelemetry import propagate, trace  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependency(
            "delayq tracing needs OpenTelemetry: pip install 'delayq[otel]'"
        ) from exc
    return propagate, trace


def unwrap(payload: Any) -> tuple[Any, dict[str, str] | None]:
    """``(payload, carrier)``: the original payload and the stored trace context,
    or ``(payload, None)`` when ``payload`` is not an envelope."""
    if (
        isinstance(payload, dict)
        and len(payload) == 2
        and ENVELOPE_KEY in payload
        and "payload" in payload
        and isinstance(payload[ENVELOPE_KEY], dict)
    ):
        carrier = {k: v for k, v in payload[ENVELOPE_KEY].items() if isinstance(v, str)}
        return payload["payload"], carrier
    return payload, None


class Tracing:
    """The producer hook and handler wrapper behind :func:`instrument`."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        propagate, trace = _otel()
        self._propagate = propagate
        self._trace = trace
        self.tracer: Tracer = trace.get_tracer("delayq", tracer_provider=tracer_provider)

    # -- producers (a ProducerHook) --------------------------------------------------
    def before_enqueue(self, specs: list[JobSpec]) -> list[JobSpec]:
        if not self._trace.get_current_span().get_span_context().is_valid:
            return specs  # nothing to link to: leave the payload as it is
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        head = json.dumps({ENVELOPE_KEY: carrier}, separators=(",", ":"))[:-1]
        return [replace(s, payload=f'{head},"payload":{s.payload}}}') for s in specs]

    def after_enqueue(self, specs: Sequence[JobSpec], outcomes: Sequence[EnqueueOutcome]) -> None:
        pass

    def after_cancel(self, job_id: str, outcome: CancelOutcome) -> None:
        pass

    # -- workers ----------------------------------------------------------------------
    def wrap(self, entry: Handler) -> Callable[..., Any]:
        """A function running ``entry`` inside a span linked to the job's trace."""
        tracing = self

        if entry.is_async:

            async def run_async(payload: Any, ctx: JobContext) -> Any:
                original, carrier = unwrap(payload)
                with tracing._span(ctx, carrier):
                    return await entry.call(original, ctx)

            return _named(run_async, entry.fn)

        def run(payload: Any, ctx: JobContext) -> Any:
            original, carrier = unwrap(payload)
            with tracing._span(ctx, carrier):
                return entry.call(original, ctx)

        return _named(run, entry.fn)

    def _span(self, ctx: JobContext, carrier: dict[str, str] | None) -> Any:
        links = []
        if carrier:
            linked = self._trace.get_current_span(self._propagate.extract(carrier))
            span_context = linked.get_span_context()
            if span_context.is_valid:
                links.append(self._trace.Link(span_context))
        return self.tracer.start_as_current_span(
            f"delayq.job {ctx.name}",
            kind=self._trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "delayq.job.id": ctx.id,
                "delayq.job.name": ctx.name,
                "delayq.job.attempt": ctx.attempt,
                "delayq.job.lateness_s": ctx.lateness,
            },
        )


def _named(fn: Callable[..., Any], like: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``like``'s name and doc, but its OWN signature: no
    ``__wrapped__``, so the app sees that it takes ``(payload, ctx)``."""
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(fn, attr, getattr(like, attr))
    return fn


def instrument(app: DelayQ, *, tracer_provider: TracerProvider | None = None) -> Tracing:
    """Trace what ``app`` schedules and run its registered handlers in linked spans.

    Wraps the handlers registered so far (register first, then instrument).
    """
    tracing = Tracing(tracer_provider)
    app.add_hook(tracing)
    for name, entry in app.handlers.items():
        app.register(name, tracing.wrap(entry), replace=True)
    return tracing
