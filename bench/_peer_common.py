"""What every peer's benchmark handler shares: where to connect and how to record a run.

The peer worker entry modules (``bench._peer_*``) are imported inside the peers' own worker
processes, which the benchmark starts with these environment variables set:

- ``BENCH_PEER_REDIS_URL``: the Redis (with its dedicated database) the run uses;
- ``BENCH_PEER_OUT``: the file each handler appends one ``"<index> <lateness_s>"`` line to.

Lateness is measured first thing in the handler (wall clock, ``time.time()``) against the
absolute due time passed as an argument, so every system is timed the same way. A line is
one ``os.write`` on an ``O_APPEND`` descriptor: atomic between threads and forked children.
"""

from __future__ import annotations

import os
import time

REDIS_URL_ENV = "BENCH_PEER_REDIS_URL"
OUT_ENV = "BENCH_PEER_OUT"

_fd: int | None = None
_fd_pid: int | None = None


def redis_url() -> str:
    """The Redis URL for this run (the benchmark always sets it)."""
    return os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/15")


def record(index: int, due: float) -> None:
    """Append this job's lateness (start minus due, seconds) to the results file."""
    started = time.time()
    global _fd, _fd_pid  # noqa: PLW0603 - one descriptor per process, reopened after fork
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:
        _fd = os.open(os.environ[OUT_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = pid
    os.write(_fd, f"{index} {started - due:.6f}\n".encode())
