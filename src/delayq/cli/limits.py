"""``delayq limits ls/set/rm``: flow-control limits from the command line.

A thin front end over :meth:`DelayQ.limit <delayq.app.DelayQ.limit>`; an edit
applies to the next claim of every running worker. Exit codes as for
``delayq``: 1 when the limit does not exist, 2 for bad input.
"""

from __future__ import annotations

import click

from delayq.cli._common import _JSON_OPTION, _echo_json, _open_app

__all__ = ["limits"]


@click.group()
def limits() -> None:
    """Flow-control limits (per-key concurrency and rate), stored in the store."""


@limits.command("ls")
@_JSON_OPTION
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List the limits, by pattern."""
    with _open_app(ctx) as app:
        found = app.limits()
    if as_json:
        _echo_json(
            [
                {
                    "pattern": lim.pattern,
                    "concurrency": lim.concurrency,
                    "rate": None if lim.rate is None else str(lim.rate),
                    "burst": lim.burst,
                }
                for lim in found
            ]
        )
        return
    if not found:
        click.echo("no limits")
    for lim in found:
        click.echo(lim.describe())


@limits.command("set")
@click.argument("pattern")
@click.option("--concurrency", type=int, default=None, help="Jobs of one key running at once.")
@click.option("--rate", default=None, help="Starts per period of one key, e.g. 100/s, 5/m.")
@click.option("--burst", type=int, default=0, show_default=True, help="More starts per period.")
@click.pass_context
def set_limit(
    ctx: click.Context, pattern: str, concurrency: int | None, rate: str | None, burst: int
) -> None:
    """Declare (or replace) the limit of the keys matching PATTERN (* is a wildcard)."""
    with _open_app(ctx) as app:
        limit = app.limit(pattern, concurrency=concurrency, rate=rate, burst=burst)
    click.echo(f"limit {limit.describe()}")


@limits.command("rm")
@click.argument("pattern")
@click.pass_context
def rm(ctx: click.Context, pattern: str) -> None:
    """Delete the limit of PATTERN."""
    with _open_app(ctx) as app:
        removed = app.remove_limit(pattern)
    if not removed:
        raise click.ClickException(f"no limit {pattern!r}")
    click.echo(f"removed limit {pattern}")
