"""Progress bars for long CLI operations: on a terminal only, silent when piped.

:func:`progress` yields an ``advance(n)`` function. On a terminal (stderr is a
TTY) it draws a rich progress bar on stderr, a pulsing one when the total is
unknown; otherwise it draws nothing, so piped output and logs stay clean.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["progress"]


@contextmanager
def progress(
    description: str, total: int | None = None, *, stream: TextIO | None = None
) -> Iterator[Callable[[int], None]]:
    """A progress bar for ``total`` steps (None: unknown) while the block runs."""
    out = sys.stderr if stream is None else stream
    if not out.isatty():

        def quiet(n: int = 1) -> None:
            pass

        yield quiet
        return
    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=Console(file=out), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)

        yield advance
