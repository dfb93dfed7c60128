"""``delayq recurring ls/add/pause/resume/rm``: recurring schedules from the command line.

A thin front end over :meth:`DelayQ.recurring <delayq.app.DelayQ.recurring>` and
its siblings; edits take effect in running workers at the schedule's next
occurrence (no restart). Exit codes as for ``delayq``: 1 when the schedule
does not exist, 2 for bad input.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from delayq._present import iso
from delayq.cli._common import (
    _JSON_OPTION,
    _BadInput,
    _console,
    _duration,
    _echo_json,
    _maybe_when,
    _open_app,
)
from delayq.cli._render import when
from delayq.recurring import Schedule

__all__ = ["recurring", "schedule_to_dict"]


def _timing(schedule: Schedule) -> str:
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.tz})"
    return f"every {schedule.every:g}s"


def schedule_to_dict(schedule: Schedule, now: float) -> dict[str, Any]:
    """A schedule as JSON-ready data, with its next run (epoch seconds and ISO 8601 UTC)."""
    data = schedule.as_dict(now)
    data["next_run_iso"] = iso(data["next_run"])
    return data


@click.group()
def recurring() -> None:
    """Recurring schedules (cron or every N seconds), stored in the store."""


@recurring.command("ls")
@_JSON_OPTION
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List the schedules with their next run."""
    with _open_app(ctx) as app:
        schedules = app.recurring_schedules()
        now = app.clock.time()
    if as_json:
        _echo_json([schedule_to_dict(s, now) for s in schedules])
        return
    table = Table(title=f"{len(schedules)} recurring schedule(s)", title_justify="left")
    for column in ("name", "handler", "timing", "next run", "misfire", "state"):
        table.add_column(column)
    for s in schedules:
        table.add_row(
            s.name,
            s.handler,
            _timing(s),
            when(s.next_run(now), now),
            s.misfire,
            "paused" if s.paused else "active",
        )
    _console().print(table)


@recurring.command("add")
@click.argument("name")
@click.argument("payload", required=False, default="null")
@click.option("--cron", default=None, help="A cron expression, e.g. '0 3 * * *'.")
@click.option("--every", default=None, help="An interval, e.g. 30s, 5m, 1h (at least 1s).")
@click.option("--tz", default="UTC", show_default=True, help="Time zone of --cron.")
@click.option("--handler", default=None, help="Handler to run (default: NAME).")
@click.option("--start", default=None, help="First possible run: ISO 8601 time, +10m, epoch.")
@click.option("--end", default=None, help="Last possible run: ISO 8601 time, +1d, epoch.")
@click.option("--jitter", default=None, help="Delay each run by a random 0..jitter, e.g. 10s.")
@click.option("--max-attempts", type=int, default=None, help="Attempts per occurrence.")
@click.option("--backoff", default=None, help="Retry delays, e.g. '2s,5s,10s,20s'.")
@click.option(
    "--misfire",
    default="latest",
    show_default=True,
    help="After downtime: 'latest' (run the latest missed once), 'skip' (none) or "
    "'catchup:N' (the last N).",
)
@_JSON_OPTION
@click.pass_context
def add(
    ctx: click.Context,
    *,
    name: str,
    payload: str,
    cron: str | None,
    every: str | None,
    tz: str,
    handler: str | None,
    start: str | None,
    end: str | None,
    jitter: str | None,
    max_attempts: int | None,
    backoff: str | None,
    misfire: str,
    as_json: bool,
) -> None:
    """Add schedule NAME (or change it to this definition) with a JSON PAYLOAD."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise _BadInput(f'PAYLOAD must be JSON, e.g. \'{{"report": "daily"}}\': {exc}') from exc
    with _open_app(ctx) as app:
        now = app.clock.time()
        schedule = app.recurring(
            name,
            cron=cron,
            every=None if every is None else _duration(every, "--every"),
            tz=tz,
            payload=data,
            handler=handler,
            start=_maybe_when(start, now, "--start"),
            end=_maybe_when(end, now, "--end"),
            jitter=0 if jitter is None else _duration(jitter, "--jitter"),
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
        )
    if as_json:
        _echo_json(schedule_to_dict(schedule, now))
        return
    state = " (paused)" if schedule.paused else ""
    click.echo(
        f"schedule {schedule.name}{state}: {_timing(schedule)}, next run "
        f"{when(schedule.next_run(now), now)}"
    )


def _edit(ctx: click.Context, name: str, verb: str) -> None:
    with _open_app(ctx) as app:
        action = {
            "paused": app.pause_recurring,
            "resumed": app.resume_recurring,
            "removed": app.remove_recurring,
        }[verb]
        found = action(name)
    if not found:
        click.echo(f"no recurring schedule named {name!r}", err=True)
        ctx.exit(1)
    click.echo(f"{verb} {name}")


@recurring.command("pause")
@click.argument("name")
@click.pass_context
def pause(ctx: click.Context, name: str) -> None:
    """Pause schedule NAME (no runs until resumed)."""
    _edit(ctx, name, "paused")


@recurring.command("resume")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """Resume schedule NAME from its next occurrence."""
    _edit(ctx, name, "resumed")


@recurring.command("rm")
@click.argument("name")
@click.pass_context
def rm(ctx: click.Context, name: str) -> None:
    """Remove schedule NAME (no later runs)."""
    _edit(ctx, name, "removed")
