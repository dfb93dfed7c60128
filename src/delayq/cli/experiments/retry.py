"""Experiment 2 of the seed notes: retry with exponential backoff on a DelayQueue.

Job ``loan-9001`` fails on attempts #0 and #1 and succeeds on #2. After a
failed attempt ``n`` it goes back into a real :class:`~delayq.DelayQueue`
with a backoff of ``50 ms << n`` (50 ms, then 100 ms); the consumer blocks
in ``take()`` until it is due. The timeline prints the measured offset of each
attempt from the first one, so the gap shows the backoff plus the queue's
lateness::

    python -m delayq.cli.experiments.retry      # or: delayq experiment retry
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from delayq.clock import SYSTEM_CLOCK, Clock
from delayq.timers.delay_queue import DelayQueue

__all__ = ["run"]

JOB_ID = "loan-9001"
MAX_ATTEMPT = 3
BASE_BACKOFF_MS = 50


@dataclass(frozen=True, slots=True)
class RetryJob:
    """One attempt of a job, due at a monotonic ``deadline``."""

    id: str
    deadline: float
    attempt: int


def run(out: TextIO, *, clock: Clock = SYSTEM_CLOCK) -> None:
    """Run the experiment on ``clock`` and print its timeline to ``out``."""
    queue: DelayQueue[RetryJob] = DelayQueue(clock=clock)
    out.write("== Experiment 2: retry with exponential backoff (DelayQueue) ==\n")
    t0 = clock.monotonic()
    queue.put(RetryJob(JOB_ID, t0, 0))
    lateness: list[float] = []
    while True:
        job = queue.take()
        now = clock.monotonic()
        offset_ms = (now - t0) * 1000
        lateness.append((now - job.deadline) * 1000)
        ok = job.attempt == MAX_ATTEMPT - 1
        outcome = "succeeded" if ok else "failed"
        out.write(f"  +{offset_ms:4.0f}ms  attempt {job.id}#{job.attempt} -> {outcome}\n")
        if ok:
            break
        backoff_ms = BASE_BACKOFF_MS << job.attempt
        out.write(f"           back off {backoff_ms}ms, then retry\n")
        queue.put(RetryJob(job.id, now + backoff_ms / 1000, job.attempt + 1))
    out.write(f"  queue length at the end = {len(queue)}\n")
    worst = max(lateness)
    mean = sum(lateness) / len(lateness)
    out.write(f"  lateness per attempt: mean {mean:.2f}ms, max {worst:.2f}ms\n")
    queue.close()


if __name__ == "__main__":
    run(sys.stdout)
