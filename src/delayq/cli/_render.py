"""Tables and times as the CLI prints them (pure: no click, no store)."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.table import Table

from delayq._present import error_summary, relative
from delayq.job import Job


def when(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "-"
    local = datetime.fromtimestamp(epoch, tz=UTC).astimezone()
    return f"{local:%Y-%m-%d %H:%M:%S} ({relative(epoch, now)})"


def first_line(text: str | None, width: int = 60) -> str:
    """The error summary (:func:`~delayq._present.error_summary`) cut to ``width``."""
    return error_summary(text, width) or ""


def jobs_table(jobs: list[Job], now: float, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("id", "name", "state", "due", "attempts", "last error / outcome"):
        table.add_column(column, overflow="fold" if column == "id" else "ellipsis")
    for job in jobs:
        table.add_row(
            job.id,
            job.name,
            job.state.value,
            when(job.run_at, now),
            f"{job.attempts}/{job.max_attempts}",
            first_line(job.last_error or job.outcome),
        )
    return table
