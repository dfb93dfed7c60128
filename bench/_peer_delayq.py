"""delayq worker entry for the Redis peers benchmark.

``python -m bench._peer_delayq`` runs one worker process with delayq's default settings
(``Worker(app).run()``: concurrency 8, no polling), the same thing ``delayq worker
bench._peer_delayq:app`` runs. The jobs live on their own queue so their keys
(``delayq:{bench-peers}:*``) are easy to find and delete.
"""

from __future__ import annotations

from typing import Any

from bench._peer_common import record, redis_url
from delayq.app import DelayQ

QUEUE = "bench-peers"

app = DelayQ(f"{redis_url()}?queue={QUEUE}")


@app.handler("noop")
def noop(payload: dict[str, Any]) -> None:
    """No-op job that only records its lateness."""
    record(payload["index"], payload["due"])


def main() -> None:
    """Run one worker until SIGINT/SIGTERM (graceful stop)."""
    from delayq.worker import Worker  # noqa: PLC0415 - only the worker process needs it

    Worker(app).run()


if __name__ == "__main__":
    main()
