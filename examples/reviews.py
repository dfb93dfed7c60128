"""Post a default good review 24 hours after delivery, unless the customer reviews first.

Shows the rest of the job API: a delivery schedules ``review.default`` for
24 hours later; a customer's own review cancels it; a second delivery of the
same order (a replacement parcel) restarts the 24 hours with
``on_conflict="replace"``; ``get`` reports where each job is.

Run it (time compressed: "24 hours" is 2 seconds here)::

    python examples/reviews.py
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from delayq import DelayQ, Worker

REVIEW_AFTER = 24 * 3600.0

reviews: dict[int, str] = {}


def create_app(url: str | None = None) -> DelayQ:
    app = DelayQ(url)

    @app.handler("review.default")
    def post_default_review(payload: dict[str, Any]) -> None:
        order = payload["order"]
        reviews.setdefault(order, "5 stars (default)")
        print(f"  order {order}: no review after 24 hours, posted {reviews[order]!r}")

    return app


def delivered(app: DelayQ, order: int, *, review_after: float = REVIEW_AFTER) -> None:
    # "replace": a re-delivery restarts the 24 hours instead of failing.
    app.schedule(
        "review.default",
        {"order": order},
        delay=review_after,
        job_id=f"review-{order}",
        on_conflict="replace",
    )


def customer_reviewed(app: DelayQ, order: int, text: str) -> None:
    reviews[order] = text
    outcome = app.cancel(f"review-{order}")
    print(f"  order {order}: customer wrote {text!r}; default review {outcome.value}")


def main() -> None:
    compressed = 2.0  # "24 hours"
    with tempfile.TemporaryDirectory() as tmp, create_app(f"sqlite:///{tmp}/shop.db") as app:
        with Worker(app):
            print('orders 1, 2 and 3 delivered ("24 hours" = 2 s)')
            for order in (1, 2, 3):
                delivered(app, order, review_after=compressed)
            time.sleep(0.5)
            customer_reviewed(app, 2, "4 stars, fast shipping")
            print("  order 3: replacement parcel delivered, the 24 hours start again")
            delivered(app, 3, review_after=compressed)
            job = app.get("review-3")
            assert job is not None
            print(f"  review-3 is {job.state.value}, due in {job.run_at - time.time():.1f}s")
            while app.stats().scheduled or app.stats().running:
                time.sleep(0.05)
        print("reviews:", dict(sorted(reviews.items())))


if __name__ == "__main__":
    main()
