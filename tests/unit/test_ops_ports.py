"""A worker's ports: a taken dashboard port never stops the jobs, and a metrics
port a sibling held is taken over when that sibling stops."""

from __future__ import annotations

import logging
import socket
import urllib.request
from pathlib import Path

import pytest

from delayq.app import DelayQ
from delayq.cli import worker as worker_module
from delayq.cli.worker import WorkerOps
from tests._util import wait_until

pytest.importorskip("prometheus_client")


def test_a_taken_web_port_is_logged_and_the_worker_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("uvicorn")
    monkeypatch.delenv("DELAYQ_WEB_TOKEN", raising=False)
    with socket.socket() as taken, DelayQ(f"sqlite:///{tmp_path / 'ops.db'}") as app:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ops = WorkerOps(app, web_port=taken.getsockname()[1])
        with caplog.at_level(logging.INFO, logger="delayq.worker"):
            ops.start()  # no ConfigurationError
        try:
            assert ops.web_url is None
            assert "runs without it" in caplog.text
        finally:
            ops.close()


def test_a_metrics_port_is_taken_over_when_its_holder_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(worker_module, "METRICS_RETRY", 0.02)
    with DelayQ("memory://") as app:
        first = WorkerOps(app, metrics_port=0)
        first.start()
        port = first.port
        assert port is not None
        second = WorkerOps(app, metrics_port=port)
        try:
            second.start()
            assert second.port is None
            first.close()
            assert wait_until(lambda: second.port == port, timeout=30)
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200
        finally:
            first.close()
            second.close()
