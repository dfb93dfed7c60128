"""The dashboard's recurring schedules: a list, a page per schedule, its API twin.

``/recurring`` lists the schedules; ``/recurring/{name}`` shows one: its
definition, next run times, last run and outcome, and its recent occurrences
with their jobs' states (:meth:`DelayQ.recurring_status
<delayq.app.DelayQ.recurring_status>`, read by id, as ``delayq recurring show``
does), with run-now, pause and resume forms. ``/api/recurring...`` answers the
same as JSON. Outcomes use the CLI's words (``enqueued``, ``paused``,
``resumed``, ``not_found``). A store that keeps no schedules (RabbitMQ) gets a
page that says so (the API: 501).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from delayq._present import iso
from delayq.app import DelayQ
from delayq.errors import ConfigurationError, InvalidOption
from delayq.recurring import Occurrence, Schedule, ScheduleStatus
from delayq.web import views
from delayq.web._dashboard import dashboard
from delayq.web.security import CSRF_FIELD

__all__ = ["API_PATHS", "ROUTES", "schedule_url"]

_RUNS = 10  # next run times shown by default
_HISTORY = 20  # recent occurrences shown by default
_LIST_HISTORY = 5  # occurrences read per schedule on the list, for its last run


def schedule_url(name: str, **query: str) -> str:
    """The page of schedule ``name`` (``query`` as its query string)."""
    url = f"/recurring/{quote(name, safe='')}"
    return f"{url}?{urlencode(query)}" if query else url


# -- what the pages and the API show (plain data) -------------------------------------
def _count(query: Mapping[str, str], field: str, default: int) -> int:
    text = query.get(field) or str(default)
    try:
        value = int(text)
    except ValueError:
        raise InvalidOption(f"{field} must be an int from 0 to 100, got {text!r}") from None
    if not 0 <= value <= 100:
        raise InvalidOption(f"{field} must be an int from 0 to 100, got {value}")
    return value


def timing(schedule: Schedule) -> str:
    """``cron 0 3 * * * (Europe/Berlin)`` / ``every 300s``."""
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.tz})"
    return f"every {schedule.every:g}s"


def state_word(schedule: Schedule, now: float) -> str:
    """``active``, ``paused`` or ``ended`` (past its ``end``: no next run)."""
    if schedule.paused:
        return "paused"
    return "active" if schedule.next_run(now) is not None else "ended"


def no_job_reason(schedule: Schedule, occurrence: Occurrence, now: float) -> str:
    """Why an occurrence has no job, in a few words."""
    if occurrence.at > now:
        return "not enqueued yet"
    if schedule.paused:
        return "paused: not run"
    return "no job: skipped (misfire or overlap), or its record expired"


def schedules(app: DelayQ) -> list[ScheduleStatus]:
    """Every schedule with its next run and (from its latest occurrences) its last run."""
    found = []
    for schedule in app.recurring_schedules():
        status = app.recurring_status(schedule.name, runs=1, history=_LIST_HISTORY)
        if status is not None:  # (removed since it was listed)
            found.append(status)
    return found


def _status_dict(status: ScheduleStatus, now: float) -> dict[str, Any]:
    data = status.as_dict(now)
    data["state"] = state_word(status.schedule, now)
    data["next_runs_iso"] = [iso(t) for t in status.next_runs]
    return data


# -- pages ---------------------------------------------------------------------------
def _unsupported(request: Request, exc: ConfigurationError) -> Response:
    return dashboard(request).render(
        request, "error.html", status=501, status_code=501, message=str(exc)
    )


async def list_page(request: Request) -> Response:
    dash = dashboard(request)
    try:
        found = await dash.call(schedules, dash.app)
    except ConfigurationError as exc:
        return _unsupported(request, exc)
    now = dash.app.clock.time()
    return dash.render(
        request,
        "recurring.html",
        statuses=found,
        now=now,
        timing=timing,
        state_word=state_word,
        schedule_url=schedule_url,
    )


async def schedule_page(request: Request) -> Response:
    dash = dashboard(request)
    name = request.path_params["name"]
    runs = _count(request.query_params, "runs", _RUNS)
    history = _count(request.query_params, "history", _HISTORY)
    try:
        status = await dash.call(dash.app.recurring_status, name, runs=runs, history=history)
    except ConfigurationError as exc:
        return _unsupported(request, exc)
    now = dash.app.clock.time()
    schedule = None if status is None else status.schedule
    return dash.render(
        request,
        "schedule.html",
        status=404 if status is None else 200,
        name=name,
        info=status,
        schedule=schedule,
        state=None if schedule is None else state_word(schedule, now),
        payload=None if schedule is None else views.pretty_payload(schedule.as_dict()["payload"]),
        done=request.query_params.get("done"),
        done_job=request.query_params.get("job"),
        now=now,
        timing=timing,
        no_job_reason=no_job_reason,
        schedule_url=schedule_url,
    )


_ACTIONS = ("run", "pause", "resume")


def _act(app: DelayQ, name: str, action: str) -> tuple[str, str | None]:
    """Run ``action`` on schedule ``name``: (outcome word, job id of a run-now)."""
    if action == "run":
        if app.get_recurring(name) is None:
            return views._logged("recurring run", name, "not_found"), None
        job_id = app.run_recurring_now(name)
        views._logged("recurring run", name, f"enqueued {job_id}")
        return "enqueued", job_id
    done = app.pause_recurring(name) if action == "pause" else app.resume_recurring(name)
    outcome = ("paused" if action == "pause" else "resumed") if done else "not_found"
    return views._logged(f"recurring {action}", name, outcome), None


def _action_of(request: Request) -> str:
    action: str = request.path_params["action"]
    if action not in _ACTIONS:
        raise HTTPException(404, f"no such action {action!r}; one of {', '.join(_ACTIONS)}")
    return action


async def action(request: Request) -> Response:
    what = _action_of(request)
    data = await request.form()
    dash = dashboard(request)
    csrf = data.get(CSRF_FIELD)
    dash.check_action(request, csrf if isinstance(csrf, str) else "")
    name = request.path_params["name"]
    try:
        outcome, job_id = await dash.call(_act, dash.app, name, what)
    except ConfigurationError as exc:
        return _unsupported(request, exc)
    query = {"done": outcome} if job_id is None else {"done": outcome, "job": job_id}
    return dash.redirect(request, schedule_url(name, **query))


# -- the API -------------------------------------------------------------------------
async def api_list(request: Request) -> JSONResponse:
    dash = dashboard(request)
    try:
        found = await dash.call(schedules, dash.app)
    except ConfigurationError as exc:
        return JSONResponse({"error": str(exc)}, 501)
    now = dash.app.clock.time()
    return JSONResponse({"schedules": [_status_dict(s, now) for s in found]})


async def api_schedule(request: Request) -> JSONResponse:
    dash = dashboard(request)
    name = request.path_params["name"]
    runs = _count(request.query_params, "runs", _RUNS)
    history = _count(request.query_params, "history", _HISTORY)
    try:
        status = await dash.call(dash.app.recurring_status, name, runs=runs, history=history)
    except ConfigurationError as exc:
        return JSONResponse({"error": str(exc)}, 501)
    if status is None:
        return JSONResponse({"error": "no recurring schedule with this name"}, 404)
    return JSONResponse(_status_dict(status, dash.app.clock.time()))


async def api_action(request: Request) -> JSONResponse:
    what = _action_of(request)
    dash = dashboard(request)
    dash.check_action(request, None)
    name = request.path_params["name"]
    try:
        outcome, job_id = await dash.call(_act, dash.app, name, what)
    except ConfigurationError as exc:
        return JSONResponse({"error": str(exc)}, 501)
    body: dict[str, Any] = {"name": name, "outcome": outcome}
    if job_id is not None:
        body["id"] = job_id
    return JSONResponse(body, 404 if outcome == "not_found" else 200)


def _answer(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_COUNTS = [
    {"name": "runs", "in": "query", "schema": {"type": "integer", "maximum": 100}},
    {"name": "history", "in": "query", "schema": {"type": "integer", "maximum": 100}},
]


def _outcome(words: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "outcome": {"type": "string", "enum": words},
            "id": {"type": "string", "description": "the job a run-now enqueued"},
        },
    }


_STATUS = {
    "type": "object",
    "description": "the schedule's fields, with state, next_run, next_runs, last_run, history",
}


def _post(summary: str, words: list[str]) -> dict[str, Any]:
    outcome = _outcome(words)
    return {
        "post": {
            "summary": summary,
            "parameters": [_NAME],
            "security": [{"bearer": []}],
            "responses": {
                "200": _answer(outcome),
                "401": _answer({"type": "object"}, "no token"),
                "404": _answer(outcome, "no such schedule"),
            },
        }
    }


API_PATHS: dict[str, Any] = {
    "/api/recurring": {
        "get": {
            "summary": "Every recurring schedule with its next run and last run",
            "responses": {
                "200": _answer({"type": "object", "properties": {"schedules": {"type": "array"}}}),
                "501": _answer({"type": "object"}, "the store keeps no schedules"),
            },
        }
    },
    "/api/recurring/{name}": {
        "get": {
            "summary": "One schedule: next run times, last run, recent occurrences",
            "parameters": [_NAME, *_COUNTS],
            "responses": {
                "200": _answer(_STATUS),
                "404": _answer({"type": "object"}, "no such schedule"),
            },
        }
    },
    "/api/recurring/{name}/run": _post(
        "Enqueue one occurrence due now (the schedule's handler, payload, options)",
        ["enqueued", "not_found"],
    ),
    "/api/recurring/{name}/pause": _post("Pause the schedule", ["paused", "not_found"]),
    "/api/recurring/{name}/resume": _post(
        "Resume from the next occurrence", ["resumed", "not_found"]
    ),
}
"""The OpenAPI description of these routes (part of ``/api/openapi.json``)."""


ROUTES = [
    Route("/recurring", list_page),
    Route("/recurring/{name:path}/{action}", action, methods=["POST"]),
    Route("/recurring/{name:path}", schedule_page),
    Route("/api/recurring", api_list),
    Route("/api/recurring/{name:path}/{action}", api_action, methods=["POST"]),
    Route("/api/recurring/{name:path}", api_schedule),
]
