"""Operating a worker process: its ``/metrics`` endpoint and per-job log lines.

``delayq worker --metrics-port N --log-format json`` builds a
:class:`WorkerOps` and passes its :meth:`~WorkerOps.on_result` to the worker.
Kept out of ``cli.py`` so that it is tested without a CLI runner.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Literal

from delayq.errors import ConfigurationError
from delayq.logs import result_logger
from delayq.metrics import Metrics, exposition_registry, multiprocess_dir

if TYPE_CHECKING:
    from delayq.app import DelayQ
    from delayq.worker import JobResult

__all__ = ["LogFormat", "WorkerOps"]

LogFormat = Literal["text", "json"]

log = logging.getLogger("delayq.worker")


class WorkerOps:
    """Metrics and per-job logs for one worker process.

    Per-job lines are logged at INFO with ``--log-format json`` (for a log
    pipeline) and at DEBUG otherwise (the readable default stays quiet).
    ``start()`` serves ``/metrics`` on ``metrics_host:metrics_port`` when a port
    is given. In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) the served
    numbers are the sum over this host's worker processes, so when the port is
    taken by a sibling this process only writes its samples and says so.
    """

    def __init__(
        self,
        app: DelayQ,
        *,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        log_format: LogFormat = "text",
    ) -> None:
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ConfigurationError(f"--metrics-port must be 0..65535, got {metrics_port}")
        self.app = app
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.metrics = Metrics().instrument(app) if metrics_port is not None else None
        level = logging.INFO if log_format == "json" else logging.DEBUG
        self._log_result = result_logger(logging.getLogger("delayq.jobs"), level)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None  # the port actually served (0 picks a free one)

    def on_result(self, result: JobResult) -> None:
        """Pass as ``Worker(on_result=...)``."""
        if self.metrics is not None:
            self.metrics.on_result(result)
        self._log_result(result)

    def start(self) -> None:
        """Serve ``/metrics`` if a port was given (see the class docstring)."""
        if self.metrics_port is None:
            return
        from prometheus_client import start_http_server  # noqa: PLC0415

        registry = exposition_registry(self.metrics, self.app.backend)
        try:
            self._server, self._thread = start_http_server(
                self.metrics_port, addr=self.metrics_host, registry=registry
            )
        except OSError as exc:
            if multiprocess_dir() is None:
                raise ConfigurationError(
                    f"cannot serve metrics on {self.metrics_host}:{self.metrics_port}: {exc}"
                ) from exc
            log.info(
                "metrics port %d is taken (another worker of this host serves the sum over "
                "%s); this worker writes its samples there",
                self.metrics_port,
                multiprocess_dir(),
            )
            return
        self.port = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", self.metrics_host, self.port)

    def close(self) -> None:
        """Stop serving; in multiprocess mode mark this process's live gauges dead."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.metrics is not None and multiprocess_dir() is not None:
            from prometheus_client import multiprocess  # noqa: PLC0415

            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
