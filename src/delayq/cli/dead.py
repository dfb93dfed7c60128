"""``delayq dead list / requeue / purge``: the dead letters."""

from __future__ import annotations

import click

from delayq._present import job_dict
from delayq.cli._common import _JSON_OPTION, _BadInput, _console, _duration, _echo_json, _open_app
from delayq.cli._progress import progress
from delayq.cli._render import jobs_table


@click.group()
def dead() -> None:
    """Dead letters: list, requeue, purge."""


@dead.command(name="list")
@click.option("--limit", type=int, default=50, show_default=True)
@_JSON_OPTION
@click.pass_context
def dead_list(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Dead jobs with their last error, most recent first."""
    with _open_app(ctx) as app:
        jobs = app.dead_letters(limit=limit)
        now = app.clock.time()
    if as_json:
        _echo_json([job_dict(j) for j in jobs])
        return
    _console().print(jobs_table(jobs, now, f"{len(jobs)} dead job(s)"))


@dead.command(name="requeue")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--delay", metavar="DURATION", default=None, help="Due after this (default now).")
@_JSON_OPTION
@click.pass_context
def dead_requeue(
    ctx: click.Context, *, job_ids: tuple[str, ...], delay: str | None, as_json: bool
) -> None:
    """Give dead jobs a fresh set of attempts."""
    seconds = None if delay is None else _duration(delay, "--delay")
    done: dict[str, bool] = {}
    with _open_app(ctx) as app, progress("requeueing", len(job_ids)) as advance:
        for job_id in job_ids:
            done[job_id] = app.requeue(job_id, delay=seconds)
            advance(1)
    if as_json:
        _echo_json({job_id: ("requeued" if ok else "not_dead") for job_id, ok in done.items()})
    else:
        for job_id, ok in done.items():
            click.echo(f"{job_id}: {'requeued' if ok else 'not dead (not requeued)'}")
    if not all(done.values()):
        ctx.exit(1)


@dead.command(name="purge")
@click.option("--id", "job_ids", multiple=True, help="Purge this dead job (repeatable).")
@click.option("--older-than", metavar="DURATION", help="Purge jobs dead for longer, e.g. 7d.")
@click.option("--all", "purge_all", is_flag=True, help="Purge every dead job.")
@_JSON_OPTION
@click.pass_context
def dead_purge(
    ctx: click.Context,
    *,
    job_ids: tuple[str, ...],
    older_than: str | None,
    purge_all: bool,
    as_json: bool,
) -> None:
    """Delete dead jobs (say which: --id, --older-than or --all)."""
    if not (job_ids or older_than or purge_all):
        raise _BadInput("say which dead jobs to purge: --id ID, --older-than 7d, or --all")
    age = None if older_than is None else _duration(older_than, "--older-than")
    with _open_app(ctx) as app, progress("purging"):
        count = app.purge_dead(job_ids=list(job_ids) or None, older_than=age)
    if as_json:
        _echo_json({"purged": count})
    else:
        click.echo(f"purged {count} dead job(s)")
