"""``delayq worker`` flags reach the Worker (prefetch, timeout, unknown-handler grace)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from delayq.app import DelayQ
from delayq.cli import cli
from delayq.cli import worker as cli_module
from delayq.worker import Worker, WorkerStats


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    module = types.ModuleType("worker_cli_app")
    app = DelayQ(url)
    module.app = app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "worker_cli_app", module)
    monkeypatch.setenv("DELAYQ_URL", url)
    yield "worker_cli_app:app"
    app.close()


class _Recorded:
    """Stands in for Worker: builds the real one (so its checks run), never runs it."""

    options: ClassVar[dict[str, Any]] = {}

    def __init__(self, app: DelayQ, **options: Any) -> None:
        self.handlers = Worker(app, **options).handlers
        _Recorded.options = options
        self.concurrency = options["concurrency"]
        self.lease = options["lease"]
        self.name = options.get("name")

    def health_snapshot(self) -> Any:
        return SimpleNamespace(in_flight=0)

    def run(self) -> None:
        return None

    def stats(self) -> WorkerStats:
        return WorkerStats()


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["worker", *args], catch_exceptions=False)


def test_the_worker_flags_reach_the_worker(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module, "Worker", _Recorded)
    result = invoke(target, "--prefetch", "3", "--timeout", "90s", "--unknown-handler-grace", "10m")
    assert result.exit_code == 0, result.output
    options = _Recorded.options
    assert (options["prefetch"], options["timeout"], options["unknown_handler_grace"]) == (
        3,
        90.0,
        600.0,
    )


def test_the_pool_flags_reach_the_worker_with_the_target_for_the_children(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_module, "Worker", _Recorded)
    result = invoke(target, "--pool", "process", "--max-tasks-per-child", "50")
    assert result.exit_code == 0, result.output
    options = _Recorded.options
    assert (options["pool"], options["max_tasks_per_child"], options["app_target"]) == (
        "process",
        50,
        target,
    )
    assert invoke(target, "--pool", "fork").exit_code == 2
    assert invoke(target, "--max-tasks-per-child", "0").exit_code == 2


def test_the_worker_defaults_leave_timeouts_off_and_a_five_minute_grace(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_module, "Worker", _Recorded)
    assert invoke(target).exit_code == 0
    options = _Recorded.options
    assert options["prefetch"] is None and options["timeout"] is None
    assert options["handlers"] is None  # every handler
    assert options["unknown_handler_grace"] == 300.0
    assert (options["pool"], options["max_tasks_per_child"], options["app_target"]) == (
        "thread",
        None,
        None,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--timeout", "forever"), "--timeout"),
        (("--timeout", "0s"), "timeout must be > 0"),
        (("--unknown-handler-grace", "soon"), "--unknown-handler-grace"),
        (("--prefetch", "-1"), "--prefetch"),
    ],
)
def test_bad_worker_flags_are_explained(target: str, args: tuple[str, ...], message: str) -> None:
    result = invoke(target, *args)
    assert result.exit_code == 2 and message in result.output


def test_the_handlers_flag_reaches_the_worker_as_a_list_of_names(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_module, "Worker", _Recorded)
    result = invoke(target, "--handlers", "mail, report", "--handlers", "mail,export")
    assert result.exit_code == 0, result.output
    assert _Recorded.options["handlers"] == ["mail", "report", "export"]


def test_a_handlers_flag_with_an_empty_name_is_a_usage_error(target: str) -> None:
    result = invoke(target, "--handlers", "mail,,report")
    assert result.exit_code == 2 and "--handlers" in result.output


def test_a_handlers_flag_naming_an_unregistered_handler_stops_the_worker_at_start(
    target: str,
) -> None:
    app = sys.modules["worker_cli_app"].app
    app.register("mail", lambda p: None)
    result = invoke(target, "--handlers", "mail,nope")
    assert result.exit_code == 1
    assert "ConfigurationError" in result.output and "'nope'" in result.output
    assert "registers 'mail'" in result.output
