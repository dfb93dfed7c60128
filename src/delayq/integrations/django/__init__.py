"""delayq in a Django project: settings-based config, ``manage.py delayq_worker``,
``schedule(..., on_commit=True)``.

Add ``"delayq.integrations.django"`` to ``INSTALLED_APPS`` and configure it::

    DELAYQ = {
        "URL": "sqlite:///jobs.db",        # the store (or "APP": "shop.jobs:app", your own DelayQ)
        "OPTIONS": {"max_attempts": 5},   # DelayQ options, when delayq builds the app
        "WORKER": {"concurrency": 4},     # delayq_worker's Worker options
        "MODULES": ["shop.jobs"],         # imported before a worker starts (their handlers)
    }

Tasks and handlers are registered on :func:`get_app` (``app = get_app()`` in a
``jobs.py`` module: each installed app's ``jobs`` module is imported by
``delayq_worker``, like ``MODULES``). The app's commit hook is Django's
``transaction.on_commit``, so ``app.schedule(..., on_commit=True)`` and
``task.options(on_commit=True).schedule(...)`` store the job only when the
current transaction commits (of the ``default`` database; at once outside a
transaction). On PostgreSQL, ``schedule(..., connection=django.db.connection)``
writes the job in that very transaction instead (the store and the project's
database being one). ``manage.py delayq_worker`` runs a worker until SIGINT / SIGTERM;
``--once`` runs the jobs due now in the command's own thread and exits (cron, tests).
Needs ``pip install 'delayq[django]'``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from delayq._loader import load_app
from delayq.app import DelayQ
from delayq.errors import ConfigurationError, MissingDependency

try:
    from django.conf import settings
    from django.db import transaction
except ImportError as exc:
    raise MissingDependency(
        f"delayq.integrations.django needs {exc.name or 'django'}: pip install 'delayq[django]'"
    ) from exc

__all__ = ["SETTING", "get_app", "modules", "reset", "worker_options"]

SETTING = "DELAYQ"
"""The name of the Django setting (a dict) read here."""

_KNOWN = frozenset({"URL", "APP", "OPTIONS", "WORKER", "MODULES"})


class _Built:
    """The app built from the settings, once. ``lock`` guards ``app``."""

    lock = threading.Lock()
    app: DelayQ | None = None


def _config() -> Mapping[str, Any]:
    config = getattr(settings, SETTING, {})
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"settings.{SETTING} must be a dict, got {config!r}")
    unknown = sorted(set(config) - _KNOWN)
    if unknown:
        raise ConfigurationError(
            f"settings.{SETTING} has unknown keys {unknown}; known: {sorted(_KNOWN)}"
        )
    if "APP" in config and ("URL" in config or "OPTIONS" in config):
        raise ConfigurationError(
            f"settings.{SETTING}: give APP (your DelayQ) or URL / OPTIONS (delayq builds it), "
            f"not both"
        )
    return config


def _on_commit(fn: Any) -> None:
    transaction.on_commit(fn)


def get_app() -> DelayQ:
    """The project's :class:`~delayq.DelayQ`, built once from ``settings.DELAYQ``
    (``APP``: loaded by its ``module:attr`` name; else ``DelayQ(URL, **OPTIONS)``)
    with Django's ``transaction.on_commit`` as its commit hook."""
    with _Built.lock:
        if _Built.app is None:
            config = _config()
            if "APP" in config:
                app = load_app(str(config["APP"]))
            else:
                app = DelayQ(config.get("URL"), **dict(config.get("OPTIONS", {})))
            app.set_commit_hook(_on_commit)
            _Built.app = app
        return _Built.app


def worker_options() -> dict[str, Any]:
    """``settings.DELAYQ["WORKER"]``: the options of ``delayq_worker``'s Worker."""
    return dict(_config().get("WORKER", {}))


def modules() -> list[str]:
    """``settings.DELAYQ["MODULES"]``: modules to import before a worker starts."""
    found = _config().get("MODULES", [])
    if isinstance(found, str) or not all(isinstance(m, str) for m in found):
        raise ConfigurationError(f"settings.{SETTING}['MODULES'] must be a list of module names")
    return list(found)


def reset() -> None:
    """Close and forget the app (tests that change ``settings.DELAYQ``)."""
    with _Built.lock:
        app, _Built.app = _Built.app, None
    if app is not None:
        app.close()
