"""Cancel unpaid orders 30 minutes after they were placed.

The classic delayed job: placing an order schedules its own cancellation;
paying cancels that job. The job id is derived from the order id, so the
payment handler can find it, and scheduling twice is harmless.

Run the story (time compressed: "30 minutes" is 2 seconds here)::

    python examples/orders.py

Or run the handlers in a worker against a real file, and drive them from the CLI::

    export DELAYQ_URL=sqlite:///shop.db
    delayq worker examples.orders:create_app &
    delayq schedule order.cancel '{"order": 7}' --delay 30m --id cancel-order-7
    delayq cancel cancel-order-7
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from delayq import CancelOutcome, DelayQ, JobContext, Worker

CANCEL_AFTER = 30 * 60.0  # seconds an order may stay unpaid

# The shop's "database": order id -> status.
orders: dict[int, str] = {}


def create_app(url: str | None = None) -> DelayQ:
    """The app with its handlers (``url=None``: $DELAYQ_URL, else ./delayq.db)."""
    app = DelayQ(url)

    @app.handler("order.cancel")
    def cancel_unpaid_order(payload: dict[str, Any], ctx: JobContext) -> None:
        order = payload["order"]
        # Idempotent: at-least-once delivery may run this twice after a crash.
        if orders.get(order) == "placed":
            orders[order] = "cancelled"
        print(f"  order {order} cancelled: not paid in time ({ctx.lateness * 1000:.1f} ms late)")

    return app


def place_order(app: DelayQ, order: int, *, cancel_after: float = CANCEL_AFTER) -> str:
    orders[order] = "placed"
    return app.schedule(
        "order.cancel",
        {"order": order},
        delay=cancel_after,
        job_id=f"cancel-order-{order}",
        on_conflict="keep",  # placing the same order twice schedules one cancel
    )


def pay(app: DelayQ, order: int) -> None:
    outcome = app.cancel(f"cancel-order-{order}")
    if outcome is CancelOutcome.CANCELLED:
        orders[order] = "paid"
        print(f"  order {order} paid: its cancel job was cancelled")
    else:  # RUNNING or FINISHED: too late, the order is being cancelled
        print(f"  order {order} paid too late ({outcome.value}): refund it")


def main() -> None:
    compressed = 2.0  # "30 minutes"
    with tempfile.TemporaryDirectory() as tmp, create_app(f"sqlite:///{tmp}/shop.db") as app:
        with Worker(app, concurrency=2):
            print('placing orders 1, 2 and 3 ("30 minutes" = 2 s)')
            for order in (1, 2, 3):
                place_order(app, order, cancel_after=compressed)
            time.sleep(0.5)
            pay(app, 2)
            while app.stats().scheduled or app.stats().running:
                time.sleep(0.05)
        print("orders:", dict(sorted(orders.items())))


if __name__ == "__main__":
    main()
