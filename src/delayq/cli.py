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

import importlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn, TextIO, TypeVar
from urllib.parse import unquote, urlsplit

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from delayq.app import URL_ENV, DelayQ
from delayq.backoff import parse_duration
from delayq.bulk import schedule_many_command
from delayq.demo import DemoConfig, run_demo
from delayq.errors import DelayqError, InvalidInput
from delayq.experiments import EXPERIMENTS
from delayq.job import EnqueueOutcome, Job, JobState
from delayq.logs import JsonFormatter
from delayq.ops import WorkerOps
from delayq.progress import progress
from delayq.web.command import web as web_command
from delayq.worker import Worker

__all__ = ["main"]

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


# -- time parsing and display ----------------------------------------------------------
def parse_when(text: str, *, now: float, field: str) -> float:
    """``now``, ``+10m`` / ``-1h`` / ``+30`` (relative: a sign always means "from
    now", a bare number of seconds included), an ISO 8601 time with an offset,
    or unsigned epoch seconds, as epoch seconds."""
    value = text.strip()
    if value == "now":
        return now
    if value[:1] in "+-" and value[1:2].isdigit():
        try:
            seconds = parse_duration(value[1:])
        except InvalidInput as exc:
            raise _BadInput(f"{field}: {exc}") from exc
        return now + seconds if value[0] == "+" else now - seconds
    if _is_number(value):
        return float(value)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _BadInput(
            f"{field}: cannot read {text!r} as a time; use 'now', '+10m', '-1h', "
            f"an ISO 8601 time with an offset (2030-01-01T09:00:00+01:00) or epoch seconds"
        ) from None
    if when.tzinfo is None:
        raise _BadInput(
            f"{field}: {text!r} has no UTC offset; add one, e.g. {value}Z or {value}+01:00"
        )
    return when.timestamp()


def _maybe_when(text: str | None, now: float, field: str) -> float | None:
    return None if text is None else parse_when(text, now=now, field=field)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _duration(text: str, field: str) -> float:
    try:
        return parse_duration(text)
    except InvalidInput as exc:
        raise _BadInput(f"{field}: {exc}") from exc


def _relative(seconds: float) -> str:
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f}ms"
    elif s < 60:
        text = f"{s:.1f}s"
    elif s < 3600:
        text = f"{int(s // 60)}m {int(s % 60)}s"
    elif s < 86400:
        text = f"{int(s // 3600)}h {int(s % 3600 // 60)}m"
    else:
        text = f"{int(s // 86400)}d {int(s % 86400 // 3600)}h"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _when(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "-"
    local = datetime.fromtimestamp(epoch, tz=UTC).astimezone()
    return f"{local:%Y-%m-%d %H:%M:%S} ({_relative(epoch - now)})"


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC).isoformat()


def job_to_dict(job: Job) -> dict[str, Any]:
    """A job as JSON-ready data (times as epoch seconds plus ISO 8601 UTC)."""
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "payload": job.payload,
        "run_at": job.run_at,
        "run_at_iso": _iso(job.run_at),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "backoff": job.backoff,
        "misfire": job.misfire,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "lease_until": job.lease_until,
        "last_error": job.last_error,
        "outcome": job.outcome,
    }


def _first_line(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines and lines[0].startswith("Traceback") else (lines or [""])[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def _jobs_table(jobs: list[Job], now: float, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("id", "name", "state", "due", "attempts", "last error / outcome"):
        table.add_column(column, overflow="fold" if column == "id" else "ellipsis")
    for job in jobs:
        table.add_row(
            job.id,
            job.name,
            job.state.value,
            _when(job.run_at, now),
            f"{job.attempts}/{job.max_attempts}",
            _first_line(job.last_error or job.outcome),
        )
    return table


# -- the command group -------------------------------------------------------------------
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


# -- worker -------------------------------------------------------------------------------
def _load_app(target: str, url: str | None) -> DelayQ:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise _BadInput(f"TARGET must look like 'package.module:app', got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if url is not None:
        os.environ[URL_ENV] = url  # an app built with DelayQ() picks it up
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name!r}: {exc}")
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        _fail(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(obj, DelayQ) and callable(obj):
        obj = obj()
    if not isinstance(obj, DelayQ):
        _fail(f"{target} is a {type(obj).__name__}, not a DelayQ app (or a function returning one)")
    return obj


def _setup_logging(level: str, log_format: str = "text") -> Callable[[], None]:
    """Send delayq's logs to stderr at ``level``; returns a function undoing it."""
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
    elif sys.stderr.isatty():
        handler = RichHandler(show_path=False, rich_tracebacks=True)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
        )
    root = logging.getLogger("delayq")
    saved = (list(root.handlers), root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False

    def restore() -> None:
        root.handlers[:], root.level, root.propagate = saved

    return restore


@cli.command()
@click.argument("target")
@click.option("-c", "--concurrency", default=8, show_default=True, help="Handlers run at once.")
@click.option("--lease", default="30s", show_default=True, help="Lease per claim (renewed).")
@click.option("--batch", type=int, default=None, help="Most jobs per claim (default concurrency).")
@click.option("--grace", default="30s", show_default=True, help="Time to finish on stop.")
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=None,
    help="Jobs claimed ahead of free slots under a backlog (default concurrency / 2).",
)
@click.option(
    "--timeout",
    default=None,
    help="Longest run of one attempt, e.g. '5m', for handlers without their own timeout.",
)
@click.option(
    "--unknown-handler-grace",
    default="5m",
    show_default=True,
    help="How long jobs naming an unknown handler are retried before they are dead-lettered.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--web-port", type=int, default=None, help="Serve the dashboard (127.0.0.1).")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.pass_context
def worker(
    ctx: click.Context,
    *,
    target: str,
    concurrency: int,
    lease: str,
    batch: int | None,
    grace: str,
    prefetch: int | None,
    timeout: str | None,
    unknown_handler_grace: str,
    log_level: str,
    metrics_port: int | None,
    metrics_host: str,
    web_port: int | None,
    log_format: str,
) -> None:
    """Run the handlers of the DelayQ app TARGET ('package.module:app').

    Stops gracefully on SIGINT / SIGTERM: no new claims, in-flight jobs get the
    grace period to finish; a second signal stops at once.
    """
    settings: _Settings = ctx.ensure_object(_Settings)
    _require_durable(settings.url)
    with _errors():
        app = _load_app(target, settings.url)
        ops = WorkerOps(
            app,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            log_format="json" if log_format == "json" else "text",
            web_port=web_port,
        )
        w = Worker(
            app,
            concurrency=concurrency,
            lease=_duration(lease, "--lease"),
            batch=batch,
            grace=_duration(grace, "--grace"),
            prefetch=prefetch,
            timeout=None if timeout is None else _duration(timeout, "--timeout"),
            unknown_handler_grace=_duration(unknown_handler_grace, "--unknown-handler-grace"),
            on_result=ops.on_result,
        )
    restore_logging = _setup_logging(log_level, log_format)
    log = logging.getLogger("delayq.worker")
    if settings.url is not None and app.url != settings.url:
        log.warning(
            "%s opens its own store %s; --url %s is not used", target, app.url, settings.url
        )
    log.info(
        "worker %d: %s on %s, handlers: %s; concurrency %d, lease %.1fs",
        os.getpid(),
        target,
        app.url,
        ", ".join(sorted(app.handlers)) or "none",
        w.concurrency,
        w.lease,
    )
    try:
        with _errors():
            ops.start()
        w.run()
    finally:
        ops.close()
        stats = w.stats()
        log.info(
            "worker stopped: %d claimed, %d succeeded, %d retried, %d dead, %d skipped",
            stats.claimed,
            stats.succeeded,
            stats.retried,
            stats.dead,
            stats.skipped,
        )
        app.close()
        restore_logging()


# -- producers ---------------------------------------------------------------------------
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
    return {"at": parse_when(at, now=app.clock.time(), field="--at")}


@cli.command()
@click.argument("name")
@click.argument("payload", required=False, default="null")
@_when_options
@click.option("--id", "job_id", help="Job id (default: generated). Makes scheduling idempotent.")
@click.option(
    "--on-conflict",
    type=click.Choice(["reject", "keep", "replace"]),
    default="reject",
    show_default=True,
)
@click.option("--max-attempts", type=int, default=None, help="Attempts before dead-lettering.")
@click.option("--backoff", default=None, help="Retry delays, e.g. '2s,5s,10s,20s'.")
@click.option(
    "--misfire",
    default=None,
    help="What to do when the job is claimed late: 'run' (default), 'skip' (skips it when "
    "claimed more than 1s late for any reason, a busy worker's backlog included) or a grace "
    "in seconds (e.g. --misfire 300: skip only when over 5 minutes late, i.e. after downtime).",
)
@_JSON_OPTION
@click.pass_context
def schedule(
    ctx: click.Context,
    *,
    name: str,
    payload: str,
    delay: str | None,
    at: str | None,
    job_id: str | None,
    on_conflict: str,
    max_attempts: int | None,
    backoff: str | None,
    misfire: str | None,
    as_json: bool,
) -> None:
    """Schedule handler NAME with a JSON PAYLOAD (default null)."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise _BadInput(f"PAYLOAD must be JSON, e.g. '{{\"order\": 42}}': {exc}") from exc
    with _open_app(ctx) as app:
        due = _due(app, delay, at, now_by_default=True)
        # build + enqueue (not schedule) to learn whether the job was kept or replaced.
        spec = app.build(
            name,
            data,
            job_id=job_id,
            max_attempts=max_attempts,
            backoff=backoff,
            misfire=misfire,
            **due,
        )
        [outcome] = app.enqueue([spec], on_conflict=on_conflict)  # type: ignore[arg-type]
        job = app.get(spec.id) if "inspect" in app._backend.features else None
        now = app.clock.time()
    if as_json:
        _echo_json({**(job_to_dict(job) if job else {"id": spec.id}), "outcome": outcome.value})
        return
    due_text = _when(job.run_at, now) if job else "?"
    shown = job.name if job else name
    if outcome is EnqueueOutcome.KEPT:
        click.echo(f"kept existing job {spec.id} ({shown}) due {due_text}; not changed")
    elif outcome is EnqueueOutcome.REPLACED:
        click.echo(f"replaced job {spec.id} ({shown}) due {due_text}")
    else:
        click.echo(f"scheduled {spec.id} ({shown}) due {due_text}")


@cli.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or upgrade a PostgreSQL store's schema (safe to run concurrently)."""
    with _errors():
        from delayq.backends.postgres.migrate import migrate_url  # noqa: PLC0415 (optional extra)

        click.echo(migrate_url(ctx.obj.url))


@cli.command()
@click.argument("job_id")
@_JSON_OPTION
@click.pass_context
def cancel(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Cancel a scheduled job (reports cancelled / running / finished / not_found)."""
    with _open_app(ctx) as app:
        outcome = app.cancel(job_id)
    if as_json:
        _echo_json({"id": job_id, "outcome": outcome.value})
    else:
        click.echo(f"{job_id}: {outcome.value}")
    if outcome == "not_found":
        ctx.exit(1)


@cli.command()
@click.argument("job_id")
@_when_options
@_JSON_OPTION
@click.pass_context
def reschedule(
    ctx: click.Context, *, job_id: str, delay: str | None, at: str | None, as_json: bool
) -> None:
    """Move a scheduled job to a new due time."""
    with _open_app(ctx) as app:
        outcome = app.reschedule(job_id, **_due(app, delay, at))
        job = app.get(job_id)
        now = app.clock.time()
    if as_json:
        _echo_json({"id": job_id, "outcome": outcome.value, "run_at": job.run_at if job else None})
    elif outcome == "rescheduled" and job is not None:
        click.echo(f"{job_id}: rescheduled, due {_when(job.run_at, now)}")
    else:
        click.echo(f"{job_id}: {outcome.value}")
    if outcome == "not_found":
        ctx.exit(1)


# -- inspection ---------------------------------------------------------------------------
@cli.command()
@click.argument("job_id")
@_JSON_OPTION
@click.pass_context
def get(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job: state, attempts, due time, last error."""
    with _open_app(ctx) as app:
        job = app.get(job_id)
        now = app.clock.time()
    if job is None:
        _fail(f"no job with id {job_id!r}")
    if as_json:
        _echo_json(job_to_dict(job))
        return
    table = Table(show_header=False, title=f"job {job.id}", title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("name", job.name),
        ("state", job.state.value),
        ("due", _when(job.run_at, now)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("backoff", json.dumps(job.backoff)),
        ("misfire", job.misfire),
        ("created", _when(job.created_at, now)),
        ("updated", _when(job.updated_at, now)),
        ("lease until", _when(job.lease_until, now)),
        ("payload", json.dumps(job.payload, ensure_ascii=False)),
        ("outcome", job.outcome or "-"),
        ("last error", job.last_error or "-"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    _console().print(table)


@cli.command(name="ls")
@click.option(
    "--state",
    type=click.Choice([s.value for s in JobState]),
    default=None,
    help="Only jobs in this state.",
)
@click.option("--due-after", metavar="WHEN", help="Due at or after: ISO 8601, '-1h', epoch.")
@click.option("--due-before", metavar="WHEN", help="Due before: ISO 8601, '+10m', epoch.")
@click.option("--limit", type=int, default=50, show_default=True)
@_JSON_OPTION
@click.pass_context
def list_command(
    ctx: click.Context,
    *,
    state: str | None,
    due_after: str | None,
    due_before: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs in due-time order, by state and/or due window."""
    with _open_app(ctx) as app:
        now = app.clock.time()
        jobs = app.list_jobs(
            state=state,
            due_after=_maybe_when(due_after, now, "--due-after"),
            due_before=_maybe_when(due_before, now, "--due-before"),
            limit=limit,
        )
    if as_json:
        _echo_json([job_to_dict(j) for j in jobs])
        return
    title = f"{len(jobs)} job(s)" + (f" in state {state}" if state else "")
    _console().print(_jobs_table(jobs, now, title))


@cli.command()
@_JSON_OPTION
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Counts by state and the next due time."""
    with _open_app(ctx) as app:
        s = app.stats()
        url = app.url
        now = app.clock.time()
    if as_json:
        _echo_json({"url": url, **s.as_dict()})
        return
    table = Table(title=f"delayq stats: {url}", title_justify="left")
    for column in ("scheduled", "due now", "running", "succeeded", "dead", "cancelled", "skipped"):
        table.add_column(column, justify="right")
    table.add_column("next due")
    table.add_row(
        *(str(v) for v in (s.scheduled, s.due, s.running, s.succeeded, s.dead, s.cancelled)),
        str(s.skipped),
        _when(s.next_due, now),
    )
    _console().print(table)


# -- dead letters ---------------------------------------------------------------------------
@cli.group()
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
        _echo_json([job_to_dict(j) for j in jobs])
        return
    _console().print(_jobs_table(jobs, now, f"{len(jobs)} dead job(s)"))


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


# -- demo and experiments ---------------------------------------------------------------------
@cli.command()
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Wall-clock seconds the story takes (default 60). Sets --speed.",
)
@click.option("--speed", type=float, default=1.0, show_default=True, help="Time factor.")
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="SQLite file to use (default: a fresh file in a temporary directory).",
)
@click.option("--orders", type=int, default=None, help="How many orders (default 90).")
@click.option("--seed", type=int, default=7, show_default=True)
def demo(
    *, duration: float | None, speed: float, db: str | None, orders: int | None, seed: int
) -> None:
    """The order story on SQLite, time compressed to about a minute.

    Unpaid orders are cancelled after "30 minutes", paid ones get their cancel
    job cancelled, delivered orders get an automatic review "24 hours" later,
    and a flaky webhook is retried at "2s, 5s, 10s, 20s" before dead-lettering.
    """
    if duration is not None:
        if not duration > 0:
            raise _BadInput(f"--duration must be > 0 seconds, got {duration}")
        speed = DemoConfig.story_seconds() / duration
    if not (speed > 0 and math.isfinite(speed)):
        raise _BadInput(f"--speed must be a positive number, got {speed}")
    if db is not None and os.path.exists(db):
        raise _BadInput(f"--db {db} exists; the demo needs a new file (or none: a temp file)")
    config = DemoConfig(speed=speed, seed=seed)
    if orders is not None:
        if orders < 1:
            raise _BadInput(f"--orders must be >= 1, got {orders}")
        config = DemoConfig(speed=speed, seed=seed, orders=orders)
    with _errors():
        summary = run_demo(config, db_path=db, console=_console())
    if not summary.ok:
        _fail("the demo found a problem: " + "; ".join(summary.problems))


@cli.command()
@click.argument("name")
def experiment(name: str) -> None:
    """Run a seed experiment: retry (backoff on a DelayQueue) or precision (wheels vs queue)."""
    module_name = EXPERIMENTS.get(name)
    if module_name is None:
        raise _BadInput(f"unknown experiment {name!r}; choose one of: {', '.join(EXPERIMENTS)}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        _fail(f"experiment {name!r} is not available in this installation ({module_name} missing)")
    if not callable(getattr(module, "run", None)):
        _fail(f"{module_name} has no run(out) function")
    entry: Callable[[TextIO], None] = module.run
    entry(sys.stdout)


cli.add_command(web_command)
cli.add_command(schedule_many_command)
cli.add_command(importlib.import_module("delayq.cli_recurring").recurring)
