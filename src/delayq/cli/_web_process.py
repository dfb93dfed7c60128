"""A worker's dashboard served by a spawned child process (``delayq worker --web-port``).

Served inside the worker, every page and API answer ran Python under the
worker's GIL and the worker's claims waited for it (lateness p99 5 ms alone,
9-34 ms under eight pollers). The child is a fresh interpreter: it loads the app
by its name (``package.module:app``, the one loader, as a process pool's child
does) or opens the store by URL, and reads the store through its own
connections, never through the worker's objects.

What only the worker knows travels over one pipe, parent to child: every
:data:`RELAY_SECONDS` the newest slots of its lateness series (a few hundred
bytes), and every :data:`FAMILIES_SECONDS` its counters and histograms (the
handlers table and ``/metrics``; collecting them costs milliseconds of the
worker's GIL, so seldom). In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``)
the child reads the directory itself and nothing is relayed.

The child says ``{"ready": port}`` once it listens (or ``{"error": why}``: a
taken port, an app it cannot load; the worker then runs without a dashboard),
ignores SIGINT (a Ctrl-C reaches the whole process group; the worker stops
gracefully and then stops it), and ends when its pipe says stop or closes: the
worker stopped, or died (its end of the pipe closes with it).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from delayq._loader import load_app
from delayq.app import DelayQ
from delayq.cli.web import _setup_logging
from delayq.observe.metrics import LatenessSeries, Metrics, RelayedCounters

__all__ = [
    "FAMILIES_SECONDS",
    "NICE",
    "RELAY_SECONDS",
    "START_TIMEOUT",
    "WebProcess",
    "web_process_main",
]

RELAY_SECONDS = 1.0
"""Seconds between the lateness slots a worker sends its dashboard's process."""

FAMILIES_SECONDS = 10.0
"""Seconds between the counters and histograms a worker sends (each send collects
them all: a few milliseconds of the worker's time per handler name)."""

START_TIMEOUT = 60.0
"""Seconds a worker waits for its dashboard's process to listen."""

NICE = 5
"""The child's niceness: on a busy machine the worker's claims go first."""

SERIES_FROM = "the worker serving this dashboard"

log = logging.getLogger("delayq.worker")


class WebProcess:
    """The parent side: spawn the dashboard's process, feed it, stop it.

    ``target`` (``package.module:app``) or ``url`` say how the child opens the
    store (the target first: its app may carry options a URL does not).
    ``metrics`` is the worker's (relayed to the child; None in multiprocess
    mode). Only the relay thread writes to the pipe. ``_lock`` guards
    ``_stopped``.
    """

    def __init__(
        self,
        *,
        target: str | None,
        url: str | None,
        port: int,
        token: str,
        metrics: Metrics | None,
        series: LatenessSeries | None,
        cache_seconds: float,
        log_format: str,
    ) -> None:
        self.target = target
        self.url = url
        self.port = port
        self.token = token
        self.metrics = metrics
        self.series = series
        self.cache_seconds = cache_seconds
        self.log_format = log_format
        self.bound: int | None = None
        self._mp = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: Connection | None = None
        self._relay: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def start(self) -> int | None:
        """Start the child and wait until it listens: the port it serves, or None
        (logged: the worker runs on without a dashboard)."""
        parent_end, child_end = self._mp.Pipe()
        level = logging.getLevelName(logging.getLogger("delayq").getEffectiveLevel())
        self._proc = self._mp.Process(
            target=web_process_main,
            args=(child_end, self.target, self.url, self.port, self.token),
            kwargs={
                "relayed": self.series is not None,
                "cache_seconds": self.cache_seconds,
                "log_level": str(level).lower(),
                "log_format": self.log_format,
                "nice": NICE,
            },
            name="delayq-web",
            daemon=False,
        )
        self._proc.start()
        child_end.close()  # the child holds the only other end: its death is an EOF here
        self._conn = parent_end
        reason = None
        try:
            if not parent_end.poll(START_TIMEOUT):
                reason = f"it did not listen within {START_TIMEOUT:g}s"
            else:
                hello = parent_end.recv()
                if "ready" in hello:
                    self.bound = int(hello["ready"])
                else:
                    reason = str(hello.get("error", "it did not say why"))
        except (EOFError, OSError):
            self._proc.join(5)
            reason = f"it exited with code {self._proc.exitcode}"
        if reason is None and self.series is not None:
            try:  # before any job: the child's baseline
                self._send_state(families=True)
            except (OSError, ValueError):
                reason = "it exited as it started"
        if reason is not None:
            log.warning(
                "cannot serve the dashboard on 127.0.0.1:%d (%s); this worker runs without it",
                self.port,
                reason,
            )
            self.close()
            return None
        if self.series is not None:  # else the child reads the multiprocess directory
            self._relay = threading.Thread(target=self._feed, name="delayq-web-relay", daemon=True)
            self._relay.start()
        return self.bound

    def _send_state(self, *, families: bool) -> None:
        assert self._conn is not None
        message: dict[str, Any] = {}
        if self.series is not None:
            message["slots"] = self.series.recent()
        if families and self.metrics is not None and self.series is not None:
            message["families"] = self.metrics.families()
        if message:
            self._conn.send(message)

    def _feed(self) -> None:
        last_families = time.monotonic()
        while not self._stop.wait(RELAY_SECONDS):
            now = time.monotonic()
            families = now - last_families >= FAMILIES_SECONDS
            if families:
                last_families = now
            try:
                self._send_state(families=families)
            except (OSError, ValueError):  # the child is gone
                if not self._stop.is_set():
                    log.warning(
                        "the dashboard's process (pid %s) exited with code %s; "
                        "this worker runs on without it",
                        self.pid,
                        self._proc.exitcode if self._proc is not None else None,
                    )
                return
        with contextlib.suppress(OSError, ValueError):
            assert self._conn is not None
            self._conn.send("stop")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the child (a stop message, then SIGTERM, then SIGKILL). Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        if self._relay is not None:
            self._relay.join(timeout)
        elif self._conn is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send("stop")
        proc = self._proc
        if proc is not None:
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        if self._conn is not None:
            self._conn.close()


# -- the child ------------------------------------------------------------------------
def web_process_main(
    conn: Connection,
    target: str | None,
    url: str | None,
    port: int,
    token: str,
    *,
    relayed: bool,
    cache_seconds: float,
    log_level: str,
    log_format: str,
    nice: int = NICE,
) -> None:
    """The dashboard's process: serve until the pipe says stop or closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(nice)
    _setup_logging(log_level, log_format)
    # the worker logs where the dashboard listens; uvicorn's start-up lines are noise here
    logging.getLogger("uvicorn.error").setLevel(
        max(logging.WARNING, logging.getLogger("delayq").getEffectiveLevel())
    )
    app = None
    try:
        app = load_app(target, url) if target is not None else DelayQ(url)
        _serve(conn, app, port, token, relayed=relayed, cache_seconds=cache_seconds)
    except Exception as exc:
        log.exception("the dashboard's process failed")
        with contextlib.suppress(OSError, ValueError):
            conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        if app is not None:
            app.close()


def _serve(
    conn: Connection, app: DelayQ, port: int, token: str, *, relayed: bool, cache_seconds: float
) -> None:
    import uvicorn  # noqa: PLC0415 (the web extra: checked by the parent before the spawn)

    from delayq.web import create_app  # noqa: PLC0415

    series = LatenessSeries() if relayed else None
    counters = RelayedCounters() if relayed else None
    site = create_app(
        app,
        token=token,
        metrics=counters,
        series=series,
        series_from=SERIES_FROM,
        cache_seconds=cache_seconds,
    )
    config = uvicorn.Config(
        site, host="127.0.0.1", port=port, log_config=None, access_log=False, ws="none"
    )
    server = uvicorn.Server(config)
    # uvicorn in a thread: it installs no signal handlers there (SIGINT stays ignored)
    thread = threading.Thread(target=_run, args=(server,), name="delayq-web", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            conn.send({"error": f"cannot listen on 127.0.0.1:{port} (port taken?)"})
            return
        time.sleep(0.01)
    conn.send({"ready": server.servers[0].sockets[0].getsockname()[1]})
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the worker is gone
            if message == "stop":
                break
            if series is not None and "slots" in message:
                series.merge(message["slots"])
            if counters is not None and "families" in message:
                counters.update(message["families"])
    finally:
        server.should_exit = True
        thread.join(10)


def _run(server: Any) -> None:
    """uvicorn's ``run``: a port it cannot bind ends it with SystemExit (after
    logging why), which must end only this thread."""
    with contextlib.suppress(SystemExit):
        server.run()
