"""The ``delayq`` command: run workers, schedule and inspect jobs, run the demo.

A thin front end: it parses input, calls :class:`~delayq.app.DelayQ` and
renders the answer as a table (or JSON with ``--json``). The store comes from
``--url`` or ``$DELAYQ_URL`` (default: ``sqlite:///delayq.db``).

Exit codes: 0 success, 1 a failure or "not found", 2 bad input.

Stores that forget everything when the process exits (``memory://``,
``sqlite:///:memory:``) are refused, except by ``demo`` and ``experiment``:
``delayq schedule`` would report a job that no worker can ever see.
"""

from __future__ import annotations

import click

from delayq.app import URL_ENV
from delayq.cli import dead, demo, jobs, limits, rabbitmq, recurring, worker
from delayq.cli._common import _Settings
from delayq.cli.bulk import schedule_many_command
from delayq.cli.bulk_actions import bulk_command
from delayq.cli.web import web
from delayq.cli.workers import workers_command

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar=URL_ENV,
    default=None,
    metavar="URL",
    help=f"Store URL (default ${URL_ENV}, else sqlite:///delayq.db): sqlite:///jobs.db, "
    "redis://host:6379/0 (memory:// only for demo and experiment).",
)
@click.version_option(package_name="delayq")
@click.pass_context
def cli(ctx: click.Context, url: str | None) -> None:
    """delayq: run work later, at the right time, without losing it."""
    ctx.obj = _Settings(url=url or None)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="delayq")


for _command in (
    worker.worker,
    jobs.schedule,
    jobs.migrate,
    jobs.cancel,
    jobs.reschedule,
    jobs.get,
    jobs.list_command,
    jobs.stats,
    dead.dead,
    demo.demo,
    demo.experiment,
    web,
    schedule_many_command,
    bulk_command,
    workers_command,
    recurring.recurring,
    limits.limits,
    rabbitmq.rabbitmq,
):
    cli.add_command(_command)
