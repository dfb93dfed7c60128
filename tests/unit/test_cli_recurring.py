"""``delayq recurring ls/add/pause/resume/rm``, through click's CliRunner on a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from delayq.app import DelayQ
from delayq.cli import cli
from delayq.recurring import LEAD, TICK_HANDLER


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, ["--url", url, "recurring", *args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def run_json(url: str, *args: str) -> Any:
    return json.loads(run(url, *args, "--json").output)


def test_add_stores_a_cron_schedule_and_seeds_its_first_tick(url: str) -> None:
    out = run(
        url, "add", "report.daily", '{"to": "ops"}', "--cron", "0 3 * * *", "--tz", "Europe/Berlin"
    ).output
    assert out.startswith("schedule report.daily: cron 0 3 * * * (Europe/Berlin), next run ")
    with DelayQ(url) as app:
        schedule = app.get_recurring("report.daily")
        assert schedule is not None and schedule.payload == '{"to":"ops"}'
        [tick] = app.list_jobs()
        next_run = schedule.next_run(app.clock.time())
        assert next_run is not None
        assert tick.name == TICK_HANDLER and tick.run_at == next_run - LEAD


def test_add_every_with_options_and_list_as_json(url: str) -> None:
    run(
        url,
        "add",
        "poll",
        "--every",
        "5m",
        "--jitter",
        "10s",
        "--handler",
        "poller",
        "--max-attempts",
        "2",
        "--backoff",
        "1s,2s",
        "--misfire",
        "catchup:3",
    )
    [entry] = run_json(url, "ls")
    assert (entry["name"], entry["handler"], entry["every"], entry["jitter"]) == (
        "poll",
        "poller",
        300.0,
        10.0,
    )
    assert (entry["max_attempts"], entry["misfire"], entry["paused"]) == (2, "catchup:3", False)
    assert entry["next_run"] > 0 and entry["next_run_iso"].endswith("+00:00")


def test_ls_shows_a_table_with_the_state(url: str) -> None:
    run(url, "add", "poll", "--every", "1m")
    run(url, "pause", "poll")
    out = run(url, "ls").output
    assert "1 recurring schedule(s)" in out and "every 60s" in out and "paused" in out


def test_pause_resume_and_rm_report_and_fail_for_an_unknown_name(url: str) -> None:
    run(url, "add", "poll", "--every", "1m")
    assert run(url, "pause", "poll").output == "paused poll\n"
    assert run_json(url, "ls")[0]["next_run"] is None
    assert run(url, "resume", "poll").output == "resumed poll\n"
    assert run(url, "rm", "poll").output == "removed poll\n"
    assert run_json(url, "ls") == []
    for verb in ("pause", "resume", "rm"):
        assert "no recurring schedule named 'poll'" in run(url, verb, "poll", code=1).output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "not cron"], "not a valid cron expression"),
        (["--cron", "0 3 * * *", "--tz", "Nowhere/Else"], "not a known time zone"),
        (["--every", "soon"], "--every"),
        ([], "exactly one of cron"),
        (["--every", "1m", "--misfire", "twice"], "misfire"),
    ],
)
def test_bad_definitions_exit_2_and_store_nothing(url: str, args: list[str], message: str) -> None:
    assert message in run(url, "add", "job", *args, code=2).output
    assert run_json(url, "ls") == []


def test_a_forgetful_store_is_refused() -> None:
    result = CliRunner().invoke(cli, ["--url", "memory://", "recurring", "ls"])
    assert result.exit_code == 2 and "memory://" in result.output


def test_update_changes_only_the_options_it_is_given(url: str) -> None:
    run(url, "add", "r1", '{"a": 1}', "--cron", "0 3 * * *", "--tz", "Europe/Berlin")
    out = run(url, "update", "r1", "--cron", "0 4 * * *").output
    assert out.startswith("schedule r1: cron 0 4 * * * (Europe/Berlin), next run ")
    [entry] = run_json(url, "ls")
    assert (entry["cron"], entry["tz"], entry["payload"]) == (
        "0 4 * * *",
        "Europe/Berlin",
        {"a": 1},
    )
    run(url, "update", "r1", "--payload", '{"a": 2}', "--overlap", "skip")
    [entry] = run_json(url, "ls")
    assert (entry["cron"], entry["payload"], entry["overlap"]) == ("0 4 * * *", {"a": 2}, "skip")
    assert "no recurring schedule named 'nope'" in run(url, "update", "nope", code=1).output


def test_add_keep_leaves_a_stored_schedule_and_add_declares_the_whole_definition(
    url: str,
) -> None:
    run(url, "add", "r1", '{"a": 1}', "--cron", "0 3 * * *", "--tz", "Europe/Berlin")
    run(url, "add", "r1", "--cron", "0 4 * * *", "--keep")
    [entry] = run_json(url, "ls")
    assert (entry["cron"], entry["tz"], entry["payload"]) == (
        "0 3 * * *",
        "Europe/Berlin",
        {"a": 1},
    )
    run(url, "add", "r1", "--cron", "0 4 * * *")  # a whole definition: the others default
    [entry] = run_json(url, "ls")
    assert (entry["cron"], entry["tz"], entry["payload"]) == ("0 4 * * *", "UTC", None)


def test_ls_and_show_print_times_in_the_schedules_zone(url: str) -> None:
    run(url, "add", "r1", "--cron", "0 3 * * *", "--tz", "Europe/Berlin")
    run(url, "add", "r2", "--every", "1h")
    out = run(url, "ls").output
    assert "03:00:00 CE" in out  # CET or CEST, as the date falls
    assert "UTC" in out
    shown = run(url, "show", "r1", "--runs", "2").output
    assert shown.startswith("r1: cron 0 3 * * * (Europe/Berlin), active")
    assert shown.count("03:00:00 CE") >= 2 and "last run: -" in shown
    data = run_json(url, "show", "r1", "--runs", "3")
    assert len(data["next_runs"]) == 3 and data["history"] == [] and data["last_run"] is None
    assert "no recurring schedule named 'x'" in run(url, "show", "x", code=1).output


def test_run_enqueues_an_occurrence_due_now(url: str) -> None:
    run(url, "add", "report", '{"to": "ops"}', "--cron", "0 3 * * *", "--handler", "h")
    out = run(url, "run", "report").output
    assert out.startswith("enqueued report@")
    job_id = out.split()[1]
    with DelayQ(url) as app:
        job = app.get(job_id)
        assert job is not None and (job.name, job.payload) == ("h", {"to": "ops"})
    assert "no recurring schedule named 'x'" in run(url, "run", "x", code=1).output


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_sync_makes_the_store_hold_exactly_the_files_schedules(
    url: str, tmp_path: Path, suffix: str
) -> None:
    run(url, "add", "old", "--every", "1m")
    run(url, "add", "keep", "--every", "1m")
    path = tmp_path / f"schedules{suffix}"
    if suffix == ".json":
        path.write_text(
            json.dumps(
                [
                    {"name": "keep", "every": 60},
                    {"name": "new", "cron": "@daily", "tz": "Europe/Berlin", "payload": {"a": 1}},
                ]
            )
        )
    else:
        path.write_text(
            '[keep]\nevery = 60\n\n[new]\ncron = "@daily"\ntz = "Europe/Berlin"\n'
            "payload = { a = 1 }\n"
        )
    out = run(url, "sync", str(path), "--dry-run").output
    assert "would be created 1: new" in out and "would be removed 1: old" in out
    assert [e["name"] for e in run_json(url, "ls")] == ["keep", "old"]
    assert run_json(url, "sync", str(path)) == {
        "created": ["new"],
        "changed": [],
        "unchanged": ["keep"],
        "removed": ["old"],
    }
    assert [(e["name"], e["payload"]) for e in run_json(url, "ls")] == [
        ("keep", None),
        ("new", {"a": 1}),
    ]


def test_sync_refuses_a_bad_file_and_changes_nothing(url: str, tmp_path: Path) -> None:
    run(url, "add", "old", "--every", "1m")
    path = tmp_path / "bad.json"
    path.write_text('[{"name": "x", "every": 0}]')
    assert "every" in run(url, "sync", str(path), code=2).output
    path.write_text("{not json")
    assert "not valid" in run(url, "sync", str(path), code=2).output
    assert [e["name"] for e in run_json(url, "ls")] == ["old"]
