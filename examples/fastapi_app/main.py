"""A FastAPI shop whose unpaid orders cancel themselves, with delayq inside.

One process serves the API, runs the jobs (an in-process worker) and the
dashboard under ``/delayq``::

    pip install 'delayq[fastapi]' uvicorn
    DELAYQ_URL=sqlite:///shop.db uvicorn main:api      # from examples/fastapi_app/

    curl -X POST localhost:8000/orders/7               # schedules its cancellation
    curl -X POST localhost:8000/orders/7/pay           # cancels that job
    curl -X POST localhost:8000/orders/7/invoice       # a job whose result we wait for
    open http://localhost:8000/delayq/                 # the dashboard

``create_api`` builds it for tests (``tests/integration/test_fastapi_example.py``
drives it with Starlette's TestClient).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from fastapi import FastAPI, HTTPException

from delayq import DelayQ, JobFailed, ResultTimeout
from delayq.integrations.fastapi import AsyncDelayQDep, DelayQLifespan

CANCEL_AFTER = 30 * 60.0  # seconds an order may stay unpaid


def create_api(
    url: str | None = None,
    *,
    cancel_after: float = CANCEL_AFTER,
    dashboard_token: str | None = None,
    allowed_hosts: Sequence[str] = (),
) -> FastAPI:
    queue = DelayQ(url, backoff=[1, 2, 5])
    orders: dict[int, str] = {}

    @queue.task(name="order.cancel")
    def cancel_unpaid(order_id: int) -> None:
        if orders.get(order_id) == "unpaid":
            orders[order_id] = "cancelled"

    @queue.task(name="order.invoice", store_result=True)
    def invoice(order_id: int) -> dict[str, object]:
        return {"order": order_id, "status": orders.get(order_id, "unknown"), "total": 99.5}

    lifespan = DelayQLifespan(queue, worker=True, worker_options={"concurrency": 2})
    api = FastAPI(lifespan=lifespan)
    lifespan.mount_dashboard(
        api, "/delayq", token=dashboard_token, allowed_hosts=list(allowed_hosts)
    )

    @api.post("/orders/{order_id}")
    async def place(order_id: int, jobs: AsyncDelayQDep) -> dict[str, str]:
        orders[order_id] = "unpaid"
        job_id = await jobs.schedule(
            "order.cancel",
            cancel_unpaid.payload(order_id),
            delay=cancel_after,
            job_id=f"cancel-order-{order_id}",
            on_conflict="keep",
        )
        return {"order": str(order_id), "cancel_job": job_id}

    @api.post("/orders/{order_id}/pay")
    async def pay(order_id: int, jobs: AsyncDelayQDep) -> dict[str, str]:
        orders[order_id] = "paid"
        outcome = await jobs.cancel(f"cancel-order-{order_id}")
        return {"order": str(order_id), "cancel": outcome.value}

    @api.get("/orders/{order_id}")
    async def status(order_id: int) -> dict[str, str]:
        if order_id not in orders:
            raise HTTPException(404, f"no order {order_id}")
        return {"order": str(order_id), "status": orders[order_id]}

    @api.post("/orders/{order_id}/invoice")
    async def make_invoice(order_id: int, wait: float = 10.0) -> dict[str, object]:
        handle = invoice.schedule(order_id)
        try:
            return {"job": handle.id, "invoice": await handle.aresult(timeout=wait)}
        except ResultTimeout:
            return {"job": handle.id, "invoice": None}
        except JobFailed as exc:
            raise HTTPException(500, str(exc)) from exc

    return api


if os.environ.get("DELAYQ_URL"):  # `uvicorn main:api`
    hosts = [h for h in os.environ.get("DELAYQ_ALLOWED_HOSTS", "").split(",") if h]
    api = create_api(allowed_hosts=hosts)
