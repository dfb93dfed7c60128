"""examples/fastapi_app runs: its API, in-process worker and mounted dashboard,
driven by Starlette's TestClient (real time, deadlines)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the fastapi extra is not installed")

from starlette.testclient import TestClient

from tests._util import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app" / "main.py"
DEADLINE = 30.0  # real seconds; reached only when something is broken
TOKEN = "test-token"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_example_main", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def client() -> Iterator[TestClient]:
    api = _example().create_api(
        "memory://", cancel_after=0.05, dashboard_token=TOKEN, allowed_hosts=["testserver"]
    )
    with TestClient(api) as client:  # runs the lifespan: the app opens, the worker starts
        yield client


def _eventually(read: Any, expected: Any) -> None:
    seen: list[Any] = [None]

    def arrived() -> bool:
        seen[0] = read()
        return bool(seen[0] == expected)

    assert wait_until(arrived, DEADLINE, 0.02), f"still {seen[0]!r}, expected {expected!r}"


def test_an_unpaid_order_is_cancelled_by_the_in_process_worker(client: TestClient) -> None:
    placed = client.post("/orders/7").json()
    assert placed == {"order": "7", "cancel_job": "cancel-order-7"}
    _eventually(lambda: client.get("/orders/7").json()["status"], "cancelled")


def test_a_paid_order_cancels_its_cancellation(client: TestClient) -> None:
    api = _example().create_api("memory://", cancel_after=3600, allowed_hosts=["testserver"])
    with TestClient(api) as slow:
        slow.post("/orders/8")
        assert slow.post("/orders/8/pay").json() == {"order": "8", "cancel": "cancelled"}
        assert slow.get("/orders/8").json()["status"] == "paid"


def test_an_endpoint_awaits_a_job_s_result(client: TestClient) -> None:
    client.post("/orders/9")
    answer = client.post("/orders/9/invoice").json()
    assert answer["invoice"] == {"order": 9, "status": "unpaid", "total": 99.5}
    assert answer["job"]


def test_the_dashboard_is_served_under_its_prefix(client: TestClient) -> None:
    page = client.get("/delayq/")
    assert page.status_code == 200
    assert 'href="/delayq/jobs' in page.text  # links follow the mount prefix
    client.post("/orders/10")
    listed = client.get("/delayq/api/jobs")
    assert listed.status_code == 200 and "cancel-order-10" in listed.text
