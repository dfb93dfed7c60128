"""Schedule records (the ``recurring`` feature): the checks every store shares.

Each store keeps its schedule records in a mixin named ``<Store>Schedules`` in
its folder's ``_schedules.py`` (:mod:`delayq.backends.memory._schedules` is the
reference), separate from its job methods: the records are a small key-value
table with compare-and-set, nothing more.
"""

from __future__ import annotations

from delayq._validate import MAX_SCHEDULE_NAME, check_int, check_schedule_name, utf8_problem
from delayq.errors import InvalidOption

__all__ = [
    "MAX_SCHEDULE_NAME",
    "check_schedule_args",
    "check_schedule_name",
    "check_version",
]


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
