"""``delayq workers``: the workers the store has heard from (their heartbeats)."""

from __future__ import annotations

import click
from rich.table import Table

from delayq._present import relative
from delayq.backends.base import WorkerRegistry
from delayq.cli._common import _JSON_OPTION, _console, _echo_json, _open_app
from delayq.observe.workers import worker_rows

__all__ = ["workers_command"]


@click.command(name="workers")
@_JSON_OPTION
@click.pass_context
def workers_command(ctx: click.Context, *, as_json: bool) -> None:
    """Workers from their heartbeats in the store; 'gone': not seen for its lease."""
    with _open_app(ctx) as app:
        backend = app.backend
        if not isinstance(backend, WorkerRegistry):
            raise click.ClickException(f"{app.url}: this store keeps no worker heartbeats")
        now = app.clock.time()
        rows = worker_rows(backend.list_workers(), now)
    if as_json:
        _echo_json(rows)
        return
    table = Table(title=f"{len(rows)} worker(s)", title_justify="left")
    for column in ("worker", "host", "pid", "status", "in flight", "started", "last seen"):
        table.add_column(column)
    for w in rows:
        status = f"gone ({w['seen_ago']:.0f}s > lease {w['lease']:g}s)" if w["gone"] else "alive"
        table.add_row(
            str(w["name"] or w["id"]),
            str(w["host"]),
            str(w["pid"]),
            status,
            f"{w['in_flight']}/{w['concurrency']}",
            relative(w["started"], now),
            relative(w["last_seen"], now),
        )
    _console().print(table)
