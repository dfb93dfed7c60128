from __future__ import annotations

from django.urls import path
from orders import views

urlpatterns = [
    path("orders/<int:order_id>", views.place),
    path("jobs/<str:job_id>", views.job),
]
