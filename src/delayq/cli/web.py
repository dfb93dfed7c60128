"""``delayq web``: serve the dashboard with uvicorn.

Imports only click at module level (the CLI registers this command even when
the ``web`` extra is not installed; running it then says what to install).
"""

from __future__ import annotations

import logging
import secrets
import sys

import click

from delayq.errors import DelayqError, MissingDependency
from delayq.web.security import is_loopback

__all__ = ["TOKEN_ENV", "web"]

TOKEN_ENV = "DELAYQ_WEB_TOKEN"

_ANY_ADDRESS = ("0.0.0.0", "::", "[::]")


@click.command()
@click.option(
    "--url", "store_url", default=None, help="Store URL (else delayq --url / $DELAYQ_URL)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    help=f"Token for actions (and for reads beyond loopback). Also ${TOKEN_ENV}. "
    "Default on loopback: a random one, printed in a login link.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="A host name this server answers to besides the loopback names and --host "
    "(the public name behind a proxy; repeatable; '*' for any). Requests naming "
    "another Host are refused (DNS rebinding). Default for --host 0.0.0.0: any.",
)
@click.option(
    "--root-path",
    default="",
    help="Serve under this path prefix (e.g. /ops/delayq); a proxy may strip it or not.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@click.pass_context
def web(
    ctx: click.Context,
    *,
    store_url: str | None,
    host: str,
    port: int,
    token: str | None,
    allowed_hosts: tuple[str, ...],
    root_path: str,
    log_format: str,
    log_level: str,
) -> None:
    """Serve the dashboard: pages, JSON API (/api) and /metrics.

    Binds 127.0.0.1 by default. Any other address serves other machines, so it
    needs --token (or $DELAYQ_WEB_TOKEN), and then every page asks for it too.
    """
    loopback = is_loopback(host)
    if not loopback and not token:
        raise click.UsageError(
            f"--host {host} is reachable from other machines: give --token or ${TOKEN_ENV}"
        )
    url: str | None = store_url or getattr(ctx.obj, "url", None)
    try:
        import uvicorn  # noqa: PLC0415

        from delayq.app import DelayQ  # noqa: PLC0415
        from delayq.web import create_app  # noqa: PLC0415
        from delayq.web.app import UnderRoot  # noqa: PLC0415
    except ImportError as exc:
        raise click.ClickException(
            f"delayq web needs {exc.name or 'its packages'}: pip install 'delayq[web]'"
        ) from exc
    _setup_logging(log_level, log_format)
    chosen = token or secrets.token_urlsafe(24)
    try:
        app = DelayQ(url)
        hosts = [h for h in (host, *allowed_hosts) if h not in _ANY_ADDRESS]
        if host in _ANY_ADDRESS and not allowed_hosts:
            hosts = ["*"]  # any name reaches it; every read needs the token there anyway
        site = create_app(
            app,
            token=chosen,
            require_token_for_reads=not loopback,
            allowed_hosts=hosts,
            cache_seconds=1.0,  # pollers share answers (delayq.web._cache)
        )
    except (DelayqError, MissingDependency) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    shown_host = f"[{host}]" if ":" in host else host
    root = "/" + root_path.strip("/") if root_path.strip("/") else ""
    base = f"http://{shown_host}:{port}{root}/"
    if token is None:
        click.echo(f"delayq dashboard for {app.url}: {base}?token={chosen}", err=True)
    else:
        click.echo(f"delayq dashboard for {app.url}: {base} (log in with ?token=...)", err=True)
    try:
        uvicorn.run(
            UnderRoot(site, root) if root else site,
            host=host,
            port=port,
            log_config=None,  # our handlers (text or json) on the root logger
            access_log=False,
            ws="none",
            lifespan="on",
        )
    finally:
        app.close()


def _setup_logging(level: str, log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        from delayq.observe.logs import JsonFormatter  # noqa: PLC0415

        formatter: logging.Formatter = JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    handler.setFormatter(formatter)
    for name in ("delayq", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
