"""Connections of the PostgreSQL store: URL options, driver errors, the caller's connection.

* :func:`split_url` takes delayq's own options (``?queue=orders&schema=jobs``)
  out of a ``postgresql://`` URL and leaves libpq's.
* :func:`mapped` is the ONE place psycopg errors become delayq errors.
* :func:`caller_connection` accepts what an application holds (a psycopg
  ``Connection``, a SQLAlchemy ``Connection`` or ``Session`` on the psycopg
  driver) and returns the psycopg connection whose transaction a job joins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import psycopg_pool

from delayq.backends import _urls as urls
from delayq.backends._urls import flag, mask
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError, InvalidOption

__all__ = ["URL_OPTIONS", "caller_connection", "mapped", "mask", "split_url"]


URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "queue": str,
    "schema": str,
    "result_ttl": float,
    "dead_ttl": float,
    "pool_size": int,
    "migrate": flag,
    "synchronous_commit": str,
}
"""Query parameters that are delayq options; every other one goes to libpq."""


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """``(libpq URL, delayq options)`` of a ``postgresql://`` or ``postgres://`` URL."""
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"the PostgreSQL store needs a postgresql:// URL, got {mask(url)!r}"
        )
    return urls.split_url(url, URL_OPTIONS, store="PostgreSQL")


@contextlib.contextmanager
def mapped(where: str, doing: str) -> Iterator[None]:
    """Turn psycopg errors raised inside into delayq errors (the cause kept)."""
    try:
        yield
    except psycopg_pool.PoolTimeout as exc:
        raise BackendUnavailable(f"PostgreSQL at {where} unavailable while {doing}: {exc}") from exc
    except psycopg.OperationalError as exc:
        raise BackendUnavailable(f"PostgreSQL at {where} failed while {doing}: {exc}") from exc
    except psycopg.Error as exc:
        raise BackendError(f"PostgreSQL at {where} failed while {doing}: {exc}") from exc


def caller_connection(obj: object) -> psycopg.Connection[Any]:
    """The psycopg connection behind what the caller passed as ``connection=``.

    Accepts a psycopg 3 ``Connection``, a SQLAlchemy ``Connection``, or a
    SQLAlchemy ``Session`` (its current connection, which starts its
    transaction), both on the ``postgresql+psycopg`` driver.
    """
    found: object = obj
    if not isinstance(found, psycopg.Connection) and callable(getattr(found, "get_bind", None)):
        found = found.connection()  # type: ignore[attr-defined]  # a SQLAlchemy Session
    if not isinstance(found, psycopg.Connection) and hasattr(found, "in_transaction"):
        # A SQLAlchemy Connection: begin its transaction as its own first
        # statement would (autobegin), so its commit() / rollback() covers the job.
        sa_conn: Any = found
        if not sa_conn.in_transaction():
            sa_conn.begin()
        proxied = getattr(found, "connection", None)
        found = getattr(proxied, "dbapi_connection", found)
    if isinstance(found, psycopg.Connection):
        if found.closed:
            raise InvalidOption("connection= is closed")
        return found
    raise InvalidOption(
        f"connection= takes a psycopg 3 Connection, or a SQLAlchemy Connection or Session "
        f"using the postgresql+psycopg driver; got {type(obj).__name__}"
    )
