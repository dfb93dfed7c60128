"""SQLite-specific behaviour: pragmas, the due-time index, URLs, wake-ups across processes.

The store's contract is checked in ``tests/contract``; these tests cover what
only SQLite has.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pytest

from delayq.backends import open_backend
from delayq.backends import sqlite as sqlite_module
from delayq.backends.sqlite import SQLiteBackend
from delayq.backends.sqlite import _ops as ops_module
from delayq.backends.sqlite import _schema as schema_module
from delayq.backends.sqlite import _wake as wake_module
from delayq.backends.sqlite._wake import WakeChannel, wake_directory
from delayq.errors import (
    BackendUnavailable,
    ConfigurationError,
    InvalidOption,
    QueueClosed,
)
from delayq.job import JobState
from delayq.testing import FakeClock
from tests._util import wait_until
from tests.contract._support import spec

SRC = str(Path(sqlite_module.__file__).resolve().parents[3])


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def pragma(path: str, name: str) -> object:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


# -- pragmas ----------------------------------------------------------------------


def test_a_file_database_runs_in_wal_mode(db: str) -> None:
    SQLiteBackend(db).close()
    assert pragma(db, "journal_mode") == "wal"


def test_synchronous_defaults_to_full(db: str) -> None:
    backend = SQLiteBackend(db)
    try:
        assert backend._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        backend.close()


def test_synchronous_normal_is_an_explicit_option(db: str) -> None:
    backend = SQLiteBackend(db, synchronous="normal")
    try:
        assert backend._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert "synchronous='normal'" in repr(backend)
    finally:
        backend.close()


@pytest.mark.parametrize("value", ["off", "extra", 1, None])
def test_an_unknown_synchronous_setting_is_rejected(db: str, value: object) -> None:
    with pytest.raises(InvalidOption, match="synchronous"):
        SQLiteBackend(db, synchronous=value)  # type: ignore[arg-type]


def test_busy_timeout_is_set_on_the_connection(db: str) -> None:
    backend = SQLiteBackend(db, busy_timeout=2.5)
    try:
        assert backend._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    finally:
        backend.close()


def test_a_write_blocked_past_busy_timeout_raises_backend_unavailable(
    db: str, clock: FakeClock
) -> None:
    backend = SQLiteBackend(db, clock=clock, busy_timeout=0.05)
    other = sqlite3.connect(db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(BackendUnavailable, match="busy_timeout"):
            backend.enqueue([spec("j", clock.time())])
        other.execute("ROLLBACK")
        backend.enqueue([spec("j", clock.time())])
        assert backend.get("j") is not None
    finally:
        other.close()
        backend.close()


# -- the due-time index -------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "params"),
    [
        (schema_module.CLAIM_DUE, (1.0, 10)),
        (schema_module.HEAD, ()),
        (schema_module.EXPIRED_LEASES, (1.0,)),
        (schema_module.NEXT_LEASE, ()),
    ],
    ids=["claim", "next_due", "expired_leases", "next_lease"],
)
def test_hot_queries_search_an_index_and_never_scan_or_sort(
    db: str, clock: FakeClock, query: str, params: tuple[object, ...]
) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"j{i}", t0 + i) for i in range(2000)])
        backend.claim(limit=50, lease=30, now=t0 + 100)
        backend._conn.execute("ANALYZE")
        plan = " | ".join(
            row[3] for row in backend._conn.execute(f"EXPLAIN QUERY PLAN {query}", params)
        )
    finally:
        backend.close()
    assert "SEARCH delayq_jobs USING" in plan, plan
    assert "INDEX delayq_jobs_due" in plan or "INDEX delayq_jobs_lease" in plan, plan
    assert "SCAN" not in plan and "TEMP B-TREE" not in plan, plan


def test_the_claim_query_reads_only_the_rows_it_returns(db: str, clock: FakeClock) -> None:
    """Claim cost does not grow with the backlog: SQLite steps the index ``limit`` times."""
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"j{i}", t0 + i) for i in range(5000)])
        steps: list[int] = []

        def count() -> int:
            steps.append(1)
            return 0

        backend._conn.set_progress_handler(count, 1)  # called every VM instruction
        rows = backend._conn.execute(schema_module.CLAIM_DUE, (t0 + 10_000, 10)).fetchall()
        small = len(steps)
        steps.clear()
        backend._conn.execute(schema_module.CLAIM_DUE, (t0 + 10_000, 20)).fetchall()
        backend._conn.set_progress_handler(None, 1)
    finally:
        backend.close()
    assert len(rows) == 10
    # Twice the rows, about twice the instructions; nothing proportional to the 5000 pending.
    assert small < 1000
    assert len(steps) < 2.5 * small


@pytest.mark.parametrize(
    ("query", "params"),
    [(schema_module.CLAIM_DUE_OF, ("mine", 1.0, 10)), (schema_module.HEAD_OF, ("mine",))],
    ids=["claim_of_a_handler", "head_of_a_handler"],
)
def test_the_handler_filter_queries_search_the_name_index(
    db: str, clock: FakeClock, query: str, params: tuple[object, ...]
) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"o{i}", t0 + i, name="other") for i in range(2000)])
        backend.enqueue([spec(f"m{i}", t0 + i, name="mine") for i in range(50)])
        backend._conn.execute("ANALYZE")
        plan = " | ".join(
            row[3] for row in backend._conn.execute(f"EXPLAIN QUERY PLAN {query}", params)
        )
    finally:
        backend.close()
    assert "SEARCH delayq_jobs USING" in plan and "INDEX delayq_jobs_name" in plan, plan
    assert "SCAN delayq_jobs" not in plan and "TEMP B-TREE" not in plan, plan


def _filtered_claim_steps(path: str, clock: FakeClock, backlog: int) -> int:
    """VM instructions of one filtered claim beside ``backlog`` due jobs of another handler."""
    backend = SQLiteBackend(path, clock=clock, synchronous="normal")
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"o{i}", t0 - 1, name="other") for i in range(backlog)])
        backend.enqueue([spec(f"m{i}", t0 - 1, name="mine") for i in range(20)])
        backend.claim(limit=1, lease=30, now=t0, names=["mine"])  # housekeeping done
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        backend._conn.set_progress_handler(count, 1)
        claims = backend.claim(limit=10, lease=30, now=t0, names=["mine", "nobody"])
        backend._conn.set_progress_handler(None, 1)
        assert [c.job.id for c in claims] == [f"m{i}" for i in range(1, 11)]
        return steps[0]
    finally:
        backend.close()


def test_a_filtered_claim_costs_the_same_beside_any_backlog_of_other_handlers(
    tmp_path: Path, clock: FakeClock
) -> None:
    small = _filtered_claim_steps(str(tmp_path / "small.db"), clock, 500)
    big = _filtered_claim_steps(str(tmp_path / "big.db"), clock, 5000)
    assert big < 1.5 * small, (small, big)


def test_integrity_check_is_ok_after_a_workload(db: str, clock: FakeClock) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal", result_ttl=10)
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"j{i}", t0 + i % 7) for i in range(300)])
        for claim in backend.claim(limit=200, lease=5, now=t0 + 10):
            if claim.job.attempts % 3 == 0:
                backend.bury(claim, "x")
            else:
                backend.ack(claim)
        backend.enqueue([spec("j1", t0)], on_conflict="replace")
        clock.advance(60)
        backend.claim(limit=500, lease=5, now=clock.time())
        backend.purge_dead()
    finally:
        backend.close()
    assert pragma(db, "integrity_check") == "ok"


def test_tokens_keep_increasing_across_reopen(db: str, clock: FakeClock) -> None:
    first = SQLiteBackend(db, clock=clock, synchronous="normal")
    first.enqueue([spec("a", clock.time())])
    token = first.claim(limit=1, lease=5, now=clock.time())[0].token
    first.close()
    again = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        again.enqueue([spec("b", clock.time())])
        assert again.claim(limit=1, lease=5, now=clock.time())[0].token > token
    finally:
        again.close()


def test_a_newer_schema_version_is_refused(db: str) -> None:
    SQLiteBackend(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE delayq_meta SET value = 99 WHERE key = 'schema_version'")
    with pytest.raises(ConfigurationError, match="schema version 99"):
        SQLiteBackend(db)


# -- URLs and lifecycle ---------------------------------------------------------------


def test_open_backend_reads_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = open_backend("sqlite:///relative.db")
    try:
        assert isinstance(backend, SQLiteBackend)
        assert backend.path == str(tmp_path / "relative.db")  # resolved once, at open
        assert backend.url == "sqlite:///relative.db"
    finally:
        backend.close()
    assert (tmp_path / "relative.db").exists()


def test_a_relative_path_keeps_naming_the_same_file_after_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    backend = SQLiteBackend("jobs.db", synchronous="normal")
    try:
        backend.enqueue([spec("a", 1.0)])
        pid = os.fork()
        if pid == 0:  # a daemonising child: chdir, then use the inherited backend
            code = 1
            try:
                os.chdir(tmp_path / "elsewhere")
                backend.enqueue([spec("b", 1.0)])
                code = 0 if backend.get("a") is not None else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert backend.get("b") is not None
    finally:
        backend.close()
    assert not (tmp_path / "elsewhere" / "jobs.db").exists()


def test_open_backend_reads_an_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "abs.db"
    backend = open_backend(f"sqlite:///{path}")
    try:
        assert isinstance(backend, SQLiteBackend)
        assert backend.path == str(path)
    finally:
        backend.close()
    assert path.exists()


def test_open_backend_memory_url_keeps_jobs_in_the_object(clock: FakeClock) -> None:
    backend = open_backend("sqlite:///:memory:", clock=clock)
    try:
        backend.enqueue([spec("m", clock.time())])
        assert [c.job.id for c in backend.claim(limit=5, lease=5, now=clock.time())] == ["m"]
    finally:
        backend.close()


def test_url_query_options_are_applied(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db?synchronous=normal&busy_timeout=3"
    backend = SQLiteBackend.from_url(url)
    try:
        assert backend._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert backend._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 3000
    finally:
        backend.close()


def test_a_keyword_that_contradicts_the_url_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db?synchronous=normal"
    with pytest.raises(InvalidOption, match=r"synchronous='full'.*synchronous='normal'"):
        SQLiteBackend.from_url(url, synchronous="full")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://host/jobs.db", "host part"),
        ("sqlite:///", "names no file"),
        ("sqlite:///jobs.db?colour=blue", "unknown sqlite URL option"),
        ("sqlite:///jobs.db?busy_timeout=soon", "not a number"),
        ("redis:///jobs.db", "needs a sqlite:// URL"),
    ],
)
def test_bad_urls_are_rejected_with_a_hint(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SQLiteBackend.from_url(url)


def test_a_database_in_a_missing_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="cannot open"):
        SQLiteBackend(str(tmp_path / "no" / "such" / "dir" / "jobs.db"))


def test_calls_after_close_raise_queue_closed(db: str, clock: FakeClock) -> None:
    backend = SQLiteBackend(db, clock=clock)
    backend.close()
    with pytest.raises(QueueClosed):
        backend.enqueue([spec("j", clock.time())])
    backend.wait_for_due(10)  # returns at once instead of raising


# -- threads -------------------------------------------------------------------------


def test_threads_sharing_one_backend_never_claim_a_job_twice(db: str, clock: FakeClock) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    t0 = clock.time()
    backend.enqueue([spec(f"j{i}", t0) for i in range(400)])
    claimed: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        while batch := backend.claim(limit=3, lease=60, now=t0):
            for claim in batch:
                backend.ack(claim)
            with lock:
                claimed.extend(c.job.id for c in batch)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(claimed) == sorted(f"j{i}" for i in range(400))
        assert backend.stats().succeeded == 400
    finally:
        backend.close()


def test_wait_for_due_wakes_at_once_for_an_earlier_job_from_another_handle(
    db: str, clock: FakeClock
) -> None:
    """Two backends on one file in one process wake each other through the wake sockets."""
    waiting = SQLiteBackend(db, clock=clock)
    writer = SQLiteBackend(db, clock=clock)
    done = threading.Event()

    def wait() -> None:
        waiting.wait_for_due(3600)
        done.set()

    try:
        thread = threading.Thread(target=wait)
        thread.start()
        assert clock.wait_for_waiters(1)
        writer.enqueue([spec("soon", clock.time() + 60)])
        assert done.wait(10)
        thread.join()
    finally:
        writer.close()
        waiting.close()


def test_without_wake_sockets_a_waiter_notices_other_commits_by_data_version(
    db: str, clock: FakeClock
) -> None:
    waiting = SQLiteBackend(db, clock=clock)
    writer = SQLiteBackend(db, clock=clock)
    assert waiting._wake is not None
    waiting._wake._failed = True  # as on a platform without unix datagram sockets
    done = threading.Event()

    def wait() -> None:
        waiting.wait_for_due(3600)
        done.set()

    thread = threading.Thread(target=wait)
    try:
        thread.start()
        assert clock.wait_for_waiters(1)
        t0 = clock.time()
        writer.enqueue([spec("soon", t0 + 3000)])

        def tick() -> bool:  # the fallback re-checks every FALLBACK_POLL s of backend time
            clock.advance(sqlite_module.FALLBACK_POLL)
            return done.is_set()

        assert wait_until(tick)
        assert clock.time() - t0 < 60  # woken by the commit, long before the due time
        thread.join()
    finally:
        writer.close()
        waiting.close()
    assert not list(wake_directory(db).glob("*.sock"))


# -- the wake channel ------------------------------------------------------------------


def test_the_wake_directory_sits_next_to_the_database() -> None:
    with tempfile.TemporaryDirectory(prefix="dq-") as short:
        db = os.path.join(short, "jobs.db")
        assert wake_directory(db) == Path(os.path.realpath(db) + ".wake")


def test_a_long_database_path_keeps_its_wake_directory_next_to_it(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120) / "jobs.db"
    directory = wake_directory(str(deep))
    assert directory == Path(os.path.realpath(deep) + ".wake")  # never moved to /tmp


def test_notify_unlinks_sockets_of_dead_processes(db: str) -> None:
    directory = wake_directory(db)
    directory.mkdir()
    stale = directory / "999999-1.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(stale))
    sock.close()  # the file stays, nobody listens: like a SIGKILLed worker
    channel = WakeChannel(db, lambda: None)
    try:
        channel.notify()
    finally:
        channel.close()
    assert not stale.exists()


def test_a_listening_channel_receives_a_notify_and_removes_its_socket_on_close(db: str) -> None:
    woken = threading.Event()
    listener = WakeChannel(db, woken.set)
    sender = WakeChannel(db, lambda: None)
    try:
        assert listener.listen()
        path = listener.socket_path
        assert path is not None and os.path.exists(path)
        sender.notify()
        assert woken.wait(10)
    finally:
        sender.close()
        listener.close()
    assert not os.path.exists(path)
    assert wake_directory(db).is_dir()  # stays, like -wal and -shm


# -- several processes ---------------------------------------------------------------

WAITER = textwrap.dedent(
    """
    import sys, time
    from delayq.backends.sqlite import SQLiteBackend
    backend = SQLiteBackend(sys.argv[1])
    start = time.monotonic()
    backend.wait_for_due(60)
    print(f"{time.monotonic() - start:.3f}", flush=True)
    backend.close()
    """
)

CLAIMER = textwrap.dedent(
    """
    import json, sys, time
    from delayq.backends.sqlite import SQLiteBackend
    backend = SQLiteBackend(sys.argv[1], synchronous="normal", busy_timeout=30)
    mine = []
    while batch := backend.claim(limit=5, lease=600):
        for claim in batch:
            backend.ack(claim)
        mine.extend(c.job.id for c in batch)
    print(json.dumps(mine), flush=True)
    backend.close()
    """
)


def run_python(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_a_waiting_process_wakes_when_another_process_enqueues_an_earlier_job(db: str) -> None:
    backend = SQLiteBackend(db)
    try:
        backend.enqueue([spec("far", backend._clock.time() + 3600)])
        child = run_python(WAITER, db)
        directory = wake_directory(db)
        assert wait_until(lambda: directory.exists() and any(directory.glob("*.sock")), 20)
        backend.enqueue([spec("soon", backend._clock.time() + 1800)])
        out, err = child.communicate(timeout=30)
    finally:
        backend.close()
    assert child.returncode == 0, err
    assert float(out) < 30  # woken, not timed out after 60 s (nor due for 30 minutes)


@pytest.mark.slow
def test_several_processes_never_claim_the_same_job(db: str) -> None:
    backend = SQLiteBackend(db, synchronous="normal")
    now = backend._clock.time()
    backend.enqueue([spec(f"j{i}", now - 1) for i in range(1500)])
    backend.close()
    children = [run_python(CLAIMER, db) for _ in range(3)]
    results = [child.communicate(timeout=120) for child in children]
    for child, (_out, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err
    claimed = [job_id for out, _err in results for job_id in json.loads(out)]
    duplicates = [job_id for job_id, n in Counter(claimed).items() if n > 1]
    assert duplicates == []
    assert len(claimed) == 1500
    again = SQLiteBackend(db)
    try:
        assert again.stats().succeeded == 1500
        assert all(j.attempts == 1 for j in again.list_jobs(state=JobState.SUCCEEDED, limit=2000))
    finally:
        again.close()
    assert pragma(db, "integrity_check") == "ok"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_its_own_connection(db: str) -> None:
    backend = SQLiteBackend(db, synchronous="normal")
    try:
        backend.enqueue([spec("parent", backend._clock.time() + 60)])
        pid = os.fork()
        if pid == 0:  # the child: use the inherited object, then leave without cleanup
            code = 1
            try:
                backend.enqueue([spec("child", backend._clock.time() + 60)])
                code = 0 if backend.get("parent") is not None else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        job = backend.get("child")
        assert job is not None and job.state is JobState.SCHEDULED
    finally:
        backend.close()
    assert pragma(db, "integrity_check") == "ok"


# -- review regressions --------------------------------------------------------------


def test_wake_sockets_of_two_containers_with_the_same_pid_never_collide(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two containers sharing the volume, both PID 1 with the same counter: each
    keeps its own live socket and both hear a notify."""
    monkeypatch.setattr(os, "getpid", lambda: 1)
    got = {"a": threading.Event(), "b": threading.Event()}
    monkeypatch.setattr(wake_module, "_counter", iter(range(1, 100)), raising=False)
    a = WakeChannel(db, got["a"].set)
    assert a.listen()
    monkeypatch.setattr(wake_module, "_counter", iter(range(1, 100)), raising=False)
    b = WakeChannel(db, got["b"].set)
    assert b.listen()
    sender = WakeChannel(db, lambda: None)
    try:
        assert a.socket_path != b.socket_path
        sender.notify()
        assert got["a"].wait(5) and got["b"].wait(5)
    finally:
        for channel in (a, b, sender):
            channel.close()


def test_list_jobs_without_a_state_walks_an_index_instead_of_sorting(
    db: str, clock: FakeClock
) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"j{i}", t0 + i) for i in range(500)])
        backend._conn.execute("ANALYZE")
        query = (
            f"{schema_module.SELECT} WHERE {schema_module.NOT_EXPIRED} ORDER BY run_at, seq LIMIT ?"
        )
        plan = " | ".join(
            row[3] for row in backend._conn.execute(f"EXPLAIN QUERY PLAN {query}", (t0, 10))
        )
        assert [j.id for j in backend.list_jobs(limit=3)] == ["j0", "j1", "j2"]
    finally:
        backend.close()
    assert "TEMP B-TREE" not in plan, plan
    assert "delayq_jobs_run_at" in plan, plan


def test_a_claim_purges_a_bounded_number_of_finished_records(
    db: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops_module, "PURGE_BATCH", 10)
    backend = SQLiteBackend(db, clock=clock, synchronous="normal", result_ttl=60)
    try:
        t0 = clock.time()
        backend.enqueue([spec(f"j{i}", t0) for i in range(25)])
        for claim in backend.claim(limit=25, lease=30, now=t0):
            backend.ack(claim)
        clock.advance(120)

        def rows() -> int:
            return int(backend._conn.execute("SELECT COUNT(*) FROM delayq_jobs").fetchone()[0])

        assert backend.get("j0") is None  # past result_ttl: gone for readers at once
        backend.claim(limit=1, lease=30)
        assert rows() == 15
        backend.claim(limit=1, lease=30)  # a full batch: the next claim goes on at once
        assert rows() == 5
        backend.claim(limit=1, lease=30)
        assert rows() == 0
    finally:
        backend.close()


def test_an_unreadable_row_is_buried_and_the_other_jobs_of_the_claim_are_claimed(
    db: str, clock: FakeClock
) -> None:
    backend = SQLiteBackend(db, clock=clock, synchronous="normal")
    try:
        t0 = clock.time()
        backend.enqueue([spec("a", t0), spec("bad", t0), spec("b", t0)])
        backend._conn.execute("UPDATE delayq_jobs SET payload = '{not json' WHERE id = 'bad'")
        claims = backend.claim(limit=10, lease=30, now=t0)
        assert [c.job.id for c in claims] == ["a", "b"]
        assert claims[0].job.payload == {"id": "a"}
        [dead] = backend.dead_letters()
        assert dead.id == "bad" and dead.state is JobState.DEAD
        assert dead.payload == "{not json"  # still readable for inspection
        assert "cannot decode the stored job" in (dead.last_error or "")
        assert backend.stats().running == 2
    finally:
        backend.close()
