"""Operating a worker process: ``/metrics``, per-job log lines, an embedded dashboard.

``delayq worker --metrics-port N --web-port M --log-format json`` builds a
:class:`WorkerOps` and passes its :meth:`~WorkerOps.on_result` to the worker.
Kept out of ``cli.py`` so that it is tested without a CLI runner.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import TYPE_CHECKING, Any, Literal

from delayq.clock import SYSTEM_CLOCK
from delayq.errors import ConfigurationError
from delayq.logs import result_logger
from delayq.metrics import LatenessSeries, Metrics, exposition_registry, multiprocess_dir

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

    ``web_port`` serves the dashboard from this process on 127.0.0.1 (uvicorn in
    a thread), its lateness chart fed by this worker's ``on_result``; the token
    comes from ``$DELAYQ_WEB_TOKEN`` or is made up and logged in a login link.
    """

    def __init__(
        self,
        app: DelayQ,
        *,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        log_format: LogFormat = "text",
        web_port: int | None = None,
    ) -> None:
        for option, port in (("--metrics-port", metrics_port), ("--web-port", web_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigurationError(f"{option} must be 0..65535, got {port}")
        self.app = app
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.web_port = web_port
        self.series = LatenessSeries() if web_port is not None else None
        wanted = metrics_port is not None or web_port is not None
        self.metrics = Metrics(series=self.series).instrument(app) if wanted else None
        self._web: Any = None
        self._web_thread: threading.Thread | None = None
        self.web_url: str | None = None
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
        """Serve ``/metrics`` and the dashboard if ports were given (see the class docstring)."""
        if self.web_port is not None:
            self._start_web(self.web_port)
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

    def _start_web(self, port: int) -> None:
        try:
            import uvicorn  # noqa: PLC0415

            from delayq.web import create_app  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigurationError(
                f"--web-port needs {exc.name or 'the web extra'}: pip install 'delayq[web]'"
            ) from exc
        from delayq.web.command import TOKEN_ENV  # noqa: PLC0415

        given = os.environ.get(TOKEN_ENV) or None
        token = given or secrets.token_urlsafe(24)
        site = create_app(self.app, token=token, metrics=self.metrics, series=self.series)
        config = uvicorn.Config(
            site, host="127.0.0.1", port=port, log_config=None, access_log=False, ws="none"
        )
        self._web = uvicorn.Server(config)
        self._web_thread = threading.Thread(target=self._web.run, name="delayq-web", daemon=True)
        self._web_thread.start()
        deadline = SYSTEM_CLOCK.monotonic() + 30
        while not self._web.started:
            if not self._web_thread.is_alive() or SYSTEM_CLOCK.monotonic() > deadline:
                raise ConfigurationError(f"cannot serve the dashboard on 127.0.0.1:{port}")
            SYSTEM_CLOCK.sleep(0.01)
        bound = self._web.servers[0].sockets[0].getsockname()[1]
        self.web_url = f"http://127.0.0.1:{bound}/"
        login = self.web_url if given else f"{self.web_url}?token={token}"
        log.info("dashboard on %s", login)

    def close(self) -> None:
        """Stop serving; in multiprocess mode mark this process's live gauges dead."""
        if self._web is not None:
            self._web.should_exit = True
            if self._web_thread is not None:
                self._web_thread.join(10)
            self._web = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.metrics is not None and multiprocess_dir() is not None:
            from prometheus_client import multiprocess  # noqa: PLC0415

            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
