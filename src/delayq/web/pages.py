"""The dashboard's HTML pages: overview, jobs, job detail, dead letters, actions.

Actions are plain HTML forms (POST with the session's CSRF value), answered
with a redirect to the job's page that shows the outcome in the CLI's words
(Post/Redirect/Get: reloading a page never repeats an action).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from delayq.job import JobState
from delayq.web import views

if TYPE_CHECKING:
    from delayq.web.app import Dashboard

__all__ = ["routes"]


def _job_url(job_id: str, **query: str) -> str:
    url = f"/jobs/{quote(job_id, safe='')}"
    return f"{url}?{urlencode(query)}" if query else url


def routes(dash: Dashboard) -> list[Route]:
    app = dash.app

    async def overview(request: Request) -> Response:
        now = app.clock.time()
        data = await dash.call(
            views.overview, app, dash.series.points(), dash.series.slot_seconds, now
        )
        return dash.render(
            request,
            "overview.html",
            data=data,
            chart=views.lateness_svg(dash.series.points()),
            source=dash.lateness_source,
            relative=views.relative,
            seconds=views.seconds_text,
            iso=views.iso,
            states=[s.value for s in JobState],
        )

    async def jobs(request: Request) -> Response:
        wanted = (request.query_params.get("id") or "").strip()
        if wanted:
            return RedirectResponse(_job_url(wanted), status_code=303)
        filters = views.JobFilters.parse(request.query_params)
        page, cursor = await dash.call(views.list_page, app, filters)
        next_url = None if cursor is None else "/jobs?" + urlencode(filters.query(after=cursor))
        first_url = "/jobs?" + urlencode(filters.query()) if filters.after is not None else None
        return dash.render(
            request,
            "jobs.html",
            jobs=page,
            filters=filters,
            raw=request.query_params,
            next_url=next_url,
            first_url=first_url,
            now=app.clock.time(),
            relative=views.relative,
            iso=views.iso,
            job_url=_job_url,
            states=[s.value for s in JobState],
        )

    async def job(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        found = await dash.call(app.get, job_id)
        status = 200 if found is not None else 404
        return dash.render(
            request,
            "job.html",
            status=status,
            job_id=job_id,
            job=found,
            payload=None if found is None else views.pretty_payload(found.payload),
            done=request.query_params.get("done"),
            now=app.clock.time(),
            relative=views.relative,
            iso=views.iso,
            job_url=_job_url,
        )

    async def dead(request: Request) -> Response:
        jobs = await dash.call(app.dead_letters, limit=views.PAGE_SIZE)
        return dash.render(
            request,
            "dead.html",
            jobs=jobs,
            done=request.query_params.get("done"),
            now=app.clock.time(),
            relative=views.relative,
            iso=views.iso,
            job_url=_job_url,
            page_size=views.PAGE_SIZE,
        )

    async def form(request: Request) -> dict[str, Any]:
        data = await request.form()
        fields = {k: v for k, v in data.items() if isinstance(v, str)}
        dash.check_action(request, fields.get("csrf", ""))
        return fields

    def act(kind: str) -> Any:
        async def endpoint(request: Request) -> Response:
            fields = await form(request)
            job_id = request.path_params["job_id"]
            if kind == "cancel":
                outcome = await dash.call(views.cancel, app, job_id)
            elif kind == "reschedule":
                outcome = await dash.call(
                    views.reschedule, app, job_id, delay=fields.get("delay"), at=fields.get("at")
                )
            else:
                outcome = await dash.call(views.requeue, app, job_id)
            if fields.get("back") == "dead":
                query = urlencode({"done": f"{job_id}: {outcome}"})
                return RedirectResponse(f"/dead?{query}", status_code=303)
            return RedirectResponse(_job_url(job_id, done=outcome), status_code=303)

        return endpoint

    async def purge(request: Request) -> Response:
        fields = await form(request)
        job_id = fields.get("id") or None
        count = await dash.call(
            views.purge,
            app,
            job_ids=[job_id] if job_id else None,
            older_than=fields.get("older_than"),
            everything=fields.get("all") == "yes",
        )
        return RedirectResponse(
            "/dead?" + urlencode({"done": f"purged {count} dead job(s)"}), status_code=303
        )

    return [
        Route("/", overview),
        Route("/jobs", jobs),
        Route("/jobs/{job_id:path}/cancel", act("cancel"), methods=["POST"]),
        Route("/jobs/{job_id:path}/reschedule", act("reschedule"), methods=["POST"]),
        Route("/jobs/{job_id:path}/requeue", act("requeue"), methods=["POST"]),
        Route("/jobs/{job_id:path}", job),
        Route("/dead", dead),
        Route("/dead/purge", purge, methods=["POST"]),
    ]
