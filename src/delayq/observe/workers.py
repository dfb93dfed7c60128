"""Worker heartbeats in the store: which workers are alive and what they hold.

A :class:`Heartbeat` writes its worker's record into the store (a store that
keeps them: :class:`~delayq.backends.base.WorkerRegistry`) every ``every``
seconds, at most a third of the worker's lease, and deletes it when the worker
stops. :func:`worker_rows` reads them back for the dashboard's workers page and
``delayq workers``: a worker not seen for longer than its lease is *gone* (it
died or stalled; its running jobs come back when their leases run out).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from delayq.backends.base import WorkerBeat, WorkerRegistry
from delayq.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from delayq.app import DelayQ
    from delayq.worker import Worker

__all__ = ["Heartbeat", "keeps_workers", "worker_rows"]

log = logging.getLogger("delayq.worker")

MAX_EVERY = 10.0


def _version() -> str:
    try:
        return version("delayq")
    except PackageNotFoundError:  # a source checkout without metadata
        return "unknown"


def keeps_workers(app: DelayQ) -> bool:
    """Whether ``app``'s store keeps worker heartbeats."""
    return isinstance(app.backend, WorkerRegistry)


class Heartbeat:
    """Renews ``worker``'s record in ``app``'s store from a daemon thread.

    ``_stop`` (an Event) is the only state shared with the thread.
    """

    def __init__(
        self,
        app: DelayQ,
        worker: Worker,
        *,
        every: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        backend = app.backend
        if not isinstance(backend, WorkerRegistry):
            raise TypeError(f"{type(backend).__name__} keeps no worker heartbeats")
        self._backend: WorkerRegistry = backend
        self.worker = worker
        self.every = every if every is not None else min(MAX_EVERY, worker.lease / 3)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._clock = clock
        self._started = clock.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def info(self) -> dict[str, Any]:
        """What the record says about the worker."""
        worker = self.worker
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "name": worker.name,
            "version": _version(),
            "concurrency": worker.concurrency,
            "in_flight": worker.health_snapshot().in_flight,
            "lease": worker.lease,
            "started": self._started,
        }

    def beat(self) -> None:
        """Write the record now."""
        self._backend.beat_worker(self.worker_id, json.dumps(self.info()))

    def start(self) -> Heartbeat:
        self.beat()  # at once: the worker is listed from its first second
        self._thread = threading.Thread(target=self._run, name="delayq-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.every):
            try:
                self.beat()
                failing = False
            except Exception as exc:  # the store is down: the worker itself will say so
                if not failing:
                    log.warning("cannot record this worker's heartbeat: %s", exc)
                failing = True

    def stop(self) -> None:
        """Stop beating and delete the record (the worker stopped cleanly)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        try:
            self._backend.forget_worker(self.worker_id)
        except Exception as exc:
            log.warning("cannot remove this worker's heartbeat record: %s", exc)


def worker_rows(beats: list[WorkerBeat], now: float) -> list[dict[str, Any]]:
    """The records as rows: each with ``seen_ago`` and ``gone`` (not seen for
    longer than its lease)."""
    rows = []
    for beat in beats:
        try:
            data = json.loads(beat.data)
        except ValueError:
            data = {}
        lease = float(data.get("lease") or 30.0)
        ago = max(0.0, now - beat.seen)
        rows.append(
            {
                "id": beat.worker_id,
                **{k: data.get(k) for k in ("host", "pid", "name", "version")},
                **{k: data.get(k) for k in ("concurrency", "in_flight", "lease", "started")},
                "last_seen": beat.seen,
                "seen_ago": ago,
                "gone": ago > lease,
            }
        )
    return rows
