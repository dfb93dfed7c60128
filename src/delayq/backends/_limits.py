"""Limit records (the ``flow_control`` feature): the checks every store shares.

Each store keeps its limit records next to its jobs and reads them in its own
claim step; the arithmetic (which limit applies to a key, the cell rate
algorithm) is :mod:`delayq.flow`, written once.
"""

from __future__ import annotations

from delayq.backends._schedules import check_version
from delayq.errors import InvalidOption
from delayq.flow import Limit

__all__ = ["check_limit_args", "check_pattern", "check_version"]


def check_limit_args(limit: object, version: object) -> tuple[Limit, int]:
    """The checked arguments of ``put_limit``."""
    if not isinstance(limit, Limit):
        raise InvalidOption(f"put_limit takes a delayq.flow.Limit, got {type(limit).__name__}")
    return limit, check_version(version)


def check_pattern(pattern: object) -> str:
    """A limit's pattern as ``get_limit`` / ``delete_limit`` take it."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidOption(f"a limit pattern must be a non-empty string, got {pattern!r}")
    return pattern
