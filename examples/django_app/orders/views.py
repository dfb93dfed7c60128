"""Placing an order schedules its cancellation inside the order's transaction."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from orders.jobs import CANCEL_AFTER, app, cancel_unpaid


class _PaymentRefused(Exception):
    pass


@csrf_exempt
@require_POST
def place(request: HttpRequest, order_id: int) -> JsonResponse:
    """``?fail=1`` rolls the order's transaction back: its job is never stored."""
    job_id = None
    try:
        with transaction.atomic():
            # ... save the order here ...
            job_id = cancel_unpaid.options(
                delay=CANCEL_AFTER,
                job_id=f"cancel-order-{order_id}",
                on_conflict="keep",
                on_commit=True,  # stored when this transaction commits
            ).schedule(order_id)
            if request.GET.get("fail"):
                raise _PaymentRefused
    except _PaymentRefused:
        return JsonResponse({"job": job_id, "placed": False}, status=402)
    return JsonResponse({"job": job_id, "placed": True})


@require_GET
def job(request: HttpRequest, job_id: str) -> JsonResponse:
    found = app.get(job_id)
    if found is None:
        return JsonResponse({"job": job_id, "state": None}, status=404)
    result = app.result(job_id, timeout=0) if found.state == "succeeded" else None
    return JsonResponse({"job": job_id, "state": found.state.value, "result": result})
