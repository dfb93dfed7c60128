"""The Django app config of ``delayq.integrations.django``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["DelayQConfig"]


class DelayQConfig(AppConfig):
    """``INSTALLED_APPS = [..., "delayq.integrations.django"]``: its command
    ``delayq_worker`` and the settings check."""

    name = "delayq.integrations.django"
    label = "delayq"
    verbose_name = "delayq"
    default = True
