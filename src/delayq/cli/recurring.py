"""``delayq recurring ls/show/add/update/run/sync/pause/resume/rm``: recurring
schedules from the command line.

A thin front end over :meth:`DelayQ.recurring <delayq.app.DelayQ.recurring>` and
its siblings; edits take effect in running workers at the schedule's next
occurrence (no restart). Exit codes as for ``delayq``: 1 when the schedule
does not exist, 2 for bad input.
"""

from __future__ import annotations

import json
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from delayq._present import iso, local, relative
from delayq.cli._common import (
    _JSON_OPTION,
    _BadInput,
    _console,
    _duration,
    _echo_json,
    _maybe_when,
    _open_app,
)
from delayq.recurring import Schedule, ScheduleStatus

__all__ = ["recurring", "schedule_to_dict"]


def _timing(schedule: Schedule) -> str:
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.tz})"
    return f"every {schedule.every:g}s"


def _when(epoch: float | None, now: float, tz: str = "UTC") -> str:
    """``epoch`` in the zone ``tz``, with the zone's abbreviation and how far off."""
    if epoch is None:
        return "-"
    return f"{local(epoch, tz)} ({relative(epoch, now)})"


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
            _when(s.next_run(now), now, s.tz),
            s.misfire,
            "paused" if s.paused else "active",
        )
    _console().print(table)


def _definition_options(fn: Any) -> Any:
    """The options of a definition (no defaults: ``update`` passes only those given)."""
    options = [
        click.option("--cron", default=None, help="A cron expression, e.g. '0 3 * * *' or @daily."),
        click.option("--every", default=None, help="An interval, e.g. 30s, 5m, 1h (at least 1s)."),
        click.option("--tz", default=None, help="Time zone of --cron (default UTC)."),
        click.option("--handler", default=None, help="Handler to run (default: NAME)."),
        click.option("--start", default=None, help="First possible run: ISO 8601, +10m, epoch."),
        click.option("--end", default=None, help="Last possible run: ISO 8601, +1d, epoch."),
        click.option("--jitter", default=None, help="Delay each run by a random 0..jitter."),
        click.option("--max-attempts", type=int, default=None, help="Attempts per occurrence."),
        click.option("--backoff", default=None, help="Retry delays, e.g. '2s,5s,10s,20s'."),
        click.option(
            "--misfire",
            default=None,
            help="After downtime: 'latest' (the default: the latest missed, once), 'skip' "
            "(none), 'catchup:N' (the last N) or a grace in seconds.",
        ),
        click.option(
            "--overlap",
            type=click.Choice(["allow", "skip", "replace"]),
            default=None,
            help="While the previous occurrence still runs: allow (the default), skip, replace.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _misfire(text: str) -> str | float:
    try:
        return float(text)
    except ValueError:
        return text


def _definition(given: dict[str, Any], now: float) -> dict[str, Any]:
    """The keywords of ``recurring`` / ``update_recurring`` for the options given."""
    out: dict[str, Any] = {}
    for key, text in given.items():
        if text is None:
            continue
        value: Any = text
        if key in ("every", "jitter"):
            value = _duration(text, f"--{key}")
        elif key in ("start", "end"):
            value = _maybe_when(text, now, f"--{key}")
        elif key == "misfire":
            value = _misfire(text)
        out[key] = value
    return out


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _BadInput(f'PAYLOAD must be JSON, e.g. \'{{"report": "daily"}}\': {exc}') from exc


def _print_schedule(schedule: Schedule, now: float) -> None:
    state = " (paused)" if schedule.paused else ""
    click.echo(
        f"schedule {schedule.name}{state}: {_timing(schedule)}, next run "
        f"{_when(schedule.next_run(now), now, schedule.tz)}"
    )


@recurring.command("add")
@click.argument("name")
@click.argument("payload", required=False, default="null")
@_definition_options
@click.option(
    "--keep", is_flag=True, help="Leave a stored schedule of that name as it is (create only)."
)
@_JSON_OPTION
@click.pass_context
def add(
    ctx: click.Context, /, *, name: str, payload: str, keep: bool, as_json: bool, **given: Any
) -> None:
    """Add schedule NAME with a JSON PAYLOAD, or change it to this whole definition
    (options not given take their defaults; `update` changes only what it is given)."""
    data = _payload(payload)
    with _open_app(ctx) as app:
        now = app.clock.time()
        schedule = app.recurring(
            name,
            payload=data,
            conflict="keep" if keep else "replace",
            **_definition(given, now),
        )
    if as_json:
        _echo_json(schedule_to_dict(schedule, now))
        return
    _print_schedule(schedule, now)


@recurring.command("update")
@click.argument("name")
@click.option("--payload", default=None, help="The new JSON payload.")
@_definition_options
@_JSON_OPTION
@click.pass_context
def update(
    ctx: click.Context, /, *, name: str, payload: str | None, as_json: bool, **given: Any
) -> None:
    """Change only the given fields of schedule NAME."""
    with _open_app(ctx) as app:
        now = app.clock.time()
        changes = _definition(given, now)
        if payload is not None:
            changes["payload"] = _payload(payload)
        if app.get_recurring(name) is None:
            click.echo(f"no recurring schedule named {name!r}", err=True)
            ctx.exit(1)
        schedule = app.update_recurring(name, **changes)
    if as_json:
        _echo_json(schedule_to_dict(schedule, now))
        return
    _print_schedule(schedule, now)


@recurring.command("show")
@click.argument("name")
@click.option("--runs", type=int, default=5, show_default=True, help="Next run times to list.")
@click.option("--history", type=int, default=10, show_default=True, help="Past occurrences.")
@_JSON_OPTION
@click.pass_context
def show(ctx: click.Context, name: str, runs: int, history: int, as_json: bool) -> None:
    """Schedule NAME: its definition, next runs, last run and recent occurrences."""
    with _open_app(ctx) as app:
        now = app.clock.time()
        status = app.recurring_status(name, runs=runs, history=history)
    if status is None:
        click.echo(f"no recurring schedule named {name!r}", err=True)
        ctx.exit(1)
    assert status is not None
    if as_json:
        data = status.as_dict(now)
        data["next_runs_iso"] = [iso(t) for t in status.next_runs]
        _echo_json(data)
        return
    _print_status(status, now)


def _print_status(status: ScheduleStatus, now: float) -> None:
    s = status.schedule
    tz = s.tz
    click.echo(f"{s.name}: {_timing(s)}, {'paused' if s.paused else 'active'}")
    click.echo(f"  handler {s.handler}, payload {s.payload}")
    click.echo(f"  misfire {s.misfire}, overlap {s.overlap}, jitter {s.jitter:g}s")
    last = status.last_run
    if last is None:
        click.echo("  last run: -")
    else:
        click.echo(f"  last run: {_when(last.at, now, tz)}: {last.state}")
    click.echo("  next runs:")
    for at in status.next_runs:
        click.echo(f"    {_when(at, now, tz)}")
    table = Table(title="recent occurrences", title_justify="left")
    for column in ("due", "state", "attempts", "note"):
        table.add_column(column)
    for o in status.history:
        table.add_row(_when(o.at, now, tz), o.state or "-", str(o.attempts), o.note or "")
    _console().print(table)


@recurring.command("run")
@click.argument("name")
@click.pass_context
def run_now(ctx: click.Context, name: str) -> None:
    """Run schedule NAME now: one occurrence due now (its handler, payload, options)."""
    with _open_app(ctx) as app:
        if app.get_recurring(name) is None:
            click.echo(f"no recurring schedule named {name!r}", err=True)
            ctx.exit(1)
        job_id = app.run_recurring_now(name)
    click.echo(f"enqueued {job_id}")


@recurring.command("sync")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Only say what would change.")
@_JSON_OPTION
@click.pass_context
def sync(ctx: click.Context, file: Path, dry_run: bool, as_json: bool) -> None:
    """Make the stored schedules exactly those in FILE, removing every other one.

    FILE is JSON (a list of definitions, or an object of name -> definition) or
    TOML (a table per name); a definition has recurring's fields (cron, every,
    tz, payload, handler, start, end, jitter, max_attempts, backoff, misfire,
    overlap); every, jitter and backoff as seconds, start and end as epoch
    seconds or ISO 8601 text.
    """
    definitions = _load_definitions(file)
    with _open_app(ctx) as app:
        result = app.sync_recurring(definitions, dry_run=dry_run)
    if as_json:
        _echo_json(result)
        return
    verb = "would be " if dry_run else ""
    for kind in ("created", "changed", "unchanged", "removed"):
        names = result[kind]
        click.echo(f"{verb}{kind} {len(names)}: {', '.join(names) or '-'}")


def _load_definitions(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _BadInput(f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from exc
    if isinstance(data, dict):
        data = [
            {"name": name, **fields} for name, fields in data.items() if isinstance(fields, dict)
        ]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise _BadInput(
            f"{path}: expected a list of definitions or an object of name -> definition"
        )
    out = []
    for item in data:
        definition = dict(item)
        for key in ("start", "end"):
            if isinstance(definition.get(key), str):
                try:
                    definition[key] = datetime.fromisoformat(definition[key])
                except ValueError as exc:
                    raise _BadInput(f"{path}: {key} {definition[key]!r}: {exc}") from exc
        out.append(definition)
    return out


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
