"""``delayq schedule-many FILE``: schedule jobs from a JSON-lines file.

Each line is one object of :meth:`DelayQ.schedule`'s arguments (``name``,
``payload``, ``delay`` or ``at`` or neither for "now", ``job_id``,
``max_attempts``, ``backoff``, ``misfire``). Jobs are stored in batches of
``--batch`` (each batch atomic: all its jobs or none), with a progress bar on a
terminal. A bad line stops before its batch is stored, naming the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, TextIO

import click

from delayq.app import DelayQ
from delayq.cli._progress import progress
from delayq.errors import DelayqError, InvalidInput

__all__ = ["read_jobs", "schedule_many_command"]

_ITEM = re.compile(r"^jobs\[(\d+)\]: (.*)$", re.DOTALL)


def read_jobs(lines: TextIO) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, job arguments)`` for each non-blank line of JSON objects."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.UsageError(f"line {number}: not JSON: {exc}") from exc
        if not isinstance(item, dict):
            raise click.UsageError(f"line {number}: each line must be a JSON object")
        yield number, item


@click.command(name="schedule-many")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.option("--batch", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.option(
    "--on-conflict",
    type=click.Choice(["reject", "keep", "replace"]),
    default="reject",
    show_default=True,
)
@click.pass_context
def schedule_many_command(
    ctx: click.Context, *, file: TextIO, batch: int, on_conflict: str
) -> None:
    """Schedule the jobs of FILE (JSON lines; '-' reads stdin), in atomic batches."""
    url: str | None = getattr(ctx.obj, "url", None)
    items = list(read_jobs(file))
    done = 0
    try:
        with DelayQ(url) as app, progress("scheduling", len(items)) as advance:
            for start in range(0, len(items), batch):
                chunk = items[start : start + batch]
                try:
                    app.schedule_many([item for _, item in chunk], on_conflict=on_conflict)  # type: ignore[arg-type]
                except InvalidInput as exc:
                    # schedule_many names jobs[i]; say which line that is.
                    text = str(exc)
                    found = _ITEM.match(text)
                    if found is not None:
                        text = f"line {chunk[int(found[1])][0]}: {found[2]}"
                    raise click.UsageError(
                        f"{text} ({done} job(s) from earlier lines were stored)"
                    ) from exc
                done += len(chunk)
                advance(len(chunk))
    except DelayqError as exc:
        raise click.ClickException(
            f"{type(exc).__name__}: {exc} ({done} job(s) from earlier lines were stored)"
        ) from exc
    click.echo(f"scheduled {done} job(s)")
