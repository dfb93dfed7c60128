"""Deliver webhooks to a flaky endpoint: retry at 2s, 5s, 10s, 20s, then dead-letter.

An async handler (it would use an HTTP client) fails at random. Each failure
is retried after the job's backoff schedule; after ``max_attempts`` the job
goes to the dead-letter set with its last error and traceback, where it can be
inspected and requeued (``delayq dead list`` / ``delayq dead requeue ID``).

Run it (time compressed ten times: the retries come at 0.2s, 0.5s, 1s, 2s)::

    python examples/webhooks.py
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from typing import Any

from delayq import DelayQ, JobContext, Worker

BACKOFF = "2s,5s,10s,20s"
MAX_ATTEMPTS = 5  # the first try and four retries

rng = random.Random(4)


def create_app(url: str | None = None) -> DelayQ:
    app = DelayQ(url)

    @app.handler("webhook.send")
    async def send_webhook(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(0.01)  # the HTTP request
        if payload["endpoint"] == "https://down.example/hook" or rng.random() < 0.5:
            raise ConnectionError(f"POST {payload['endpoint']}: 503 Service Unavailable")
        print(f"  {ctx.id}: delivered on attempt {ctx.attempt}")

    return app


def notify(app: DelayQ, event_id: str, endpoint: str, *, backoff: Any = BACKOFF) -> str:
    return app.schedule(
        "webhook.send",
        {"event": event_id, "endpoint": endpoint},
        delay=0,
        job_id=f"webhook-{event_id}",
        backoff=backoff,
        max_attempts=MAX_ATTEMPTS,
    )


def main() -> None:
    compressed = [0.2, 0.5, 1.0, 2.0]  # 2s, 5s, 10s, 20s divided by ten
    with tempfile.TemporaryDirectory() as tmp, create_app(f"sqlite:///{tmp}/hooks.db") as app:
        with Worker(app, concurrency=4) as worker:
            for n in range(1, 5):
                notify(app, f"order-paid-{n}", "https://partner.example/hook", backoff=compressed)
            notify(app, "order-paid-5", "https://down.example/hook", backoff=compressed)
            while app.stats().scheduled or app.stats().running:
                time.sleep(0.05)
            stats = worker.stats()
        print(f"retried {stats.retried} times, {stats.succeeded} delivered, {stats.dead} dead")
        for job in app.dead_letters():
            last_line = (job.last_error or "").strip().splitlines()[-1]
            print(f"  dead: {job.id} after {job.attempts} attempts: {last_line}")


if __name__ == "__main__":
    main()
