"""What every request handler of the dashboard shares: :class:`Dashboard`.

:func:`~delayq.web.app.create_app` builds one and keeps it on the Starlette
application's state; the endpoints of :mod:`~delayq.web.pages` and
:mod:`~delayq.web.api` read it with :func:`dashboard`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from delayq._present import iso, local, relative
from delayq.app import DelayQ
from delayq.observe.metrics import LatenessSeries, Metrics, lateness_bucket_totals, multiprocess_dir
from delayq.web.security import COOKIE, CSRF_FIELD, CSRF_HEADER, Guard
from delayq.web.views import seconds_text

__all__ = ["Dashboard", "dashboard", "job_url"]


def job_url(job_id: str, **query: str) -> str:
    """The page of one job (``query`` as its query string)."""
    url = f"/jobs/{quote(job_id, safe='')}"
    return f"{url}?{urlencode(query)}" if query else url


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
        # What every template may call: one rendering of times (delayq._present).
        self.templates.globals.update(
            iso=iso, local=local, relative=relative, seconds=seconds_text, job_url=job_url
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
