"""delayq in a FastAPI app: the lifespan of :mod:`delayq.integrations.starlette`
plus dependencies that hand an endpoint the app.

::

    from delayq.integrations.fastapi import AsyncDelayQDep, DelayQLifespan

    queue = DelayQ("sqlite:///jobs.db")
    lifespan = DelayQLifespan(queue, worker=True)
    api = FastAPI(lifespan=lifespan)
    lifespan.mount_dashboard(api, "/delayq", token=os.environ["DELAYQ_TOKEN"])

    @api.post("/orders/{order_id}")
    async def create(order_id: int, jobs: AsyncDelayQDep) -> dict[str, str]:
        return {"job": await jobs.schedule("order.cancel", {"order": order_id}, delay=1800)}

``DelayQDep`` gives the :class:`~delayq.DelayQ` (for sync endpoints, which
FastAPI runs in a thread), ``AsyncDelayQDep`` the :class:`~delayq.AsyncDelayQ`
over it. Needs ``pip install 'delayq[fastapi]'``.
"""

from __future__ import annotations

from typing import Annotated

from delayq.aio import AsyncDelayQ
from delayq.app import DelayQ
from delayq.errors import MissingDependency
from delayq.integrations.starlette import DelayQLifespan, get_async_delayq, get_delayq

try:
    from fastapi import Depends
except ImportError as exc:
    raise MissingDependency(
        f"delayq.integrations.fastapi needs {exc.name or 'fastapi'}: pip install 'delayq[fastapi]'"
    ) from exc

__all__ = ["AsyncDelayQDep", "DelayQDep", "DelayQLifespan", "get_async_delayq", "get_delayq"]

DelayQDep = Annotated[DelayQ, Depends(get_delayq)]
"""An endpoint parameter ``queue: DelayQDep`` is the app opened by the lifespan."""

AsyncDelayQDep = Annotated[AsyncDelayQ, Depends(get_async_delayq)]
"""An endpoint parameter ``jobs: AsyncDelayQDep`` is its ``AsyncDelayQ``."""
