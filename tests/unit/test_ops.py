"""Operating a worker: JSON log lines, the /metrics endpoint, and their CLI options."""

from __future__ import annotations

import io
import json
import logging
import socket
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from delayq.app import DelayQ
from delayq.cli import _web_process as web_process
from delayq.cli import cli
from delayq.cli.worker import WorkerOps
from delayq.errors import ConfigurationError
from delayq.observe.logs import JsonFormatter, result_logger
from delayq.worker import JobResult
from tests._util import wait_until

pytest.importorskip("prometheus_client")


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("delayq.test-json")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.handlers[:] = []


def test_a_job_result_is_one_json_object_with_id_name_attempt_and_lateness(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    log_result = result_logger(logger)
    log_result(JobResult("j-1", "mail", 2, "retried", 0.0123, 0.5, "ValueError: x\ntrace", 99.0))
    log_result(JobResult("j-2", "sms", 1, "succeeded", 0.001, 0.01))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["job_id"] == "j-1" and first["name"] == "mail" and first["attempt"] == 2
    assert first["lateness"] == 0.0123 and first["outcome"] == "retried"
    assert first["error"] == "ValueError: x" and first["retry_at"] == 99.0
    assert first["logger"] == "delayq.test-json" and first["level"] == "info"
    assert json.loads(lines[1])["job_id"] == "j-2"


def test_a_traceback_stays_inside_its_one_line_object(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        logger.exception("store failed")
    (line,) = stream.getvalue().splitlines()
    data = json.loads(line)
    assert data["message"] == "store failed" and "ValueError: broken" in data["exc"]


def test_worker_ops_serve_metrics_with_the_store_gauges(tmp_path: Path) -> None:
    with DelayQ(f"sqlite:///{tmp_path / 'ops.db'}") as app:
        app.schedule("mail")
        ops = WorkerOps(app, metrics_port=0)
        ops.start()
        try:
            assert ops.port is not None
            ops.on_result(JobResult("j", "mail", 1, "succeeded", 0.002, 0.1))
            url = f"http://127.0.0.1:{ops.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        finally:
            ops.close()
    assert 'delayq_jobs{state="scheduled"} 1.0' in text
    assert 'delayq_jobs_succeeded_total{name="mail"} 1.0' in text
    assert 'delayq_job_lateness_seconds_bucket{le="0.0025",name="mail"} 1.0' in text


def test_a_taken_metrics_port_is_an_error_outside_multiprocess_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with socket.socket() as busy, DelayQ("memory://") as app:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ops = WorkerOps(app, metrics_port=busy.getsockname()[1])
        with pytest.raises(ConfigurationError, match="cannot serve metrics"):
            ops.start()
        ops.close()


def test_worker_command_logs_json_lines_and_serves_metrics_and_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ops_worker_app.py").write_text(
        textwrap.dedent(
            """
            import os, signal
            from delayq import DelayQ

            app = DelayQ()

            @app.handler("mail")
            def mail(payload):
                if payload.get("last"):
                    os.kill(os.getpid(), signal.SIGTERM)
            """
        )
    )
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with DelayQ(url) as app:
        app.schedule("mail", {"n": 1}, job_id="first")
        app.schedule("mail", {"last": True}, job_id="last")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        result = CliRunner().invoke(
            cli,
            [
                "--url",
                url,
                "worker",
                "ops_worker_app:app",
                "-c",
                "1",
                "--log-format",
                "json",
                "--metrics-port",
                "0",
                "--health-port",
                "0",
            ],
            catch_exceptions=False,
        )
    finally:
        sys.modules.pop("ops_worker_app", None)
    assert result.exit_code == 0, result.output
    objects = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert len(objects) == len(result.output.splitlines())  # every line is one object
    jobs = [o for o in objects if "job_id" in o]
    assert [(o["job_id"], o["name"], o["attempt"], o["outcome"]) for o in jobs] == [
        ("first", "mail", 1, "succeeded"),
        ("last", "mail", 1, "succeeded"),
    ]
    assert all(o["lateness"] >= 0 for o in jobs)
    assert any("/metrics" in o["message"] for o in objects)
    assert any("/healthz" in o["message"] for o in objects)


def test_web_refuses_a_public_address_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_WEB_TOKEN", raising=False)
    result = CliRunner().invoke(cli, ["web", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "reachable from other machines" in result.output


def test_in_multiprocess_mode_a_taken_port_means_a_sibling_serves_the_sum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with DelayQ("memory://") as app:
        first = WorkerOps(app, metrics_port=0)
        first.start()
        try:
            second = WorkerOps(app, metrics_port=first.port)
            with caplog.at_level(logging.INFO, logger="delayq.worker"):
                second.start()  # no error: this process only writes its samples
            assert second.port is None
            assert "another worker of this host serves the sum" in caplog.text
            second.close()
        finally:
            first.close()


def test_worker_ops_serve_the_dashboard_charting_this_workers_lateness(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("uvicorn")
    monkeypatch.delenv("DELAYQ_WEB_TOKEN", raising=False)
    monkeypatch.setattr(web_process, "RELAY_SECONDS", 0.05)
    monkeypatch.setattr(web_process, "FAMILIES_SECONDS", 0.05)
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with DelayQ(url) as app:
        ops = WorkerOps(app, web_port=0, store_url=url)
        with caplog.at_level(logging.INFO, logger="delayq.worker"):
            ops.start()
        try:
            assert ops.web_url is not None
            assert f"dashboard on {ops.web_url}" in caplog.text
            assert "token=" not in caplog.text  # the login link never reaches the log
            assert f"{ops.web_url}?token=" in capsys.readouterr().err
            for lateness in (0.004, 0.02, 0.3):
                ops.on_result(JobResult("j", "mail", 1, "succeeded", lateness, 0.1))

            def read(path: str) -> bytes:
                with urllib.request.urlopen(ops.web_url + path, timeout=10) as response:
                    body: bytes = response.read()
                    return body

            # relayed by the worker to the dashboard's process, within a relay or two
            assert wait_until(
                lambda: (json.loads(read("api/overview"))["lateness"] or [{}])[0].get("count") == 3,
                timeout=30,
                interval=0.2,
            )
            data = json.loads(read("api/overview"))
            assert wait_until(
                lambda: b'delayq_jobs_succeeded_total{name="mail"} 3.0' in read("metrics"),
                timeout=30,
                interval=0.2,
            )
        finally:
            ops.close()
    assert data["lateness_source"] == "the worker serving this dashboard"
    assert data["lateness"][0]["p99"] == 0.5
