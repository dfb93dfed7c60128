"""The retry experiment on a fake clock: its timeline is exactly the backoff."""

from __future__ import annotations

import io
import re
import threading

from delayq.cli.experiments import retry
from delayq.testing import FakeClock


def test_the_retry_timeline_on_a_fake_clock_is_the_backoff_exactly() -> None:
    clock = FakeClock()
    out = io.StringIO()
    runner = threading.Thread(target=retry.run, args=(out,), kwargs={"clock": clock})
    runner.start()
    while runner.is_alive():
        # The experiment blocks in take() until the next attempt is due: move
        # the clock to that deadline each time it waits.
        if clock.wait_for_waiters(1, timeout=0.1):
            deadline = clock.next_deadline()
            assert deadline is not None
            clock.advance_to(deadline)
    runner.join()
    text = out.getvalue()
    offsets = [int(m) for m in re.findall(r"\+\s*(\d+)ms\s+attempt loan-9001#\d", text)]
    assert offsets == [0, 50, 150]  # 50 ms after #0, then 100 ms after #1
    assert "loan-9001#0 -> failed" in text and "loan-9001#1 -> failed" in text
    assert "loan-9001#2 -> succeeded" in text
    assert "queue length at the end = 0" in text
    assert "lateness per attempt: mean 0.00ms, max 0.00ms" in text
