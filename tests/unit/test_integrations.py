"""delayq.integrations: the Starlette / FastAPI lifespan, dependencies and dashboard mount."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from delayq import DelayQ
from delayq.errors import ConfigurationError, QueueClosed
from delayq.integrations.starlette import DelayQLifespan, get_async_delayq, get_delayq

try:  # the dev extra has it; the starlette tests run without it
    import fastapi

    from delayq.integrations.fastapi import AsyncDelayQDep, DelayQDep
except ImportError:
    fastapi = None  # type: ignore[assignment]


async def schedule(request: Request) -> JSONResponse:
    job_id = await get_async_delayq(request).schedule("ping", {"n": 1}, delay=60)
    return JSONResponse({"job": job_id, "sync": get_delayq(request).get(job_id) is not None})


def test_a_starlette_app_opens_and_closes_delayq_with_its_lifespan() -> None:
    queue = DelayQ("memory://")
    lifespan = DelayQLifespan(queue)
    web = Starlette(routes=[Route("/schedule", schedule, methods=["POST"])], lifespan=lifespan)
    with TestClient(web) as client:
        answer = client.post("/schedule").json()
        assert answer["sync"] is True
        assert queue.get(answer["job"]) is not None
        assert lifespan.worker is None  # none asked for
    with pytest.raises(QueueClosed):
        queue.schedule("ping")


def test_an_in_process_worker_runs_while_the_app_runs_and_close_false_keeps_it_open() -> None:
    queue = DelayQ("memory://")
    ran: list[int] = []
    queue.register("ping", lambda payload: ran.append(payload["n"]), store_result=True)
    lifespan = DelayQLifespan(queue, worker=True, worker_options={"concurrency": 1}, close=False)
    web = Starlette(routes=[], lifespan=lifespan)
    with TestClient(web):
        assert lifespan.worker is not None and lifespan.worker.running
        job_id = queue.schedule("ping", {"n": 5})
        assert queue.result(job_id, timeout=30) is None  # a real wait: the worker runs it
    assert ran == [5] and lifespan.worker is None
    assert queue.get(job_id) is not None  # still open
    queue.close()


def test_the_dependencies_say_what_is_missing_without_the_lifespan() -> None:
    web = Starlette(routes=[Route("/schedule", schedule, methods=["POST"])])
    with (
        TestClient(web, raise_server_exceptions=True) as client,
        pytest.raises(ConfigurationError, match="lifespan=DelayQLifespan"),
    ):
        client.post("/schedule")


def test_the_dashboard_mounts_under_a_prefix_only() -> None:
    queue = DelayQ("memory://")
    lifespan = DelayQLifespan(queue)
    web = Starlette(lifespan=lifespan)
    with pytest.raises(ConfigurationError, match="under a prefix"):
        lifespan.mount_dashboard(web, "/")
    lifespan.mount_dashboard(web, "/ops/jobs/", allowed_hosts=["testserver"])
    with TestClient(web) as client:
        page = client.get("/ops/jobs/")
        assert page.status_code == 200 and 'href="/ops/jobs/jobs' in page.text
    with pytest.raises(ConfigurationError, match="worker_options= needs worker=True"):
        DelayQLifespan(queue, worker_options={"concurrency": 2})


def test_without_fastapi_the_import_says_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["fastapi"] = None  # as if it were not installed
        try:
            import delayq.integrations.fastapi
        except ImportError as exc:
            print(type(exc).__name__, exc)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "MissingDependency" in run.stdout
    assert "pip install 'delayq[fastapi]'" in run.stdout


@pytest.mark.skipif(fastapi is None, reason="the fastapi extra is not installed")
def test_fastapi_endpoints_get_the_app_through_the_dependencies() -> None:
    queue = DelayQ("memory://")
    api = fastapi.FastAPI(lifespan=DelayQLifespan(queue))

    @api.post("/a")
    async def a(jobs: AsyncDelayQDep) -> dict[str, str]:
        return {"job": await jobs.schedule("x", delay=5)}

    @api.get("/b/{job_id}")
    def b(job_id: str, queue: DelayQDep) -> dict[str, str]:
        job = queue.get(job_id)
        return {"state": job.state.value if job else "none"}

    with TestClient(api) as client:
        job_id = client.post("/a").json()["job"]
        assert client.get(f"/b/{job_id}").json() == {"state": "scheduled"}
