"""The dashboard's ASGI application: pages, the JSON API and ``/metrics``.

:func:`create_app` builds it around an open :class:`~delayq.app.DelayQ`. The
pages are server-rendered (Jinja2, autoescaped: a payload or error holding
``<script>`` is shown as text); the charts are SVG drawn on the server. The
one script is ``static/live.js`` (live refresh, pausable; UTC or local times): the
Content-Security-Policy allows scripts from this server only, never inline.

Lateness over time comes from the most direct source available, and the
overview says which:

* ``series=``: a :class:`~delayq.observe.metrics.LatenessSeries` fed by a worker's
  ``on_result``: in this process, or relayed by the worker whose child process
  serves this dashboard (``delayq worker --web-port``);
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
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from delayq.app import DelayQ
from delayq.errors import DelayqError, InvalidInput, Unsupported
from delayq.observe.metrics import (
    CounterSource,
    LatenessSeries,
    exposition_registry,
    multiprocess_dir,
)
from delayq.web import _limits, _recurring, _workers, api, bulk, handlers, pages
from delayq.web._cache import MicroCache
from delayq.web._dashboard import Dashboard, dashboard, root_of
from delayq.web.security import LOOPBACK_HOSTS, Guard

__all__ = ["UnderRoot", "create_app"]

log = logging.getLogger("delayq.web")

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; "
        "style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # a login URL carries ?token= (and is redirected away at once); "no-referrer"
    # would make browsers send "Origin: null" on our own forms
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def create_app(
    app: DelayQ,
    *,
    token: str | None = None,
    require_token_for_reads: bool = False,
    metrics: CounterSource | None = None,
    series: LatenessSeries | None = None,
    series_from: str = "this process's worker",
    allowed_hosts: Collection[str] = (),
    cache_seconds: float = 0.0,
) -> Starlette:
    """The dashboard for ``app``'s store, as an ASGI application.

    ``token`` guards every action (a random one when None: then only code that
    holds it, such as the ``delayq web`` command printing a login link, can
    act). ``require_token_for_reads`` guards the pages and the API too (for a
    server reachable beyond this machine). ``metrics`` adds a worker's counters
    to ``/metrics`` and the handlers table (a :class:`~delayq.observe.metrics.Metrics`
    of this process, or the ones a worker relays to the child serving its
    dashboard); ``series`` is a lateness series fed by that worker, and
    ``series_from`` the overview's words for where it comes from. The caller keeps
    ``app`` open and closes it.

    Requests must name the server in ``Host``: the loopback names always, plus
    ``allowed_hosts`` (the bound address, a public name behind a proxy; ``"*"``
    allows any, for a server that checks Host itself). Mounted under a prefix
    (a Starlette ``Mount``, or a server's ``root_path``), every link, form,
    redirect and the cookie's path follow it.

    ``cache_seconds`` (e.g. 1) answers a repeated GET from the last answer for
    that long (:mod:`._cache`), so many pollers cost about one.
    """
    guard = Guard(token or secrets.token_urlsafe(24), require_for_reads=require_token_for_reads)
    hosts = [*LOOPBACK_HOSTS, *allowed_hosts]
    dash = Dashboard(
        app, guard, metrics=metrics, series=series, series_from=series_from, allowed_hosts=hosts
    )

    web = Starlette(
        routes=[
            *pages.ROUTES,
            *_recurring.ROUTES,
            *bulk.ROUTES,
            *_workers.ROUTES,
            *_limits.ROUTES,
            *handlers.ROUTES,
            *api.ROUTES,
            Route("/metrics", _metrics),
        ],
        lifespan=_lifespan,
        exception_handlers={
            HTTPException: _http_error,
            InvalidInput: _bad_input,
            DelayqError: _store_error,
            Exception: _internal_error,
        },
    )
    web.add_middleware(MicroCache, seconds=cache_seconds)  # inside the guard: after its checks
    web.add_middleware(_GuardMiddleware, dash=dash)
    web.state.dashboard = dash
    # outermost: the security headers also on a 500 answered by ServerErrorMiddleware
    web.build_middleware_stack = _with_headers(web.build_middleware_stack)  # type: ignore[method-assign]
    return web


class UnderRoot:
    """The dashboard served under the path prefix ``root`` (``delayq web --root-path``),
    behind a proxy that strips the prefix or one that forwards it as is."""

    def __init__(self, app: Callable[..., Awaitable[None]], root: str) -> None:
        self.app = app
        self.root = root.rstrip("/")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and self.root:
            path: str = scope["path"]
            if path != self.root and not path.startswith(self.root + "/"):
                path = self.root + path  # the proxy stripped the prefix
            scope = {**scope, "root_path": self.root, "path": path}
        await self.app(scope, receive, send)


def _with_headers(build: Callable[[], Any]) -> Callable[[], Any]:
    def built() -> Any:
        return _HeadersMiddleware(build())

    return built


class _HeadersMiddleware:
    """The security headers on every HTTP answer, errors included."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in _HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


@contextlib.asynccontextmanager
async def _lifespan(web: Starlette) -> AsyncIterator[None]:
    dash: Dashboard = web.state.dashboard
    task = asyncio.create_task(_sampler(dash)) if dash.sampled else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: PLC0415

    dash = dashboard(request)
    registry = exposition_registry(dash.metrics, dash.app.backend)
    body = await dash.call(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def _sampler(dash: Dashboard) -> None:
    while True:
        try:
            await dash.call(dash.sample)
        except Exception:
            log.exception("cannot read the lateness histogram in %s", multiprocess_dir())
        await asyncio.sleep(dash.series.slot_seconds)


class _GuardMiddleware:
    """The Host check; the token on reads when required; the ``?token=`` login
    that turns into a session cookie."""

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
        if not self.dash.host_allowed(request):
            log.warning("refused Host %r (not an allowed host)", request.headers.get("host"))
            response = _error_response(request, 421, "this server does not answer to that Host")
        elif given is not None:
            if guard.token_ok(given):
                query = {k: v for k, v in request.query_params.items() if k != "token"}
                # one leading slash: '//evil.example/' must stay on this server
                path = "/" + request.url.path.lstrip("/")
                target = path + (f"?{urlencode(query)}" if query else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(
                    guard.cookie,
                    guard.session,
                    path=root_of(request) or "/",
                    httponly=True,
                    samesite="strict",
                    secure=request.url.scheme == "https",
                )
            else:
                response = _error_response(request, 401, "wrong token")
        elif guard.require_for_reads and self.dash.authenticated(request) is None:
            response = _error_response(request, 401, "this dashboard needs its token (?token=)")

        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _wants_json(request: Request) -> bool:
    path = request.url.path[len(root_of(request)) :]
    return path.startswith("/api") or path == "/metrics"


def _error_response(request: Request, status: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message}, status_code=status)
    return dashboard(request).render(
        request, "error.html", status=status, status_code=status, message=message
    )


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
