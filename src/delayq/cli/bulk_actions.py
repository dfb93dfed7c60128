"""``delayq bulk requeue|purge|cancel``: act on every job a filter matches.

Counts first, asks before acting (``--yes`` skips the question, for scripts),
then acts with a progress bar (:mod:`delayq._bulk`: the same rule as the
dashboard's bulk pages and ``/api/bulk``).
"""

from __future__ import annotations

import click

from delayq import _bulk
from delayq._present import parse_payload_at, parse_time
from delayq.cli._common import _JSON_OPTION, _echo_json, _errors, _open_app, _payload_filters
from delayq.cli._progress import progress

__all__ = ["bulk_command"]

_DOING = {"requeue": "requeueing", "purge": "purging", "cancel": "cancelling"}


@click.command(name="bulk")
@click.argument("action", type=click.Choice(list(_bulk.ACTIONS)))
@click.option("--name", default=None, help="Only jobs of this handler (default any).")
@click.option("--due-after", default=None, help="Only jobs due at or after (ISO 8601 or epoch).")
@click.option("--due-before", default=None, help="Only jobs due before (ISO 8601 or epoch).")
@_payload_filters
@click.option("--yes", is_flag=True, help="Do not ask; act on the count matched now.")
@_JSON_OPTION
@click.pass_context
def bulk_command(
    ctx: click.Context,
    *,
    action: str,
    name: str | None,
    due_after: str | None,
    due_before: str | None,
    payload_contains: str | None,
    payload_at: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Requeue or purge dead jobs, or cancel scheduled ones, by filter.

    Says how many jobs match and asks before acting (at most 10,000 per run).
    """
    with _errors():
        where = _bulk.BulkFilter(
            name=name,
            due_after=None if due_after is None else parse_time(due_after, "--due-after"),
            due_before=None if due_before is None else parse_time(due_before, "--due-before"),
            payload_contains=payload_contains,
            payload_at=None if payload_at is None else parse_payload_at(payload_at, "--payload-at"),
        )
    state = _bulk.ACTIONS[action].value
    with _open_app(ctx) as app:
        matched = len(_bulk.match(app, action, where))
        if not matched:
            click.echo(f"no {state} jobs match: nothing to {action}", err=True)
            if as_json:
                _echo_json({"action": action, "matched": 0, "outcomes": {}})
            return
        if not yes:
            click.confirm(f"{matched} {state} job(s) match: {action} them?", abort=True, err=True)
        with progress(_DOING[action], matched) as advance:
            outcomes = _bulk.run(app, action, where, confirm=matched, who="cli", advance=advance)
    if as_json:
        _echo_json({"action": action, "matched": matched, "outcomes": outcomes})
    else:
        click.echo(", ".join(f"{n} {word}" for word, n in sorted(outcomes.items())))
