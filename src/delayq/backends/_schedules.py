"""Schedule records (the ``recurring`` feature): shared checks and the in-memory store.

Each store keeps its schedule records in a mixin of its own module
(``MemorySchedules`` here, :mod:`delayq.backends.sqlite._schedules`,
:mod:`delayq.backends.redis._schedules`), separate from its job methods: the
records are a small key-value table with compare-and-set, nothing more.
"""

from __future__ import annotations

import threading

from delayq._validate import check_int, utf8_problem
from delayq.backends.base import ScheduleRecord
from delayq.errors import InvalidOption

__all__ = ["MAX_SCHEDULE_NAME", "MemorySchedules", "check_schedule_args", "check_schedule_name"]

MAX_SCHEDULE_NAME = 160
"""The longest schedule name: its occurrence and tick job ids (name + time) must
stay within the 255 characters of a job id."""


def check_schedule_name(name: object) -> str:
    """``name`` if it can name a schedule, else :class:`~delayq.errors.InvalidOption`."""
    if not isinstance(name, str):
        raise InvalidOption(f"schedule name must be a str, got {type(name).__name__}")
    if not name.strip():
        raise InvalidOption(f"schedule name must not be empty, got {name!r}")
    if len(name) > MAX_SCHEDULE_NAME:
        raise InvalidOption(
            f"schedule name is {len(name)} characters; at most {MAX_SCHEDULE_NAME} are allowed"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 or 0x80 <= ord(ch) < 0xA0 for ch in name):
        raise InvalidOption(f"schedule name must not contain control characters, got {name!r}")
    problem = utf8_problem(name)
    if problem is not None:
        raise InvalidOption(f"schedule name {problem}")
    return name


def check_schedule_args(name: object, data: object, version: object) -> tuple[str, str, int]:
    """The checked arguments of ``put_schedule``."""
    if not isinstance(data, str):
        raise InvalidOption(f"schedule data must be JSON text (a str), got {type(data).__name__}")
    problem = utf8_problem(data)
    if problem is not None:
        raise InvalidOption(f"schedule data {problem}")
    return check_schedule_name(name), data, check_version(version)


def check_version(version: object) -> int:
    """A record version for compare-and-set: an int >= 0 (0 = no record)."""
    return check_int(version, "version", minimum=0, note=" (0: no record yet)")


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
