"""How the SQLite store writes: turns between writers, group commit of
concurrent enqueues, and "complete these, claim the next" in one transaction."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.backends._common import MAX_ERROR_CHARS
from delayq.backends.base import Completion
from delayq.backends.memory import MemoryBackend
from delayq.backends.sqlite import SQLiteBackend
from delayq.backends.sqlite._turns import TurnTimeout, open_turns
from delayq.errors import BackendUnavailable, InvalidOption, JobConflict, StaleClaim
from delayq.job import EnqueueOutcome, JobState
from delayq.testing import FakeClock
from tests._util import wait_until
from tests.contract._support import spec

needs_ofd = pytest.mark.skipif(
    not hasattr(fcntl, "F_OFD_SETLKW"), reason="the gate needs open-file-description locks"
)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(db: str, clock: FakeClock) -> Iterator[SQLiteBackend]:
    b = SQLiteBackend(db, clock=clock, synchronous="normal")
    yield b
    b.close()


def commits(backend: SQLiteBackend) -> list[str]:
    """Record every COMMIT this backend's connection runs from now on."""
    seen: list[str] = []
    backend._conn.set_trace_callback(
        lambda sql: seen.append(sql) if sql.strip().upper() == "COMMIT" else None
    )
    return seen


# -- turns ----------------------------------------------------------------------------


def test_a_writer_waits_for_the_turn_and_gives_up_after_its_timeout(db: str) -> None:
    SQLiteBackend(db).close()
    first, second = open_turns(db), open_turns(db)
    assert first is not None and second is not None
    try:
        first.acquire(1.0)
        with pytest.raises(TurnTimeout):
            second.acquire(0.05)
        first.release()
        second.acquire(5.0)  # the abandoned wait handed its late turn back
        second.release()
    finally:
        first.close()
        second.close()


def _gate_is_held(lock_path: str) -> bool:
    fd = os.open(lock_path, os.O_RDWR)
    try:
        probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        kind = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0]
        return bool(kind != fcntl.F_UNLCK)
    finally:
        os.close(fd)


@needs_ofd
def test_a_writer_that_just_committed_lets_the_waiting_writer_go_first(db: str) -> None:
    SQLiteBackend(db).close()
    busy, waiting = open_turns(db), open_turns(db)
    assert busy is not None and waiting is not None
    order: list[str] = []
    got_turn = threading.Event()

    def wait_then_write() -> None:
        waiting.acquire(10.0)
        order.append("waiting")
        got_turn.set()
        waiting.release()

    try:
        busy.acquire(1.0)
        thread = threading.Thread(target=wait_then_write)
        thread.start()
        assert wait_until(lambda: _gate_is_held(busy.lock_path))  # queued at the gate
        busy.release()
        busy.acquire(10.0)  # at once again: but the waiting writer goes first
        order.append("busy")
        busy.release()
        thread.join(10)
        assert got_turn.is_set()
        assert order == ["waiting", "busy"]
    finally:
        busy.close()
        waiting.close()


def test_a_write_waiting_longer_than_busy_timeout_is_unavailable(db: str) -> None:
    backend = SQLiteBackend(db, synchronous="normal", busy_timeout=0.05)
    holder = open_turns(db)
    assert holder is not None
    try:
        holder.acquire(1.0)
        with pytest.raises(BackendUnavailable, match="busy_timeout"):
            backend.enqueue([spec("a", 1.0)])
        holder.release()
        backend.enqueue([spec("a", 1.0)])
        assert backend.get("a") is not None
    finally:
        holder.close()
        backend.close()


def test_the_lock_file_takes_the_database_files_mode(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    db.touch(mode=0o660)
    os.chmod(db, 0o660)  # the umask may have trimmed it
    SQLiteBackend(str(db)).close()
    assert (os.stat(f"{db}.lock").st_mode & 0o777) == 0o660


# -- group commit -----------------------------------------------------------------------


def test_enqueues_arriving_during_a_commit_share_the_next_one(backend: SQLiteBackend) -> None:
    backend.enqueue([spec("taken", 1.0)])
    seen = commits(backend)
    errors: dict[str, BaseException] = {}

    def call(job_id: str) -> None:
        try:
            backend.enqueue([spec(job_id, 1.0)])
        except JobConflict as exc:
            errors[job_id] = exc

    with backend._db_lock:  # a commit in progress: every call now waits
        leader = threading.Thread(target=call, args=("first",))
        leader.start()
        assert wait_until(lambda: backend._leading)
        others = [threading.Thread(target=call, args=(i,)) for i in ("b", "taken", "c", "d")]
        for t in others:
            t.start()
        assert wait_until(lambda: len(backend._pending) == 4)
    for t in [leader, *others]:
        t.join(10)
    assert len(seen) == 2  # "first" alone, then the four together
    assert set(errors) == {"taken"}  # a rejected id fails only its own call
    for job_id in ("first", "b", "c", "d"):
        job = backend.get(job_id)
        assert job is not None and job.state is JobState.SCHEDULED


def test_a_failed_group_commit_fails_every_call_in_it(
    backend: SQLiteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[BaseException] = []

    def call(job_id: str) -> None:
        try:
            backend.enqueue([spec(job_id, 1.0)])
        except BackendUnavailable as exc:
            failures.append(exc)

    with backend._db_lock:
        leader = threading.Thread(target=call, args=("first",))
        leader.start()
        assert wait_until(lambda: backend._leading)
        others = [threading.Thread(target=call, args=(i,)) for i in ("b", "c")]
        for t in others:
            t.start()
        assert wait_until(lambda: len(backend._pending) == 2)
        backend._busy_timeout = 0.01
        holder = open_turns(backend.path)  # another process writing meanwhile
        assert holder is not None
        holder.acquire(1.0)
    try:
        leader.join(10)
        for t in others:
            t.join(10)
    finally:
        holder.close()
    assert len(failures) == 3
    assert backend.get("b") is None and backend.get("c") is None


def test_enqueue_reports_outcomes_per_call(backend: SQLiteBackend) -> None:
    assert backend.enqueue([spec("a", 1.0)]) == [EnqueueOutcome.CREATED]
    assert backend.enqueue([spec("a", 2.0)], on_conflict="keep") == [EnqueueOutcome.KEPT]
    assert backend.enqueue([spec("a", 3.0)], on_conflict="replace") == [EnqueueOutcome.REPLACED]


# -- complete and claim -------------------------------------------------------------------


def test_complete_and_claim_is_one_transaction(backend: SQLiteBackend, clock: FakeClock) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0) for i in range(4)])
    first = backend.claim(limit=2, lease=30)
    seen = commits(backend)
    results, claims = backend.complete_and_claim(
        [Completion.ack(c) for c in first], limit=5, lease=30
    )
    assert results == [None, None]
    assert [c.job.id for c in claims] == ["j2", "j3"]
    assert len(seen) == 1
    assert backend.stats().succeeded == 2


def test_complete_and_claim_with_limit_zero_claims_nothing(
    backend: SQLiteBackend, clock: FakeClock
) -> None:
    backend.enqueue([spec("a", clock.time()), spec("b", clock.time())])
    [claim] = backend.claim(limit=1, lease=30)
    results, claims = backend.complete_and_claim([Completion.ack(claim)], limit=0, lease=30)
    assert results == [None] and claims == []
    assert backend.stats().scheduled == 1


def test_complete_and_claim_reports_a_stale_claim_and_still_claims(
    backend: SQLiteBackend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec("a", t0), spec("b", t0 + 5)])
    [old] = backend.claim(limit=1, lease=1)
    clock.advance(2)  # the lease ran out and "a" was claimed again
    [new] = backend.claim(limit=1, lease=30)
    clock.advance(4)  # "b" is due
    results, claims = backend.complete_and_claim([Completion.ack(old)], limit=5, lease=30)
    assert isinstance(results[0], StaleClaim)
    assert [c.job.id for c in claims] == ["b"]
    assert new.job.id == "a"


def test_complete_and_claim_checks_its_limit(backend: SQLiteBackend) -> None:
    with pytest.raises(InvalidOption):
        backend.complete_and_claim([], limit=-1, lease=30)


def test_an_open_transaction_is_never_left_behind_by_a_failed_group(
    backend: SQLiteBackend,
) -> None:
    with pytest.raises(JobConflict):
        backend.enqueue([spec("x", 1.0), spec("x", 1.0)], on_conflict="reject")
    assert not backend._conn.in_transaction
    with sqlite3.connect(backend.path) as other:
        other.execute("BEGIN IMMEDIATE")  # the write lock is free
        other.rollback()


# -- stored errors ------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_huge_error_is_stored_capped_keeping_its_end(
    store: str, db: str, clock: FakeClock
) -> None:
    b = MemoryBackend(clock=clock) if store == "memory" else SQLiteBackend(db, clock=clock)
    try:
        b.enqueue([spec("j", clock.time(), max_attempts=1)])
        [claim] = b.claim(limit=1, lease=30)
        error = "Traceback (most recent call last):\n" + "  frame\n" * 50_000 + "OSError: \udcff"
        b.bury(claim, error)  # a lone surrogate from a file name, too
        job = b.get("j")
        assert job is not None and job.last_error is not None
        assert len(job.last_error) <= MAX_ERROR_CHARS
        assert job.last_error.startswith("Traceback")
        assert job.last_error.endswith("OSError: \\udcff")
    finally:
        b.close()
