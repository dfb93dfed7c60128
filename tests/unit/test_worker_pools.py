"""The worker's two pools, thread and process, keep the same promises.

The tests that apply to both run on both (``pool`` fixture); the process pool's
own promises (a timed-out handler is killed, a dying child is a failed attempt,
children are recycled) follow. Handlers live in ``tests/unit/_pool_app.py``: a
child imports them by name and reports to a file.
"""

from __future__ import annotations

import json
import logging
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.app import DelayQ
from delayq.backends.memory import MemoryBackend
from delayq.errors import ConfigurationError, InvalidOption
from delayq.job import JobState
from delayq.observe.logs import JsonFormatter
from delayq.worker import JobResult, Worker
from delayq.worker._process import describe_exit
from tests._util import wait_until
from tests.unit import _pool_app
from tests.unit._pool_app import TARGET, register_on, reports
from tests.unit._worker_harness import T0, Harness
from tests.unit.test_worker_starts import _Renewals

SLOW = 120.0  # real seconds for a child to start on a loaded machine; reached only when broken

pytestmark = pytest.mark.slow  # the process pool starts real child processes


def _harness(pool: str, store: type[MemoryBackend] = MemoryBackend, **options: Any) -> Harness:
    if pool == "process":
        options.setdefault("app_target", TARGET)
    h = Harness(store, pool=pool, **options)
    register_on(h.app)
    return h


@pytest.fixture(params=["thread", "process"])
def pool(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def report(tmp_path: Path) -> Path:
    return tmp_path / "report.jsonl"


def _result(h: Harness) -> JobResult:
    return h.results.get(timeout=SLOW)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): only a reaped child is gone.
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


# -- the same promises on both pools -----------------------------------------------------
def test_a_handler_gets_its_payload_and_context_on_either_pool(pool: str, report: Path) -> None:
    h = _harness(pool, concurrency=1)
    try:
        h.start()
        job_id = h.app.schedule("echo", {"report": str(report), "n": 7}, delay=0, max_attempts=3)
        result = _result(h)
        assert (result.job_id, result.outcome, result.attempt) == (job_id, "succeeded", 1)
        (seen,) = reports(report)
        assert seen["payload"] == {"report": str(report), "n": 7}
        assert (seen["id"], seen["attempt"], seen["max_attempts"]) == (job_id, 1, 3)
        assert seen["token"] > 0
        in_child = seen["pid"] != os.getpid()
        assert in_child is (pool == "process")
        assert h.job(job_id).state is JobState.SUCCEEDED
    finally:
        h.stop()


def test_a_failing_handler_is_retried_by_its_backoff_then_dead_lettered(
    pool: str, report: Path
) -> None:
    h = _harness(pool, concurrency=1)
    try:
        h.start()
        job_id = h.app.schedule(
            "fails", {"report": str(report), "n": 3}, delay=0, max_attempts=2, backoff=[5]
        )
        first = _result(h)
        assert (first.outcome, first.retry_at) == ("retried", T0 + 5)
        assert first.error is not None and "ValueError: boom 3" in first.error
        assert "Traceback" in first.error and "_pool_app.py" in first.error  # the child's own
        h.clock.advance(5)
        last = _result(h)
        assert (last.outcome, last.attempt) == ("dead", 2)
        job = h.job(job_id)
        assert job.state is JobState.DEAD and "ValueError: boom 3" in (job.last_error or "")
    finally:
        h.stop()


def test_an_async_handler_runs_to_its_end_on_either_pool(pool: str, report: Path) -> None:
    h = _harness(pool, concurrency=1)
    try:
        h.start()
        h.app.schedule("sleeps_async", {"report": str(report)}, delay=0)
        assert _result(h).outcome == "succeeded"
        assert reports(report)[0]["loop"] is True
    finally:
        h.stop()


def test_a_result_is_kept_from_either_pool_and_an_unstorable_one_is_dead_at_once(
    pool: str,
) -> None:
    h = _harness(pool, concurrency=1)
    try:
        h.start()
        job_id = h.app.schedule("totals", {"items": [1, 2, 3]}, delay=0)
        assert _result(h).outcome == "succeeded"
        value = h.app.result(job_id, timeout=0)
        assert value["total"] == 6
        assert (value["pid"] != os.getpid()) is (pool == "process")
        bad = h.app.schedule("returns_a_set", {}, delay=0, max_attempts=3)
        failed = _result(h)
        assert (failed.outcome, failed.attempt) == ("dead", 1)  # no retry
        assert failed.error is not None and "InvalidResult: result is a set" in failed.error
        assert "InvalidResult" in (h.job(bad).last_error or "")
    finally:
        h.stop()


def test_a_handler_past_its_timeout_is_retried_only_once_it_is_gone(
    pool: str, report: Path, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    h = _harness(pool, concurrency=1, prefetch=0)
    try:
        worker = h.start()
        payload = {"report": str(report), "release": str(release)}
        job_id = h.app.schedule("waits", payload, delay=0, max_attempts=2, backoff=[1])
        assert wait_until(lambda: len(reports(report)) == 1, SLOW)
        h.asleep(2)  # the timeout watcher and the lease keeper
        h.clock.advance(2.0)  # "waits" has timeout=2: the attempt fails now
        if pool == "thread":
            # A thread cannot be stopped: the retry waits for the body to end.
            assert wait_until(lambda: worker.stats().abandoned == 1, SLOW)
            release.touch()
        first = _result(h)
        assert first.outcome == "retried" and "ran past its timeout of 2s" in (first.error or "")
        if pool == "process":
            assert "its child process is killed" in (first.error or "")
            assert wait_until(lambda: not _alive(reports(report)[0]["pid"]), SLOW)
        assert wait_until(lambda: worker.stats().abandoned == 0, SLOW)
        release.touch()
        h.clock.advance(1)
        assert _result(h).outcome == "succeeded"
        assert h.job(job_id).attempts == 2
    finally:
        release.touch()
        h.stop()


# -- the process pool's own promises -----------------------------------------------------
def test_a_spinning_handler_past_its_timeout_is_killed_and_its_slot_serves_again(
    report: Path,
) -> None:
    h = _harness("process", concurrency=1, prefetch=0)
    try:
        worker = h.start()
        h.app.schedule("spins", {"report": str(report)}, delay=0, max_attempts=1)
        assert wait_until(lambda: len(reports(report)) == 1, SLOW)
        spinner = reports(report)[0]["pid"]
        h.asleep(2)
        h.clock.advance(2.0)
        dead = _result(h)
        assert dead.outcome == "dead" and "its child process is killed" in (dead.error or "")
        assert wait_until(lambda: not _alive(spinner), SLOW)
        assert wait_until(lambda: worker.stats().abandoned == 0, SLOW)
        h.app.schedule("echo", {"report": str(report)}, delay=0)
        assert _result(h).outcome == "succeeded"
        assert reports(report)[1]["pid"] != spinner  # a new child took its place
    finally:
        h.stop()


def test_a_child_that_dies_mid_handler_is_a_failed_attempt_with_its_signal(report: Path) -> None:
    h = _harness("process", concurrency=1)
    try:
        h.start()
        job_id = h.app.schedule("dies", {"report": str(report)}, delay=0, backoff=[3])
        first = _result(h)
        assert (first.outcome, first.retry_at) == ("retried", T0 + 3)
        assert "was killed by SIGKILL (signal 9)" in (first.error or "")
        job = h.job(job_id)
        assert (job.state, job.attempts) == (JobState.SCHEDULED, 1)  # not lost: due again
    finally:
        h.stop()


def test_a_child_sees_the_loss_of_its_lease_in_ctx_lease_lost(report: Path) -> None:
    h = _harness("process", concurrency=1, lease=3.0, store=_Renewals)
    backend = h.backend
    assert isinstance(backend, _Renewals)
    try:
        h.start()
        h.app.schedule("fenced", {"report": str(report)}, delay=0)
        assert wait_until(lambda: len(reports(report)) == 1, SLOW)
        assert reports(report)[0]["token"] > 0
        backend.refuse = True
        h.asleep(2)  # the dispatcher and the lease keeper
        h.clock.advance(1.0)  # the renewal is refused: the lease is gone
        assert wait_until(lambda: len(reports(report)) == 2, SLOW)
        assert reports(report)[1]["lost"] is True
    finally:
        h.stop()


def test_max_tasks_per_child_recycles_the_children(report: Path) -> None:
    h = _harness("process", concurrency=1, max_tasks_per_child=2)
    try:
        h.start()
        for n in range(4):
            h.app.schedule("echo", {"report": str(report), "n": n}, delay=0)
        outcomes = [_result(h).outcome for _ in range(4)]
        assert outcomes == ["succeeded"] * 4
        pids = [r["pid"] for r in sorted(reports(report), key=lambda r: r["payload"]["n"])]
        assert len(set(pids)) == 2 and pids[0] == pids[1] and pids[2] == pids[3]
    finally:
        h.stop()


def test_stopping_the_worker_ends_its_children(report: Path) -> None:
    h = _harness("process", concurrency=2)
    worker = h.start()
    h.app.schedule("echo", {"report": str(report)}, delay=0)
    assert _result(h).outcome == "succeeded"
    child = reports(report)[0]["pid"]
    worker.stop(grace=0)
    assert worker.join(SLOW)
    assert wait_until(lambda: not _alive(child), SLOW)


def test_a_child_that_cannot_load_the_app_fails_the_start(tmp_path: Path) -> None:
    h = Harness(pool="process", app_target="tests.unit._pool_app:no_such_app", concurrency=1)
    with pytest.raises(ConfigurationError, match="has no attribute 'no_such_app'"):
        h.start()


def test_the_app_target_is_found_among_the_imported_modules() -> None:
    worker = Worker(_pool_app.app, pool="process", concurrency=1)
    assert worker._pool is not None and worker._pool.target == TARGET


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"pool": "fork"}, "pool must be 'thread' or 'process', got 'fork'"),
        ({"max_tasks_per_child": 5}, "need pool='process'"),
        ({"pool": "process", "max_tasks_per_child": 0}, "max_tasks_per_child"),
        ({"pool": "process"}, "needs app_target="),
    ],
)
def test_pool_options_are_checked_when_the_worker_is_made(
    options: dict[str, Any], words: str
) -> None:
    with DelayQ("memory://") as app, pytest.raises(InvalidOption, match=words):
        Worker(app, **options)


def test_exit_statuses_read_as_words() -> None:
    assert describe_exit(-9) == "was killed by SIGKILL (signal 9)"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(None) == "ended (status unknown)"


@pytest.fixture
def cli_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "pool_cli_app.py").write_text(
        textwrap.dedent(
            """
            import os, signal
            from delayq import DelayQ

            app = DelayQ()

            @app.handler("where")
            def where(payload):
                with open(payload["report"], "a") as out:
                    out.write(f"{os.getpid()} {os.getppid()}\\n")
                if payload.get("last"):
                    os.kill(os.getppid(), signal.SIGTERM)  # stop the worker
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr("sys.path", [str(tmp_path), *__import__("sys").path])
    yield "pool_cli_app:app"
    __import__("sys").modules.pop("pool_cli_app", None)


def test_the_worker_command_runs_handlers_in_child_processes(cli_app: str, tmp_path: Path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from delayq.cli import cli  # noqa: PLC0415

    url = f"sqlite:///{tmp_path / 'pool.db'}"
    out = tmp_path / "where.txt"
    with DelayQ(url) as app:
        app.schedule("where", {"report": str(out)}, job_id="first")
        app.schedule("where", {"report": str(out), "last": True}, job_id="last", delay=0.5)
    args = ["--url", url, "worker", cli_app, "--pool", "process", "-c", "1"]
    args += ["--max-tasks-per-child", "1"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in out.read_text().splitlines()]
    assert len(lines) == 2
    assert all(int(parent) == os.getpid() for _, parent in lines)  # children of the worker
    assert lines[0][0] != lines[1][0]  # one task per child
    with DelayQ(url) as app:
        assert {app.get(j).state for j in ("first", "last")} == {JobState.SUCCEEDED}  # type: ignore[union-attr]


def test_a_handlers_timeout_starts_when_a_child_takes_it_not_while_it_waits_for_one(
    report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, release = tmp_path / "gate", tmp_path / "release"
    monkeypatch.setenv(_pool_app.GATE, str(gate))
    h = _harness("process", concurrency=1, prefetch=0, max_tasks_per_child=1)
    try:
        worker = h.start()
        gate.touch()  # the child that replaces the first one waits at its start
        h.app.schedule("echo", {"report": str(report)}, delay=0)
        assert _result(h).outcome == "succeeded"  # its child retires; the replacement waits
        payload = {"report": str(report), "release": str(release)}
        job_id = h.app.schedule("waits", payload, delay=0, max_attempts=1)
        pool = worker._pool
        assert pool is not None
        assert wait_until(lambda: h.job(job_id).state == JobState.RUNNING and pool._starting, SLOW)
        h.clock.advance(5.0)  # past "waits"'s timeout of 2 s, while no child can take it
        gate.unlink()
        assert wait_until(lambda: len(reports(report)) == 2, SLOW)  # it started, in time
        release.touch()
        result = _result(h)
        assert result.outcome == "succeeded", result.error
        assert h.job(job_id).attempts == 1
    finally:
        gate.unlink(missing_ok=True)
        release.touch()
        h.stop()


def test_a_childs_log_records_go_through_the_parents_loggers(
    report: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # before the children start: they forward INFO and up
    h = _harness("process", concurrency=1)
    try:
        h.start()
        job_id = h.app.schedule("logs", {"report": str(report)}, delay=0)
        assert _result(h).outcome == "succeeded"
    finally:
        h.stop()
    child = reports(report)[0]["pid"]
    records = [r for r in caplog.records if r.name == "tests.pool_app"]
    assert [r.getMessage() for r in records] == [
        f"info from {job_id}",
        f"warning from {job_id}",
        "it failed",
    ]  # DEBUG was not forwarded; the order is the child's
    assert {r.process for r in records} == {child}
    assert getattr(records[1], "order", None) == 7  # extra= fields come along
    assert "KeyError: 'inside'" in (records[2].exc_text or "")
    line = json.loads(JsonFormatter().format(records[2]))
    assert line["pid"] == child and line["level"] == "error"
    assert "KeyError: 'inside'" in line["exc"]


# -- claims queued in a child behind its running task -------------------------------------
def _start_counting_queued(h: Harness) -> list[int]:
    """Start ``h``'s worker; counts (in a one-item list) the claims its runner queues
    behind a running task."""
    worker = h.worker = Worker(h.app, **h.options)
    runner = worker._runner
    queue_next = runner._queue_next
    seen = [0]

    def counting() -> Any:
        got = queue_next()
        seen[0] += got is not None
        return got

    runner._queue_next = counting  # type: ignore[method-assign]
    worker.start()
    return seen


def _backlog(h: Harness, *jobs: tuple[str, dict[str, Any]], **options: Any) -> list[str]:
    """Schedule ``jobs`` due now in one batch (one claim takes them all)."""
    specs = [{"name": name, "payload": payload, "delay": 0, **options} for name, payload in jobs]
    return [str(job_id) for job_id in h.app.schedule_many(specs)]


def test_claims_queued_behind_a_running_task_run_in_the_same_child_in_order(
    report: Path,
) -> None:
    h = _harness("process", concurrency=1, prefetch=2)
    ids = _backlog(h, *[("echo", {"report": str(report), "n": n}) for n in range(3)])
    try:
        queued = _start_counting_queued(h)
        outcomes = [_result(h).outcome for _ in ids]
        assert outcomes == ["succeeded"] * 3
    finally:
        h.stop()
    ran = reports(report)
    assert [r["payload"]["n"] for r in ran] == [0, 1, 2]
    assert len({r["pid"] for r in ran}) == 1
    assert [h.job(i).attempts for i in ids] == [1, 1, 1]
    assert queued[0] <= 2  # some may have been claimed only after the child was idle


def test_claims_queued_behind_a_hung_task_are_handed_back_after_the_prefetch_hold(
    report: Path, tmp_path: Path
) -> None:
    nudge, release = tmp_path / "nudge", tmp_path / "release"
    # lease 3 s: a ready claim is held 1 s at most behind busy slots
    h = _harness("process", concurrency=1, prefetch=2, lease=3.0)
    hung = {"report": str(report), "nudge": str(nudge), "release": str(release)}
    first, *behind = _backlog(
        h, ("pauses", hung), ("echo", {"report": str(report)}), ("echo", {"report": str(report)})
    )
    try:
        queued = _start_counting_queued(h)
        worker = h.worker
        assert worker is not None
        assert wait_until(lambda: len(reports(report)) == 1, SLOW)  # "pauses" runs
        assert wait_until(lambda: worker.stats().prefetched == 2, SLOW)  # both claimed
        nudge.touch()  # its log record wakes the thread that feeds its child
        assert wait_until(lambda: queued[0] == 2, SLOW)  # both wait in the child now
        h.clock.advance(1.5)  # past the hold, not past "pauses"'s timeout of 2 s
        handed_back = [_result(h), _result(h)]
        assert {r.job_id for r in handed_back} == set(behind)
        assert {r.outcome for r in handed_back} == {"returned"}
        assert len(reports(report)) == 1  # neither ran behind the hung task
        release.touch()
        h.clock.advance(0.1)
        rest = {r.job_id: r.outcome for r in (_result(h), _result(h), _result(h))}
        assert rest == {first: "succeeded", **dict.fromkeys(behind, "succeeded")}
        assert [h.job(i).attempts for i in behind] == [1, 1]  # the hand-back used none
    finally:
        nudge.touch()
        release.touch()
        h.stop()


@pytest.mark.parametrize("ending", ["dies", "spins"])
def test_claims_queued_behind_a_child_that_ends_mid_handler_run_unharmed_elsewhere(
    ending: str, report: Path
) -> None:
    h = _harness("process", concurrency=1, prefetch=2)
    payload = {"report": str(report)}
    first, *behind = _backlog(
        h, (ending, payload), ("echo", payload), ("echo", payload), max_attempts=1
    )
    try:
        h.start()
        if ending == "spins":  # killed at its timeout of 2 s
            assert wait_until(lambda: len(reports(report)) >= 1, SLOW)
            h.asleep(2)
            h.clock.advance(2.0)
        seen: dict[str, list[JobResult]] = {}
        while len(seen.get(first, [])) < 1 or any(
            [r.outcome for r in seen.get(i, [])][-1:] != ["succeeded"] for i in behind
        ):
            result = _result(h)
            seen.setdefault(result.job_id, []).append(result)
        [dead] = seen[first]
        assert dead.outcome == "dead"
        assert "killed" in (dead.error or "")  # by SIGKILL, or at its timeout
        for i in behind:  # handed back at most (the hold passed), never failed for it
            assert {r.outcome for r in seen[i]} <= {"returned", "succeeded"}
            assert h.job(i).attempts == 1
        pids = [r["pid"] for r in reports(report)]
        assert pids[1] == pids[2] != pids[0]  # they ran in the replacement
    finally:
        h.stop()


def test_a_process_pool_prefetches_twice_its_concurrency_by_default() -> None:
    app = DelayQ("memory://")
    assert Worker(app, concurrency=3).prefetch == 1
    process = Worker(app, concurrency=3, pool="process", app_target=TARGET)
    assert (process.prefetch, process.batch) == (6, 9)  # feeds the children's queues
    assert Worker(app, concurrency=3, pool="process", app_target=TARGET, prefetch=0).prefetch == 0


def test_a_task_too_big_to_queue_waits_for_an_idle_child_and_runs(report: Path) -> None:
    h = _harness("process", concurrency=1, prefetch=2)
    big = "x" * 20_000  # over QUEUE_TASK_BYTES: never left unread in a child's pipe
    ids = _backlog(h, *[("echo", {"report": str(report), "n": n, "big": big}) for n in range(3)])
    try:
        h.start()
        assert [_result(h).outcome for _ in ids] == ["succeeded"] * 3
    finally:
        h.stop()
    assert sorted(r["payload"]["n"] for r in reports(report)) == [0, 1, 2]
    assert [h.job(i).attempts for i in ids] == [1, 1, 1]
