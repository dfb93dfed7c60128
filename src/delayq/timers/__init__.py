"""In-process timing structures, no I/O: DelayQueue, AsyncDelayQueue, RetryQueue,
HashedWheelTimer, hierarchical TimingWheel, behind one Timer interface."""

from delayq.timers.delay_queue import AsyncDelayQueue, Delayed, DelayedItem, DelayQueue

__all__ = ["AsyncDelayQueue", "DelayQueue", "Delayed", "DelayedItem"]
