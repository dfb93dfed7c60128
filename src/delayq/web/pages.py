"""The dashboard's HTML pages: overview, jobs, job detail, dead letters, actions.

Actions are plain HTML forms (POST with the session's CSRF value), answered
with a redirect to the job's page that shows the outcome in the CLI's words
(Post/Redirect/Get: reloading a page never repeats an action). Every endpoint
reads the shared :class:`~delayq.web._dashboard.Dashboard` from the application.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from delayq.job import JobState
from delayq.web import charts, views
from delayq.web._dashboard import dashboard, job_url, root_of
from delayq.web._rows import PREVIEW_CHARS, job_row, lease_expired_for

__all__ = ["REFRESH_SECONDS", "ROUTES"]

REFRESH_SECONDS = 5
"""How often the overview, jobs and dead-letter pages refresh themselves
(``static/live.js``; pausable in the page; it also switches the page's times
between UTC and the browser's zone)."""

_LIVE_JS = (Path(__file__).parent / "static" / "live.js").read_bytes()

_STATES = [s.value for s in JobState]


async def overview(request: Request) -> Response:
    dash = dashboard(request)
    app = dash.app
    now = app.clock.time()
    points = dash.series.points()
    slot = dash.series.slot_seconds
    data = await dash.call(views.overview, app, points, slot, now)
    return dash.render(
        request,
        "overview.html",
        data=data,
        chart=charts.lateness_svg(points, slot_seconds=slot, now=now),
        throughput_chart=charts.throughput_svg(points, slot_seconds=slot, now=now),
        source=dash.lateness_source,
        states=_STATES,
        refresh=REFRESH_SECONDS,
    )


async def jobs(request: Request) -> Response:
    wanted = (request.query_params.get("id") or "").strip()
    dash = dashboard(request)
    if wanted:
        return dash.redirect(request, job_url(wanted))
    filters = views.JobFilters.parse(request.query_params)
    page, cursor = await dash.call(views.list_page, dash.app, filters)
    root = root_of(request)
    next_url = None if cursor is None else f"{root}/jobs?" + urlencode(filters.query(after=cursor))
    first_url = f"{root}/jobs?" + urlencode(filters.query()) if filters.after is not None else None
    now = dash.app.clock.time()
    return dash.render(
        request,
        "jobs.html",
        jobs=[job_row(j, now) for j in page],
        filters=filters,
        raw=request.query_params,
        next_url=next_url,
        first_url=first_url,
        now=now,
        states=_STATES,
        retrying_filter=filters.retrying,
        refresh=REFRESH_SECONDS,
        # the fields show only where the store can search (others refuse: 501)
        can_search="payload_search" in dash.app.backend.features,
    )


async def job(request: Request) -> Response:
    dash = dashboard(request)
    job_id = request.path_params["job_id"]
    found = await dash.call(dash.app.get, job_id)
    status = 200 if found is not None else 404
    now = dash.app.clock.time()
    return dash.render(
        request,
        "job.html",
        status=status,
        job_id=job_id,
        job=found,
        payload=None if found is None else views.pretty_payload(found.payload),
        result=None if found is None else views.pretty_result(found.result),
        done=request.query_params.get("done"),
        now=now,
        lease_expired_for=None if found is None else lease_expired_for(found, now),
        retrying=found is not None and found.state is JobState.SCHEDULED and found.attempts > 0,
    )


async def dead(request: Request) -> Response:
    dash = dashboard(request)
    jobs = await dash.call(dash.app.dead_letters, limit=views.PAGE_SIZE, preview=PREVIEW_CHARS)
    now = dash.app.clock.time()
    return dash.render(
        request,
        "dead.html",
        jobs=[job_row(j, now) for j in jobs],
        done=request.query_params.get("done"),
        now=dash.app.clock.time(),
        page_size=views.PAGE_SIZE,
        refresh=REFRESH_SECONDS,
    )


async def _form(request: Request) -> dict[str, str]:
    data = await request.form()
    fields = {k: v for k, v in data.items() if isinstance(v, str)}
    dashboard(request).check_action(request, fields.get("csrf", ""))
    return fields


def _done(request: Request, job_id: str, outcome: str, fields: dict[str, str]) -> Response:
    dash = dashboard(request)
    if fields.get("back") == "dead":
        query = urlencode({"done": f"{job_id}: {outcome}"})
        return dash.redirect(request, f"/dead?{query}")
    return dash.redirect(request, job_url(job_id, done=outcome))


async def cancel(request: Request) -> Response:
    fields = await _form(request)
    job_id = request.path_params["job_id"]
    dash = dashboard(request)
    return _done(request, job_id, await dash.call(views.cancel, dash.app, job_id), fields)


async def reschedule(request: Request) -> Response:
    fields = await _form(request)
    job_id = request.path_params["job_id"]
    dash = dashboard(request)
    outcome = await dash.call(
        views.reschedule, dash.app, job_id, delay=fields.get("delay"), at=fields.get("at")
    )
    return _done(request, job_id, outcome, fields)


async def requeue(request: Request) -> Response:
    fields = await _form(request)
    job_id = request.path_params["job_id"]
    dash = dashboard(request)
    return _done(request, job_id, await dash.call(views.requeue, dash.app, job_id), fields)


async def purge(request: Request) -> Response:
    fields = await _form(request)
    job_id = fields.get("id") or None
    dash = dashboard(request)
    count: Any = await dash.call(
        views.purge,
        dash.app,
        job_ids=[job_id] if job_id else None,
        older_than=fields.get("older_than"),
        everything=fields.get("all") == "yes",
    )
    return dash.redirect(request, "/dead?" + urlencode({"done": f"purged {count} dead job(s)"}))


async def live_js(request: Request) -> Response:
    return Response(_LIVE_JS, media_type="text/javascript")


ROUTES = [
    Route("/", overview),
    Route("/static/live.js", live_js),
    Route("/jobs", jobs),
    Route("/jobs/{job_id:path}/cancel", cancel, methods=["POST"]),
    Route("/jobs/{job_id:path}/reschedule", reschedule, methods=["POST"]),
    Route("/jobs/{job_id:path}/requeue", requeue, methods=["POST"]),
    Route("/jobs/{job_id:path}", job),
    Route("/dead", dead),
    Route("/dead/purge", purge, methods=["POST"]),
]
