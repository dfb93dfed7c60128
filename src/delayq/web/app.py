"""The dashboard's ASGI application: pages, the JSON API and ``/metrics``.

:func:`create_app` builds it around an open :class:`~delayq.app.DelayQ`. The
pages are server-rendered (Jinja2, autoescaped: a payload or error holding
``<script>`` is shown as text) with no JavaScript at all; the lateness chart is
SVG drawn on the server. A Content-Security-Policy forbids scripts anyway.

Lateness over time comes from the most direct source available, and the
overview says which:

* ``series=``: a :class:`~delayq.metrics.LatenessSeries` fed by a worker's
  ``on_result`` in this process (the dashboard runs inside the worker);
* else, with ``PROMETHEUS_MULTIPROC_DIR`` set: the lateness histogram that the
  workers of this host write there, sampled every slot since the dashboard
  started;
* else none: a separate dashboard cannot see when jobs ran, only what the store
  keeps (the backlog and how long its oldest job has waited).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from delayq.app import DelayQ
from delayq.errors import DelayqError, InvalidInput, Unsupported
from delayq.metrics import (
    LatenessSeries,
    Metrics,
    exposition_registry,
    lateness_bucket_totals,
    multiprocess_dir,
)
from delayq.web import api, pages
from delayq.web.security import COOKIE, CSRF_FIELD, CSRF_HEADER, Guard

__all__ = ["Dashboard", "create_app"]

log = logging.getLogger("delayq.web")

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # a login URL carries ?token= (and is redirected away at once); "no-referrer"
    # would make browsers send "Origin: null" on our own forms
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Dashboard:
    """What every request handler shares: the app, the guard, the lateness source."""

    def __init__(
        self,
        app: DelayQ,
        guard: Guard,
        *,
        metrics: Metrics | None,
        series: LatenessSeries | None,
    ) -> None:
        self.app = app
        self.guard = guard
        self.metrics = metrics
        self.sampled = series is None and multiprocess_dir() is not None
        self.series = series if series is not None else LatenessSeries()
        if series is not None:
            self.lateness_source = "this process's worker"
        elif self.sampled:
            self.lateness_source = (
                f"the workers writing to {multiprocess_dir()} (since this dashboard started)"
            )
        else:
            self.lateness_source = ""
        self._last_totals: list[int] | None = None
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a (blocking) store call off the event loop."""
        return await run_in_threadpool(fn, *args, **kwargs)

    def sample(self) -> None:
        """Add what the multiprocess histogram gained since the last sample."""
        from prometheus_client import CollectorRegistry, multiprocess  # noqa: PLC0415

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiprocess_dir())  # type: ignore[no-untyped-call]
        totals = lateness_bucket_totals(registry)
        if totals is None:
            return
        last, self._last_totals = self._last_totals, totals
        if last is None:
            return  # the baseline: what happened before this dashboard started is not dated
        delta = [max(0, a - b) for a, b in zip(totals, last, strict=True)]
        if any(delta):
            self.series.add_counts(delta)

    # -- security ----------------------------------------------------------------------
    def authenticated(self, request: Request) -> str | None:
        """How the request proves the token: 'bearer', 'cookie' or None."""
        if self.guard.token_ok(self.guard.bearer(request.headers.get("authorization"))):
            return "bearer"
        if self.guard.session_ok(request.cookies.get(COOKIE)):
            return "cookie"
        return None

    def check_action(self, request: Request, form_csrf: str | None) -> None:
        """Refuse a state-changing request without the token, or (by cookie) without CSRF."""
        how = self.authenticated(request)
        if how is None:
            raise HTTPException(401, "this action needs the dashboard token")
        if how == "bearer":
            return
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise HTTPException(403, "cross-origin request refused")
        given = form_csrf if form_csrf is not None else request.headers.get(CSRF_HEADER)
        if not self.guard.csrf_ok(given):
            raise HTTPException(403, "missing or wrong CSRF value; reload the page and try again")

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        acting = self.authenticated(request) is not None
        html = self.templates.get_template(template).render(
            request_path=request.url.path,
            can_act=acting,
            csrf=self.guard.csrf if acting else "",
            csrf_field=CSRF_FIELD,
            urlencode=urlencode,
            **context,
        )
        return HTMLResponse(html, status_code=status)


def create_app(
    app: DelayQ,
    *,
    token: str | None = None,
    require_token_for_reads: bool = False,
    metrics: Metrics | None = None,
    series: LatenessSeries | None = None,
) -> Starlette:
    """The dashboard for ``app``'s store, as an ASGI application.

    ``token`` guards every action (a random one when None: then only code that
    holds it, such as the ``delayq web`` command printing a login link, can
    act). ``require_token_for_reads`` guards the pages and the API too (for a
    server reachable beyond this machine). ``metrics`` adds this process's
    counters to ``/metrics``; ``series`` is a lateness series fed by a worker
    of this process. The caller keeps ``app`` open and closes it.
    """
    guard = Guard(token or secrets.token_urlsafe(24), require_for_reads=require_token_for_reads)
    dash = Dashboard(app, guard, metrics=metrics, series=series)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_sampler(dash)) if dash.sampled else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def metrics_endpoint(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: PLC0415

        registry = exposition_registry(dash.metrics, app.backend)
        body = await dash.call(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    routes = [
        *pages.routes(dash),
        *api.routes(dash),
        Route("/metrics", metrics_endpoint),
    ]
    web = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: _http_error,
            InvalidInput: _bad_input,
            DelayqError: _store_error,
            Exception: _internal_error,
        },
    )
    web.add_middleware(_GuardMiddleware, dash=dash)
    web.state.dashboard = dash
    return web


async def _sampler(dash: Dashboard) -> None:
    while True:
        try:
            await dash.call(dash.sample)
        except Exception:
            log.exception("cannot read the lateness histogram in %s", multiprocess_dir())
        await asyncio.sleep(dash.series.slot_seconds)


class _GuardMiddleware:
    """Security headers on every answer; the token on reads when required; the
    ``?token=`` login that turns into a session cookie."""

    def __init__(self, app: Callable[..., Awaitable[None]], dash: Dashboard) -> None:
        self.app = app
        self.dash = dash

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        guard = self.dash.guard
        given = request.query_params.get("token")
        response: Response | None = None
        if given is not None:
            if guard.token_ok(given):
                query = {k: v for k, v in request.query_params.items() if k != "token"}
                target = request.url.path + (f"?{urlencode(query)}" if query else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(
                    COOKIE,
                    guard.session,
                    httponly=True,
                    samesite="strict",
                    secure=request.url.scheme == "https",
                )
            else:
                response = _error_response(request, 401, "wrong token")
        elif guard.require_for_reads and self.dash.authenticated(request) is None:
            response = _error_response(request, 401, "this dashboard needs its token (?token=)")

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in _HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        if response is not None:
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api") or request.url.path == "/metrics"


def _error_response(request: Request, status: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message}, status_code=status)
    dash: Dashboard = request.app.state.dashboard
    return dash.render(request, "error.html", status=status, status_code=status, message=message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error_response(request, exc.status_code, str(exc.detail))


async def _bad_input(request: Request, exc: Exception) -> Response:
    return _error_response(request, 400, str(exc))


async def _store_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, Unsupported):  # e.g. a broker that keeps no index of jobs
        return _error_response(request, 501, str(exc))
    log.warning("store error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
    return _error_response(request, 503, f"{type(exc).__name__}: {exc}")


async def _internal_error(request: Request, exc: Exception) -> Response:
    # The traceback goes to the server's log, never to the browser.
    log.error("error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error_response(request, 500, "internal error (see the server's log)")
