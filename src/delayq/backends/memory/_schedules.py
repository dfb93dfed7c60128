"""Schedule records in a dict: the memory store's ``recurring`` feature (the reference)."""

from __future__ import annotations

import threading

from delayq.backends._schedules import check_schedule_args, check_schedule_name, check_version
from delayq.backends.base import ScheduleRecord

__all__ = ["MemorySchedules"]


class MemorySchedules:
    """Schedule records in a dict (the reference for the other stores).

    Lock rule: ``_schedules_lock`` guards ``_schedules``; both are created on
    first use (under the class-level ``_init_lock``), so the host class needs
    no change to its constructor.
    """

    _init_lock = threading.Lock()
    _schedules_lock: threading.Lock
    _schedules: dict[str, ScheduleRecord]

    def _schedule_table(self) -> tuple[threading.Lock, dict[str, ScheduleRecord]]:
        try:
            return self._schedules_lock, self._schedules
        except AttributeError:
            with MemorySchedules._init_lock:
                if "_schedules" not in self.__dict__:
                    self._schedules = {}
                    self._schedules_lock = threading.Lock()
            return self._schedules_lock, self._schedules

    def put_schedule(self, name: str, data: str, *, version: int) -> int | None:
        name, data, version = check_schedule_args(name, data, version)
        lock, table = self._schedule_table()
        with lock:
            current = table.get(name)
            if (0 if current is None else current.version) != version:
                return None
            table[name] = ScheduleRecord(name, data, version + 1)
            return version + 1

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        name = check_schedule_name(name)
        lock, table = self._schedule_table()
        with lock:
            return table.get(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        lock, table = self._schedule_table()
        with lock:
            return [table[name] for name in sorted(table)]

    def delete_schedule(self, name: str, *, version: int | None = None) -> bool:
        name = check_schedule_name(name)
        if version is not None:
            version = check_version(version)
        lock, table = self._schedule_table()
        with lock:
            current = table.get(name)
            if current is None or (version is not None and current.version != version):
                return False
            del table[name]
            return True
