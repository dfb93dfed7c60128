"""The checks of every store's worker registry (:class:`~delayq.backends.base.WorkerRegistry`)."""

from __future__ import annotations

from delayq.errors import InvalidOption

__all__ = ["MAX_WORKER_DATA", "check_worker_beat", "check_worker_id"]

MAX_WORKER_DATA = 4096
"""The most characters a worker's record may hold."""


def check_worker_id(worker_id: object) -> str:
    if not isinstance(worker_id, str) or not 0 < len(worker_id) <= 200:
        raise InvalidOption(f"worker_id must be a str of 1..200 characters, got {worker_id!r}")
    return worker_id


def check_worker_beat(worker_id: object, data: object) -> tuple[str, str]:
    if not isinstance(data, str) or len(data) > MAX_WORKER_DATA:
        raise InvalidOption(f"a worker's data must be a str of at most {MAX_WORKER_DATA} chars")
    return check_worker_id(worker_id), data
