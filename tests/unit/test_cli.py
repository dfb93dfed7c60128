"""The ``delayq`` command, through click's CliRunner, on a SQLite file per test."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from delayq._present import parse_when
from delayq.app import DelayQ
from delayq.cli import cli
from delayq.cli import demo as demo_module


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, ["--url", url, *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def run_json(url: str, *args: str) -> Any:
    return json.loads(run(url, *args, "--json").output)


def bury(url: str, name: str = "webhook.send", error: str = "TimeoutError: no answer") -> str:
    with DelayQ(url) as app:
        job_id = app.schedule(name, {"n": 1}, delay=0)
        (claim,) = app.backend.claim(limit=1, lease=30)
        app.backend.bury(claim, error)
    return job_id


# -- schedule / get / cancel / reschedule -------------------------------------------------
def test_schedule_prints_the_new_job_id(url: str) -> None:
    out = run(url, "schedule", "order.cancel", '{"order": 42}', "--delay", "30m").output
    assert out.startswith("scheduled ") and "(order.cancel) due " in out and "in 29m" in out


def test_schedule_json_shows_the_stored_job(url: str) -> None:
    job = run_json(
        url,
        "schedule",
        "webhook.send",
        '{"n": 1}',
        "--delay",
        "5s",
        "--id",
        "w-1",
        "--max-attempts",
        "3",
        "--backoff",
        "2s,5s",
        "--misfire",
        "skip",
    )
    assert job["id"] == "w-1" and job["state"] == "scheduled" and job["payload"] == {"n": 1}
    assert job["max_attempts"] == 3 and job["misfire"] == "skip"
    assert job["backoff"] == {"kind": "schedule", "delays": [2.0, 5.0]}
    assert run_json(url, "get", "w-1")["id"] == "w-1"


def test_schedule_at_an_iso_time_with_offset(url: str) -> None:
    job = run_json(url, "schedule", "x", "--at", "2099-01-01T09:00:00+01:00")
    assert job["run_at_iso"] == "2099-01-01T08:00:00.000+00:00"


def test_schedule_at_a_naive_time_reads_it_as_utc_as_the_dashboard_does(url: str) -> None:
    job = run_json(url, "schedule", "x", "--at", "2099-01-01T09:00:00")
    assert job["run_at_iso"] == "2099-01-01T09:00:00.000+00:00"


def test_schedule_with_a_conflicting_id(url: str) -> None:
    run(url, "schedule", "x", "--delay", "1m", "--id", "dup")
    out = run(url, "schedule", "x", "--delay", "1m", "--id", "dup", code=1).output
    assert "JobConflict" in out
    run(url, "schedule", "x", "--delay", "1m", "--id", "dup", "--on-conflict", "keep")


def test_schedule_keep_reports_the_existing_job_as_kept(url: str) -> None:
    run(url, "schedule", "first", '{"v": 1}', "--delay", "1h", "--id", "k")
    keep = ["--id", "k", "--on-conflict", "keep"]
    out = run(url, "schedule", "x", '{"v": 2}', "--delay", "1m", *keep).output
    assert out.startswith("kept existing job k (first) due ") and "in 59m" in out
    assert "scheduled" not in out
    job = run_json(url, "schedule", "x", "--delay", "1m", "--id", "k", "--on-conflict", "keep")
    assert job["outcome"] == "kept" and job["name"] == "first" and job["payload"] == {"v": 1}


def test_schedule_replace_reports_the_job_as_replaced(url: str) -> None:
    first = run_json(url, "schedule", "x", "--delay", "1h", "--id", "r")
    assert first["outcome"] == "created"
    out = run(url, "schedule", "y", "--delay", "1m", "--id", "r", "--on-conflict", "replace")
    assert out.output.startswith("replaced job r (y) due ")
    assert run_json(url, "get", "r")["name"] == "y"


@pytest.mark.parametrize("store", ["memory://", "sqlite:///:memory:", "sqlite:///file::memory:"])
@pytest.mark.parametrize(
    "args",
    [
        ["schedule", "x", "--delay", "1m"],
        ["stats"],
        ["ls"],
        ["get", "some-id"],
        ["cancel", "some-id"],
        ["dead", "list"],
        ["worker", "delayq.cli._common:F"],
    ],
    ids=lambda args: args[0] if args[0] != "dead" else "dead-list",
)
def test_a_store_that_forgets_at_exit_is_refused(store: str, args: list[str]) -> None:
    out = run(store, *args, code=2).output
    assert "keeps jobs only inside this process" in out and "sqlite:///jobs.db" in out


def test_a_memory_store_from_the_environment_is_refused_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DELAYQ_URL", "memory://")
    result = CliRunner().invoke(cli, ["schedule", "x", "--delay", "1m"], catch_exceptions=False)
    assert result.exit_code == 2 and "keeps jobs only inside this process" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["x", "{not json"], "PAYLOAD must be JSON"),
        (["x", "--delay", "1s", "--at", "now"], "exactly one of --delay or --at"),
        (["x", "--delay", "soon"], "cannot read 'soon' as a duration"),
        (["x", "--at", "tomorrow"], "cannot read 'tomorrow' as a time"),
        (["x", "--delay", "1s", "--max-attempts", "0"], "max_attempts must be an int >= 1"),
        (["x", "--delay", "1s", "--id", ""], "job_id must not be empty"),
        (["x", "--delay", "1s", "--misfire", "later"], "misfire must be"),
    ],
)
def test_bad_schedule_input_exits_2_with_a_clear_message(
    url: str, args: list[str], message: str
) -> None:
    assert message in run(url, "schedule", *args, code=2).output
    assert run_json(url, "stats")["scheduled"] == 0


def test_get_an_unknown_job_exits_1(url: str) -> None:
    assert "no job with id 'nope'" in run(url, "get", "nope", code=1).output


def test_get_shows_a_readable_table(url: str) -> None:
    run(url, "schedule", "order.cancel", '{"order": 7}', "--delay", "30m", "--id", "o-7")
    out = run(url, "get", "o-7").output
    assert "order.cancel" in out and "scheduled" in out and '{"order": 7}' in out
    assert "0 of 5" in out


def test_cancel_reports_each_outcome(url: str) -> None:
    run(url, "schedule", "x", "--delay", "1h", "--id", "c-1")
    assert run(url, "cancel", "c-1").output.strip() == "c-1: cancelled"
    assert run(url, "cancel", "c-1").output.strip() == "c-1: finished"
    assert run_json(url, "cancel", "c-1") == {"id": "c-1", "outcome": "finished"}
    assert run(url, "cancel", "nope", code=1).output.strip() == "nope: not_found"


def test_reschedule_moves_the_job(url: str) -> None:
    run(url, "schedule", "x", "--delay", "1h", "--id", "r-1")
    before = run_json(url, "get", "r-1")["run_at"]
    out = run(url, "reschedule", "r-1", "--delay", "2h").output
    assert out.startswith("r-1: rescheduled, due ") and "in 1h 59m" in out
    assert run_json(url, "get", "r-1")["run_at"] == pytest.approx(before + 3600, abs=5)
    assert run(url, "reschedule", "nope", "--delay", "1s", code=1).output.strip() == (
        "nope: not_found"
    )


# -- ls / stats -----------------------------------------------------------------------
def test_ls_filters_by_state_and_due_window(url: str) -> None:
    run(url, "schedule", "x", "--delay", "1m", "--id", "soon")
    run(url, "schedule", "x", "--delay", "1h", "--id", "later")
    run(url, "schedule", "x", "--delay", "2h", "--id", "gone")
    run(url, "cancel", "gone")
    assert [j["id"] for j in run_json(url, "ls")] == ["soon", "later", "gone"]
    assert [j["id"] for j in run_json(url, "ls", "--state", "scheduled")] == ["soon", "later"]
    assert [j["id"] for j in run_json(url, "ls", "--due-before", "+10m")] == ["soon"]
    assert [j["id"] for j in run_json(url, "ls", "--due-after", "+30m", "--limit", "1")] == [
        "later"
    ]
    table = run(url, "ls", "--state", "cancelled").output
    assert "1 job(s) in state cancelled" in table and "gone" in table


def test_ls_rejects_an_unknown_state(url: str) -> None:
    assert "Invalid value for '--state'" in run(url, "ls", "--state", "asleep", code=2).output


def test_stats_counts_jobs_by_state(url: str) -> None:
    run(url, "schedule", "x", "--delay", "0s")
    run(url, "schedule", "x", "--delay", "1h")
    data = run_json(url, "stats")
    assert (data["scheduled"], data["due"], data["dead"]) == (2, 1, 0)
    assert data["url"] == url
    table = run(url, "stats").output
    assert "scheduled" in table and "next due" in table


def test_the_url_can_come_from_the_environment(url: str) -> None:
    runner = CliRunner(env={"DELAYQ_URL": url})
    result = runner.invoke(cli, ["stats", "--json"], catch_exceptions=False)
    assert json.loads(result.output)["url"] == url


# -- dead letters ---------------------------------------------------------------------
def test_dead_list_shows_the_last_error(url: str) -> None:
    job_id = bury(url)
    out = run(url, "dead", "list").output
    assert "1 dead job(s)" in out and "TimeoutError: no answer" in out
    (job,) = run_json(url, "dead", "list")
    assert job["id"] == job_id and job["state"] == "dead"


def test_dead_requeue_gives_the_job_fresh_attempts(url: str) -> None:
    job_id = bury(url)
    assert run(url, "dead", "requeue", job_id).output.strip() == f"{job_id}: requeued"
    job = run_json(url, "get", job_id)
    assert job["state"] == "scheduled" and job["attempts"] == 0
    out = run(url, "dead", "requeue", job_id, code=1).output
    assert "not dead" in out


def test_dead_purge_needs_a_selector(url: str) -> None:
    bury(url)
    assert "say which dead jobs to purge" in run(url, "dead", "purge", code=2).output
    assert run_json(url, "dead", "purge", "--older-than", "1d") == {"purged": 0}
    assert run(url, "dead", "purge", "--all").output.strip() == "purged 1 dead job(s)"
    assert run_json(url, "dead", "list") == []


def test_dead_purge_by_id(url: str) -> None:
    a, b = bury(url), bury(url)
    assert run_json(url, "dead", "purge", "--id", a) == {"purged": 1}
    assert [j["id"] for j in run_json(url, "dead", "list")] == [b]


# -- worker -----------------------------------------------------------------------------
def test_worker_runs_the_apps_handlers_and_stops_on_sigterm(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_worker_app.py").write_text(
        textwrap.dedent(
            """
            import os, signal
            from delayq import DelayQ

            app = DelayQ()  # the URL comes from --url via DELAYQ_URL

            @app.handler("note")
            def note(payload):
                with open(payload["path"], "a") as f:
                    f.write(payload["text"] + "\\n")
                if payload.get("last"):
                    os.kill(os.getpid(), signal.SIGTERM)
            """
        )
    )
    notes = tmp_path / "notes.txt"
    with DelayQ(url) as app:
        app.schedule("note", {"path": str(notes), "text": "first"}, delay=0)
        app.schedule("note", {"path": str(notes), "text": "second", "last": True}, delay=0)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        result = run(url, "worker", "cli_worker_app:app", "--concurrency", "1")
    finally:
        sys.modules.pop("cli_worker_app", None)
    assert notes.read_text().split() == ["first", "second"], result.output
    stats = run_json(url, "stats")
    assert stats["succeeded"] == 2 and stats["scheduled"] == 0


@pytest.mark.parametrize(
    ("target", "code", "message"),
    [
        ("no_colon", 2, "TARGET must look like 'package.module:app'"),
        ("delayq_no_such_module:app", 1, "cannot import 'delayq_no_such_module'"),
        ("delayq.cli._common:nothing", 1, "has no attribute 'nothing'"),
        ("delayq.cli._common:F", 1, "not a DelayQ app"),
    ],
)
def test_worker_explains_a_bad_target(url: str, target: str, code: int, message: str) -> None:
    assert message in run(url, "worker", target, code=code).output


def test_worker_rejects_bad_options(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("cli_opts_app")
    module.app = DelayQ(url)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cli_opts_app", module)
    try:
        out = run(url, "worker", "cli_opts_app:app", "--concurrency", "0", code=2).output
        assert "concurrency must be an int >= 1" in out
        out = run(url, "worker", "cli_opts_app:app", "--lease", "forever", code=2).output
        assert "--lease" in out
    finally:
        module.app.close()


# -- experiments --------------------------------------------------------------------------
def test_experiment_runs_the_registered_module(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        demo_module.EXPERIMENTS, "fake", lambda out: out.write("fake experiment ran\n")
    )
    assert run(url, "experiment", "fake").output == "fake experiment ran\n"


def test_an_unknown_experiment_lists_the_known_ones(url: str) -> None:
    out = run(url, "experiment", "nope", code=2).output
    assert "unknown experiment 'nope'" in out and "retry" in out and "precision" in out


def test_experiments_may_use_a_memory_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(demo_module.EXPERIMENTS, "fake", lambda out: out.write("ran\n"))
    assert run("memory://", "experiment", "fake").output == "ran\n"


def test_the_misfire_help_explains_that_skip_also_skips_backlog() -> None:
    result = CliRunner().invoke(cli, ["schedule", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    assert "more than 1s late for any reason" in text and "--misfire 300" in text


def test_demo_rejects_bad_pacing(url: str) -> None:
    assert "--duration must be > 0" in run(url, "demo", "--duration", "0", code=2).output
    assert "--speed must be a positive" in run(url, "demo", "--speed", "-1", code=2).output
    assert "--orders must be >= 1" in run(url, "demo", "--orders", "0", code=2).output


def test_version_and_help() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "0.1.0" in result.output
    result = CliRunner().invoke(cli, ["--help"])
    for command in ("worker", "schedule", "cancel", "reschedule", "get", "ls", "stats", "dead"):
        assert command in result.output


# -- time parsing -------------------------------------------------------------------------
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("+10m", NOW + 600),
        ("-1h", NOW - 3600),
        ("+250ms", NOW + 0.25),
        ("+30", NOW + 30),  # a sign means "from now", also for a bare number
        ("-30", NOW - 30),
        ("+1.5", NOW + 1.5),
        ("1700000123", 1_700_000_123.0),
        ("2023-11-14T22:13:20Z", NOW),
        ("2023-11-14T23:13:20+01:00", NOW),
    ],
)
def test_parse_when_reads_relative_absolute_and_epoch_times(text: str, expected: float) -> None:
    assert parse_when(text, now=NOW, field="--at") == pytest.approx(expected)


def test_parse_when_reads_a_naive_iso_time_as_utc() -> None:
    assert parse_when("2023-11-14T22:13:20", now=0.0, field="--at") == NOW
