"""The state a :class:`~delayq.worker._runner.Runner` holds, declared once for its parts.

``Runner`` sets these in its ``__init__``; its parts (``_timeouts``, ``_async``)
read and write them, and inherit this class so the type checker knows them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from delayq.app import DelayQ
    from delayq.clock import Clock
    from delayq.worker._commit import GroupCommitter
    from delayq.worker._inflight import InFlightTable
    from delayq.worker._loop import EventLoopThread
    from delayq.worker._process import ProcessPool

__all__ = ["RunnerState"]


class RunnerState:
    """Declarations only (see the module docstring)."""

    _table: InFlightTable
    _app: DelayQ
    _committer: GroupCommitter
    _clock: Clock
    _name: str
    _timeout: float | None
    _ready_hold: float
    _pool: ProcessPool | None
    _loop: EventLoopThread | None
    _loop_lock: threading.Lock
    _timeouts_changed: threading.Condition
    _watching_until: float
    _watcher: threading.Thread | None
    _async_live: int
    _loop_check_at: float
    _ping_answered: bool
    _ping_sent: float
