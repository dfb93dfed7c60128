"""The order demo and the examples, compressed to a few seconds each (real time)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from delayq.cli import cli
from delayq.cli.demo import DemoConfig, run_demo

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_demo_story_adds_up(tmp_path: Path) -> None:
    out = io.StringIO()
    config = DemoConfig(speed=15.0, orders=45, seed=3)
    summary = run_demo(config, db_path=tmp_path / "demo.db", console=Console(file=out, width=120))
    assert summary.ok, summary.problems
    assert summary.orders == 45 and 0 < summary.paid < 45
    # Each cancel job was cancelled by its payment or fired, never both. (On a loaded
    # machine the producer can fall behind its script, so a payment can come after its
    # order's cancel fired: then cancel() says so, and that order was not paid in time.)
    cancelled, fired = summary.cancelled["order.cancel"], summary.fired["order.cancel"]
    assert 0 < cancelled <= summary.paid
    assert cancelled + fired == summary.orders
    assert summary.fired["review.default"] + summary.cancelled["review.default"] == (
        summary.delivered
    )
    assert summary.retried > 0 and summary.dead > 0  # the flaky and the dead partner
    assert summary.wrongly_cancelled == 0 and summary.unfinished == 0
    p50, p99, worst = summary.lateness_ms()
    assert 0 <= p50 <= p99 <= worst
    text = out.getvalue()
    assert "delayq demo summary" in text and "lateness p50 / p99 / max" in text


def test_delayq_demo_command_runs_on_a_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "cli-demo.db"
    result = CliRunner().invoke(cli, ["demo", "--duration", "3", "--orders", "20", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "delayq demo summary" in result.output and "dead-lettered" in result.output
    assert db.exists()


def test_delayq_demo_refuses_an_existing_file(tmp_path: Path) -> None:
    db = tmp_path / "taken.db"
    db.write_text("")
    result = CliRunner().invoke(cli, ["demo", "--duration", "3", "--db", str(db)])
    assert result.exit_code == 2 and "exists; the demo needs a new file" in result.output


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        ("orders.py", "orders: {1: 'cancelled', 2: 'paid', 3: 'cancelled'}"),
        ("reviews.py", "reviews: {1: '5 stars (default)', 2: '4 stars, fast shipping'"),
        ("webhooks.py", "dead: webhook-order-paid-5 after 5 attempts"),
    ],
)
def test_the_examples_run(example: str, expected: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout
