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
from delayq.backends.memory import _store as memory_module
from delayq.backends.sqlite import SQLiteBackend
from delayq.backends.sqlite import _schema as schema_module
from delayq.backends.sqlite import _store as backend_module
from delayq.backends.sqlite import _turns as turns_module
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
    assert (os.stat(f"{db}.lock").st_mode & 0o660) == 0o660  # its group may write it too


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
        assert wait_until(lambda: backend._group.leading)
        others = [threading.Thread(target=call, args=(i,)) for i in ("b", "taken", "c", "d")]
        for t in others:
            t.start()
        assert wait_until(lambda: backend._group.waiting == 4)
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
        assert wait_until(lambda: backend._group.leading)
        others = [threading.Thread(target=call, args=(i,)) for i in ("b", "c")]
        for t in others:
            t.start()
        assert wait_until(lambda: backend._group.waiting == 2)
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


# -- bounded purges and retention ---------------------------------------------------------


def _bury(backend: SQLiteBackend | MemoryBackend, count: int, at: float) -> None:
    backend.enqueue([spec(f"d{i}", at, max_attempts=1) for i in range(count)])
    for claim in backend.claim(limit=count, lease=30):
        backend.bury(claim, "boom")


def test_purge_dead_deletes_in_bounded_transactions(
    backend: SQLiteBackend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend_module, "PURGE_BATCH", 10)
    _bury(backend, 25, clock.time())
    seen = commits(backend)
    assert backend.purge_dead() == 25
    assert len(seen) == 3  # 10 + 10 + 5, each its own write turn
    assert backend.stats().dead == 0


def test_dead_letters_past_dead_ttl_are_purged_by_later_claims(db: str, clock: FakeClock) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal", dead_ttl=60)
    try:
        _bury(backend, 3, clock.time())
        clock.advance(30)
        backend.claim(limit=1, lease=30)
        assert backend.stats().dead == 3  # kept for dead_ttl
        clock.advance(31)
        backend.claim(limit=1, lease=30)
        assert backend.stats().dead == 0 and backend.dead_letters() == []
    finally:
        backend.close()


def test_dead_ttl_is_checked(db: str) -> None:
    with pytest.raises(InvalidOption, match="dead_ttl"):
        SQLiteBackend(db, dead_ttl=-1)
    backend = SQLiteBackend.from_url(f"sqlite:///{db}?dead_ttl=86400")
    try:
        assert backend._dead_ttl == 86400
    finally:
        backend.close()


def test_the_memory_store_purges_finished_records_in_bounded_batches(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_module, "PURGE_BATCH", 10)
    backend = MemoryBackend(clock=clock, result_ttl=60)
    backend.enqueue([spec(f"s{i}", clock.time()) for i in range(25)])
    for claim in backend.claim(limit=25, lease=30):
        backend.ack(claim)
    clock.advance(61)
    assert backend.get("s0") is None  # past result_ttl: gone for every read ...
    assert len(backend._jobs) == 15  # ... though one call purged only one batch
    assert backend.stats().succeeded == 0
    assert backend.list_jobs() == []
    backend.enqueue([spec("s24", clock.time())])  # an expired id is free again
    backend.get("s1")
    backend.get("s1")
    assert set(backend._jobs) == {"s24"}


# -- nothing raises after the commit --------------------------------------------------------


def test_a_failing_wake_up_after_the_commit_never_fails_the_enqueue(
    backend: SQLiteBackend, caplog: pytest.LogCaptureFixture
) -> None:
    assert backend._wake is not None

    def broken() -> None:
        raise OSError(24, "Too many open files")

    backend._wake.notify = broken  # type: ignore[method-assign]
    with caplog.at_level("ERROR", logger="delayq.sqlite"):
        assert backend.enqueue([spec("a", 1.0)]) == [EnqueueOutcome.CREATED]
    assert backend.get("a") is not None  # stored: a retry would be a duplicate
    assert any("waking other processes failed" in r.message for r in caplog.records)


# -- the WAL shrinks after a burst ----------------------------------------------------------


def test_the_wal_shrinks_back_after_a_burst(
    db: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema_module, "WAL_SIZE_LIMIT", 1024 * 1024)
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        big = "x" * 2000
        backend.enqueue([spec(f"j{i}", 1.0, payload={"p": big}) for i in range(2000)])
        assert os.path.getsize(f"{db}-wal") > 3 * 1024 * 1024  # one big transaction
        for i in range(3):
            backend.enqueue([spec(f"small{i}", 1.0)])  # checkpointed, then restarted
        assert os.path.getsize(f"{db}-wal") <= 1024 * 1024
    finally:
        backend.close()


# -- stats from counts kept in the same transactions ----------------------------------------


def _counted(db: str) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT state, COUNT(*) FROM delayq_jobs GROUP BY state"))


def test_stats_counts_stay_equal_to_the_rows_through_every_change(
    backend: SQLiteBackend, clock: FakeClock
) -> None:
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0, max_attempts=1 if i < 3 else 3) for i in range(12)])
    backend.enqueue([spec("j11", t0 + 60)], on_conflict="replace")
    claims = backend.claim(limit=9, lease=5)
    backend.bury(claims[0], "x")
    backend.retry(claims[3], t0 + 1, "y")
    backend.ack(claims[4])
    backend.ack(claims[5], state=JobState.SKIPPED)
    backend.release(claims[6])
    backend.cancel("j10")
    clock.advance(10)  # leases of the rest expire on the next claim
    backend.claim(limit=1, lease=5)
    backend.purge_dead(job_ids=["j0"])
    stats = backend.stats()
    got = {
        "scheduled": stats.scheduled,
        "running": stats.running,
        "succeeded": stats.succeeded,
        "dead": stats.dead,
        "cancelled": stats.cancelled,
        "skipped": stats.skipped,
    }
    assert got == {state: _counted(backend.path).get(state, 0) for state in got}


def test_stats_hides_finished_records_past_result_ttl_before_they_are_purged(
    db: str, clock: FakeClock
) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal", result_ttl=60)
    try:
        backend.enqueue([spec("a", clock.time())])
        [claim] = backend.claim(limit=1, lease=30)
        backend.ack(claim)
        assert backend.stats().succeeded == 1
        clock.advance(61)
        assert backend.stats().succeeded == 0  # gone for readers; purged by a later claim
    finally:
        backend.close()


def test_a_database_from_before_the_counts_is_counted_once_when_opened(
    db: str, clock: FakeClock
) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    backend.enqueue([spec(f"j{i}", clock.time()) for i in range(5)])
    backend.claim(limit=2, lease=30)
    backend.close()
    with sqlite3.connect(db) as conn:  # as an older delayq left it
        for trigger in ("insert", "delete", "update"):
            conn.execute(f"DROP TRIGGER delayq_count_{trigger}")
        conn.execute("DROP TABLE delayq_counts")
        conn.execute("DELETE FROM delayq_meta WHERE key = 'counts_ready'")
    reopened = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        stats = reopened.stats()
        assert (stats.scheduled, stats.running) == (3, 2)
    finally:
        reopened.close()


# -- what waits for the disk -----------------------------------------------------------------


def test_on_full_a_workers_writes_skip_the_fsync_and_producers_writes_keep_it(
    db: str, clock: FakeClock
) -> None:
    backend = SQLiteBackend(db, clock=clock)  # synchronous="full"
    statements: list[str] = []
    try:
        backend._conn.set_trace_callback(statements.append)
        backend.enqueue([spec("a", clock.time()), spec("b", clock.time())])
        assert not any("synchronous" in s for s in statements)  # schedule: fsynced
        [claim] = backend.claim(limit=1, lease=30)
        backend.complete_and_claim([Completion.ack(claim)], limit=1, lease=30)
        lazy = [s for s in statements if s == "PRAGMA synchronous = NORMAL"]
        assert len(lazy) == 2  # the claim and the ack-and-claim
        statements.clear()
        assert backend.cancel("a") is not None
        assert not any("synchronous" in s for s in statements)  # cancel: fsynced
        assert backend._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    finally:
        backend.close()


def test_without_working_file_locks_writers_fall_back_to_sqlites_busy_handler(
    db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_locks(self: object) -> None:
        raise OSError(37, "No locks available")  # ENOLCK, as on some network mounts

    monkeypatch.setattr(turns_module.WriteTurns, "probe", no_locks)
    with caplog.at_level("WARNING", logger="delayq.sqlite"):
        backend = SQLiteBackend(db, synchronous="normal")
    try:
        assert backend._turns is None
        assert any("kernel file locks do not work" in r.message for r in caplog.records)
        backend.enqueue([spec("a", 1.0)])
        assert backend.get("a") is not None
    finally:
        backend.close()
