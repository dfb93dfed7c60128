"""Writers taking turns on SQLite, with real processes: a producer writing flat
out never starves a claiming loop, and a group commit killed mid-way loses no
call that returned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.app import DelayQ
from delayq.backends.sqlite import SQLiteBackend
from delayq.job import JobState
from tests._util import wait_until
from tests.contract._support import spec

pytestmark = pytest.mark.slow

HAMMER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from delayq import DelayQ

    url, stop = sys.argv[1], Path(sys.argv[2])
    app = DelayQ(url)
    n = 0
    while not stop.exists():
        app.schedule("later", {"n": n}, delay=3600)  # one write transaction per call
        n += 1
    print(n, flush=True)
    """
)

THREADED_PRODUCER = textwrap.dedent(
    """
    import os, sys, threading
    from delayq import DelayQ

    app = DelayQ(sys.argv[1])  # synchronous=full, the default

    def produce(t):
        n = 0
        while True:
            job_id = f"t{t}-{n}"
            app.schedule("later", {"n": n}, delay=3600, job_id=job_id)
            os.write(1, (job_id + "\\n").encode())  # only after schedule returned
            n += 1

    for t in range(8):
        threading.Thread(target=produce, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "jobs.db")


def _python(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", *args], text=True, **kwargs
    )


def test_claims_keep_getting_through_while_another_process_schedules_flat_out(
    db: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{db}?synchronous=normal"
    app = DelayQ(url)
    app.schedule_many([{"name": "due", "payload": i, "delay": 0} for i in range(100)])
    stop = tmp_path / "stop"
    producer = _python(HAMMER, url, str(stop), stdout=subprocess.PIPE)
    backend = app.backend
    try:
        # The producer is writing before the claims start ...
        assert wait_until(lambda: backend.stats().scheduled > 300, timeout=60)
        claimed = 0
        rounds = 0
        # ... and every one of these 100 separate claim transactions gets a turn.
        while claimed < 100 and rounds < 100_000:
            rounds += 1
            for claim in backend.claim(limit=1, lease=60):
                backend.ack(claim)
                claimed += 1
        assert claimed == 100
        assert producer.poll() is None  # still writing all along
        stats = backend.stats()
        assert stats.succeeded == 100
    finally:
        stop.touch()
        out, _ = producer.communicate(timeout=60)
        app.close()
    assert producer.returncode == 0
    assert int(out) > 50  # the producer had its turns too


def test_a_sigkill_while_eight_threads_schedule_loses_no_call_that_returned(db: str) -> None:
    url = f"sqlite:///{db}"
    DelayQ(url).close()  # create the file before the producer races to
    producer = _python(THREADED_PRODUCER, url, stdout=subprocess.PIPE)
    returned: list[str] = []
    try:
        assert producer.stdout is not None
        while len(returned) < 400:
            line = producer.stdout.readline()
            assert line, "the producer exited early"
            returned.append(line.strip())
    finally:
        producer.send_signal(signal.SIGKILL)
        rest, _ = producer.communicate(timeout=30)
    returned += [line for line in rest.splitlines() if line.strip()]
    backend = SQLiteBackend(db)
    try:
        missing = [
            job_id
            for job_id in returned
            if (job := backend.get(job_id)) is None or job.state is not JobState.SCHEDULED
        ]
        # A line is written (atomically: shorter than PIPE_BUF) only after schedule() returned.
        assert missing == []
    finally:
        backend.close()


def test_a_forked_child_takes_turns_with_its_parent(db: str) -> None:
    backend = SQLiteBackend(db, synchronous="normal")
    try:
        backend.enqueue([])
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                backend.enqueue([spec(f"child-{i}", 1.0) for i in range(3)])
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert backend.get("child-2") is not None
    finally:
        backend.close()
