"""Worker heartbeats in a dict: the memory store's worker registry (the reference)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from delayq.backends._workers import check_worker_beat, check_worker_id
from delayq.backends.base import WORKER_FORGET_AFTER, WorkerBeat

if TYPE_CHECKING:
    from delayq.clock import Clock

__all__ = ["MemoryWorkers"]


class MemoryWorkers:
    """``beat_worker``, ``list_workers``, ``forget_worker``.

    Lock rule: ``_workers_lock`` guards ``_workers``; both are created on first
    use (under the class-level ``_init_lock``).
    """

    _clock: Clock
    _init_lock = threading.Lock()
    _workers_lock: threading.Lock
    _workers: dict[str, WorkerBeat]

    def _worker_table(self) -> tuple[threading.Lock, dict[str, WorkerBeat]]:
        try:
            return self._workers_lock, self._workers
        except AttributeError:
            with MemoryWorkers._init_lock:
                if "_workers" not in self.__dict__:
                    self._workers = {}
                    self._workers_lock = threading.Lock()
            return self._workers_lock, self._workers

    def beat_worker(self, worker_id: str, data: str) -> None:
        worker_id, data = check_worker_beat(worker_id, data)
        lock, table = self._worker_table()
        now = self._clock.time()
        with lock:
            table[worker_id] = WorkerBeat(worker_id, data, now)
            for old in [k for k, b in table.items() if b.seen < now - WORKER_FORGET_AFTER]:
                del table[old]

    def list_workers(self) -> list[WorkerBeat]:
        lock, table = self._worker_table()
        with lock:
            return sorted(table.values(), key=lambda b: -b.seen)

    def forget_worker(self, worker_id: str) -> None:
        worker_id = check_worker_id(worker_id)
        lock, table = self._worker_table()
        with lock:
            table.pop(worker_id, None)
