"""The JSON API under ``/api`` (described by ``/api/openapi.json``).

Reads answer 200 (a job that does not exist: 404). Actions answer with the
CLI's outcome words, 200 when the answer is definite and the job exists, 404
with ``not_found`` / ``not_dead`` otherwise; bad input is 400 with
``{"error": ...}``, a missing token 401, a missing CSRF value 403, a store
failure 503. Actions authenticate with ``Authorization: Bearer <token>`` (or the
dashboard's session cookie plus ``X-CSRF-Token``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from delayq._present import job_dict
from delayq.errors import InvalidOption
from delayq.job import JobState
from delayq.web import views
from delayq.web._dashboard import dashboard, json_body
from delayq.web._limits import API_PATHS as _LIMIT_PATHS
from delayq.web._recurring import API_PATHS as _RECURRING_PATHS
from delayq.web._rows import PREVIEW_CHARS, job_row
from delayq.web._workers import API_PATHS as _WORKER_PATHS
from delayq.web.bulk import API_PATHS as _BULK_PATHS
from delayq.web.handlers import API_PATHS as _HANDLER_PATHS

__all__ = ["OPENAPI", "ROUTES"]


class _JSON(JSONResponse):
    """JSON without NaN (not JSON) and with non-ASCII text as is."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            _finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


async def overview(request: Request) -> _JSON:
    dash = dashboard(request)
    now = dash.app.clock.time()
    data = await dash.call(
        views.overview, dash.app, dash.series.points(), dash.series.slot_seconds, now
    )
    data["lateness_source"] = dash.lateness_source or None
    return _JSON(data)


async def jobs(request: Request) -> _JSON:
    dash = dashboard(request)
    filters = views.JobFilters.parse(request.query_params)
    page, cursor = await dash.call(views.list_page, dash.app, filters)
    nxt = None if cursor is None else {"after_run_at": cursor[0], "after_id": cursor[1]}
    now = dash.app.clock.time()
    return _JSON({"jobs": [job_row(j, now) for j in page], "next": nxt})


async def job(request: Request) -> _JSON:
    dash = dashboard(request)
    found = await dash.call(dash.app.get, request.path_params["job_id"])
    if found is None:
        return _JSON({"error": "no job with this id", "outcome": "not_found"}, 404)
    return _JSON(job_dict(found))


async def dead(request: Request) -> _JSON:
    dash = dashboard(request)
    limit = views.JobFilters.parse(request.query_params).limit
    jobs = await dash.call(dash.app.dead_letters, limit=limit, preview=PREVIEW_CHARS)
    now = dash.app.clock.time()
    return _JSON({"jobs": [job_row(j, now) for j in jobs]})


async def _act(request: Request, fn: Any, accepted: frozenset[str] = frozenset()) -> _JSON:
    """Run an action of :mod:`~delayq.web.views` on the job of the path, with the
    body's fields (only those ``accepted``) as keyword arguments."""
    dash = dashboard(request)
    dash.check_action(request, None)
    job_id = request.path_params["job_id"]
    body = await json_body(request)
    if not accepted.issuperset(body):
        unknown = sorted(set(body) - accepted)
        raise InvalidOption(f"unknown field(s) {unknown}; accepted: {sorted(accepted)}")
    outcome = await dash.call(fn, dash.app, job_id, **body)
    status = 404 if outcome in ("not_found", "not_dead") else 200
    return _JSON({"id": job_id, "outcome": outcome}, status)


async def cancel(request: Request) -> _JSON:
    return await _act(request, views.cancel)


async def reschedule(request: Request) -> _JSON:
    return await _act(request, views.reschedule, frozenset({"delay", "at"}))


async def requeue(request: Request) -> _JSON:
    return await _act(request, views.requeue)


async def purge(request: Request) -> _JSON:
    dash = dashboard(request)
    dash.check_action(request, None)
    body = await json_body(request)
    ids = body.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise InvalidOption("ids must be a list of job ids")
    count = await dash.call(
        views.purge,
        dash.app,
        job_ids=ids,
        older_than=body.get("older_than"),
        everything=body.get("all") is True,
    )
    return _JSON({"purged": count})


async def openapi(request: Request) -> _JSON:
    return _JSON(OPENAPI)


def _outcome(words: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"id": {"type": "string"}, "outcome": {"type": "string", "enum": words}},
    }


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}}
_JOB: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": "string"},
        "state": {"type": "string", "enum": [s.value for s in JobState]},
        "payload": {},
        "run_at": {"type": "number", "description": "due time, epoch seconds"},
        "run_at_iso": {"type": "string"},
        "attempts": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "backoff": {"type": "object"},
        "misfire": {"type": "string"},
        "created_at": {"type": "number"},
        "updated_at": {"type": "number"},
        "lease_until": {"type": ["number", "null"]},
        "last_error": {"type": ["string", "null"], "description": "the whole traceback"},
        "error_summary": {"type": ["string", "null"], "description": "Type: message"},
        "outcome": {"type": ["string", "null"]},
        "result": {"description": "a succeeded job's return value (present when it kept one)"},
    },
}
_ROW = {
    "type": "object",
    "description": "a job as lists show it: no payload, no traceback (GET /api/jobs/{id} has both)",
    "properties": {
        **{
            k: v
            for k, v in _JOB["properties"].items()
            if k in ("id", "name", "state", "run_at", "run_at_iso", "attempts", "max_attempts")
            or k in ("updated_at", "lease_until", "error_summary", "outcome")
        },
        "lease_expired_for": {
            "type": ["number", "null"],
            "description": "running, lease ran out this many seconds ago (its worker is gone)",
        },
        "retrying": {"type": "boolean", "description": "scheduled after a failed attempt"},
        "payload_preview": {
            "type": "string",
            "description": f"compact JSON, at most {PREVIEW_CHARS} characters",
        },
        "payload_chars": {"type": "integer", "description": "length of the whole payload JSON"},
    },
}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _action(summary: str, words: list[str], body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": [_JOB_ID],
        "security": [{"bearer": []}],
        "responses": {
            "200": _json(_outcome(words)),
            "400": _json(_ERROR, "bad input"),
            "401": _json(_ERROR, "no token"),
            "403": _json(_ERROR, "no CSRF value (cookie sessions)"),
            "404": _json(_outcome(words), "no such job"),
        },
    }
    if body is not None:
        op["requestBody"] = {"content": {"application/json": {"schema": body}}}
    return {"post": op}


_FILTERS = [
    {"name": "state", "in": "query", "schema": {"type": "string"}},
    {"name": "name", "in": "query", "schema": {"type": "string"}, "description": "handler"},
    {"name": "due_after", "in": "query", "schema": {"type": "string"}, "description": "epoch/ISO"},
    {"name": "due_before", "in": "query", "schema": {"type": "string"}},
    {"name": "after_run_at", "in": "query", "schema": {"type": "number"}, "description": "cursor"},
    {"name": "after_id", "in": "query", "schema": {"type": "string"}, "description": "cursor"},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 500}},
    {
        "name": "payload_contains",
        "in": "query",
        "schema": {"type": "string"},
        "description": "a substring of the payload's JSON (memory, SQLite, PostgreSQL; else 501)",
    },
    {
        "name": "payload_path",
        "in": "query",
        "schema": {"type": "string"},
        "description": "with payload_value: a JSON path, e.g. customer.id or $.items[0].sku",
    },
    {
        "name": "payload_value",
        "in": "query",
        "schema": {"type": "string"},
        "description": 'the value at payload_path: 42, true, "42" (a string), or text',
    },
]

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "delayq dashboard API", "version": "1"},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "paths": {
        "/api/overview": {
            "get": {
                "summary": "Counts by state, next due, oldest overdue, lateness over time",
                "responses": {"200": _json({"type": "object"})},
            }
        },
        "/api/jobs": {
            "get": {
                "summary": "A page of jobs in due order; 'next' is the cursor of the next page",
                "parameters": _FILTERS,
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "jobs": {"type": "array", "items": _ROW},
                                "next": {"type": ["object", "null"]},
                            },
                        }
                    )
                },
            }
        },
        "/api/jobs/{job_id}": {
            "get": {
                "summary": "One job",
                "parameters": [_JOB_ID],
                "responses": {"200": _json(_JOB), "404": _json(_ERROR, "no such job")},
            }
        },
        "/api/jobs/{job_id}/cancel": _action(
            "Cancel a scheduled job",
            ["cancelled", "cancelled_after_attempt", "running", "finished", "not_found"],
        ),
        "/api/jobs/{job_id}/reschedule": _action(
            "Move a scheduled job (exactly one of delay, at)",
            ["rescheduled", "rescheduled_after_attempt", "running", "finished", "not_found"],
            {
                "type": "object",
                "properties": {
                    "delay": {"type": ["number", "string"], "description": "30, '5m'"},
                    "at": {"type": ["number", "string"], "description": "epoch or ISO 8601"},
                },
            },
        ),
        "/api/jobs/{job_id}/requeue": _action(
            "Give a dead job fresh attempts, due now", ["requeued", "not_dead"]
        ),
        "/api/dead": {
            "get": {
                "summary": "Dead letters, most recently buried first",
                "responses": {"200": _json({"type": "object"})},
            }
        },
        "/api/dead/purge": {
            "post": {
                "summary": "Delete dead letters: ids, older_than ('7d') or all",
                "security": [{"bearer": []}],
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "ids": {"type": "array", "items": {"type": "string"}},
                                    "older_than": {"type": "string"},
                                    "all": {"type": "boolean"},
                                },
                            }
                        }
                    }
                },
                "responses": {
                    "200": _json({"type": "object", "properties": {"purged": {"type": "integer"}}})
                },
            }
        },
        **_RECURRING_PATHS,
        **_BULK_PATHS,
        **_WORKER_PATHS,
        **_LIMIT_PATHS,
        **_HANDLER_PATHS,
        "/metrics": {
            "get": {
                "summary": "Prometheus text: worker counters, lateness histogram, store gauges",
                "responses": {"200": {"description": "text/plain exposition"}},
            }
        },
    },
}


ROUTES = [
    Route("/api/overview", overview),
    Route("/api/jobs", jobs),
    Route("/api/jobs/{job_id:path}/cancel", cancel, methods=["POST"]),
    Route("/api/jobs/{job_id:path}/reschedule", reschedule, methods=["POST"]),
    Route("/api/jobs/{job_id:path}/requeue", requeue, methods=["POST"]),
    Route("/api/jobs/{job_id:path}", job),
    Route("/api/dead", dead),
    Route("/api/dead/purge", purge, methods=["POST"]),
    Route("/api/openapi.json", openapi),
]
