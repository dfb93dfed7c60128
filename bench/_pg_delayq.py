"""delayq worker entry for the PostgreSQL benchmark (``python -m bench._pg_delayq``).

One worker process with delayq's default settings (``Worker(app).run()``) on the
store named by ``BENCH_PG_URL``; its handler only records its lateness.
"""

from __future__ import annotations

import os
from typing import Any

from bench._peer_common import record
from delayq.app import DelayQ

URL_ENV = "BENCH_PG_URL"

app = DelayQ(os.environ.get(URL_ENV, "postgresql://postgres@127.0.0.1:5432/test"))


@app.handler("noop")
def noop(payload: dict[str, Any]) -> None:
    """No-op job that only records its lateness."""
    record(payload["i"], payload["due"])


def main() -> None:
    """Run one worker until SIGINT/SIGTERM (graceful stop)."""
    from delayq.worker import Worker  # noqa: PLC0415 - only the worker process needs it

    Worker(app).run()


if __name__ == "__main__":
    main()
