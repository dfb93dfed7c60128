"""The workers page and ``/api/workers``: the heartbeats the store keeps
(:mod:`delayq.observe.workers`); a worker not seen for its lease is gone."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from delayq.app import DelayQ
from delayq.backends.base import WorkerRegistry
from delayq.observe.workers import worker_rows
from delayq.web._dashboard import dashboard

__all__ = ["API_PATHS", "ROUTES", "workers"]


def workers(app: DelayQ) -> list[dict[str, Any]] | None:
    """The store's worker records as rows, None when the store keeps none."""
    backend = app.backend
    if not isinstance(backend, WorkerRegistry):
        return None
    return worker_rows(backend.list_workers(), app.clock.time())


async def page(request: Request) -> Response:
    dash = dashboard(request)
    rows = await dash.call(workers, dash.app)
    return dash.render(request, "workers.html", workers=rows, now=dash.app.clock.time(), refresh=5)


async def api(request: Request) -> JSONResponse:
    dash = dashboard(request)
    rows = await dash.call(workers, dash.app)
    if rows is None:
        return JSONResponse({"error": "this store keeps no worker heartbeats"}, status_code=501)
    return JSONResponse({"workers": rows})


API_PATHS: dict[str, Any] = {
    "/api/workers": {
        "get": {
            "summary": "Workers from their heartbeats in the store; gone: not seen for its lease",
            "responses": {"200": {"description": "{'workers': [...]}"}, "501": {}},
        }
    }
}

ROUTES = [Route("/workers", page), Route("/api/workers", api)]
