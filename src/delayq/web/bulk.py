"""Bulk requeue / cancel / purge by filter, with a confirmation step.

``GET /bulk?action=requeue&name=...`` says how many jobs match and shows the
form that confirms that count; ``POST /bulk/{action}`` runs it
(:mod:`delayq._bulk`: refused when the count moved meanwhile). The API twin,
``POST /api/bulk/{action}``, answers ``{"matched": N}`` without ``confirm`` (a
dry run) and ``{"matched": N, "outcomes": {...}}`` with ``"confirm": N``; a
count that moved is 409 with the new count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from delayq import _bulk
from delayq.errors import InvalidOption
from delayq.web import views
from delayq.web._dashboard import dashboard, json_body

__all__ = ["API_PATHS", "ROUTES"]


_FIELDS = ("name", "due_after", "due_before", "payload_contains", "payload_path", "payload_value")


def _where(fields: Mapping[str, Any]) -> _bulk.BulkFilter:
    name = str(fields.get("name") or "").strip() or None
    # the jobs list's payload search, read by the one parser
    search = views.JobFilters.parse(
        {
            k: str(fields[k])
            for k in ("payload_contains", "payload_path", "payload_value")
            if fields.get(k) is not None
        }
    )
    return _bulk.BulkFilter(
        name=name,
        due_after=views._bound(_text(fields.get("due_after")), "due_after"),
        due_before=views._bound(_text(fields.get("due_before")), "due_before"),
        payload_contains=search.payload_contains,
        payload_at=search.payload_at,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _action(request: Request, given: str | None = None) -> str:
    action = given if given is not None else request.path_params["action"]
    if action not in _bulk.ACTIONS:
        raise InvalidOption(f"action must be one of {', '.join(_bulk.ACTIONS)}; got {action!r}")
    return action


def _confirm(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidOption(f"confirm must be the matched count (an int), got {value!r}") from None


async def confirm_page(request: Request) -> Response:
    dash = dashboard(request)
    action = _action(request, request.query_params.get("action") or "requeue")
    where = _where(request.query_params)
    ids = await dash.call(_bulk.match, dash.app, action, where)
    return dash.render(
        request,
        "bulk.html",
        action=action,
        state=_bulk.ACTIONS[action].value,
        where=where,
        raw=request.query_params,
        matched=len(ids),
        sample=ids[:10],
        limit=_bulk.BULK_LIMIT,
        can_search="payload_search" in dash.app.backend.features,
    )


async def run_page(request: Request) -> Response:
    dash = dashboard(request)
    action = _action(request)
    data = await request.form()
    fields = {k: v for k, v in data.items() if isinstance(v, str)}
    dash.check_action(request, fields.get("csrf", ""))
    where = _where(fields)
    try:
        outcomes = await dash.call(
            _bulk.run, dash.app, action, where, confirm=_confirm(fields.get("confirm")), who="page"
        )
    except _bulk.CountChanged as exc:
        again = {k: v for k, v in fields.items() if k in _FIELDS}
        again.update(action=action, changed=str(exc))
        return dash.redirect(request, "/bulk?" + urlencode(again))
    done = ", ".join(f"{n} {word}" for word, n in sorted(outcomes.items())) or "nothing to do"
    query = urlencode({"action": action, "done": f"bulk {action}: {done}"})
    return dash.redirect(request, f"/bulk?{query}")


async def api_run(request: Request) -> JSONResponse:
    dash = dashboard(request)
    dash.check_action(request, None)
    action = _action(request)
    body = await json_body(request)
    unknown = set(body) - {*_FIELDS, "confirm"}
    if unknown:
        raise InvalidOption(f"unknown field(s) {sorted(unknown)}")
    where = _where(body)
    if body.get("confirm") is None:
        ids = await dash.call(_bulk.match, dash.app, action, where)
        return JSONResponse({"action": action, "matched": len(ids), "dry_run": True})
    try:
        outcomes = await dash.call(
            _bulk.run, dash.app, action, where, confirm=_confirm(body["confirm"]), who="api"
        )
    except _bulk.CountChanged as exc:
        return JSONResponse({"error": str(exc), "matched": exc.matched}, status_code=409)
    return JSONResponse({"action": action, "matched": sum(outcomes.values()), "outcomes": outcomes})


_BODY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "handler name (default any)"},
        "due_after": {"type": ["number", "string"]},
        "due_before": {"type": ["number", "string"]},
        "payload_contains": {"type": "string", "description": "a substring of the payload JSON"},
        "payload_path": {"type": "string", "description": "with payload_value, e.g. customer.id"},
        "payload_value": {"type": "string", "description": '42, true, "42" or text'},
        "confirm": {"type": "integer", "description": "the matched count; absent: dry run"},
    },
}

API_PATHS: dict[str, Any] = {
    "/api/bulk/{action}": {
        "post": {
            "summary": "Requeue or purge dead jobs, or cancel scheduled ones, by filter "
            f"(at most {_bulk.BULK_LIMIT}); without confirm: only the count",
            "parameters": [
                {
                    "name": "action",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": list(_bulk.ACTIONS)},
                }
            ],
            "security": [{"bearer": []}],
            "requestBody": {"content": {"application/json": {"schema": _BODY}}},
            "responses": {
                "200": {"description": "matched (dry run) or outcomes"},
                "409": {"description": "the count moved: confirm the new one"},
            },
        }
    }
}

ROUTES = [
    Route("/bulk", confirm_page),
    Route("/bulk/{action}", run_page, methods=["POST"]),
    Route("/api/bulk/{action}", api_run, methods=["POST"]),
]
