"""What every request handler of the dashboard shares: :class:`Dashboard`.

:func:`~delayq.web.app.create_app` builds one and keeps it on the Starlette
application's state; the endpoints of :mod:`~delayq.web.pages` and
:mod:`~delayq.web.api` read it with :func:`dashboard`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import anyio.to_thread
import jinja2
from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from delayq._present import error_summary, iso, local, relative
from delayq.app import DelayQ
from delayq.errors import InvalidOption
from delayq.observe.metrics import (
    CounterSource,
    LatenessSeries,
    lateness_bucket_totals,
    multiprocess_dir,
)
from delayq.web.security import CSRF_FIELD, CSRF_HEADER, Guard, host_of
from delayq.web.views import seconds_text

__all__ = ["STORE_CALLS", "Dashboard", "dashboard", "job_url", "root_of"]

STORE_CALLS = 4
"""Store calls one dashboard runs at once; more requests wait their turn, so a
burst of page loads never takes every connection (or the GIL) from a worker
sharing the process."""


def job_url(job_id: str, **query: str) -> str:
    """The page of one job (``query`` as its query string)."""
    url = f"/jobs/{quote(job_id, safe='')}"
    return f"{url}?{urlencode(query)}" if query else url


def root_of(request: Request) -> str:
    """The path prefix the dashboard is mounted under ('' at the root): set by a
    Starlette ``Mount`` or by ``delayq web --root-path``."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


async def json_body(request: Request) -> dict[str, Any]:
    """An API request's JSON object body ({} when empty)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidOption(f"the request body must be JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidOption("the request body must be a JSON object")
    return data


def dashboard(request: Request) -> Dashboard:
    """The :class:`Dashboard` of the application serving ``request``."""
    dash: Dashboard = request.app.state.dashboard
    return dash


class Dashboard:
    """What every request handler shares: the app, the guard, the lateness source."""

    def __init__(
        self,
        app: DelayQ,
        guard: Guard,
        *,
        metrics: CounterSource | None,
        series: LatenessSeries | None,
        series_from: str = "this process's worker",
        allowed_hosts: Collection[str] = (),
    ) -> None:
        self.app = app
        self.guard = guard
        # Host names this dashboard answers to (DNS rebinding), "*" for any; names
        # given by the operator are also accepted as the Origin of a form (a proxy
        # that rewrites Host, e.g. nginx's default proxy_pass)
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self._limiter: anyio.CapacityLimiter | None = None
        self.metrics = metrics
        self.sampled = series is None and multiprocess_dir() is not None
        self.series = series if series is not None else LatenessSeries()
        if series is not None:
            self.lateness_source = series_from
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
        # What every template may call: one rendering of times (delayq._present).
        self.templates.globals.update(
            iso=iso,
            when=when,
            local=local,
            relative=relative,
            seconds=seconds_text,
            error=error_summary,
        )

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a (blocking) store call off the event loop, :data:`STORE_CALLS` at most at once."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(STORE_CALLS)
        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self._limiter
        )

    def host_allowed(self, request: Request) -> bool:
        """Whether the request's Host is one this dashboard answers to."""
        if "*" in self.allowed_hosts:
            return True
        host = host_of(request.headers.get("host", ""))
        return host is not None and host in self.allowed_hosts

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
        if self.guard.session_ok(request.cookies.get(self.guard.cookie)):
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
        if origin is not None and not self._same_origin(request, origin):
            raise HTTPException(403, "cross-origin request refused")
        given = form_csrf if form_csrf is not None else request.headers.get(CSRF_HEADER)
        if not self.guard.csrf_ok(given):
            raise HTTPException(403, "missing or wrong CSRF value; reload the page and try again")

    def _same_origin(self, request: Request, origin: str) -> bool:
        if origin == f"{request.url.scheme}://{request.url.netloc}":
            return True
        # behind a proxy that rewrites Host: the public name the operator allowed
        host = host_of(origin.partition("://")[2])
        return host is not None and host in self.public_hosts

    @property
    def public_hosts(self) -> frozenset[str]:
        """Host names given by the operator (not the loopback defaults, not "*")."""
        return self.allowed_hosts - _LOOPBACK_NAMES - {"*"}

    def redirect(self, request: Request, path: str) -> Response:
        """A 303 to ``path`` (a path of this dashboard, as '/jobs') under its root."""
        return RedirectResponse(root_of(request) + path, status_code=303)

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        acting = self.authenticated(request) is not None
        root = root_of(request)
        rooted: dict[str, Any] = {
            key: _rooted(root, context.get(key) or job_url)
            for key in ("job_url", "schedule_url")
            if key == "job_url" or key in context
        }
        context.update(rooted)
        html = self.templates.get_template(template).render(
            root=root,
            request_path=request.url.path[len(root) :] or "/",
            can_act=acting,
            csrf=self.guard.csrf if acting else "",
            csrf_field=CSRF_FIELD,
            urlencode=urlencode,
            **context,
        )
        return HTMLResponse(html, status_code=status)


def when(epoch: float | None) -> Markup | str:
    """A time as ``<time>`` showing ISO 8601 UTC, carrying its epoch seconds so the
    page's script can show it in the browser's zone (the header's toggle)."""
    text = iso(epoch)
    if text is None or epoch is None:
        return "-"
    return Markup('<time datetime="{0}" data-epoch="{1!r}">{0}</time>').format(text, float(epoch))


_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _rooted(root: str, url_of: Callable[..., str]) -> Callable[..., str]:
    """``url_of`` (a dashboard path builder) with the mount prefix in front."""

    def rooted(*args: Any, **query: str) -> str:
        return root + url_of(*args, **query)

    return rooted
