"""Long CLI operations: schedule-many from a JSON-lines file, progress bars only on a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

from click.testing import CliRunner

from delayq.app import DelayQ
from delayq.cli import cli
from delayq.cli._progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_bar_is_drawn_on_a_terminal_and_nothing_when_piped() -> None:
    terminal, pipe = _Terminal(), io.StringIO()
    with progress("working", 3, stream=terminal) as advance:
        for _ in range(3):
            advance(1)
    with progress("working", 3, stream=pipe) as advance:
        advance(3)
    assert "working" in terminal.getvalue()
    assert pipe.getvalue() == ""


def test_schedule_many_stores_each_line_in_batches(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    lines = [json.dumps({"name": "mail", "payload": {"n": i}, "delay": 60}) for i in range(7)]
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]))
    result = CliRunner().invoke(
        cli, ["--url", url, "schedule-many", str(tmp_path / "jobs.jsonl"), "--batch", "3"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "scheduled 7 job(s)"  # piped: no progress bar drawn
    with DelayQ(url) as app:
        assert sorted(j.payload["n"] for j in app.list_jobs(name="mail")) == list(range(7))


def test_schedule_many_names_the_bad_line_and_keeps_earlier_batches(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    text = "\n".join(
        [
            json.dumps({"name": "mail"}),
            json.dumps({"name": "mail"}),
            json.dumps({"name": "mail"}),
            json.dumps({"name": "mail", "max_attempts": 0}),
        ]
    )
    result = CliRunner().invoke(
        cli, ["--url", url, "schedule-many", "-", "--batch", "2"], input=text
    )
    assert result.exit_code == 2
    assert "line 4: max_attempts must be" in result.output
    assert "2 job(s) from earlier lines were stored" in result.output
    with DelayQ(url) as app:
        assert len(app.list_jobs()) == 2  # the batch holding line 4 stored nothing


def test_schedule_many_refuses_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    result = CliRunner().invoke(
        cli, ["--url", url, "schedule-many", "-"], input='{"name": "x"}\n[1]\n'
    )
    assert result.exit_code == 2 and "line 2: each line must be a JSON object" in result.output
