"""``delayq schedule / cancel / reschedule / get / ls / stats / migrate``."""

from __future__ import annotations

import json

import click
from rich.table import Table

from delayq._present import job_dict, parse_payload_at
from delayq.cli._common import (
    _JSON_OPTION,
    _BadInput,
    _console,
    _due,
    _echo_json,
    _errors,
    _fail,
    _maybe_when,
    _open_app,
    _payload_filters,
    _when_options,
)
from delayq.cli._render import jobs_table, when
from delayq.job import EnqueueOutcome, JobState


@click.command()
@click.argument("name")
@click.argument("payload", required=False, default="null")
@_when_options
@click.option("--id", "job_id", help="Job id (default: generated). Makes scheduling idempotent.")
@click.option(
    "--on-conflict",
    type=click.Choice(["reject", "keep", "replace"]),
    default="reject",
    show_default=True,
)
@click.option("--max-attempts", type=int, default=None, help="Attempts before dead-lettering.")
@click.option("--backoff", default=None, help="Retry delays, e.g. '2s,5s,10s,20s'.")
@click.option(
    "--misfire",
    default=None,
    help="What to do when the job is claimed late: 'run' (default), 'skip' (skips it when "
    "claimed more than 1s late for any reason, a busy worker's backlog included) or a grace "
    "in seconds (e.g. --misfire 300: skip only when over 5 minutes late, i.e. after downtime).",
)
@_JSON_OPTION
@click.pass_context
def schedule(
    ctx: click.Context,
    *,
    name: str,
    payload: str,
    delay: str | None,
    at: str | None,
    job_id: str | None,
    on_conflict: str,
    max_attempts: int | None,
    backoff: str | None,
    misfire: str | None,
    as_json: bool,
) -> None:
    """Schedule handler NAME with a JSON PAYLOAD (default null)."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise _BadInput(f"PAYLOAD must be JSON, e.g. '{{\"order\": 42}}': {exc}") from exc
    with _open_app(ctx) as app:
        due = _due(app, delay, at, now_by_default=True)
        # build + enqueue (not schedule) to learn whether the job was kept or replaced.
        spec = app.build(
            name,
            data,
            job_id=job_id,
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
            delay=due.get("delay"),
            at=due.get("at"),
        )
        [outcome] = app.enqueue([spec], on_conflict=on_conflict)  # type: ignore[arg-type]
        job = app.get(spec.id) if "inspect" in app._backend.features else None
        now = app.clock.time()
    if as_json:
        _echo_json({**(job_dict(job) if job else {"id": spec.id}), "outcome": outcome.value})
        return
    due_text = when(job.run_at, now) if job else "?"
    shown = job.name if job else name
    if outcome is EnqueueOutcome.KEPT:
        click.echo(f"kept existing job {spec.id} ({shown}) due {due_text}; not changed")
    elif outcome is EnqueueOutcome.REPLACED:
        click.echo(f"replaced job {spec.id} ({shown}) due {due_text}")
    else:
        click.echo(f"scheduled {spec.id} ({shown}) due {due_text}")


@click.command()
@click.option("--sql", "as_sql", is_flag=True, help="Print the statements; change nothing.")
@click.pass_context
def migrate(ctx: click.Context, as_sql: bool) -> None:
    """Create or upgrade a PostgreSQL store's schema (safe to run concurrently)."""
    with _errors():
        from delayq.backends.postgres.migrate import migrate_url  # noqa: PLC0415 (optional extra)

        click.echo(migrate_url(ctx.obj.url, sql=as_sql))


@click.command()
@click.argument("job_id")
@_JSON_OPTION
@click.pass_context
def cancel(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Cancel a scheduled job (reports cancelled / running / finished / not_found)."""
    with _open_app(ctx) as app:
        outcome = app.cancel(job_id)
    if as_json:
        _echo_json({"id": job_id, "outcome": outcome.value})
    else:
        click.echo(f"{job_id}: {outcome.value}")
    if outcome == "not_found":
        ctx.exit(1)


@click.command()
@click.argument("job_id")
@_when_options
@_JSON_OPTION
@click.pass_context
def reschedule(
    ctx: click.Context, *, job_id: str, delay: str | None, at: str | None, as_json: bool
) -> None:
    """Move a scheduled job to a new due time."""
    with _open_app(ctx) as app:
        outcome = app.reschedule(job_id, **_due(app, delay, at))
        job = app.get(job_id)
        now = app.clock.time()
    if as_json:
        _echo_json({"id": job_id, "outcome": outcome.value, "run_at": job.run_at if job else None})
    elif outcome == "rescheduled" and job is not None:
        click.echo(f"{job_id}: rescheduled, due {when(job.run_at, now)}")
    else:
        click.echo(f"{job_id}: {outcome.value}")
    if outcome == "not_found":
        ctx.exit(1)


@click.command()
@click.argument("job_id")
@_JSON_OPTION
@click.pass_context
def get(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job: state, attempts, due time, last error."""
    with _open_app(ctx) as app:
        job = app.get(job_id)
        now = app.clock.time()
    if job is None:
        _fail(f"no job with id {job_id!r}")
    if as_json:
        _echo_json(job_dict(job))
        return
    table = Table(show_header=False, title=f"job {job.id}", title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("name", job.name),
        ("state", job.state.value),
        ("due", when(job.run_at, now)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("backoff", json.dumps(job.backoff)),
        ("misfire", job.misfire),
        ("created", when(job.created_at, now)),
        ("updated", when(job.updated_at, now)),
        ("lease until", when(job.lease_until, now)),
        ("payload", json.dumps(job.payload, ensure_ascii=False)),
        ("outcome", job.outcome or "-"),
        ("last error", job.last_error or "-"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    _console().print(table)


@click.command(name="ls")
@click.option(
    "--state",
    type=click.Choice([s.value for s in JobState]),
    default=None,
    help="Only jobs in this state.",
)
@click.option("--due-after", metavar="WHEN", help="Due at or after: ISO 8601, '-1h', epoch.")
@click.option("--due-before", metavar="WHEN", help="Due before: ISO 8601, '+10m', epoch.")
@click.option("--name", default=None, help="Only jobs of this handler.")
@_payload_filters
@click.option("--limit", type=int, default=50, show_default=True)
@_JSON_OPTION
@click.pass_context
def list_command(
    ctx: click.Context,
    *,
    state: str | None,
    due_after: str | None,
    due_before: str | None,
    name: str | None,
    payload_contains: str | None,
    payload_at: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs in due-time order, by state, handler, due window and/or payload."""
    with _open_app(ctx) as app:
        now = app.clock.time()
        jobs = app.list_jobs(
            state=state,
            due_after=_maybe_when(due_after, now, "--due-after"),
            due_before=_maybe_when(due_before, now, "--due-before"),
            limit=limit,
            name=name,
            payload_contains=payload_contains,
            payload_at=None if payload_at is None else parse_payload_at(payload_at, "--payload-at"),
        )
    if as_json:
        _echo_json([job_dict(j) for j in jobs])
        return
    title = f"{len(jobs)} job(s)" + (f" in state {state}" if state else "")
    _console().print(jobs_table(jobs, now, title))


@click.command()
@_JSON_OPTION
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Counts by state and the next due time."""
    with _open_app(ctx) as app:
        s = app.stats()
        url = app.url
        now = app.clock.time()
    if as_json:
        _echo_json({"url": url, **s.as_dict()})
        return
    table = Table(title=f"delayq stats: {url}", title_justify="left")
    for column in ("scheduled", "due now", "running", "succeeded", "dead", "cancelled", "skipped"):
        table.add_column(column, justify="right")
    table.add_column("next due")
    table.add_row(
        *(str(v) for v in (s.scheduled, s.due, s.running, s.succeeded, s.dead, s.cancelled)),
        str(s.skipped),
        when(s.next_due, now),
    )
    _console().print(table)
