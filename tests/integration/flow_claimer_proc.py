"""A claiming process for the multi-process flow-control tests.

``python -m tests.integration.flow_claimer_proc URL OUT HOLD`` claims jobs from
the store at URL until none is left, holds each for HOLD seconds, and appends one
line per job to OUT: ``<job id> <monotonic start> <monotonic end> <claimed_at>`` (the system's
monotonic clock is shared by every process), between the claim's return and the
ack, so the intervals lie inside the store's leases.
"""

from __future__ import annotations

import sys
import time

from delayq.backends import open_backend
from delayq.backends.base import Completion


def main(url: str, out: str, hold: float) -> None:
    backend = open_backend(url)
    idle_since = time.monotonic()
    try:
        with open(out, "a", buffering=1) as log:
            while time.monotonic() - idle_since < 3.0:
                claims = backend.claim(limit=2, lease=60.0)
                if not claims:
                    time.sleep(0.005)
                    continue
                idle_since = time.monotonic()
                start = time.monotonic()
                time.sleep(hold)
                end = time.monotonic()
                for claim in claims:
                    log.write(f"{claim.job.id} {start!r} {end!r} {claim.claimed_at!r}\n")
                backend.complete([Completion.ack(claim) for claim in claims])
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
