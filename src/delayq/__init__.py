"""delayq: run work later, at the right time, without losing it.

In-process structures (``DelayQueue``, timing wheels), a durable embedded
default (SQLite) and distributed stores (Redis) serve one model: a job due at a
time.
"""

from __future__ import annotations

from delayq.aio import AsyncDelayQ
from delayq.app import DelayQ
from delayq.backoff import Backoff, ExponentialBackoff, ScheduleBackoff
from delayq.clock import SYSTEM_CLOCK, Clock, SystemClock
from delayq.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    DelayqError,
    InvalidDelay,
    InvalidInput,
    InvalidJobId,
    InvalidOption,
    InvalidPayload,
    InvalidResult,
    JobCancelled,
    JobConflict,
    JobDidNotSucceed,
    JobFailed,
    JobNotFound,
    JobSkipped,
    MissingDependency,
    PayloadTooLarge,
    QueueClosed,
    QueueFull,
    ResultTimeout,
    ResultTooLarge,
    StaleClaim,
    UnknownHandler,
    Unsupported,
)
from delayq.job import (
    CancelOutcome,
    Job,
    JobContext,
    JobState,
    KeyInfo,
    Misfire,
    RescheduleOutcome,
)
from delayq.keyed import KeyedOutcome, KeyedResult
from delayq.recurring import MissedRuns, Schedule, ScheduleStatus
from delayq.results import JobHandle
from delayq.task import Task, TaskCall
from delayq.timers.async_delay_queue import AsyncDelayQueue
from delayq.timers.base import Timer, TimerHandle
from delayq.timers.delay_queue import Delayed, DelayedItem, DelayQueue
from delayq.timers.hashed_wheel import HashedWheel, HashedWheelTimer
from delayq.timers.heap_timer import DelayQueueTimer
from delayq.timers.retry_queue import RetryQueue
from delayq.timers.timing_wheel import HierarchicalWheel, TimingWheel
from delayq.worker import JobResult, Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "AsyncDelayQ",
    "AsyncDelayQueue",
    "BackendError",
    "BackendUnavailable",
    "Backoff",
    "CancelOutcome",
    "Clock",
    "ConfigurationError",
    "DelayQ",
    "DelayQueue",
    "DelayQueueTimer",
    "Delayed",
    "DelayedItem",
    "DelayqError",
    "ExponentialBackoff",
    "HashedWheel",
    "HashedWheelTimer",
    "HierarchicalWheel",
    "InvalidDelay",
    "InvalidInput",
    "InvalidJobId",
    "InvalidOption",
    "InvalidPayload",
    "InvalidResult",
    "Job",
    "JobCancelled",
    "JobConflict",
    "JobContext",
    "JobDidNotSucceed",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "JobResult",
    "JobSkipped",
    "JobState",
    "KeyInfo",
    "KeyedOutcome",
    "KeyedResult",
    "Misfire",
    "MissedRuns",
    "MissingDependency",
    "PayloadTooLarge",
    "QueueClosed",
    "QueueFull",
    "RescheduleOutcome",
    "ResultTimeout",
    "ResultTooLarge",
    "RetryQueue",
    "SYSTEM_CLOCK",
    "Schedule",
    "ScheduleBackoff",
    "ScheduleStatus",
    "StaleClaim",
    "SystemClock",
    "Task",
    "TaskCall",
    "Timer",
    "TimerHandle",
    "TimingWheel",
    "UnknownHandler",
    "Unsupported",
    "Worker",
    "WorkerStats",
]
