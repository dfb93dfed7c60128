"""SQLite inspection reads run on read-only connections of their own.

A dashboard reading the store of a worker's process must never hold off the
worker's claims and commits (WAL readers and the writer run side by side).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from delayq.backends.sqlite import SQLiteBackend
from delayq.errors import QueueClosed
from delayq.job import JobState
from delayq.testing import FakeClock
from tests.contract._support import spec


@pytest.fixture
def backend(tmp_path: Path) -> SQLiteBackend:
    return SQLiteBackend(str(tmp_path / "jobs.db"), clock=FakeClock(), synchronous="normal")


def test_a_claim_and_an_ack_commit_while_another_thread_holds_a_read_open(
    backend: SQLiteBackend,
) -> None:
    now = backend._clock.time()
    backend.enqueue([spec("j1", now)])
    reading, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def long_read() -> None:  # a dashboard page in the middle of a slow query
        with backend._read("reading slowly") as conn:
            seen.append(conn.execute("SELECT COUNT(*) FROM delayq_jobs").fetchone()[0])
            reading.set()
            release.wait(120)
            seen.append(conn.execute("SELECT COUNT(*) FROM delayq_jobs").fetchone()[0])

    reader = threading.Thread(target=long_read)
    reader.start()
    try:
        assert reading.wait(30)
        done = threading.Event()

        def work() -> None:
            for claim in backend.claim(limit=1, lease=30, now=now):
                backend.ack(claim)
            backend.enqueue([spec("j2", now)])
            done.set()

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        assert done.wait(20), "the worker's commits waited for the read"
    finally:
        release.set()
        reader.join(30)
    assert seen == [1, 1]  # the read kept its snapshot
    assert backend.stats().succeeded == 1
    assert backend.stats().scheduled == 1
    backend.close()


def test_inspection_connections_cannot_write(backend: SQLiteBackend) -> None:
    with backend._read("checking") as conn:
        assert conn.execute("PRAGMA query_only").fetchone()[0] == 1
    backend.close()


def test_reads_after_close_raise_queue_closed(backend: SQLiteBackend) -> None:
    backend.stats()
    backend.close()
    with pytest.raises(QueueClosed):
        backend.stats()


def _steps(backend: SQLiteBackend, call: Callable[[], object]) -> int:
    """SQLite VM instructions ``call`` runs on this thread's read connection."""
    counted = [0]

    def tick() -> int:
        counted[0] += 1
        return 0

    with backend._read("counting") as conn:
        conn.set_progress_handler(tick, 1)
    try:
        call()
    finally:
        with backend._read("counting") as conn:
            conn.set_progress_handler(None, 1)
    return counted[0]


def test_a_rare_handler_name_is_listed_from_an_index_not_a_walk(backend: SQLiteBackend) -> None:
    now = backend._clock.time()
    backend.enqueue([spec(f"c{i}", now + i, name="common") for i in range(3000)])
    backend.enqueue([spec(f"r{i}", now + 5000 + i, name="rare") for i in range(3)])
    for state in (None, JobState.SCHEDULED):
        rare = _steps(backend, lambda s=state: backend.list_jobs(name="rare", state=s, limit=10))
        few = _steps(backend, lambda s=state: backend.list_jobs(state=s, limit=3))
        assert [j.id for j in backend.list_jobs(name="rare", state=state)] == ["r0", "r1", "r2"]
        assert rare < 20 * few, (state, rare, few)  # about the rows returned, not 3000
    backend.close()
