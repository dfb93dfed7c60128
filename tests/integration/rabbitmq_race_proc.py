"""A bare claimer for the RabbitMQ cancel tests (run with ``python -m``).

``python -m tests.integration.rabbitmq_race_proc URL QUEUE RECORD [--die-after-claim]``
claims jobs of ``QUEUE`` and, for each claim (its start recorded in the queue's
log, so its "handler" may run), appends ``<job id> <attempt>`` to ``RECORD``
(flushed and synced) before acking it; it exits after the job ``stop``. With
``--die-after-claim`` it kills itself (SIGKILL) right after its first claim
returns, before recording it: between the start record and the handler.
"""

from __future__ import annotations

import argparse
import os
import signal

from delayq.backends.base import Completion
from delayq.backends.rabbitmq import RabbitMQBackend


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("record")
    parser.add_argument("--die-after-claim", action="store_true")
    args = parser.parse_args(argv)
    store = RabbitMQBackend(args.url, queue=args.queue)
    with open(args.record, "a", buffering=1) as out:
        while True:
            claims = store.claim(limit=8, lease=30.0)
            if claims and args.die_after_claim:
                os.kill(os.getpid(), signal.SIGKILL)
            for claim in claims:
                out.write(f"{claim.job.id} {claim.job.attempts}\n")
                out.flush()
                os.fsync(out.fileno())
            if claims:
                store.complete([Completion.ack(claim) for claim in claims])
            if any(claim.job.id == "stop" for claim in claims):
                break
            if not claims:
                store.wait_for_due(0.5)
    store.close()


if __name__ == "__main__":
    main()
