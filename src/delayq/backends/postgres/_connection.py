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
import select
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import psycopg_pool

from delayq.backends import _urls as urls
from delayq.backends._urls import flag, mask
from delayq.errors import BackendError, BackendUnavailable, ConfigurationError, InvalidOption

__all__ = [
    "URL_OPTIONS",
    "caller_connection",
    "check_idle",
    "connect_error",
    "mapped",
    "mask",
    "split_url",
]


URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "queue": str,
    "schema": str,
    "result_ttl": float,
    "dead_ttl": float,
    "pool_size": int,
    "migrate": flag,
    "synchronous_commit": str,
    "lock_timeout": float,
    "pgbouncer": flag,
    "listen": flag,
    "poll_interval": float,
}
"""Query parameters that are delayq options; every other one goes to libpq."""


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """``(libpq URL, delayq options)`` of a ``postgresql://`` or ``postgres://`` URL."""
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"the PostgreSQL store needs a postgresql:// URL, got {mask(url)!r}"
        )
    return urls.split_url(url, URL_OPTIONS, store="PostgreSQL")


_BUSY = (
    psycopg.errors.QueryCanceled,  # statement_timeout, a cancel
    psycopg.errors.LockNotAvailable,  # lock_timeout, NOWAIT
    psycopg.errors.TransactionRollback,  # deadlock, serialization failure
)
# Refusals at connect time that a later attempt may not meet (everything else the
# server answers with FATAL is the configuration's: database, role, password, option).
_TRANSIENT = (
    "too many clients",
    "remaining connection slots",
    "starting up",
    "shutting down",
    "in recovery mode",
    "not yet accepting connections",
)


@contextlib.contextmanager
def mapped(where: str, doing: str) -> Iterator[None]:
    """Turn psycopg errors raised inside into delayq errors (the cause kept).

    A timeout, a lock wait given up, a deadlock or a serialization failure is a
    :class:`~delayq.errors.BackendError` saying so (the server is there: retry
    the call, or the caller's transaction); only connection failures are
    :class:`~delayq.errors.BackendUnavailable`.
    """
    try:
        yield
    except psycopg_pool.PoolTimeout as exc:
        raise BackendUnavailable(f"PostgreSQL at {where} unavailable while {doing}: {exc}") from exc
    except _BUSY as exc:
        raise BackendError(
            f"PostgreSQL at {where} gave up while {doing} ({type(exc).__name__}: a timeout, "
            f"a lock wait, a deadlock or a serialization failure; retry): {exc}"
        ) from exc
    except psycopg.OperationalError as exc:
        raise BackendUnavailable(f"PostgreSQL at {where} failed while {doing}: {exc}") from exc
    except psycopg.Error as exc:
        raise BackendError(f"PostgreSQL at {where} failed while {doing}: {exc}") from exc


def connect_error(where: str, exc: psycopg.Error) -> Exception:
    """The delayq error of a failed first connection: the server's refusal of this
    configuration (no such database or role, a bad password or option) is a
    :class:`~delayq.errors.ConfigurationError`, raised at once."""
    text = str(exc)
    if "FATAL:" in text and not any(t in text for t in _TRANSIENT):
        return ConfigurationError(f"PostgreSQL at {where} refused the connection: {text}")
    return BackendUnavailable(f"PostgreSQL at {where} unavailable while connecting: {text}")


def check_idle(conn: psycopg.Connection[Any]) -> None:
    """The pool's check before handing out a connection: a round trip only when the
    idle socket is readable, which means the server closed it (a restart, a
    terminated backend); then the pool replaces it instead of failing the call."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        psycopg_pool.ConnectionPool.check_connection(conn)


def caller_connection(obj: object) -> psycopg.Connection[Any]:
    """The psycopg connection behind what the caller passed as ``connection=``.

    Accepts a psycopg 3 ``Connection``, a SQLAlchemy ``Connection``, or a
    SQLAlchemy ``Session`` (its current connection, which starts its
    transaction), both on the ``postgresql+psycopg`` driver, or a Django database
    connection (``django.db.connection``, the ``postgresql`` backend on psycopg 3:
    inside ``transaction.atomic()`` the job joins that transaction). Nothing is
    begun on a connection that is refused.
    """
    found: object = obj
    if getattr(found, "vendor", None) == "postgresql" and callable(
        getattr(found, "ensure_connection", None)
    ):
        found.ensure_connection()  # type: ignore[attr-defined]  # a Django connection
        found = getattr(found, "connection", None)
    if not isinstance(found, psycopg.Connection) and callable(getattr(found, "get_bind", None)):
        try:
            found = found.connection()  # type: ignore[attr-defined]  # a SQLAlchemy Session
        except Exception as exc:  # e.g. UnboundExecutionError: a Session with no bind
            raise InvalidOption(f"connection= is a Session without a connection: {exc}") from exc
    sa_conn: Any = None
    if not isinstance(found, psycopg.Connection) and hasattr(found, "in_transaction"):
        sa_conn = found  # a SQLAlchemy Connection
        proxied = getattr(found, "connection", None)
        found = getattr(proxied, "dbapi_connection", found)
    if isinstance(found, psycopg.Connection):
        if found.closed:
            raise InvalidOption("connection= is closed")
        if sa_conn is not None and not sa_conn.in_transaction():
            # Begin its transaction as its own first statement would (autobegin),
            # so its commit() / rollback() covers the job.
            sa_conn.begin()
        return found
    kind = f"{type(found).__module__}.{type(found).__qualname__}"
    raise InvalidOption(
        f"connection= takes a psycopg 3 Connection, a SQLAlchemy Connection or Session "
        f"using the postgresql+psycopg driver, or a Django connection on psycopg 3; got {kind}"
    )
