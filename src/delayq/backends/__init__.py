"""Durable stores behind one contract (:class:`~delayq.backends.base.Backend`).

:func:`open_backend` picks the store from a URL:

* ``memory://``: the in-memory reference store (tests, examples).
* ``sqlite:///path/to/jobs.db``: the embedded default (``sqlite:///:memory:`` too).
* ``redis://host:port/db``: Redis ZSET + Lua (``pip install 'delayq[redis]'``).
* ``postgresql://user@host/db?queue=q``: PostgreSQL (``pip install 'delayq[postgres]'``).
* ``amqp://user:pass@host:port/vhost?queue=name``: RabbitMQ TTL + dead-letter levels
  (``pip install 'delayq[rabbitmq]'``).
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from delayq.backends._common import CompletesAndClaims
from delayq.backends.base import Backend
from delayq.errors import ConfigurationError, MissingDependency

__all__ = ["DEFAULT_URL", "Backend", "combines_complete_and_claim", "open_backend"]

DEFAULT_URL = "sqlite:///delayq.db"
"""Used when no URL is given: a SQLite file in the working directory."""

# scheme -> (module, class name, extra that provides its driver, driver module)
_BACKENDS: dict[str, tuple[str, str, str | None, str | None]] = {
    "memory": ("delayq.backends.memory", "MemoryBackend", None, None),
    "sqlite": ("delayq.backends.sqlite", "SQLiteBackend", None, None),
    "redis": ("delayq.backends.redis", "RedisBackend", "redis", "redis"),
    "rediss": ("delayq.backends.redis", "RedisBackend", "redis", "redis"),
    "unix": ("delayq.backends.redis", "RedisBackend", "redis", "redis"),
    **{
        f"{s}+{kind}": ("delayq.backends.redis", "RedisBackend", "redis", "redis")
        for s in ("redis", "rediss")
        for kind in ("cluster", "sentinel")
    },
    "postgresql": ("delayq.backends.postgres", "PostgresBackend", "postgres", "psycopg_pool"),
    "postgres": ("delayq.backends.postgres", "PostgresBackend", "postgres", "psycopg_pool"),
    "amqp": ("delayq.backends.rabbitmq", "RabbitMQBackend", "rabbitmq", "pika"),
    "amqps": ("delayq.backends.rabbitmq", "RabbitMQBackend", "rabbitmq", "pika"),
}


def open_backend(url: str | None = None, **options: Any) -> Backend:
    """Open the store named by ``url`` (``DEFAULT_URL`` when None).

    ``options`` go to the backend's constructor (``clock=``, ``result_ttl=``,
    ``synchronous=`` for SQLite, ``prefix=`` for Redis, ...).
    """
    url = DEFAULT_URL if url is None else url
    if not isinstance(url, str):
        raise ConfigurationError(f"backend URL must be a str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    try:
        module_name, class_name, extra, driver = _BACKENDS[scheme]
    except KeyError:
        known = ", ".join(f"{s}://" for s in sorted(_BACKENDS))
        raise ConfigurationError(
            f"unknown backend URL scheme {scheme!r} in {url!r}; known schemes: {known}"
        ) from None
    if driver is not None:
        try:
            importlib.import_module(driver)
        except ImportError as exc:
            raise MissingDependency(
                f"the {scheme}:// backend needs the {driver!r} package: "
                f"pip install 'delayq[{extra}]'"
            ) from exc
    module = importlib.import_module(module_name)
    backend: Backend = getattr(module, class_name).from_url(url, **options)
    return backend


def combines_complete_and_claim(backend: object) -> bool:
    """Whether ``backend`` completes a batch and claims in ONE round trip.

    A store without it inherits the default ``complete_and_claim`` (complete,
    then claim: two calls); a worker gains nothing by pairing them then.
    """
    method = getattr(type(backend), "complete_and_claim", None)
    return method is not None and method is not CompletesAndClaims.complete_and_claim
