"""In-process timing structures, no I/O: DelayQueue, AsyncDelayQueue, RetryQueue,
HashedWheelTimer, hierarchical TimingWheel, behind one Timer interface."""
