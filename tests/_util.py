"""Small helpers for the few real-time tests: poll up to a deadline, never sleep blindly."""

from __future__ import annotations

import threading
from collections.abc import Callable

from delayq.clock import SYSTEM_CLOCK

_never = threading.Event()


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.005
) -> bool:
    """Poll ``predicate`` until true or ``timeout`` real seconds pass; return its last value."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    while True:
        if predicate():
            return True
        left = deadline - SYSTEM_CLOCK.monotonic()
        if left <= 0:
            return bool(predicate())
        _never.wait(min(interval, left))
