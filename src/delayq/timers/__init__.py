"""In-process timing structures, no I/O: DelayQueue, AsyncDelayQueue, RetryQueue,
HashedWheelTimer, hierarchical TimingWheel, behind one Timer interface."""

from delayq.timers.async_delay_queue import AsyncDelayQueue
from delayq.timers.base import Timer, TimerHandle
from delayq.timers.delay_queue import Delayed, DelayedItem, DelayQueue
from delayq.timers.hashed_wheel import HashedWheel, HashedWheelTimer
from delayq.timers.heap_timer import DelayQueueTimer
from delayq.timers.retry_queue import RetryQueue
from delayq.timers.timing_wheel import HierarchicalWheel, TimingWheel

__all__ = [
    "AsyncDelayQueue",
    "DelayQueue",
    "DelayQueueTimer",
    "Delayed",
    "DelayedItem",
    "HashedWheel",
    "HashedWheelTimer",
    "HierarchicalWheel",
    "RetryQueue",
    "Timer",
    "TimerHandle",
    "TimingWheel",
]
