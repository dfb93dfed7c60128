"""The shop's jobs, registered on the project's app (imported by ``delayq_worker``)."""

from __future__ import annotations

import os

from delayq.integrations.django import get_app

app = get_app()

CANCEL_AFTER = float(os.environ.get("ORDER_CANCEL_AFTER", "1800"))


@app.task(name="order.cancel", store_result=True)
def cancel_unpaid(order_id: int) -> str:
    # A real shop reads the order here and cancels it if it is still unpaid.
    return f"cancelled order {order_id}"
