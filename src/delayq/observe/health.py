"""``/healthz`` and the worker's own gauges, served from the worker's process.

:func:`healthz` answers a liveness probe from :meth:`Worker.health_snapshot`:
``200 ok`` while the worker is healthy, ``503`` with one line per problem
otherwise (the rule is :meth:`~delayq.worker.WorkerHealth.problems`), as
Kubernetes liveness probes expect. :class:`OpsServer` serves it, and
``/metrics`` when given a registry, on one port (a small threaded WSGI server
from the standard library, so the health port needs no extra package).

:class:`WorkerCollector` adds gauges read from the worker at each scrape:
``delayq_worker_abandoned`` (handlers running on past their timeout: sync
threads, cancelled coroutines that go on, child processes being killed),
``delayq_worker_abandoned_cap`` and ``delayq_worker_healthy``. They describe
the process that serves the scrape (in multiprocess mode too: they are never
summed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from delayq.worker import Worker

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["HEALTH_PATH", "OpsServer", "WorkerCollector", "healthz"]

HEALTH_PATH = "/healthz"

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def healthz(worker: Worker) -> tuple[int, str]:
    """The liveness answer for ``worker``: (HTTP status, text body)."""
    problems = worker.health_snapshot().problems()
    if not problems:
        return 200, "ok\n"
    return 503, "unhealthy\n" + "".join(f"{p}\n" for p in problems)


class WorkerCollector:
    """The worker's gauges, read at each scrape (a prometheus_client collector)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        health = self.worker.health_snapshot()
        yield GaugeMetricFamily(
            "delayq_worker_abandoned",
            "Handlers running on past their timeout (threads, tasks, child processes).",
            value=health.abandoned,
        )
        yield GaugeMetricFamily(
            "delayq_worker_abandoned_cap",
            "max_abandoned: at this many abandoned handlers the worker claims nothing.",
            value=health.abandoned_cap,
        )
        yield GaugeMetricFamily(
            "delayq_worker_healthy",
            "1 while /healthz answers 200, else 0.",
            value=0.0 if health.problems() else 1.0,
        )


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds up the worker's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a probe every few seconds is not worth a log line


class OpsServer:
    """Serves ``/healthz`` (when given a worker) and ``/metrics`` (when given a
    registry) on ``host:port`` from a daemon thread; ``port`` 0 picks a free one.

    Raises ``OSError`` when the port cannot be bound. ``port`` is the bound port.
    """

    def __init__(
        self, host: str, port: int, *, worker: Worker | None = None, registry: Any = None
    ) -> None:
        self._worker = worker
        self._metrics: Wsgi | None = None
        if registry is not None:
            from prometheus_client import make_wsgi_app  # noqa: PLC0415

            self._metrics = make_wsgi_app(registry)
        self._server = make_server(
            host, port, self._app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.port: int = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="delayq-ops-http", daemon=True
        )
        self._thread.start()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == HEALTH_PATH and self._worker is not None:
            status, body = healthz(self._worker)
            reason = "OK" if status == 200 else "Service Unavailable"
            data = body.encode()
            start_response(
                f"{status} {reason}",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))],
            )
            return [data]
        if self._metrics is not None:
            return self._metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found\n"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
