"""rq job function for the Redis peers benchmark (``rq worker --with-scheduler``)."""

from __future__ import annotations

from bench._peer_common import record


def noop(index: int, due: float) -> None:
    """No-op job that only records its lateness."""
    record(index, due)
