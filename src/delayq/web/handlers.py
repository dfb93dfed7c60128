"""The per-handler table: for each handler, what waits, what runs, what failed,
how late and how fast.

From the store (every dashboard): counts of scheduled, running and dead jobs,
the due backlog and its oldest overdue job. A store with ``handler_counts``
(SQLite) groups them in one read; others get a bounded walk of each state
(:data:`SCAN` jobs at most, then the counts say "at least"). From this
process's worker counters (a dashboard served by the worker, or
``PROMETHEUS_MULTIPROC_DIR``): attempts, failure rate and lateness p50 / p99
per handler, since the counters started.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from delayq.app import DelayQ
from delayq.job import JobState
from delayq.observe.metrics import (
    LATENESS_BUCKETS,
    CounterSource,
    bucket_quantile,
    multiprocess_dir,
)
from delayq.web._dashboard import dashboard

__all__ = ["API_PATHS", "ROUTES", "SCAN", "handler_table"]

SCAN = 2000
_STATES = (JobState.SCHEDULED, JobState.RUNNING, JobState.DEAD)


def _store_counts(app: DelayQ, now: float) -> tuple[dict[str, dict[str, Any]], bool]:
    grouped = getattr(app.backend, "handler_counts", None)
    table: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        return table.setdefault(
            name,
            {"name": name, "scheduled": 0, "running": 0, "dead": 0, "due": 0, "oldest_due": None},
        )

    if grouped is not None:
        for name, state, count, due, oldest in grouped(now):
            r = row(name)
            r[state] = count
            if state == "scheduled":
                r["due"], r["oldest_due"] = due, oldest
        return table, False
    capped = False
    for state in _STATES:
        jobs = app.list_jobs(state=state, limit=SCAN, preview=1)
        capped = capped or len(jobs) == SCAN
        for job in jobs:
            r = row(job.name)
            r[state.value] += 1
            if state is JobState.SCHEDULED and job.run_at <= now:
                r["due"] += 1
                if r["oldest_due"] is None or job.run_at < r["oldest_due"]:
                    r["oldest_due"] = job.run_at
    return table, capped


def _counters(metrics: CounterSource | None) -> dict[str, dict[str, Any]]:
    """Per handler from the worker counters: attempts, failures, lateness buckets."""
    registry: Any = None
    if multiprocess_dir() is not None:
        from prometheus_client import CollectorRegistry, multiprocess  # noqa: PLC0415

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiprocess_dir())  # type: ignore[no-untyped-call]
    elif metrics is not None:
        registry = metrics.registry
    out: dict[str, dict[str, Any]] = {}
    if registry is None:
        return out
    index = {repr(float(b)): i for i, b in enumerate(LATENESS_BUCKETS)}
    for family in registry.collect():
        for sample in family.samples:
            name = sample.labels.get("name")
            if name is None:
                continue
            r = out.setdefault(
                name,
                {"started": 0.0, "failed": 0.0, "buckets": [0.0] * (len(LATENESS_BUCKETS) + 1)},
            )
            if sample.name == "delayq_jobs_started_total":
                r["started"] += sample.value
            elif sample.name == "delayq_jobs_failed_total":
                r["failed"] += sample.value
            elif sample.name == "delayq_job_lateness_seconds_bucket":
                le = sample.labels["le"]
                i = len(LATENESS_BUCKETS) if le == "+Inf" else index.get(repr(float(le)))
                if i is not None:
                    r["buckets"][i] += sample.value  # cumulative, undone below
    for r in out.values():
        cum = r.pop("buckets")
        per = [cum[0]] + [max(0.0, b - a) for a, b in itertools.pairwise(cum)]
        counts = [int(c) for c in per]
        r["p50"] = _finite(bucket_quantile(counts, 0.50, LATENESS_BUCKETS))
        r["p99"] = _finite(bucket_quantile(counts, 0.99, LATENESS_BUCKETS))
        r["failure_rate"] = r["failed"] / r["started"] if r["started"] else None
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def handler_table(app: DelayQ, metrics: CounterSource | None, now: float) -> dict[str, Any]:
    """Rows by handler name (most due first), and whether store counts were capped."""
    table, capped = _store_counts(app, now)
    counters = _counters(metrics)
    for name, c in counters.items():
        row = table.setdefault(
            name,
            {"name": name, "scheduled": 0, "running": 0, "dead": 0, "due": 0, "oldest_due": None},
        )
        row.update(c)
    for row in table.values():
        row["oldest_overdue_age"] = None if row["oldest_due"] is None else now - row["oldest_due"]
    rows = sorted(table.values(), key=lambda r: (-r["due"], -r["dead"], r["name"]))
    return {"handlers": rows, "capped": capped, "counters": bool(counters)}


async def page(request: Request) -> Response:
    dash = dashboard(request)
    now = dash.app.clock.time()
    data = await dash.call(handler_table, dash.app, dash.metrics, now)
    return dash.render(request, "handlers.html", data=data, now=now, refresh=5, scan=SCAN)


async def api(request: Request) -> JSONResponse:
    dash = dashboard(request)
    data = await dash.call(handler_table, dash.app, dash.metrics, dash.app.clock.time())
    return JSONResponse(data)


API_PATHS: dict[str, Any] = {
    "/api/handlers": {
        "get": {
            "summary": "Per handler: scheduled, due, oldest overdue, running, dead; attempts, "
            "failure rate, lateness p50/p99 from the worker counters",
            "responses": {"200": {"description": "{'handlers': [...], 'capped': bool}"}},
        }
    }
}

ROUTES = [Route("/handlers", page), Route("/api/handlers", api)]
