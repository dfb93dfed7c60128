"""``delayq web`` as users run it: a real process, a login link, a token."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from delayq.app import DelayQ

pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def test_delayq_web_prints_a_login_link_and_guards_actions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'web.db'}"
    with DelayQ(url) as app:
        job_id = app.schedule("mail", {"n": 1}, delay=600)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "DELAYQ_WEB_TOKEN"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq",
            "web",
            "--url",
            url,
            "--port",
            str(port),
            "--log-format",
            "json",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # printed before the server starts
        found = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", first)
        assert found, first
        base, token = found[1], found[2]
        for line in proc.stderr:  # JSON lines until uvicorn says it runs
            if "Uvicorn running" in line:
                break
        with urllib.request.urlopen(base + "api/jobs", timeout=10) as response:
            assert response.status == 200  # loopback: reads need no token
        anonymous = urllib.request.Request(base + f"api/jobs/{job_id}/cancel", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(anonymous, timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        signed = urllib.request.Request(
            base + f"api/jobs/{job_id}/cancel",
            method="POST",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(signed, timeout=10) as response:
            assert response.read() == f'{{"id":"{job_id}","outcome":"cancelled"}}'.encode()
        opener = urllib.request.build_opener(_NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as login:
            opener.open(base + f"?token={token}", timeout=10)
        assert login.value.code == 303 and "delayq_session_" in login.value.headers["set-cookie"]
        login.value.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            if proc.stderr is not None:
                proc.stderr.close()


def test_delayq_web_serves_under_a_root_path_and_checks_the_host(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'web.db'}"
    with DelayQ(url):
        pass
    port = _free_port()
    command = [sys.executable, "-m", "delayq", "web", "--url", url, "--port", str(port)]
    command += ["--root-path", "/ops/delayq", "--allowed-host", "jobs.example.com"]
    env = {k: v for k, v in os.environ.items() if k != "DELAYQ_WEB_TOKEN"}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/ops/delayq/?token=" in first, first
        for line in proc.stderr:
            if "Uvicorn running" in line:
                break
        base = f"http://127.0.0.1:{port}/ops/delayq"
        with urllib.request.urlopen(base + "/", timeout=10) as response:
            html = response.read().decode()
        assert 'href="/ops/delayq/jobs"' in html
        proxied = urllib.request.Request(
            base + "/api/overview", headers={"Host": "jobs.example.com"}
        )
        with urllib.request.urlopen(proxied, timeout=10) as response:
            assert response.status == 200
        stripped = f"http://127.0.0.1:{port}/jobs"  # a proxy that strips the prefix
        with urllib.request.urlopen(stripped, timeout=10) as response:
            assert 'action="/ops/delayq/jobs"' in response.read().decode()
        rebound = urllib.request.Request(base + "/api/jobs", headers={"Host": "attacker.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=10)
        assert refused.value.code == 421
        refused.value.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            if proc.stderr is not None:
                proc.stderr.close()
