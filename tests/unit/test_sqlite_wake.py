"""Wake-ups between processes on one SQLite file never fail silently.

Sockets are as accessible as the database (another user can wake a worker),
the wake directory stays next to the database however long its path, a wake-up
that cannot be delivered is logged once, counted and makes waiters fall back
to a bounded wait, and a channel that fails its start-up self-check says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.backends.sqlite import SQLiteBackend
from delayq.testing import FakeClock
from tests._util import wait_until
from tests.contract._support import spec


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="dq-wake-", dir="/tmp"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_in_thread(backend: SQLiteBackend, max_wait: float = 3600) -> threading.Event:
    done = threading.Event()

    def wait() -> None:
        backend.wait_for_due(max_wait)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    return done


def test_wake_sockets_and_their_directory_follow_the_database_group_access(
    shared_dir: Path, clock: FakeClock
) -> None:
    db = shared_dir / "jobs.db"
    db.touch()
    os.chmod(db, 0o660)  # a group-writable database
    backend = SQLiteBackend(str(db), clock=clock)
    try:
        backend.wait_for_due(0)  # binds the socket
        assert backend._wake is not None
        path = backend._wake.socket_path
        assert path is not None
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o660 == 0o660
        assert stat.S_IMODE(os.stat(f"{db}.wake").st_mode) & 0o770 == 0o770
    finally:
        backend.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_process_of_another_user_wakes_a_waiting_worker(
    shared_dir: Path, clock: FakeClock
) -> None:
    db = shared_dir / "jobs.db"
    SQLiteBackend(str(db)).close()
    for name in os.listdir(shared_dir):
        os.chmod(shared_dir / name, 0o666 if name != "jobs.db.wake" else 0o777)
    waiting = SQLiteBackend(str(db), clock=clock)
    read_end, write_end = os.pipe()
    try:
        done = wait_in_thread(waiting)
        assert clock.wait_for_waiters(1)
        pid = os.fork()
        if pid == 0:  # a producer running as nobody (uid 65534)
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                producer = SQLiteBackend(str(db))
                # Due in an hour: only a wake-up (not a due time) ends the wait.
                producer.enqueue([spec("from-nobody", clock.time() + 3600)])
                os.write(write_end, str(producer.wake_failures).encode())
                producer.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.read(read_end, 64) == b"0"  # every wake-up delivered
        assert done.wait(30)
    finally:
        os.close(read_end)
        os.close(write_end)
        waiting.close()


def test_a_long_database_path_keeps_waking_other_processes(
    tmp_path: Path, clock: FakeClock
) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    db = str(deep / "jobs.db")
    waiting = SQLiteBackend(db, clock=clock)
    writer = SQLiteBackend(db, clock=clock)
    try:
        done = wait_in_thread(waiting)
        assert clock.wait_for_waiters(1)
        assert waiting._wake is not None
        path = waiting._wake.socket_path
        assert path is not None and path.startswith(db + ".wake/")  # never in /tmp
        writer.enqueue([spec("later", clock.time() + 3600)])
        assert done.wait(30)
        assert writer.wake_failures == 0
    finally:
        writer.close()
        waiting.close()


class _RefusingSender:
    """A sender socket whose every ``sendto`` is refused, as for another user's socket."""

    def sendto(self, data: bytes, address: str) -> int:
        raise PermissionError(13, "Permission denied")

    def close(self) -> None:
        pass


def test_an_undelivered_wake_up_is_logged_once_counted_and_waiters_fall_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = str(tmp_path / "jobs.db")
    waiting = SQLiteBackend(db, synchronous="normal")
    writer = SQLiteBackend(db, synchronous="normal")
    try:
        waiting.wait_for_due(0)  # listening, and it has seen no failure yet
        assert writer._wake is not None
        writer._wake._sender = _RefusingSender()  # type: ignore[assignment]
        with caplog.at_level(logging.WARNING, logger="delayq.sqlite"):
            writer.enqueue([spec("a", 2e9)])
            writer.enqueue([spec("b", 1.9e9)])
        assert writer.wake_failures == 2
        undelivered = [r for r in caplog.records if "could not be delivered" in r.message]
        assert len(undelivered) == 1  # once per socket, not per wake-up
        # The waiter learns it through the database and waits bounded from now on:
        # another connection's commit ends its wait without any wake-up.
        done = wait_in_thread(waiting)
        assert wait_until(lambda: waiting._wake_distrusted, timeout=30)

        def commit_elsewhere() -> bool:  # a change that wakes nobody (a later job)
            writer._conn.execute("UPDATE delayq_meta SET value = value + 1 WHERE key = 'token'")
            return done.is_set()

        assert wait_until(commit_elsewhere, timeout=30, interval=0.1)
    finally:
        writer.close()
        waiting.close()


def test_a_channel_that_cannot_work_says_so_and_the_waiter_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "jobs.db"
    Path(f"{db}.wake").write_text("not a directory")
    backend = SQLiteBackend(str(db), synchronous="normal")
    other = SQLiteBackend(str(db), synchronous="normal")
    try:
        with caplog.at_level(logging.WARNING, logger="delayq.sqlite"):
            backend.wait_for_due(0)
        assert any("wake-ups unavailable" in r.message for r in caplog.records)
        done = wait_in_thread(backend)
        later = iter(range(1_000_000))

        def commit_elsewhere() -> bool:  # no socket wakes it: data_version does
            other.enqueue([spec(f"later-{next(later)}", 2e9)])
            return done.is_set()

        assert wait_until(commit_elsewhere, timeout=30, interval=0.1)
    finally:
        other.close()
        backend.close()
