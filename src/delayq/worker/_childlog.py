"""Log records of a process-pool child, replayed in its parent as JSON.

A spawned child starts with Python's default logging (nothing configured), so
a handler's ``log.info`` would vanish and a ``--log-format json`` worker would
print a child's warnings as plain text. Instead the child's root logger has one
handler, :class:`PipeLogHandler`, that sends each record over the child's pipe
as a JSON frame ``{"log": {...}}`` (the message already formatted, a traceback
as text: nothing is pickled). The parent reads these frames while it waits for
the child (before its ``ready`` and before each answer) and :func:`replay`
hands each record to the parent's logger of the same name, so it goes through
the parent's own levels, handlers and formatters (text, JSON, a user's setup),
with the child's pid in ``%(process)d``.

The child forwards records at :func:`forward_level` (the lowest level the
parent's loggers are set to), so a parent at INFO does not receive DEBUG
chatter. A record logged by a child's own background thread while it has no
task waits in the pipe until the parent next reads it.
"""

from __future__ import annotations

import json
import logging
import threading
from multiprocessing.connection import Connection
from typing import Any

from delayq.observe.logs import JOB_FIELD

__all__ = ["PipeLogHandler", "forward_level", "replay"]

_FIELDS = (
    "name",
    "levelno",
    "levelname",
    "pathname",
    "filename",
    "module",
    "lineno",
    "funcName",
    "created",
    "msecs",
    "thread",
    "threadName",
    "process",
    "processName",
)


def forward_level() -> int:
    """The lowest level any logger of this process is set to (the root's included):
    records below it would be dropped by every logger here."""
    levels = [logging.getLogger().getEffectiveLevel()]
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels.append(logger.level)
    return min(levels)


class PipeLogHandler(logging.Handler):
    """Sends each record to the parent as a JSON frame (under ``lock``, the lock the
    child's answers are sent under too)."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        super().__init__()
        self._conn = conn
        self._lock = lock
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data: dict[str, Any] = {field: getattr(record, field, None) for field in _FIELDS}
            data["msg"] = record.getMessage()
            if record.exc_info:
                data["exc_text"] = self._formatter.formatException(record.exc_info)
            elif record.exc_text:
                data["exc_text"] = record.exc_text
            if record.stack_info:
                data["stack_info"] = record.stack_info
            job = getattr(record, JOB_FIELD, None)
            if isinstance(job, dict):
                data[JOB_FIELD] = job
            frame = json.dumps({"log": data}, default=str).encode()
            with self._lock:
                self._conn.send_bytes(frame)
        except Exception:
            self.handleError(record)


def replay(data: dict[str, Any]) -> None:
    """Hand a child's record to this process's logger of the same name."""
    record = logging.makeLogRecord(data)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)
