"""delayq in a Starlette (or FastAPI) app: one lifespan opens and closes it.

::

    queue = DelayQ("sqlite:///jobs.db")
    lifespan = DelayQLifespan(queue, worker=True)      # worker=: an in-process Worker
    web = Starlette(routes=[...], lifespan=lifespan)   # or FastAPI(lifespan=lifespan)
    lifespan.mount_dashboard(web, "/delayq", token="...")

    async def endpoint(request):
        job_id = await get_async_delayq(request).schedule("order.cancel", {"order": 42})

While the web app runs, ``request.state.delayq`` is the :class:`~delayq.DelayQ`
and ``request.state.adelayq`` an :class:`~delayq.AsyncDelayQ` over it (its calls
do not block the event loop). At shutdown the worker stops (its running handlers
get ``stop_grace`` seconds), then the app is closed (``close=False`` leaves it
open). A mounted dashboard's own lifespan (its lateness sampler) runs inside this
one, since Starlette does not run the lifespan of a mounted app. Needs
``pip install 'delayq[web]'`` (Starlette).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from delayq.aio import AsyncDelayQ
from delayq.app import DelayQ
from delayq.errors import ConfigurationError, MissingDependency
from delayq.web import create_app
from delayq.worker import Worker

try:
    from starlette.applications import Starlette
    from starlette.requests import HTTPConnection
except ImportError as exc:  # pragma: no cover - the extra is installed in development
    raise MissingDependency(
        f"delayq.integrations.starlette needs {exc.name or 'starlette'}: "
        f"pip install 'delayq[web]' (or 'delayq[fastapi]')"
    ) from exc

__all__ = ["DelayQLifespan", "get_async_delayq", "get_delayq"]


class DelayQLifespan:
    """A Starlette / FastAPI ``lifespan=`` that opens ``app`` for the web app's life.

    ``worker=True`` runs a :class:`~delayq.Worker` in this process while the web
    app runs (``worker_options`` are its options: ``concurrency=``...); the web
    process then serves requests and runs jobs. ``stop_grace``: seconds the
    worker's running handlers get at shutdown. ``close``: close ``app`` at
    shutdown (the default; False when something else owns it).
    """

    def __init__(
        self,
        app: DelayQ,
        *,
        worker: bool = False,
        worker_options: Mapping[str, Any] | None = None,
        stop_grace: float = 10.0,
        close: bool = True,
    ) -> None:
        if not isinstance(app, DelayQ):
            raise ConfigurationError(f"DelayQLifespan needs a DelayQ app, got {app!r}")
        if worker_options and not worker:
            raise ConfigurationError("worker_options= needs worker=True")
        self.app = app
        self.run_worker = worker
        self.worker_options = dict(worker_options or {})
        self.stop_grace = stop_grace
        self.close = close
        self.worker: Worker | None = None  # while the web app runs, with worker=True
        self._dashboards: list[Starlette] = []

    def mount_dashboard(self, web: Starlette, path: str = "/delayq", **options: Any) -> Starlette:
        """Mount the dashboard (:func:`delayq.web.create_app`, ``options`` are its
        own: ``token=``, ``allowed_hosts=``...) at ``path`` of ``web``; its
        links, forms and cookie follow the prefix. Returns the dashboard app."""
        if not path.startswith("/") or path == "/":
            raise ConfigurationError(
                f"mount the dashboard under a prefix like '/delayq', got {path!r}"
            )
        dashboard = create_app(self.app, **options)
        web.mount(path.rstrip("/"), dashboard)
        self._dashboards.append(dashboard)
        return dashboard

    def __call__(self, web: Any) -> contextlib.AbstractAsyncContextManager[dict[str, Any]]:
        return self._lifespan(web)

    @contextlib.asynccontextmanager
    async def _lifespan(self, web: Any) -> AsyncIterator[dict[str, Any]]:
        app = self.app
        adelayq = AsyncDelayQ(app=app)
        web.state.delayq = app
        web.state.adelayq = adelayq
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self._closed, adelayq)
            for dashboard in self._dashboards:
                await stack.enter_async_context(dashboard.router.lifespan_context(dashboard))
            if self.run_worker:
                worker = Worker(app, **self.worker_options)
                await asyncio.to_thread(worker.start)
                self.worker = worker
                stack.push_async_callback(self._stopped, worker)
            yield {"delayq": app, "adelayq": adelayq}

    async def _stopped(self, worker: Worker) -> None:
        await asyncio.to_thread(worker.stop, self.stop_grace)
        self.worker = None

    async def _closed(self, adelayq: AsyncDelayQ) -> None:
        await adelayq.close()
        if self.close:
            await asyncio.to_thread(self.app.close)


def get_delayq(request: HTTPConnection) -> DelayQ:
    """The app opened by :class:`DelayQLifespan` (an endpoint's or a dependency's)."""
    found = getattr(request.state, "delayq", None)
    if found is None:
        found = getattr(request.app.state, "delayq", None)
    if not isinstance(found, DelayQ):
        raise ConfigurationError(
            "no delayq app on this request: pass lifespan=DelayQLifespan(app) to the web app"
        )
    return found


def get_async_delayq(request: HTTPConnection) -> AsyncDelayQ:
    """The :class:`~delayq.AsyncDelayQ` over :func:`get_delayq`'s app (calls that
    do not block the event loop)."""
    found = getattr(request.state, "adelayq", None)
    if found is None:
        found = getattr(request.app.state, "adelayq", None)
    if not isinstance(found, AsyncDelayQ):
        raise ConfigurationError(
            "no delayq app on this request: pass lifespan=DelayQLifespan(app) to the web app"
        )
    return found
