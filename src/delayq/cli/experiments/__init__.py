"""The seed experiments as runnable commands (``delayq experiment <name>``).

Each experiment module exposes ``run(out: TextIO) -> None`` and is listed
in :data:`EXPERIMENTS`:

* ``retry``: a job failing twice then succeeding, 50 ms << attempt backoff, on a
  ``DelayQueue`` (``delayq.cli.experiments.retry``).
* ``precision``: hashed wheel vs DelayQueue vs hierarchical wheel on six delays
  (``delayq.cli.experiments.precision``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from delayq.cli.experiments import precision, retry

__all__ = ["EXPERIMENTS"]

EXPERIMENTS: dict[str, Callable[[TextIO], None]] = {
    "retry": retry.run,
    "precision": precision.run,
}
