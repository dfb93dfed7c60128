"""What every ``delayq`` command shares: the store settings, errors as exit codes,
opening the app, ``--json`` output and time options."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
from urllib.parse import unquote, urlsplit

import click
from rich.console import Console

from delayq._present import parse_when
from delayq.app import DelayQ
from delayq.backoff import parse_duration
from delayq.errors import DelayqError, InvalidInput

F = TypeVar("F", bound=Callable[..., Any])

_JSON_OPTION = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of a table."
)


@dataclass(slots=True)
class _Settings:
    url: str | None


class _BadInput(click.UsageError):
    """Bad input reported by delayq (exit code 2)."""


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)


@contextmanager
def _errors() -> Iterator[None]:
    """Turn delayq errors into clean CLI errors (no traceback)."""
    try:
        yield
    except InvalidInput as exc:
        raise _BadInput(str(exc)) from exc
    except DelayqError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


def _forgetful_store(url: str | None) -> str | None:
    """Why the store at ``url`` loses its jobs when this process exits, or None."""
    if url is None:
        return None  # the default: a SQLite file
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return "memory://"
    if parts.scheme == "sqlite":
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if path == ":memory:" or path.startswith("file::memory:"):
            return "an in-memory SQLite database"
    return None


def _require_durable(url: str | None) -> None:
    """Refuse a store that forgets at exit: a command's jobs would vanish with it."""
    kind = _forgetful_store(url)
    if kind is not None:
        raise _BadInput(
            f"--url {url}: {kind} keeps jobs only inside this process, so they would vanish "
            f"when this command exits; use a durable store such as sqlite:///jobs.db or "
            f"redis://localhost:6379/0 (memory:// suits `delayq demo`, `delayq experiment` "
            f"and tests)"
        )


@contextmanager
def _open_app(ctx: click.Context) -> Iterator[DelayQ]:
    settings: _Settings = ctx.ensure_object(_Settings)
    _require_durable(settings.url)
    with _errors(), DelayQ(settings.url) as app:
        yield app


def _console() -> Console:
    # Piped output is not cut to 80 columns: tables stay one row per job.
    width = None if sys.stdout.isatty() else 160
    return Console(highlight=False, soft_wrap=False, width=width)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _parse_when(text: str, *, now: float, field: str) -> float:
    """:func:`~delayq._present.parse_when`, bad input as a usage error (exit code 2)."""
    try:
        return parse_when(text, now=now, field=field)
    except InvalidInput as exc:
        raise _BadInput(str(exc)) from exc


def _maybe_when(text: str | None, now: float, field: str) -> float | None:
    return None if text is None else _parse_when(text, now=now, field=field)


def _duration(text: str, field: str) -> float:
    try:
        return parse_duration(text)
    except InvalidInput as exc:
        raise _BadInput(f"{field}: {exc}") from exc


def _handler_names(values: tuple[str, ...]) -> list[str] | None:
    """``--handlers a,b`` (also given more than once) -> ``["a", "b"]``; None when
    not given. An empty name (``a,,b``) is a usage error naming the option."""
    if not values:
        return None
    names = [part.strip() for value in values for part in value.split(",")]
    if not all(names):
        raise click.BadParameter(
            f"names the handlers to serve, comma-separated (a,b); got {','.join(values)!r}",
            param_hint="--handlers",
        )
    return list(dict.fromkeys(names))


def _when_options(fn: F) -> F:
    fn = click.option(
        "--at",
        "at",
        metavar="WHEN",
        help="Due time: 'now', '+30' or '+10m' (from now), ISO 8601 with an offset, or "
        "epoch seconds.",
    )(fn)
    fn = click.option("--delay", metavar="DURATION", help="Due after e.g. 30s, 5m, 24h.")(fn)
    return fn


def _due(
    app: DelayQ, delay: str | None, at: str | None, *, now_by_default: bool = False
) -> dict[str, float]:
    if now_by_default and delay is None and at is None:
        return {}  # schedule with neither: due now
    if (delay is None) == (at is None):
        raise _BadInput("give exactly one of --delay or --at")
    if delay is not None:
        return {"delay": _duration(delay, "--delay")}
    assert at is not None
    return {"at": _parse_when(at, now=app.clock.time(), field="--at")}


def _payload_filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--payload-contains`` and ``--payload-at``: the payload search options of every
    command that selects jobs (``delayq ls``, ``delayq bulk``)."""
    fn = click.option(
        "--payload-at",
        metavar="PATH=VALUE",
        default=None,
        help="Only jobs whose payload has VALUE at PATH, e.g. customer.id=42 or "
        'status="paid" (memory, SQLite, PostgreSQL).',
    )(fn)
    return click.option(
        "--payload-contains",
        metavar="TEXT",
        default=None,
        help="Only jobs whose payload JSON holds TEXT (memory, SQLite, PostgreSQL).",
    )(fn)
