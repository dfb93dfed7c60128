"""SQLite tells result waiters in other processes that their jobs finished
(``<db>.done/`` datagrams beside the wake sockets)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from delayq import DelayQ
from delayq.backends.base import TellsFinishes
from delayq.backends.sqlite import SQLiteBackend
from delayq.backends.sqlite._finished import FinishChannel, _datagrams
from delayq.testing import FakeClock

TIMEOUT = 30.0  # real seconds; only reached when something is broken

pytestmark = pytest.mark.skipif(
    not hasattr(os, "O_DIRECTORY"), reason="unix datagram sockets (not on Windows)"
)

OTHER_PROCESS = """
import sys
from delayq.backends.base import Completion
from delayq.backends.sqlite import SQLiteBackend

store = SQLiteBackend(sys.argv[1])
[claim] = store.claim(limit=1, lease=30)
assert store.complete([Completion.ack(claim, result='{"total": 42}')]) == [None]
store.close()
"""


def test_a_result_recorded_by_another_process_wakes_the_waiter_at_once(tmp_path: Path) -> None:
    db = str(tmp_path / "jobs.db")
    clock = FakeClock()  # never advanced: only a notice from the other process ends the wait
    store = SQLiteBackend(db, clock=clock)
    app = DelayQ(backend=store, clock=clock)
    assert isinstance(store, TellsFinishes)
    job_id = app.schedule("total", None)
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(app.result(job_id, timeout=3600)), daemon=True
    )
    waiter.start()
    try:
        assert clock.wait_for_waiters(1, TIMEOUT)  # it read the job unfinished, and listens
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OTHER_PROCESS), db],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        waiter.join(TIMEOUT)
        assert not waiter.is_alive(), "the waiter was not told"
        assert got == [{"total": 42}]
    finally:
        app.close()
        store.close()
    assert list((tmp_path / "jobs.db.done").iterdir()) == []  # its socket went with it


def test_nothing_is_sent_or_created_where_nobody_ever_waited(tmp_path: Path) -> None:
    channel = FinishChannel(str(tmp_path / "jobs.db"))
    channel.send(["a", "b"])
    assert not (tmp_path / "jobs.db.done").exists()
    channel.close()


def test_a_listener_hears_the_ids_another_channel_sends_and_a_dead_one_is_removed(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "jobs.db")
    heard: list[list[str]] = []
    got = threading.Event()

    def on_finished(ids: list[str]) -> None:
        heard.append(ids)
        got.set()

    listening, sending = FinishChannel(db), FinishChannel(db)
    try:
        assert listening.listen(on_finished)
        assert listening.listen(on_finished)  # once: the second call returns at once
        (tmp_path / "jobs.db.done" / "gone.sock").touch()  # a socket whose process died
        sending.send(["job-1", "job-2"])
        assert got.wait(TIMEOUT)
        assert heard == [["job-1", "job-2"]]
        assert not (tmp_path / "jobs.db.done" / "gone.sock").exists()
    finally:
        listening.close()
        sending.close()
    assert list((tmp_path / "jobs.db.done").iterdir()) == []


def test_many_ids_are_split_into_datagrams_of_bounded_size() -> None:
    ids = [f"job-{n:06d}" for n in range(20_000)]
    datagrams = _datagrams(ids)
    assert len(datagrams) > 1 and all(len(d) <= 60_000 for d in datagrams)
    assert b"\n".join(datagrams).decode().split("\n") == ids
