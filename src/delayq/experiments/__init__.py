"""The seed experiments as runnable commands (``delayq experiment <name>``).

Each experiment module exposes ``run(out: TextIO) -> None`` and is listed
in :data:`EXPERIMENTS`:

* ``retry``: a job failing twice then succeeding, 50 ms << attempt backoff, on a
  ``DelayQueue`` (``delayq.experiments.retry``).
* ``precision``: hashed wheel vs DelayQueue vs hierarchical wheel on six delays
  (``delayq.experiments.precision``).
"""

from __future__ import annotations

EXPERIMENTS: dict[str, str] = {
    "retry": "delayq.experiments.retry",
    "precision": "delayq.experiments.precision",
}
