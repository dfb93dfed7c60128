"""The dashboard's flow-control limits: a page and its API twin.

``/limits`` lists the limits the store holds (:meth:`DelayQ.limits
<delayq.app.DelayQ.limits>`), with a form that declares or replaces one and a
remove button per limit; ``/api/limits`` answers the same as JSON, ``POST
/api/limits`` sets one (``{"pattern": ..., "concurrency": ..., "rate": ...,
"burst": ...}``) and ``DELETE /api/limits/{pattern}`` removes one. An edit
applies at the next claim of every worker, as with ``delayq limits set``. The
outcome words are the CLI's (``set``, ``removed``, ``not_found``); bad input
gets the limit's own error (400). A store without flow control gets a page
that says so (the API: 501).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from delayq.app import DelayQ
from delayq.errors import InvalidOption, Unsupported
from delayq.flow import Limit
from delayq.web import views
from delayq.web._dashboard import dashboard
from delayq.web.security import CSRF_FIELD

__all__ = ["API_PATHS", "ROUTES", "limit_dict"]


def limit_dict(limit: Limit) -> dict[str, Any]:
    return {
        "pattern": limit.pattern,
        "concurrency": limit.concurrency,
        "rate": None if limit.rate is None else str(limit.rate),
        "burst": limit.burst,
        "describe": limit.describe(),
    }


def _count(value: Any, field: str) -> int | None:
    """A form or JSON count: None when empty, else an int (the limit checks its range)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidOption(f"{field} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidOption(f"{field} must be a whole number, got {value!r}") from None


def _set(app: DelayQ, fields: dict[str, Any]) -> Limit:
    pattern = fields.get("pattern")
    if not isinstance(pattern, str) or not pattern.strip():
        raise InvalidOption("pattern is required: a key, or a key with * wildcards (tenant:*)")
    rate = fields.get("rate")
    if rate is not None and not isinstance(rate, str):
        raise InvalidOption(f"rate must be text such as 100/s, got {rate!r}")
    limit = app.limit(
        pattern.strip(),
        concurrency=_count(fields.get("concurrency"), "concurrency"),
        rate=(rate or "").strip() or None,
        burst=_count(fields.get("burst"), "burst") or 0,
    )
    views._logged("limit set", limit.pattern, limit.describe())
    return limit


def _remove(app: DelayQ, pattern: str) -> str:
    outcome = "removed" if app.remove_limit(pattern) else "not_found"
    return views._logged("limit remove", pattern, outcome)


async def page(request: Request) -> Response:
    dash = dashboard(request)
    try:
        found = await dash.call(dash.app.limits)
    except Unsupported as exc:
        return dash.render(request, "limits.html", limits=None, reason=str(exc))
    return dash.render(
        request,
        "limits.html",
        limits=found,
        done=request.query_params.get("done"),
        pattern=request.query_params.get("pattern"),
    )


async def set_action(request: Request) -> Response:
    form = await request.form()
    dash = dashboard(request)
    csrf = form.get(CSRF_FIELD)
    dash.check_action(request, csrf if isinstance(csrf, str) else "")
    fields = {k: form.get(k) for k in ("pattern", "concurrency", "rate", "burst")}
    limit = await dash.call(_set, dash.app, fields)
    return dash.redirect(request, "/limits?" + urlencode({"done": "set", "pattern": limit.pattern}))


async def remove_action(request: Request) -> Response:
    form = await request.form()
    dash = dashboard(request)
    csrf = form.get(CSRF_FIELD)
    dash.check_action(request, csrf if isinstance(csrf, str) else "")
    pattern = request.path_params["pattern"]
    outcome = await dash.call(_remove, dash.app, pattern)
    return dash.redirect(request, "/limits?" + urlencode({"done": outcome, "pattern": pattern}))


async def api_list(request: Request) -> JSONResponse:
    dash = dashboard(request)
    try:
        found = await dash.call(dash.app.limits)
    except Unsupported as exc:
        return JSONResponse({"error": str(exc)}, 501)
    return JSONResponse({"limits": [limit_dict(lim) for lim in found]})


async def api_set(request: Request) -> JSONResponse:
    dash = dashboard(request)
    dash.check_action(request, None)
    try:
        body = await request.json()
    except ValueError:
        raise InvalidOption("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidOption("the body must be a JSON object")
    try:
        limit = await dash.call(_set, dash.app, body)
    except Unsupported as exc:
        return JSONResponse({"error": str(exc)}, 501)
    return JSONResponse({"outcome": "set", **limit_dict(limit)})


async def api_remove(request: Request) -> JSONResponse:
    dash = dashboard(request)
    dash.check_action(request, None)
    pattern = request.path_params["pattern"]
    try:
        outcome = await dash.call(_remove, dash.app, pattern)
    except Unsupported as exc:
        return JSONResponse({"error": str(exc)}, 501)
    return JSONResponse(
        {"pattern": pattern, "outcome": outcome}, 404 if outcome == "not_found" else 200
    )


_LIMIT = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string"},
        "concurrency": {"type": ["integer", "null"]},
        "rate": {"type": ["string", "null"], "description": "e.g. 100/s, 5/m, 20/10s"},
        "burst": {"type": "integer"},
    },
}


def _answer(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


API_PATHS: dict[str, Any] = {
    "/api/limits": {
        "get": {
            "summary": "The flow-control limits the store holds, by pattern",
            "responses": {
                "200": _answer({"type": "object", "properties": {"limits": {"type": "array"}}}),
                "501": _answer({"type": "object"}, "the store has no flow control"),
            },
        },
        "post": {
            "summary": "Declare or replace a limit (applies at every worker's next claim)",
            "security": [{"bearer": []}],
            "requestBody": {"content": {"application/json": {"schema": _LIMIT}}},
            "responses": {
                "200": _answer(_LIMIT),
                "400": _answer({"type": "object"}, "a bad limit"),
                "401": _answer({"type": "object"}, "no token"),
            },
        },
    },
    "/api/limits/{pattern}": {
        "delete": {
            "summary": "Remove the limit of a pattern",
            "security": [{"bearer": []}],
            "parameters": [{"name": "pattern", "in": "path", "required": True}],
            "responses": {
                "200": _answer({"type": "object"}),
                "404": _answer({"type": "object"}, "no such limit"),
            },
        }
    },
}
"""The OpenAPI description of these routes (part of ``/api/openapi.json``)."""

ROUTES = [
    Route("/limits", page),
    Route("/limits", set_action, methods=["POST"]),
    Route("/limits/{pattern:path}/remove", remove_action, methods=["POST"]),
    Route("/api/limits", api_list),
    Route("/api/limits", api_set, methods=["POST"]),
    Route("/api/limits/{pattern:path}", api_remove, methods=["DELETE"]),
]
