"""``delayq worker TARGET``: run an app's handlers, and operate the process.

:class:`WorkerOps` adds what a worker process serves besides its jobs
(``/metrics``, ``/healthz``, per-job log lines, a dashboard in a child process):
``delayq worker --metrics-port N --health-port H --web-port M --log-format json``
builds one, passes its :meth:`~WorkerOps.on_result` to the worker and starts it
with the worker. It is tested without a CLI runner.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import click
from rich.logging import RichHandler

from delayq._loader import app_target, load_app
from delayq.app import DelayQ
from delayq.cli._common import _duration, _errors, _handler_names, _require_durable, _Settings
from delayq.cli._web_process import WebProcess
from delayq.cli.web import TOKEN_ENV
from delayq.errors import ConfigurationError
from delayq.observe.health import OpsServer, WorkerCollector
from delayq.observe.logs import JsonFormatter, result_logger
from delayq.observe.metrics import LatenessSeries, Metrics, exposition_registry, multiprocess_dir
from delayq.observe.workers import Heartbeat, keeps_workers
from delayq.worker import Worker

if TYPE_CHECKING:
    from delayq.worker import JobResult

__all__ = ["METRICS_RETRY", "WEB_CACHE_SECONDS", "LogFormat", "WorkerOps", "worker"]

WEB_CACHE_SECONDS = 1.0
"""How long the worker's dashboard answers a repeated GET from its last answer:
many pollers then cost the store about one (``delayq.web._cache``)."""

METRICS_RETRY = 5.0
"""Seconds between this worker's tries to take over a metrics port a sibling holds."""

LogFormat = Literal["text", "json"]

log = logging.getLogger("delayq.worker")


class WorkerOps:
    """Metrics and per-job logs for one worker process.

    Per-job lines are logged at INFO with ``--log-format json`` (for a log
    pipeline) and at DEBUG otherwise (the readable default stays quiet).
    ``start(worker)`` serves ``/metrics`` (with the worker's gauges) and
    ``/healthz`` on ``metrics_host:metrics_port`` when a port is given, and
    ``/healthz`` alone on ``metrics_host:health_port``. In multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR``) the served numbers are the sum over this
    host's worker processes, so when the port is taken by a sibling this
    process only writes its samples and says so (its ``/healthz`` then needs a
    ``health_port`` of its own).

    While a sibling holds the metrics port, this process retries the bind every
    :data:`METRICS_RETRY` seconds, so the port is served again soon after the
    sibling stops.

    With a worker and a store that keeps heartbeats, it records the worker there
    (:mod:`delayq.observe.workers`: the dashboard's workers page and ``delayq
    workers``) until closed.

    ``web_port`` serves the dashboard on 127.0.0.1 from a spawned child process
    (:mod:`._web_process`: the worker's GIL stays the worker's), which loads the
    app by ``app_target`` (``package.module:app``), else opens ``store_url``, else
    loads the app by the name it has among the imported modules, and shows the lateness and
    counters this worker relays to it; it stops with the worker. The token
    comes from ``$DELAYQ_WEB_TOKEN`` or is made up, and the login link carrying
    it is printed to this process's terminal (stderr), never into the log. A
    taken web port (or a child that cannot start) is logged and the worker runs
    on without the dashboard.
    """

    def __init__(
        self,
        app: DelayQ,
        *,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        log_format: LogFormat = "text",
        web_port: int | None = None,
        health_port: int | None = None,
        app_target: str | None = None,
        store_url: str | None = None,
    ) -> None:
        for option, port in (
            ("--metrics-port", metrics_port),
            ("--web-port", web_port),
            ("--health-port", health_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigurationError(f"{option} must be 0..65535, got {port}")
        self.app = app
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.web_port = web_port
        self.health_port = health_port
        self.app_target = app_target
        self.store_url = store_url
        self.log_format: LogFormat = log_format
        # relayed to the dashboard's process; in multiprocess mode it reads the directory
        relay = web_port is not None and multiprocess_dir() is None
        self.series = LatenessSeries() if relay else None
        wanted = metrics_port is not None or web_port is not None
        self.metrics = Metrics(series=self.series).instrument(app) if wanted else None
        self._web: WebProcess | None = None
        self.web_url: str | None = None
        level = logging.INFO if log_format == "json" else logging.DEBUG
        self._log_result = result_logger(logging.getLogger("delayq.jobs"), level)
        self._server: OpsServer | None = None
        self._health: OpsServer | None = None
        self._closing = threading.Event()
        self._takeover: threading.Thread | None = None
        self._heartbeat: Heartbeat | None = None
        self.port: int | None = None  # the metrics port actually served (0 picks a free one)
        self.health_port_served: int | None = None

    def on_result(self, result: JobResult) -> None:
        """Pass as ``Worker(on_result=...)``."""
        if self.metrics is not None:
            self.metrics.on_result(result)
        self._log_result(result)

    def start(self, worker: Worker | None = None) -> None:
        """Serve ``/metrics``, ``/healthz`` (for ``worker``) and the dashboard if
        ports were given (see the class docstring)."""
        if worker is not None and keeps_workers(self.app):
            self._heartbeat = Heartbeat(self.app, worker).start()
        if self.web_port is not None:
            self._start_web(self.web_port)
        if self.health_port is not None and worker is not None:
            try:
                self._health = OpsServer(self.metrics_host, self.health_port, worker=worker)
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot serve /healthz on {self.metrics_host}:{self.health_port}: {exc}"
                ) from exc
            self.health_port_served = self._health.port
            log.info("health on http://%s:%d/healthz", self.metrics_host, self._health.port)
        if self.metrics_port is None:
            return
        registry = exposition_registry(self.metrics, self.app.backend)
        if worker is not None:
            registry.register(WorkerCollector(worker))
        try:
            self._serve_metrics(worker, registry)
        except OSError as exc:
            if multiprocess_dir() is None:
                raise ConfigurationError(
                    f"cannot serve metrics on {self.metrics_host}:{self.metrics_port}: {exc}"
                ) from exc
            log.info(
                "metrics port %d is taken (another worker of this host serves the sum over "
                "%s); this worker writes its samples there and takes the port over when it "
                "frees",
                self.metrics_port,
                multiprocess_dir(),
            )
            self._takeover = threading.Thread(
                target=self._take_over_metrics,
                args=(worker, registry),
                name="delayq-metrics-takeover",
                daemon=True,
            )
            self._takeover.start()

    def _serve_metrics(self, worker: Worker | None, registry: Any) -> None:
        assert self.metrics_port is not None
        self._server = OpsServer(
            self.metrics_host, self.metrics_port, worker=worker, registry=registry
        )
        self.port = self._server.port
        log.info("metrics on http://%s:%d/metrics", self.metrics_host, self.port)

    def _take_over_metrics(self, worker: Worker | None, registry: Any) -> None:
        while not self._closing.wait(METRICS_RETRY):
            try:
                self._serve_metrics(worker, registry)
            except OSError:
                continue
            if self._closing.is_set():  # closed while binding: close() may have missed it
                server, self._server = self._server, None
                if server is not None:
                    server.close()
            return

    def _start_web(self, port: int) -> None:
        try:
            import uvicorn  # noqa: F401, PLC0415 (the child needs them: say so here)

            import delayq.web  # noqa: F401, PLC0415
        except ImportError as exc:
            raise ConfigurationError(
                f"--web-port needs {exc.name or 'the web extra'}: pip install 'delayq[web]'"
            ) from exc
        if self.app.url.startswith("memory:"):
            log.warning(
                "cannot serve the dashboard of a memory:// store from another process; "
                "this worker runs without it (serve delayq.web.create_app(app) yourself)"
            )
            return
        target = self.app_target
        if target is None and self.store_url is None:
            target = app_target(self.app)
        if target is None and self.store_url is None:
            log.warning(
                "cannot serve the dashboard: its process loads the app by name and this "
                "app is no module-level variable (give app_target='package.module:app' "
                "or store_url=); this worker runs without it"
            )
            return
        given = os.environ.get(TOKEN_ENV) or None
        token = given or secrets.token_urlsafe(24)
        self._web = WebProcess(
            target=target,
            url=self.store_url,
            port=port,
            token=token,
            metrics=self.metrics,
            series=self.series,
            cache_seconds=WEB_CACHE_SECONDS,
            log_format=self.log_format,
        )
        bound = self._web.start()
        if bound is None:
            self._web = None
            return
        self.web_url = f"http://127.0.0.1:{bound}/"
        log.info("dashboard on %s (process %s)", self.web_url, self._web.pid)
        if not given:  # the token goes to the terminal only, never into a log pipeline
            click.echo(f"dashboard login link: {self.web_url}?token={token}", err=True)

    def close(self) -> None:
        """Stop serving; in multiprocess mode mark this process's live gauges dead."""
        self._closing.set()
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._takeover is not None:
            self._takeover.join(10)
            self._takeover = None
        if self._web is not None:
            self._web.close()
            self._web = None
        for server in (self._server, self._health):
            if server is not None:
                server.close()
        self._server = self._health = None
        if self.metrics is not None and multiprocess_dir() is not None:
            from prometheus_client import multiprocess  # noqa: PLC0415

            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


# -- the command ----------------------------------------------------------------------
def _setup_logging(level: str, log_format: str = "text") -> Callable[[], None]:
    """Send delayq's logs to stderr at ``level``; returns a function undoing it."""
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
    elif sys.stderr.isatty():
        handler = RichHandler(show_path=False, rich_tracebacks=True)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
        )
    root = logging.getLogger("delayq")
    saved = (list(root.handlers), root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False

    def restore() -> None:
        root.handlers[:], root.level, root.propagate = saved

    return restore


@click.command()
@click.argument("target")
@click.option("-c", "--concurrency", default=8, show_default=True, help="Handlers run at once.")
@click.option("--lease", default="30s", show_default=True, help="Lease per claim (renewed).")
@click.option("--batch", type=int, default=None, help="Most jobs per claim (default concurrency).")
@click.option("--grace", default="30s", show_default=True, help="Time to finish on stop.")
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=None,
    help=(
        "Jobs claimed ahead of free slots under a backlog (default concurrency / 2; "
        "2 x concurrency with --pool process)."
    ),
)
@click.option(
    "--timeout",
    default=None,
    help="Longest run of one attempt, e.g. '5m', for handlers without their own timeout.",
)
@click.option(
    "--pool",
    type=click.Choice(["thread", "process"]),
    default="thread",
    show_default=True,
    help="Run handlers on threads, or in spawned child processes (CPU-bound work, hard "
    "timeouts: a child past its timeout is killed).",
)
@click.option(
    "--max-tasks-per-child",
    type=click.IntRange(min=1),
    default=None,
    help="With --pool process: replace a child after this many jobs (memory leaks).",
)
@click.option(
    "--handlers",
    "handlers",
    multiple=True,
    metavar="NAMES",
    help="Serve only these handlers, comma-separated (a,b): claim only their jobs, so a "
    "slow handler can have workers of its own (default: every handler of the app).",
)
@click.option(
    "--unknown-handler-grace",
    default="5m",
    show_default=True,
    help="How long jobs naming an unknown handler are retried before they are dead-lettered.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option(
    "--health-port",
    type=int,
    default=None,
    help="Serve /healthz here (200 healthy, 503 and why not); also served on --metrics-port.",
)
@click.option(
    "--web-port",
    type=int,
    default=None,
    help="Serve the dashboard on 127.0.0.1, from a child process (it loads TARGET too).",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.pass_context
def worker(
    ctx: click.Context,
    *,
    target: str,
    concurrency: int,
    lease: str,
    batch: int | None,
    grace: str,
    prefetch: int | None,
    timeout: str | None,
    pool: str,
    max_tasks_per_child: int | None,
    handlers: tuple[str, ...],
    unknown_handler_grace: str,
    log_level: str,
    metrics_port: int | None,
    metrics_host: str,
    health_port: int | None,
    web_port: int | None,
    log_format: str,
) -> None:
    """Run the handlers of the DelayQ app TARGET ('package.module:app').

    Stops gracefully on SIGINT / SIGTERM: no new claims, in-flight jobs get the
    grace period to finish; a second signal stops at once.
    """
    settings: _Settings = ctx.ensure_object(_Settings)
    _require_durable(settings.url)
    with _errors():
        app = load_app(target, settings.url)
        ops = WorkerOps(
            app,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            log_format="json" if log_format == "json" else "text",
            web_port=web_port,
            health_port=health_port,
            app_target=target,
            store_url=settings.url,
        )
        w = Worker(
            app,
            concurrency=concurrency,
            lease=_duration(lease, "--lease"),
            batch=batch,
            grace=_duration(grace, "--grace"),
            prefetch=prefetch,
            timeout=None if timeout is None else _duration(timeout, "--timeout"),
            unknown_handler_grace=_duration(unknown_handler_grace, "--unknown-handler-grace"),
            on_result=ops.on_result,
            pool=pool,
            max_tasks_per_child=max_tasks_per_child,
            app_target=target if pool == "process" else None,
            handlers=_handler_names(handlers),
        )
    restore_logging = _setup_logging(log_level, log_format)
    log = logging.getLogger("delayq.worker")
    if settings.url is not None and app.url != settings.url:
        log.warning(
            "%s opens its own store %s; --url %s is not used", target, app.url, settings.url
        )
    served = sorted(app.handlers) if w.handlers is None else sorted(w.handlers)
    log.info(
        "worker %d: %s on %s, handlers: %s%s; concurrency %d (%s pool), lease %.1fs",
        os.getpid(),
        target,
        app.url,
        ", ".join(served) or "none",
        "" if w.handlers is None else " only",
        w.concurrency,
        pool,
        w.lease,
    )
    try:
        with _errors():
            ops.start(w)
            w.run()
    finally:
        ops.close()
        stats = w.stats()
        log.info(
            "worker stopped: %d claimed, %d succeeded, %d retried, %d dead, %d skipped",
            stats.claimed,
            stats.succeeded,
            stats.retried,
            stats.dead,
            stats.skipped,
        )
        app.close()
        restore_logging()
