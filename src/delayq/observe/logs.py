"""Logs for machines: one JSON object per line (``--log-format json``).

:class:`JsonFormatter` turns a log record into ``{"ts", "level", "logger",
"message", "pid", ...}``; a record about one job (see :func:`result_logger`)
also carries ``job_id``, ``name`` (the handler), ``attempt``, ``lateness``
(seconds from due to claim), ``outcome`` and ``duration``. A traceback goes
into ``"exc"`` as text, so a line is always one object.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from delayq._present import error_summary, iso

if TYPE_CHECKING:
    from delayq.worker import JobResult

__all__ = ["JOB_FIELD", "JsonFormatter", "result_logger"]

JOB_FIELD = "delayq_job"
"""The LogRecord attribute holding a job's fields (``extra={JOB_FIELD: {...}}``);
not ``name`` itself, which a LogRecord reserves for the logger's name."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process or os.getpid(),
        }
        job = getattr(record, JOB_FIELD, None)
        if isinstance(job, dict):
            data.update(job)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exc"] = record.exc_text
        return json.dumps(data, ensure_ascii=False, default=str)


def result_logger(logger: logging.Logger, level: int = logging.INFO) -> Callable[[JobResult], None]:
    """An ``on_result`` callback logging one record per finished attempt."""

    def log_result(result: JobResult) -> None:
        if not logger.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "job_id": result.job_id,
            "name": result.name,
            "attempt": result.attempt,
            "lateness": round(result.lateness, 6),
            "outcome": result.outcome,
            "duration": round(result.duration, 6),
        }
        if result.start_lateness is not None:
            fields["start_lateness"] = round(result.start_lateness, 6)
        if result.retry_at is not None:
            fields["retry_at"] = result.retry_at
        if result.error is not None:
            fields["error"] = error_summary(result.error, 500) or ""
        logger.log(
            level,
            "job %s (%s) attempt %d %s, %.3fs late",
            result.job_id,
            result.name,
            result.attempt,
            result.outcome,
            result.lateness,
            extra={JOB_FIELD: fields},
        )

    return log_result
