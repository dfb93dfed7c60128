"""``delayq rabbitmq verify / setup / teardown``: operating the RabbitMQ store's topology."""

from __future__ import annotations

import os

import click

from delayq.app import URL_ENV
from delayq.cli._common import _JSON_OPTION, _echo_json, _errors, _fail, _Settings


def _url(ctx: click.Context, url: str | None) -> str:
    settings = ctx.find_object(_Settings)
    chosen = url or (settings.url if settings is not None else None) or os.environ.get(URL_ENV)
    if not chosen or not chosen.startswith(("amqp://", "amqps://")):
        _fail("give an amqp:// URL (argument, --url or $DELAYQ_URL)")
    return chosen


@click.group()
def rabbitmq() -> None:
    """The RabbitMQ store: check a broker, declare or remove a queue's topology."""


@rabbitmq.command()
@click.argument("url", required=False)
@click.option(
    "--policies/--no-policies",
    default=True,
    show_default=True,
    help="Read the virtual host's policies and the broker's feature flags through rabbitmqctl.",
)
@_JSON_OPTION
@click.pass_context
def verify(ctx: click.Context, url: str | None, policies: bool, as_json: bool) -> None:
    """Broker version and feature flags, topology, orphans and policies that touch delayq's
    queues."""
    from delayq.backends.rabbitmq import admin  # noqa: PLC0415 - needs pika

    with _errors():
        settings = admin.Settings.parse(_url(ctx, url))
        if policies:
            report = admin.verify(settings)
        else:
            report = admin.verify(settings, policies=lambda vhost: [], feature_flags=lambda: None)
    if as_json:
        _echo_json(
            {
                "version": report.version,
                "queues": report.queues,
                "policies": report.policies,
                "problems": report.problems,
                "notes": report.notes,
            }
        )
    else:
        for line in report.lines():
            click.echo(line)
    if report.problems:
        ctx.exit(1)


@rabbitmq.command()
@click.argument("url", required=False)
@click.pass_context
def setup(ctx: click.Context, url: str | None) -> None:
    """Declare the queue's topology (then workers may open it with declare=passive)."""
    from delayq.backends.rabbitmq import admin  # noqa: PLC0415 - needs pika

    with _errors():
        names = admin.setup(admin.Settings.parse(_url(ctx, url)))
    click.echo(f"declared {len(names)} queues ({names[-2]}, {names[-1]} and the shared levels)")


@rabbitmq.command()
@click.argument("url", required=False)
@click.option("--force", is_flag=True, help="Delete the queue even with jobs or consumers.")
@click.pass_context
def teardown(ctx: click.Context, url: str | None, force: bool) -> None:
    """Remove the queue (?queue=...) and its dead letters; its jobs still in the shared
    levels go to the orphans queue instead of stalling them."""
    from delayq.backends.rabbitmq import admin  # noqa: PLC0415 - needs pika

    with _errors():
        deleted = admin.teardown(admin.Settings.parse(_url(ctx, url)), force=force)
    click.echo(f"deleted: {', '.join(deleted) if deleted else 'nothing (no such queue)'}")
