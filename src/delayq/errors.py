"""The one exception tree of delayq.

::

    DelayqError
    ├── InvalidInput (also ValueError)         bad input, raised at the call that received it
    │   ├── InvalidDelay                       NaN, inf, bool, str ... as a delay or due time
    │   ├── InvalidPayload                     payload is not JSON data
    │   │   ├── PayloadTooLarge                encoded payload over the size limit
    │   │   └── InvalidResult                  a handler's return value is not JSON data
    │   │       └── ResultTooLarge             its encoded result over the size limit
    │   ├── InvalidJobId                       empty, too long, control characters
    │   └── InvalidOption                      max_attempts < 1, unknown on_conflict, bad backoff
    ├── JobNotFound (also LookupError)         no job with that id
    ├── JobConflict                            a job with that id exists (on_conflict="reject")
    ├── JobDidNotSucceed                       a job's result was asked for; it ended otherwise
    │   ├── JobFailed                          dead-lettered (``.error``: its stored error)
    │   ├── JobCancelled                       cancelled before it ran
    │   └── JobSkipped                         skipped by its misfire policy
    ├── ResultTimeout (also TimeoutError)      a job did not finish within the wait for its result
    ├── UnknownHandler (also LookupError)      no handler registered under that name
    ├── StaleClaim                             the claim's fencing token is no longer current
    ├── QueueClosed                            the queue or timer was closed
    ├── QueueFull                              ``max_pending`` reached
    ├── Unsupported (also NotImplementedError) the store does not keep that promise (its features)
    ├── ConfigurationError                     bad URL, unsafe server setting ...
    │   └── MissingDependency (also ImportError) an optional extra is not installed
    └── BackendError                           the store failed
        └── BackendUnavailable                 the store cannot be reached

Driver errors are wrapped with ``raise ... from exc`` so the cause is kept.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "ConfigurationError",
    "DelayqError",
    "InvalidDelay",
    "InvalidInput",
    "InvalidJobId",
    "InvalidOption",
    "InvalidPayload",
    "InvalidResult",
    "JobCancelled",
    "JobConflict",
    "JobDidNotSucceed",
    "JobFailed",
    "JobNotFound",
    "JobSkipped",
    "MissingDependency",
    "PayloadTooLarge",
    "QueueClosed",
    "QueueFull",
    "ResultTimeout",
    "ResultTooLarge",
    "StaleClaim",
    "UnknownHandler",
    "Unsupported",
]


class DelayqError(Exception):
    """Base class of every error delayq raises on purpose."""


class InvalidInput(DelayqError, ValueError):
    """Bad input, rejected at the call that received it; nothing was stored."""


class InvalidDelay(InvalidInput):
    """A delay or due time that is not a finite real number (or an aware datetime)."""


class InvalidPayload(InvalidInput):
    """A payload that is not JSON data (dict, list, str, int, float, bool, None)."""


class PayloadTooLarge(InvalidPayload):
    """An encoded payload larger than the configured limit."""


class InvalidResult(InvalidPayload):
    """A handler's return value that is not JSON data (a job storing its result)."""


class ResultTooLarge(InvalidResult):
    """A handler's encoded return value larger than the result size limit."""


class InvalidJobId(InvalidInput):
    """A job id that is empty, too long, or contains control characters."""


class InvalidOption(InvalidInput):
    """An option outside its accepted range (max_attempts, on_conflict, backoff, ...)."""


class JobNotFound(DelayqError, LookupError):
    """No job with the given id."""


class JobConflict(DelayqError):
    """A job with the given id already exists and ``on_conflict="reject"``."""


class JobDidNotSucceed(DelayqError):
    """The job whose result was asked for ended without succeeding (``.job``: the
    :class:`~delayq.job.Job` as the store reported it)."""

    def __init__(self, message: str, *, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class JobFailed(JobDidNotSucceed):
    """The job was dead-lettered; ``error`` is its stored error text (with traceback)."""

    def __init__(self, message: str, *, job: Any = None, error: str | None = None) -> None:
        super().__init__(message, job=job)
        self.error = error


class JobCancelled(JobDidNotSucceed):
    """The job was cancelled before it ran (it has no result)."""


class JobSkipped(JobDidNotSucceed):
    """The job was skipped by its misfire policy (it has no result)."""


class ResultTimeout(DelayqError, TimeoutError):
    """The job did not finish within the time given to wait for its result."""


class UnknownHandler(DelayqError, LookupError):
    """No handler is registered under the given name."""


class StaleClaim(DelayqError):
    """The claim's lease expired or was superseded: its fencing token is stale."""


class QueueClosed(DelayqError):
    """The queue, timer or worker was closed; no more items come out of it."""


class QueueFull(DelayqError):
    """The structure holds ``max_pending`` items and refuses more."""


class Unsupported(DelayqError, NotImplementedError):
    """The store does not keep this promise; its ``features`` say which it keeps."""


class ConfigurationError(DelayqError):
    """A configuration delayq cannot work with (bad URL, unsafe server setting)."""


class MissingDependency(ConfigurationError, ImportError):
    """An optional extra is not installed; the message says what to install."""


class BackendError(DelayqError):
    """The durable store failed."""


class BackendUnavailable(BackendError):
    """The durable store cannot be reached."""
